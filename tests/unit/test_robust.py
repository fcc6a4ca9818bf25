"""Byzantine-robust aggregation (``aggregation`` in the run config), with Flower's rules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from aggregator.robust import robust_aggregate
from aggregator.server_app import run_rounds
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.runtime.rounds import received_model
from edge_client.runtime.rounds import train_round as fedstream_train
from edge_client.wire.codec import encode
from edge_client.wire.records import CONFIG, DeviceReply, RoundPlan
from edge_client.wire.run_config import RunSettings

ATTACK = 50.0  # the hostile device sends this times minus its honest update (finite: passes
# every codec check; only the aggregation rule can stop it)


def honest_and_one_attacker(n: int = 6) -> tuple[list[dict[str, np.ndarray]], list[int]]:
    rng = np.random.default_rng(0)
    deltas = [{"w": 1.0 + 0.01 * rng.standard_normal((3, 4))} for _ in range(n - 1)]
    deltas.append({"w": np.full((3, 4), 1000.0)})
    return deltas, [10, 20, 30, 40, 50, 60]


@pytest.mark.parametrize("rule", ["trimmed-mean", "median", "krum", "multi-krum"])
def test_robust_rules_ignore_one_outlier_where_the_mean_does_not(rule: str) -> None:
    # Prepare
    deltas, weights = honest_and_one_attacker()
    mean = sum(w * d["w"] for d, w in zip(deltas, weights, strict=True)) / sum(weights)
    # Execute
    combined, kept = robust_aggregate(rule, deltas, weights, trim_fraction=0.2, malicious=1)
    # Assert
    assert float(np.abs(mean - 1).max()) > 100  # FedAvg is dragged away
    assert float(np.abs(combined["w"] - 1).max()) < 0.05
    if rule in ("krum", "multi-krum"):
        assert 5 not in kept and len(kept) == (1 if rule == "krum" else 5)
    else:
        assert kept == list(range(6))


def test_multi_krum_averages_the_kept_updates_by_samples_used() -> None:
    deltas = [{"w": np.array([1.0])}, {"w": np.array([1.1])}, {"w": np.array([0.9])}]
    deltas += [{"w": np.array([1.05])}, {"w": np.array([99.0])}]
    weights = [1, 3, 1, 1, 1]

    combined, kept = robust_aggregate("multi-krum", deltas, weights, malicious=1)

    assert kept == [0, 1, 2, 3]
    assert combined["w"][0] == pytest.approx((1.0 + 3 * 1.1 + 0.9 + 1.05) / 6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rule": "fedavg"}, "robust rule"),
        ({"rule": "mean-ish"}, "robust rule"),
        ({"deltas": []}, "at least one update"),
        ({"trim_fraction": 0.5}, "range"),
        ({"rule": "krum", "malicious": -1}, "krum-malicious"),
    ],
)
def test_bad_robust_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    deltas, weights = honest_and_one_attacker()
    args: dict[str, Any] = {"rule": "trimmed-mean", "deltas": deltas, "weights": weights}
    args.update(kwargs)
    if not args["deltas"]:
        args["weights"] = []
    with pytest.raises(ValueError, match=message):
        robust_aggregate(**args)


class Attacker:
    """fedstream's ClientApp, except that dev-3 sends a scaled, sign-flipped update."""

    def __init__(self) -> None:
        self.app = ClientApp()
        self.app.train()(self._train)

    def _train(self, msg: Message, context: Context) -> Message:
        reply = DeviceReply.from_content(fedstream_train(msg, context).content)
        if reply.device_id != "dev-3":
            return Message(reply.to_content(), reply_to=msg)
        shapes = {k: a.shape for k, a in received_model(msg, context).items()}
        plan = RoundPlan.from_record(msg.content.config_records[CONFIG])
        rng = np.random.default_rng(plan.server_round)
        bad = {k: (-ATTACK * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}
        hostile = DeviceReply(reply.device_id, reply.metrics, encode(bad, "none"))
        return Message(hostile.to_content(), reply_to=msg)


@pytest.mark.parametrize(
    ("rule", "survives"), [("fedavg", False), ("krum", True), ("trimmed-mean", True)]
)
def test_a_robust_rule_keeps_training_with_a_hostile_device(
    tmp_path: Path, rule: str, survives: bool, fast: Callable[..., RunSettings]
) -> None:
    # Prepare: 5 devices, dev-3 hostile from round 1.
    fleet = [VirtualDevice(f"dev-{i}", rate=20_000) for i in range(5)]
    grid = InProcessGrid(fleet, tmp_path / "buffers", client_app=Attacker().app)
    # (max-diverged-rounds 0: a run that diverges goes on, so that FedAvg's wreck is measured)
    settings = fast(
        controller="fixed", local_steps=20, num_rounds=5, aggregation=rule, krum_malicious=1,
        max_diverged_rounds=0,
    )  # fmt: skip
    # Execute
    records = run_rounds(grid, settings)
    grid.close()
    # Assert: FedAvg is wrecked (chance is 1/6), so that training diverges on the devices;
    # the robust rules learn (without the attacker FedAvg reached 0.64 here), and Krum
    # never picks dev-3.
    final = records[-1].accuracy
    assert records[-1].aggregation == rule
    if survives:
        assert final > 0.4, [r.accuracy for r in records]
    else:
        assert final < 0.3, [r.accuracy for r in records]
        assert records[-1].diverged > 0
    if rule == "krum":
        assert all(len(r.aggregated) == 1 and "dev-3" not in r.aggregated for r in records)
