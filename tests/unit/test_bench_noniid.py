"""The non-IID benchmark's accounting: injection counted as delivered, the budget's cuts, the
pool's use, and a whole (faked) run's tables, goals and files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from aggregator.round_log import RoundRecord
from aggregator.server_app import run_rounds
from deploy.bench import noniid
from deploy.bench.common import FleetRun, write_result
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.wire.records import ReplyMetrics
from edge_client.wire.run_config import RunSettings
from tests.helpers import Fast, round_record

#: A device that trained 20 steps of 16 and sent a 25 kB update.
TRAINED = ReplyMetrics(
    num_examples=320, batch_size=16, step_s=0.01, train_loss=1.0, local_steps=20, bytes_up=25_000
)


def metrics(opt_in: bool, shared: int = 0, samples: int = 0, used: int = 0) -> ReplyMetrics:
    """A device that trained 20 steps of 16 (``used`` of them from its pool)."""
    return replace(
        TRAINED,
        inject_used=used,
        inject_opt_in=int(opt_in),
        inject_bytes=shared,
        inject_samples=samples,
    )


def record(
    round_: int, devices: dict[str, ReplyMetrics], picked: Sequence[str], accuracy: float = 0.5
) -> RoundRecord:
    """A round of these devices, every one messaged, the model 24,000 B down."""
    return round_record(
        round=round_, accuracy=0.0, test_accuracy=accuracy, loss=0.0,
        global_batch=128, sum_b=128, planned=dict.fromkeys(devices, 16), devices=devices,
        aggregated=list(devices), bytes_up=sum(m.bytes_up for m in devices.values()),
        broadcast_bytes=24_000, inject_picked=list(picked),
        inject_bytes=sum(m.inject_bytes for m in devices.values()), virtual_s=1.0,
    )  # fmt: skip


def test_injection_is_counted_as_delivered_to_every_other_opted_in_device() -> None:
    # Prepare: 4 devices, 3 opted in; two of them picked, 8,000 and 7,000 B queued.
    devices = {
        "a": metrics(True, 8_000, 10),
        "b": metrics(True, 7_000, 9),
        "c": metrics(True),
        "d": metrics(False),
    }
    # Execute
    traffic = noniid.round_traffic(record(2, devices, ["a", "b"]))
    # Assert: each frame goes up once and down to the 2 other opted-in devices
    assert traffic.queued_bytes == 15_000 and traffic.frames == 2
    assert traffic.delivered_bytes == 30_000 and traffic.delivered_frames == 4
    # the model's traffic: 4 updates up, 4 copies of the model down
    assert traffic.model_bytes == 4 * 25_000 + 4 * 24_000


def test_nothing_is_delivered_without_a_second_opted_in_device() -> None:
    devices = {"a": metrics(True, 8_000, 10), "b": metrics(False)}
    traffic = noniid.round_traffic(record(2, devices, ["a"]))
    assert traffic.delivered_bytes == 0 and traffic.delivered_frames == 0


def test_delivered_frames_match_what_the_in_process_broker_delivered(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: 4 devices, one label each, 3 opted in; two of them share each round.
    devices = [VirtualDevice(f"dev-{i}", rate=20_000, labels=[i], inject=i < 3) for i in range(4)]
    grid = InProcessGrid(devices, tmp_path / "buffers")
    settings = fast(controller="fixed", num_rounds=4, inject_alpha=0.67, eval_samples=100)
    # Execute
    records = run_rounds(grid, settings)
    delivered = grid.inject_delivered
    grid.close()
    # Assert: the records' count (queued x (opted-in - 1)) is the broker's
    traffic = [noniid.round_traffic(r) for r in records]
    assert delivered > 0
    assert sum(t.delivered_frames for t in traffic) == delivered
    assert all(t.delivered_bytes == 2 * t.queued_bytes for t in traffic)


def test_budget_cuts_count_shares_smaller_than_beta_of_the_samples_trained() -> None:
    # Prepare: 320 samples trained, 80 from the pool: beta 0.25 of the 240 own ones is 60.
    rounds = [
        record(2, {"a": metrics(True, 8_000, 10, used=80), "b": metrics(True)}, ["a"]),
        record(3, {"a": metrics(True), "b": metrics(True, 50_000, 60, used=80)}, ["b"]),
    ]
    # Execute
    shares = noniid.budget_cuts(rounds, beta=0.25)
    # Assert: the first share was cut (10 < 60), the second was not
    assert shares == noniid.Shares(shares=2, cut=1, samples=70, wanted=120)


def test_pools_are_fed_by_the_others_shares_and_drawn_from_without_being_consumed() -> None:
    # Prepare: a shares 10 samples in round 1, b 20 in round 2; each then draws 80 per round.
    rounds = [
        record(1, {"a": metrics(True, 8_000, 10), "b": metrics(True)}, ["a"]),
        record(2, {"a": metrics(True, used=80), "b": metrics(True, 9_000, 20, used=80)}, ["b"]),
    ]
    # Execute
    use = noniid.pool_use(rounds)
    # Assert: a's pool got b's 20 samples, b's pool a's 10; 160 draws from 30 delivered
    assert use["pool_end"] == pytest.approx(15.0)
    assert use["pool_fraction"] == pytest.approx(160 / 1280)
    assert use["draws_per_sample"] == pytest.approx(160 / 30)
    assert noniid.pool_use([record(1, {"a": metrics(False)}, [])]) == {}


def fake_fleet(
    label: str, devices: Sequence[VirtualDevice], settings: RunSettings, seed: int = 0
) -> FleetRun:
    """A run without training: accuracy grows with the seed and for injection; picked
    devices share within the budget."""
    skewed = any(d.labels is not None or d.dirichlet is not None for d in devices)
    inject = any(d.inject for d in devices)
    top = 0.95 if not skewed else 0.9 if inject else 0.5
    records = []
    for n in range(1, settings.num_rounds + 1):
        picked = [devices[n % len(devices)].device_id] if inject and n > 1 else []
        replies = {
            d.device_id: metrics(
                d.inject,
                settings.inject_budget if d.device_id in picked else 0,
                settings.inject_budget // 800 if d.device_id in picked else 0,
                used=round(settings.inject_mix * 16) * 20 if inject and n > 2 else 0,
            )
            for d in devices
        }
        accuracy = top * min(1.0, n / (settings.num_rounds / 2)) - 0.01 * seed
        records.append(record(n, replies, picked, accuracy))
    return FleetRun(records, [])


@pytest.mark.parametrize("quick", [True, False])
def test_a_whole_run_reports_every_seed_the_goals_and_the_sweep(
    quick: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: runs that train nothing
    monkeypatch.setattr(noniid, "run_fleet", fake_fleet)
    # Execute
    result = noniid.run(quick=quick)
    paths = write_result(result, tmp_path)
    # Assert: one seed and no sweep or FedProx when quick; all three seeds and the sweep else
    doc = json.loads((tmp_path / "noniid.json").read_text())
    methods = {(e["partition"], e["method"]) for e in doc["entries"]}
    assert doc["seeds"] == ([0] if quick else [0, 1, 2])
    assert (("one-label", "fedprox-0.1") in methods) is not quick
    assert all((("one-label", m) in methods) is not quick for m in noniid.SWEEP)
    assert ("Sweep:" in result.table) is not quick
    # injection counted as delivered: 16,384 B from one picked device to 7 others
    inject = next(
        e
        for e in doc["entries"]
        if (e["partition"], e["method"]) == ("one-label", "inject-0.25-0.25")
    )
    assert inject["delivered_bytes_max_round"] == 7 * 16_384
    assert all(len(v) == len(doc["seeds"]) for k, v in inject.items() if k.endswith("_per_seed"))
    # goals: injection at 0.9/0.95 of IID is met, its bytes (7 x 16 kB) are over one update
    goal = doc["goal"]["partitions"]["one-label"]
    assert goal["inject_met"] and goal["fedavg_below"] and goal["reference_trained"]
    assert not goal["bytes_met"] and goal["delivered_updates_per_round"] > 1
    assert "MISSED < 1 in every round" in result.table and "chance is 0.17" in result.table
    assert any(p.suffix == ".png" for p in paths)


def test_every_sweep_run_changes_one_injection_parameter_from_the_goals() -> None:
    for overrides in noniid.SWEEP.values():
        changed: dict[str, Any] = {
            k: v for k, v in overrides.items() if noniid.INJECT.get(k, object()) != v
        }
        assert set(changed) <= {"inject_budget", "inject_mix"} and len(changed) == 1
