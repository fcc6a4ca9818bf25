"""The goals of ``fedstream bench deployment`` (issue 53), judged from its entries alone:
each in every repetition (or seed) it was measured in."""

from __future__ import annotations

from typing import Any

from deploy.bench.common import every_seed, verdict

__all__ = ["goals"]

#: The goals :func:`goals` judges (issue 53): the idle round over plain Flower's, seconds
#: above the slowest device's compute, a device's CPU seconds per idle round, the dynamic
#: controller's time to 0.9 over the fixed split's, the fixed split's slowest device's
#: training share, the agent's memory growth over the soak.
GOAL_VS_PLAIN, GOAL_ABOVE_COMPUTE_S, GOAL_DEVICE_CPU_S = 0.4, 2.0, 0.3
GOAL_CONTROLLER_RATIO, GOAL_SLOWEST_SHARE, GOAL_SOAK_GROWTH = 0.8, 0.4, 0.05
#: The test accuracy whose time the controller goal compares (one of the controller runs'
#: targets).
CONTROLLER_TARGET = 0.9


def goals(entries: list[dict[str, Any]], soak: dict[str, Any]) -> dict[str, Any]:
    """The deployment goals, each judged in every repetition (or seed) it was measured in:
    the value in each, and ``met`` or ``MISSED`` (:func:`~deploy.bench.common.every_seed`).

    - ``idle-round-vs-plain``: fedstream-idle-agent's median round over plain Flower's
      (``plain-flower-tuned``) at most :data:`GOAL_VS_PLAIN`;
    - ``idle-round-above-compute-s``: its median round less the slowest device's compute
      (median over the steady rounds) at most :data:`GOAL_ABOVE_COMPUTE_S`;
    - ``device-cpu-s-per-idle-round``: its device's CPU seconds per steady round, every
      process of the device, polling between rounds included, at most
      :data:`GOAL_DEVICE_CPU_S`;
    - ``controller-time-to-0.9``: the dynamic arm's wall time to 0.9 over the fixed arm's,
      seed by seed, at most :data:`GOAL_CONTROLLER_RATIO`, while the fixed split's slowest
      device trains for at least :data:`GOAL_SLOWEST_SHARE` of its round;
    - ``soak-rss-growth``: the agent's resident memory after the soak over after its first
      few messages, at most :data:`GOAL_SOAK_GROWTH` more.
    """

    def of(variant: str) -> list[dict[str, Any]]:
        return [e for e in entries if e["variant"] == variant]

    idle = of("fedstream-idle-agent")
    vs_plain = [e["vs_plain_tuned"] for e in idle]
    above = [
        round(e["round_wall_median_s"] - e["slowest_compute_s"], 3)
        for e in idle
        if "slowest_compute_s" in e
    ]
    cpu = [e.get("device_cpu_s_per_round") for e in idle]
    fixed = {e["seed"]: e for e in of("controller-fixed")}
    dynamic = {e["seed"]: e for e in of("controller-dynamic")}
    target = str(CONTROLLER_TARGET)

    def ratio(seed: int) -> float | None:
        a, b = dynamic[seed]["time_to_s"].get(target), fixed[seed]["time_to_s"].get(target)
        return None if a is None or b is None else round(a / b, 3)

    controller = [ratio(seed) for seed in sorted(fixed) if seed in dynamic]
    shares = [fixed[seed].get("slowest_training_share") for seed in sorted(fixed)]
    growth = soak.get("rss_growth_after_warmup")
    rows = {
        "idle-round-vs-plain": (vs_plain, lambda v: v <= GOAL_VS_PLAIN),
        "idle-round-above-compute-s": (above, lambda v: v <= GOAL_ABOVE_COMPUTE_S),
        "device-cpu-s-per-idle-round": (cpu, lambda v: v <= GOAL_DEVICE_CPU_S),
        "controller-time-to-0.9": (controller, lambda v: v <= GOAL_CONTROLLER_RATIO),
        "controller-fixed-slowest-training-share": (shares, lambda v: v >= GOAL_SLOWEST_SHARE),
        "soak-rss-growth": ([growth], lambda v: v <= GOAL_SOAK_GROWTH),
    }
    return {
        name: {"values": values, "verdict": verdict(every_seed(values, ok))}
        for name, (values, ok) in rows.items()
    }
