"""``fedstream bench forecast``: learning from an unlabelled stream by forecasting it.

The stream is a real recording the project did not generate: weekly mean CO2 at Mauna Loa,
1958-2001 (``deploy/bench/data``). Each sample is a window of W = 52 weeks plus the H = 4
weeks to forecast (the built-in ``forecast`` task: targets cut from the stream itself, no
labels, MAE as the metric). The first 80 % of the series is split in time across 4 devices,
each streaming its era in order (always ahead of training); the last 20 % is the test set
(never streamed). Baselines, scored on the same test windows:

- naive: repeat the last reading;
- ridge autoregression: least squares with an L2 penalty on the same inputs (the 52 past
  weeks relative to the last, in ppmv), fitted centrally on all training windows, its
  penalty tuned on the last fifth of them.

The federated model is scored after the last round; seeds change its initialisation (the
data and the stream order are the same in every seed).
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from deploy.bench.common import (
    SEEDS,
    Result,
    footnote,
    markdown_table,
    run_fleet,
    spread,
    verdict,
)
from deploy.constants import FORECAST_LR
from deploy.inprocess import VirtualDevice
from edge_client.emulation.sources import ArraySource
from edge_client.task.forecasting import Forecast
from edge_client.task.recordings import load_series, series_windows
from edge_client.wire.run_config import RunSettings

__all__ = ["relative_windows", "results_table", "ridge_mae", "run"]

DATA = Path(__file__).parent / "data" / "co2_mauna_loa_weekly.csv"
PAST, HORIZON = 52, 4  # a year of weeks in, a month out
DEVICES = 4
TRAIN_FRACTION = 0.8
ROUNDS, QUICK_ROUNDS = 40, 10
RIDGE_PENALTIES = (0.01, 0.1, 1.0, 10.0, 100.0, 1000.0)
GOAL_VS_NAIVE = 0.10  # at least 10 % lower MAE than the naive forecast
GOAL_VS_RIDGE = 1.0  # no worse than the ridge autoregression


def relative_windows(windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The baselines' inputs and targets: the forecast task's
    (:meth:`~edge_client.task.forecasting.Forecast.relative`: past readings and the horizon,
    relative to the last past reading, in ppmv), flattened, as float64."""
    inputs, targets = Forecast(HORIZON).relative(torch.from_numpy(windows))
    return inputs.flatten(1).double().numpy(), targets.flatten(1).double().numpy()


def ridge_mae(train: np.ndarray, test: np.ndarray) -> tuple[float, float]:
    """The ridge autoregression's test MAE and its penalty (tuned on the last fifth of the
    training windows, then refitted on all of them)."""
    x, y = relative_windows(train)
    cut = int(len(x) * 0.8)

    def fit(xs: np.ndarray, ys: np.ndarray, penalty: float) -> np.ndarray:
        return np.linalg.solve(xs.T @ xs + penalty * np.eye(xs.shape[1]), xs.T @ ys)

    def mae(coef: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> float:
        return float(np.abs(xs @ coef - ys).mean())

    best = min(RIDGE_PENALTIES, key=lambda p: mae(fit(x[:cut], y[:cut], p), x[cut:], y[cut:]))
    x_test, y_test = relative_windows(test)
    return mae(fit(x, y, best), x_test, y_test), best


def run(quick: bool = False) -> Result:
    """The federated forecast against the naive and ridge baselines, over the seeds."""
    series = load_series(DATA)[:, 0]  # weekly CO2, ppmv; the 59 missing weeks filled linearly
    split = int(len(series) * TRAIN_FRACTION)
    train = series_windows(series[:split], PAST + HORIZON)
    test = series_windows(series[split:], PAST + HORIZON)
    naive = float(np.abs(relative_windows(test)[1]).mean())
    ridge, penalty = ridge_mae(train, test)
    seeds = SEEDS[:1] if quick else SEEDS
    rounds = QUICK_ROUNDS if quick else ROUNDS
    curves = _federated(train, test, rounds, seeds)
    maes = [curve[-1] for curve in curves]
    vs_naive = [1 - m / naive for m in maes]
    vs_ridge = [m / ridge for m in maes]
    entries: list[dict[str, Any]] = [
        {"model": "naive (repeat the last reading)", "mae": naive},
        {"model": f"ridge autoregression (penalty {penalty:g})", "mae": ridge},
        {
            "model": "fedstream forecast, federated",
            "mae_per_seed": maes,
            "mae": statistics.mean(maes),
            "lower_than_naive_per_seed": vs_naive,
            "vs_ridge_per_seed": vs_ridge,
            "test_mae_per_round": curves,
        },
    ]
    met_naive = min(vs_naive) >= GOAL_VS_NAIVE
    met_ridge = max(vs_ridge) <= GOAL_VS_RIDGE
    table = results_table(naive, ridge, penalty, maes, (vs_naive, vs_ridge), rounds) + footnote(
        f"Weekly CO2 at Mauna Loa 1958-2001 (a real recording, public domain: "
        f"deploy/bench/data), {len(series):,} weeks; windows of {PAST} weeks in, {HORIZON} out "
        f"(stride 1): {len(train):,} training windows in time order, split in time across "
        f"{DEVICES} devices (each streams its era, always ahead), {len(test):,} test windows "
        f"from the last {1 - TRAIN_FRACTION:.0%} of the series (never streamed). The built-in "
        f"forecast task (task = forecast): a linear autoregression plus an MLP correction on "
        f"changes relative to the last reading, in units of each window's spread (scale-free), "
        f"L1 loss in those units, lr {FORECAST_LR}, 20 local steps, "
        f"B = 128, fednova averaging, scored after the last round; seeds "
        f"{', '.join(map(str, seeds))} (they change the initialisation only), mean (min-max)",
        f"at least {GOAL_VS_NAIVE:.0%} lower MAE than naive in every seed: "
        f"{min(vs_naive):.0%} ({verdict(met_naive)}); no worse than ridge in every seed: "
        f"worst {max(vs_ridge):.2f}x ({verdict(met_ridge)})",
        virtual_clock=False,
    )
    meta = {
        "past": PAST,
        "horizon": HORIZON,
        "devices": DEVICES,
        "rounds": rounds,
        "seeds": list(seeds),
        "naive_mae": naive,
        "ridge_mae": ridge,
        "ridge_penalty": penalty,
        "goals_met": {"vs_naive": met_naive, "vs_ridge": met_ridge},
    }
    return Result("forecast", entries, table, meta, sources=("deploy/bench/data/",))


def _federated(
    train: np.ndarray, test: np.ndarray, rounds: int, seeds: Sequence[int]
) -> list[list[float]]:
    """Train the forecast task on :data:`DEVICES` devices, each streaming its era of the
    training windows, once per seed; each seed's test MAE after every round."""
    curves: list[list[float]] = []
    with tempfile.TemporaryDirectory(prefix="fedstream-bench-forecast-") as tmp:
        test_file = Path(tmp) / "test.npz"
        np.savez(test_file, x=test, y=np.zeros(len(test), dtype=np.int64))
        for seed in seeds:
            devices = [
                VirtualDevice(
                    f"dev-{k}",
                    rate=float("inf"),
                    source=ArraySource(
                        train[part], np.zeros(len(part), np.int64), np.random.default_rng(k)
                    ),
                )
                for k, part in enumerate(np.array_split(np.arange(len(train)), DEVICES))
            ]
            settings = RunSettings(
                task="forecast",
                forecast_horizon=HORIZON,
                sample_shape=f"1,{PAST + HORIZON}",
                num_rounds=rounds,
                local_steps=20,
                global_batch=128,
                b_min=8,
                lr=FORECAST_LR,
                controller="fixed",
                controller_probe=0,
                availability_cap=False,  # streams always ahead: the model alone differs
                eval_data=str(test_file),
                eval_samples=len(test),
                seed=seed,
            )
            records = run_fleet(f"forecast seed {seed}", devices, settings, seed).records
            curves.append([r.test_accuracy for r in records])
    return curves


def results_table(
    naive: float,
    ridge: float,
    penalty: float,
    maes: Sequence[float],
    vs: tuple[Sequence[float], Sequence[float]],
    rounds: int,
) -> str:
    """The results table: the forecasters' test MAE side by side.

    Parameters
    ----------
    naive, ridge : float
        The baselines' test MAE (``naive_mae``, ``ridge_mae`` in ``forecast.json``).
    penalty : float
        The ridge penalty chosen.
    maes : sequence of float
        The federated forecast's test MAE per seed.
    vs : tuple of two sequences of float
        Per seed, how much lower its MAE is than naive's (a fraction) and its ratio to
        ridge's.
    rounds : int
        Rounds of each federated run.

    Returns
    -------
    str
        The markdown table.
    """
    vs_naive, vs_ridge = vs
    rows = [
        ["naive: repeat the last reading", f"{naive:.3f}", "-", f"{naive / ridge:.2f}x"],
        [
            f"ridge autoregression (penalty {penalty:g})",
            f"{ridge:.3f}",
            f"{1 - ridge / naive:.0%}",
            "1.00x",
        ],
        [
            f"fedstream forecast, {DEVICES} devices, {rounds} rounds",
            spread(maes, "{:.3f}"),
            spread([100 * v for v in vs_naive], "{:.0f}") + " %",
            spread(vs_ridge, "{:.2f}") + "x",
        ],
    ]
    return markdown_table(["forecaster", "test MAE (ppmv)", "lower than naive", "vs ridge"], rows)
