"""Measure the aggregator's own cost per round, the lines the in-process runner charges.

    python dev/server_cost.py        # prints the fitted lines as JSON

Two lines, each fitted to the minimum of repeated timings on one torch thread (as the
step-time line of the benchmarks is), so that fixed-seed runs stay deterministic:

- **aggregation**: adding ``n`` updates of ``P`` values to the streaming weighted mean
  (:class:`aggregator.aggregation.WeightedMean`, float64 sums) and taking the result:
  seconds = a + c x (n x P);
- **evaluation**: scoring the built-in task's model on ``S`` held-out samples
  (:func:`edge_client.task.evaluate`): seconds = a + c x (S x P).

The figures in :data:`deploy.constants.SERVER_COST` come from a run of this script on the
2-core x86_64 development machine (torch 2.13.0+cpu); their docstring says which.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable

import numpy as np
import torch

from aggregator.aggregation import WeightedMean
from edge_client.task import Classification, evaluate, init_model

REPEATS = 7


def fastest(work: Callable[[], object], repeats: int = REPEATS) -> float:
    """The minimum wall time of ``work`` over ``repeats`` calls (after one warm-up)."""
    work()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return min(times)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line in relative error (weights 1/y), so
    that the small cases, which most rounds are, are fitted as well as the large ones."""
    y = np.array(ys)
    c, a = np.polyfit(np.array(xs, float), y, 1, w=1 / y)
    return float(c), float(a)


def aggregation_line() -> tuple[float, float]:
    """(a, c) of seconds = a + c x updates x values."""
    xs, ys = [], []
    for values in (10_000, 100_000, 1_000_000):
        for n in (2, 8, 32):
            deltas = [{"w": np.full(values, 1e-3, np.float32)} for _ in range(n)]

            def combine(deltas: list[dict[str, np.ndarray]] = deltas, size: int = values) -> None:
                mean = WeightedMean({"w": (size,)})
                for i, d in enumerate(deltas):
                    mean.update(d, 10, f"dev-{i}")
                mean.result()

            xs.append(n * values)
            ys.append(fastest(combine))
    c, a = fit(xs, ys)
    return max(float(a), 0.0), float(c)


def evaluation_line() -> tuple[float, float]:
    """(a, c) of seconds = a + c x samples x parameters, on the built-in task's models."""
    xs, ys = [], []
    for width in (32, 128):
        task = Classification(model="mlp", width=width)
        model = init_model(task, (32,), 10, seed=0)
        params = sum(math.prod(p.shape) for p in model.parameters())
        for samples in (250, 1000, 4000):
            x = np.random.default_rng(0).normal(size=(samples, 32)).astype(np.float32)
            y = np.zeros(samples, np.int64)
            xs.append(samples * params)
            ys.append(fastest(lambda x=x, y=y, m=model, t=task: evaluate(t, m, x, y)))
    c, a = fit(xs, ys)
    return max(float(a), 0.0), float(c)


def main() -> None:
    torch.set_num_threads(1)
    agg, ev = aggregation_line(), evaluation_line()
    print(
        json.dumps(
            {
                "aggregate_s": agg[0],
                "aggregate_per_value_s": agg[1],
                "evaluate_s": ev[0],
                "evaluate_per_sample_parameter_s": ev[1],
                "torch": torch.__version__,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
