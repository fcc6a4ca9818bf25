"""The batch controller: OmniLearn's law, bounds, deadband, availability, integers."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.controller import BatchController, Plan
from edge_client.wire.run_config import ControllerSettings

DEVICES = ["d0", "d1", "d2", "d3"]


def profile(*slowdowns: float) -> dict[str, float]:
    return dict(zip(DEVICES, slowdowns, strict=True))


def step_time(
    batch: int, slowdown: float, noise: float = 0.0, rng: np.random.Generator | None = None
) -> float:
    """A device whose step costs 1 ms per sample times its slowdown (plus noise)."""
    jitter = 1.0 + (rng.uniform(-noise, noise) if rng is not None else 0.0)
    return 1e-3 * batch * slowdown * jitter


def run(
    ctrl: BatchController,
    slowdowns: dict[str, float],
    rounds: int,
    noise: float = 0.0,
    seed: int = 0,
    start: int = 1,
) -> list[Plan]:
    rng = np.random.default_rng(seed)
    plans = []
    for r in range(start, start + rounds):
        plan = ctrl.plan(list(slowdowns), r)
        plans.append(plan)
        for d, b in plan.batches.items():
            ctrl.observe(d, b, step_time(b, slowdowns[d], noise, rng))
    return plans


def spread(plan: Plan, slowdowns: dict[str, float]) -> float:
    times = [step_time(b, slowdowns[d]) for d, b in plan.batches.items()]
    return max(times) / min(times) - 1


def test_converges_within_three_periods_and_keeps_the_sum() -> None:
    # Prepare
    slow = profile(1, 1, 2, 4)
    ctrl = BatchController(
        ControllerSettings(global_batch=256, b_min=4, b_max=256, controller_period=2)
    )
    # Execute: 1 round to measure, then 3 controller periods.
    plans = run(ctrl, slow, 1 + 3 * 2)
    # Assert
    assert all(p.total == 256 for p in plans)
    assert spread(plans[-1], slow) <= 0.10
    assert plans[-1].batches["d0"] > plans[-1].batches["d2"] > plans[-1].batches["d3"]


def test_bounds_hold_and_clamped_excess_goes_to_the_others() -> None:
    slow = profile(1, 1, 1, 50)
    ctrl = BatchController(ControllerSettings(global_batch=200, b_min=10, b_max=60))

    plans = run(ctrl, slow, 5)

    # The fast three would take 66.7 each: pinned at b-max, the straggler takes the rest.
    assert plans[-1].batches == {"d0": 60, "d1": 60, "d2": 60, "d3": 20}
    assert all(10 <= b <= 60 and p.total == 200 for p in plans for b in p.batches.values())


def test_upper_bound_redistribution_in_proportion_to_throughput() -> None:
    slow = {"fast": 1.0, "mid": 2.0, "slow": 4.0}
    ctrl = BatchController(ControllerSettings(global_batch=140, b_min=1, b_max=60))

    last = run(ctrl, slow, 4)[-1].batches

    # Unbounded: 80/40/20. "fast" is capped at 60; its 20 extra go 2:1 to mid and slow.
    assert last == {"fast": 60, "mid": 53, "slow": 27}


def test_deadband_keeps_the_plan_steady_under_timing_noise() -> None:
    slow = profile(1, 1, 2, 4)
    ctrl = BatchController(ControllerSettings(global_batch=256, b_min=4, b_max=256, deadband=0.1))
    run(ctrl, slow, 4)  # converge without noise
    settled = dict(ctrl.devices["d0"].__dict__)

    plans = run(ctrl, slow, 30, noise=0.05, start=5)

    assert all(p.batches == plans[0].batches for p in plans)
    assert ctrl.devices["d0"].batch == settled["batch"]


def test_without_deadband_noise_moves_the_plan() -> None:
    slow = profile(1, 1, 2, 4)
    ctrl = BatchController(ControllerSettings(global_batch=256, b_min=4, b_max=256, deadband=0.0))
    plans = run(ctrl, slow, 30, noise=0.05)
    assert len({tuple(p.batches.values()) for p in plans[5:]}) > 1


def test_heterogeneity_change_mid_run_is_rebalanced() -> None:
    ctrl = BatchController(
        ControllerSettings(global_batch=256, b_min=4, b_max=256, controller_smoothing=1.0)
    )
    run(ctrl, profile(1, 1, 2, 4), 4)
    changed = profile(4, 2, 1, 1)

    plans = run(ctrl, changed, 4, start=5)

    assert spread(plans[-1], changed) <= 0.10
    assert plans[-1].batches["d0"] < plans[-1].batches["d3"]


def test_a_speed_change_is_rebalanced_within_three_periods_with_step_overhead() -> None:
    # Prepare: steps cost 1 ms + 0.02 ms per sample (fixed overhead), default smoothing;
    # 8 rounds at one profile fill the history with timings that the change makes wrong.
    ctrl = BatchController(ControllerSettings(global_batch=512, b_min=8, b_max=512))

    def affine(b: int, slowdown: float) -> float:
        return (1e-3 + 2e-5 * b) * slowdown

    def rounds(slow: dict[str, float], n: int, start: int) -> list[float]:
        out = []
        for r in range(start, start + n):
            plan = ctrl.plan(list(slow), r)
            times = {d: affine(b, slow[d]) for d, b in plan.batches.items()}
            out.append(max(times.values()) / min(times.values()))
            for d, b in plan.batches.items():
                ctrl.observe(d, b, times[d])
        return out

    rounds(profile(1, 1, 1, 1), 8, 1)
    # Execute: the devices' speeds change (OmniLearn HL4 as slowdowns)
    imbalance = rounds(profile(24 / 9, 24 / 9, 4, 1), 4, 9)
    # Assert: the first round runs the old plan; within 3 more periods step times are even
    assert imbalance[0] > 2
    assert min(imbalance[1:]) <= 1.15


def test_a_newcomer_gets_an_equal_share_and_the_others_keep_their_plan() -> None:
    # Prepare: four known devices with timings (d3 is 4x slower)
    ctrl = BatchController(
        ControllerSettings(global_batch=256, b_min=4, b_max=256, controller_smoothing=1.0)
    )
    slow = profile(1, 1, 2, 4)
    run(ctrl, slow, 4)
    # Execute: a fifth device without timings joins
    plan = ctrl.plan([*DEVICES, "new"], 5)
    # Assert: it gets B / 5; the others still follow their speeds; the sum holds
    assert plan.batches["new"] == 256 // 5 and plan.total == 256
    assert plan.batches["d3"] < plan.batches["d2"] < plan.batches["d0"]


def test_availability_cap_and_learning_rate_scaling() -> None:
    slow = profile(1, 1, 1, 1)
    ctrl = BatchController(ControllerSettings(global_batch=200, b_min=5, b_max=200, lr_batch=0))
    run(ctrl, slow, 2)
    # d0 can only have 20 samples by the end of the round; the others take its share.
    capped = ctrl.plan(DEVICES, 3, available={"d0": 20.7})
    # Every device starved: the sum cannot reach B, so the learning rate is scaled.
    starved = ctrl.plan(DEVICES, 4, available={d: 30 for d in DEVICES})

    assert capped.batches["d0"] == 20 and capped.total == 200 and capped.lr_scale == 1.0
    assert starved.batches == dict.fromkeys(DEVICES, 30)
    assert starved.lr_scale == pytest.approx(120 / 200)


@pytest.mark.parametrize(
    ("available", "scale"),
    [
        (30, 120 / 128),  # capped below lr-batch: the linear scaling rule
        (40, 1.0),  # capped, yet 160 samples a step: above lr-batch, the full rate
        (200, 1.0),  # not capped
    ],
)
def test_the_learning_rate_scales_below_lr_batch_only(available: int, scale: float) -> None:
    # Prepare: B = 512 sized for the controller's room, lr meant for 128 samples a step.
    ctrl = BatchController(ControllerSettings(global_batch=512, b_max=512, lr_batch=128))
    run(ctrl, profile(1, 1, 1, 1), 2)
    # Execute: every device's stream caps it at `available` samples a step.
    plan = ctrl.plan(DEVICES, 3, available=dict.fromkeys(DEVICES, available))
    # Assert
    assert plan.lr_scale == pytest.approx(scale)


def test_modes_fixed_and_static() -> None:
    slow = profile(1, 1, 2, 4)
    fixed = BatchController(ControllerSettings(global_batch=250, controller="fixed"))
    static = BatchController(ControllerSettings(global_batch=256, b_min=4, controller="static"))

    fixed_plans = run(fixed, slow, 3)
    static_plans = run(static, slow, 3)
    later = run(static, profile(4, 2, 1, 1), 3, start=4)

    assert fixed_plans[-1].batches == {"d0": 63, "d1": 63, "d2": 62, "d3": 62}
    assert static_plans[-1].batches == {"d0": 93, "d1": 93, "d2": 47, "d3": 23}
    assert later[-1].batches == static_plans[-1].batches  # frozen at the first throughput


def test_a_returning_device_gets_its_old_state() -> None:
    slow = profile(1, 1, 2, 4)
    ctrl = BatchController(ControllerSettings(global_batch=240, b_min=4, b_max=240))
    run(ctrl, slow, 3)
    before = ctrl.devices["d3"].history

    without = ctrl.plan(DEVICES[:3], 4)
    back = ctrl.plan(DEVICES, 5)

    assert without.total == 240 and "d3" not in without.batches
    assert ctrl.devices["d3"].history == before
    assert spread(back, slow) <= 0.10


def test_state_round_trips_for_checkpoints() -> None:
    slow = profile(1, 1, 2, 4)
    ctrl = BatchController(ControllerSettings(global_batch=256, b_min=4))
    run(ctrl, slow, 3)

    again = BatchController.from_state_dict(ctrl.state_dict(), ctrl.config)

    assert again.plan(DEVICES, 4) == ctrl.plan(DEVICES, 4)


def test_too_many_devices_for_b_min() -> None:
    ctrl = BatchController(ControllerSettings(global_batch=16, b_min=8))
    with pytest.raises(ValueError, match="exceed global-batch"):
        ctrl.plan(["a", "b", "c"], 1)


LEVELS = {  # OmniLearn's heterogeneity levels: cores per device, slowdown = max / cores
    "HL1": (12, 12, 12, 12),
    "HL2": (12, 12, 8, 16),
    "HL4": (9, 9, 6, 24),
    "HL8": (6, 6, 4, 32),
}


def affine_noisy(b: int, slowdown: float, rng: np.random.Generator, noise: float) -> float:
    """1 ms of fixed cost + 0.02 ms per sample, times the slowdown, times +-noise."""
    return (1e-3 + 2e-5 * b) * slowdown * (1.0 + rng.uniform(-noise, noise))


@pytest.mark.parametrize(("seed", "noise"), [(0, 0.0), (1, 0.03), (2, 0.03), (3, 0.03)])
def test_each_heterogeneity_level_is_balanced_within_three_periods(seed: int, noise: float) -> None:
    # Prepare: OmniLearn's schedule HL1 -> HL2 -> HL4 -> HL8, steps with a fixed cost and
    # timing noise, the default deadband and period. (Holding each device within the
    # deadband of its own ideal batch stuck at 1.22 from HL2 on.)
    ctrl = BatchController(ControllerSettings(global_batch=512, b_min=8, b_max=512))
    rng = np.random.default_rng(seed)
    rounds = 1 + 3 * ctrl.config.controller_period  # the change is seen, then 3 periods
    server_round = 0
    for level, cores in LEVELS.items():
        slow = {f"d{i}": max(cores) / c for i, c in enumerate(cores)}
        # Execute
        for _ in range(rounds):
            server_round += 1
            plan = ctrl.plan(list(slow), server_round)
            for d, b in plan.batches.items():
                ctrl.observe(d, b, affine_noisy(b, slow[d], rng, noise))
        final = ctrl.plan(list(slow), server_round + 1)
        # Assert: the plan's true (noise-free) step times are within 10 % of each other.
        times = [affine_noisy(b, slow[d], rng, 0.0) for d, b in final.batches.items()]
        assert max(times) / min(times) < 1.1, level
        assert final.total == 512


def test_a_slope_lost_in_noise_falls_back_to_the_proportional_law() -> None:
    # Prepare: steps dominated by a fixed cost, timings that only noise tells apart.
    rng = np.random.default_rng(3)
    ctrl = BatchController(ControllerSettings(global_batch=128, b_min=4, b_max=128))
    for r in range(1, 9):
        plan = ctrl.plan(["a", "b"], r)
        for d, b in plan.batches.items():
            ctrl.observe(d, b, 0.05 * (1.0 + rng.uniform(-0.2, 0.2)) + 1e-7 * b)
    # Execute
    models = {d: s.cost_model(ctrl.config.controller_smoothing) for d, s in ctrl.devices.items()}
    plan = ctrl.plan(["a", "b"], 9)
    # Assert: no fitted intercept (the law's t = c * b), and no device handed all of B.
    assert all(m is not None and m[0] == 0.0 for m in models.values())
    assert plan.total == 128 and all(20 <= b <= 108 for b in plan.batches.values())
