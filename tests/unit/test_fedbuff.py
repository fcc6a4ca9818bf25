"""Buffered asynchronous aggregation (FedBuff): staleness weights and exactly-once counting."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from aggregator.fedbuff import UpdateBuffer, staleness_weight
from tests.helpers import fitted

SHAPES = {"w": (2,), "b": (1,)}


def delta(value: float) -> dict[str, np.ndarray]:
    return {k: np.full(s, value) for k, s in SHAPES.items()}


@pytest.mark.parametrize(
    ("rule", "tau", "a", "b", "expected"),
    [
        ("constant", 7, 0.5, 4, 1.0),
        ("polynomial", 0, 0.5, 4, 1.0),
        ("polynomial", 3, 0.5, 4, 0.5),  # (1 + 3) ** -0.5
        ("polynomial", 8, 0.5, 4, 1 / 3),  # (1 + 8) ** -0.5
        ("polynomial", 1, 2.0, 4, 0.25),  # (1 + 1) ** -2
        ("hinge", 4, 0.5, 4, 1.0),  # up to b: 1
        ("hinge", 6, 0.5, 4, 0.5),  # 1 / (0.5 * 2 + 1)
        ("hinge", 10, 0.5, 4, 0.25),  # 1 / (0.5 * 6 + 1)
    ],
)
def test_staleness_weights_match_hand_computed_values(
    rule: str, tau: int, a: float, b: int, expected: float
) -> None:
    assert staleness_weight(tau, rule, a, b) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("tau", "rule", "a"), [(-1, "constant", 0.5), (0, "exp", 0.5), (0, "hinge", 0.0)]
)
def test_bad_staleness_settings_are_refused(tau: int, rule: str, a: float) -> None:
    with pytest.raises(ValueError):
        staleness_weight(tau, rule, a)


def test_the_step_is_the_sample_and_staleness_weighted_sum_over_the_samples() -> None:
    # Prepare: at version 2, a fresh update (10 samples, +1) and one from version 0
    # (tau 2, polynomial a = 1: weight 1/3; 30 samples, +3)
    buffer = UpdateBuffer(SHAPES, size=2, rule="polynomial", a=1.0, server_lr=0.5, version=2)
    # Execute
    refused = [
        buffer.add("u1", "fast", 2, delta(1.0), 10),
        buffer.add("u2", "slow", 0, delta(3.0), 30),
    ]
    new, made = buffer.apply({"w": np.zeros(2), "b": np.ones(1)})
    # Assert: 0.5 * (10 * 1 * 1 + 30 * 1/3 * 3) / 40 = 0.5
    assert refused == [None, None] and made.version == buffer.version == 3
    assert new["w"].tolist() == pytest.approx([0.5, 0.5]) and new["b"].tolist() == pytest.approx(
        [1.5]
    )
    assert [(c.device, c.staleness) for c in made.contributions] == [("fast", 0), ("slow", 2)]
    assert made.contributions[1].weight == pytest.approx(1 / 3)


def test_every_update_is_counted_in_exactly_one_aggregation_under_reordering_and_dropouts() -> None:
    # Prepare: 6 devices of different speeds, each given work at the current version as soon
    # as it replies; a tenth of the replies are lost, a fifth delivered twice, and arrival
    # order follows random delays (an event queue on a virtual clock).
    rng = np.random.default_rng(0)
    buffer = UpdateBuffer(SHAPES, size=3, rule="hinge", max_staleness=6)
    model = {k: np.zeros(s) for k, s in SHAPES.items()}
    events: list[tuple[float, int, str, str, int]] = []
    serial = 0
    for k in range(6):
        events.append((0.0, serial, f"u{serial}", f"d{k}", buffer.version))
        serial += 1
    accepted: list[str] = []
    refused: dict[str, list[str]] = {}
    applied: list[str] = []
    # Execute
    while events and buffer.version < 40:
        at, _, uid, dev, base = heapq.heappop(events)
        speed = 1.0 + int(dev[1:])  # d5 is 6x slower than d0
        if rng.random() < 0.1:  # lost: the device is given new work after a timeout
            heapq.heappush(events, (at + 5 * speed, serial, f"u{serial}", dev, buffer.version))
            serial += 1
            continue
        for _delivery in range(1 + int(rng.random() < 0.2)):
            why = buffer.add(uid, dev, base, delta(1.0), 10)
            if why is None:
                accepted.append(uid)
            else:
                refused.setdefault(why, []).append(uid)
        if buffer.full:
            model, made = buffer.apply(model)
            applied.extend(c.update_id for c in made.contributions)
        heapq.heappush(
            events, (at + speed * rng.uniform(0.5, 1.5), serial, f"u{serial}", dev, buffer.version)
        )
        serial += 1
    # Assert: each accepted update in exactly one aggregation (but those still buffered);
    # every duplicate delivery refused; some updates too stale for the 6x slower device
    still = len(buffer)
    assert sorted(applied) == sorted(accepted[: len(accepted) - still])
    assert len(set(applied)) == len(applied)
    assert set(refused["duplicate"]) <= set(accepted)
    assert not set(refused.get("too-stale", [])) & set(accepted)
    assert buffer.version == 40 and len(applied) == 3 * 40


def test_an_update_staler_than_the_bound_is_refused_and_counted() -> None:
    # Prepare
    buffer = UpdateBuffer(SHAPES, size=1, max_staleness=2)
    model = {k: np.zeros(s) for k, s in SHAPES.items()}
    for i in range(3):
        buffer.add(f"u{i}", "fast", buffer.version, delta(1.0), 1)
        model, _ = buffer.apply(model)
    # Execute: version 3 now; from version 0 is 3 stale, from 1 is 2
    refusals = [
        buffer.add("old", "slow", 0, delta(9.0), 1),
        buffer.add("ok", "slow", 1, delta(9.0), 1),
    ]
    ahead = buffer.add("ahead", "odd", 4, delta(1.0), 1)
    # Assert
    assert refusals == ["too-stale", None] and ahead == "bad-version"
    with pytest.raises(ValueError, match="tensors"):
        buffer.add("shape", "odd", 3, {"w": np.zeros(3), "b": np.zeros(1)}, 1)


def test_a_resumed_buffer_continues_the_version_and_remembers_what_it_took() -> None:
    # Prepare
    buffer = UpdateBuffer(SHAPES, size=1, max_staleness=3)
    model = {k: np.zeros(s) for k, s in SHAPES.items()}
    buffer.add("u0", "d0", 0, delta(1.0), 1)
    model, _ = buffer.apply(model)
    state = buffer.state_dict()
    # Execute: a new aggregator process, from the checkpoint
    resumed = UpdateBuffer(SHAPES, size=1, max_staleness=3)
    resumed.load_state_dict(state)
    # Assert: the version goes on, and a reply redelivered after the restart counts once
    assert resumed.version == 1
    assert resumed.add("u0", "d0", 0, delta(1.0), 1) == "duplicate"
    assert resumed.add("u1", "d0", 1, delta(1.0), 1) is None
    _, made = resumed.apply(model)
    assert made.version == 2


def test_fednova_weighting_counts_each_update_once_per_step() -> None:
    # Prepare: fednova weighting; a fresh update of 10 steps (+2, i.e. +0.2 a step) and one
    # of 5 steps from a version ago (polynomial a = 1: weight 1/2; +1, i.e. +0.2 a step)
    buffer = UpdateBuffer(SHAPES, size=2, rule="polynomial", a=1.0, weighting="fednova", version=1)
    # Execute
    buffer.add("u1", "a", 1, delta(2.0), num_examples=500, local_steps=10)
    buffer.add("u2", "b", 0, delta(1.0), num_examples=5, local_steps=5)
    new, _ = buffer.apply({"w": np.zeros(2), "b": np.zeros(1)})
    # Assert: mean steps 7.5 x (1 x 0.2 + 1/2 x 0.2) / 2 = 1.125; the samples do not weigh
    assert new["w"].tolist() == pytest.approx([1.125, 1.125])


def test_a_buffer_takes_its_rule_from_the_run_settings() -> None:
    from edge_client.wire.run_config import RunSettings

    settings = RunSettings(
        mode="async", staleness="hinge", staleness_exponent=2.0, staleness_hinge=1,
        server_lr=0.5, max_staleness=3, aggregation="fedavg",
    )  # fmt: skip
    buffer = UpdateBuffer.from_settings(settings, SHAPES, size=4, version=7)
    assert (buffer.rule, buffer.a, buffer.b, buffer.server_lr) == ("hinge", 2.0, 1, 0.5)
    assert (buffer.max_staleness, buffer.weighting, buffer.size, buffer.version) == (
        3, "fedavg", 4, 7,
    )  # fmt: skip
    assert buffer.add("old", "d", 3, delta(1.0), 1) == "too-stale"  # 4 versions old


def test_adaptive_weighting_weighs_n_over_n_plus_r_and_learns_from_each_buffer() -> None:
    # Prepare: adaptive weighting with an estimate of r = 480 samples; two fresh updates of
    # 20 steps, 160 and 1120 samples (weights 160 / 640 = 0.25 and 1120 / 1600 = 0.7).
    het = fitted(h=1.0, s=480.0)
    buffer = UpdateBuffer(SHAPES, size=2, weighting="adaptive", heterogeneity=het)
    rounds = het.rounds
    # Execute
    buffer.add("u1", "slow", 0, delta(20.0), num_examples=160, local_steps=20)
    buffer.add("u2", "fast", 0, delta(0.0), num_examples=1120, local_steps=20)
    new, made = buffer.apply({"w": np.zeros(2), "b": np.zeros(1)})
    # Assert: 20 steps x 0.25 x 1 a step / 0.95 = 5.263158; the ratio used is recorded, and
    # the buffer's pair went into the estimate the next version weighs by.
    assert new["w"].tolist() == pytest.approx([5.263157895, 5.263157895])
    assert made.ratio == pytest.approx(480.0)
    assert het.rounds == rounds + 1 and buffer.ratio == het.ratio()


def test_the_default_buffer_is_adaptive() -> None:
    from edge_client.wire.run_config import RunSettings

    buffer = UpdateBuffer.from_settings(RunSettings(mode="async"), SHAPES, size=2)
    assert buffer.weighting == "adaptive"
