"""Compressed updates side by side: traffic both ways, bytes to a target, accuracy, codec
speed (issue: update codec; re-measured for honest seed reproductions).

Every mode trains the same task (4 devices, slowdowns 1/1/2/4) for the same rounds from the
same seeds with the ``fixed`` controller, on streams always ahead of training, so that every
mode trains on the same samples at the same batches and the codec is the only difference
(the availability cap is off: an always-ahead stream publishes no rate, and the cap would
then shrink every batch to b-min once the first samples are used). Two models:

* the default **CNN** (6,342 parameters), eight modes, 100 rounds x 20 local steps,
  B = 128: sparse updates converge later, not lower, so the comparison runs until training
  has settled;
* a **1M-parameter model** (:data:`LARGE`), where compression matters: the two-layer MLP at
  5,050 hidden units (1,004,956 parameters), 20 rounds at the same K and B, five modes: none,
  int8, top-k 1 %, adaptive 10 % and top-k 1 % with an fp16 broadcast (there the model
  going down dwarfs the update going up). Not the CNN at width 448 (1,020,550 parameters):
  one of its SGD steps at the per-device batch of 32 costs about 0.18 s on one core of this
  machine against about 0.004 s for the MLP, so three seeds of five modes would take hours;
  at K = 5 and B = 32 (3 s per round) it was still at 0.58 after 12 rounds (seed 0). The MLP
  reaches 0.9 in a handful of rounds at the CNN's K and B, so the codec's cost in accuracy
  can be read off. The adaptive rule runs at 10 % here: at 1 % its gap EWMA stays at
  0.43-0.48 (seed 0, 20 rounds), above delta 0.3, and every round goes dense (as on the
  small model).

``--quick`` runs seed 0 only: the CNN 15 rounds in five modes, the MLP 6 rounds in three.

Traffic is what crosses the links: **up**, the update frames the aggregator received;
**down**, one copy of the model as broadcast per device sent the round's plan (every device:
the model goes down to each). Bytes to the target are summed through the round at which the
target is reached (held for two evaluations). Times are on the in-process runner's *virtual
clock*: compute charged from the step time measured at the start for the model trained (the
fitted line at the per-device batch, times the device's slowdown), plus each device's frame at
``uplink-mbps``, and the model going down at the same rate before (the runner charges each
message's model; devices receive in parallel), and the aggregator's aggregation and
evaluation (a measured cost line). Encode/decode speed
is timed apart on a 1M-value float32 delta (median of 5, *wall clock*).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes

from aggregator.round_log import RoundRecord
from deploy.bench import common
from deploy.inprocess import VirtualDevice
from edge_client.task.constants import DEFAULT_NUM_CLASSES, DEFAULT_SHAPE
from edge_client.task.models import build_model
from edge_client.wire.codec import decode, encode
from edge_client.wire.run_config import RunSettings

__all__ = [
    "CASES",
    "LARGE",
    "SMALL",
    "ModelCase",
    "bytes_to_target",
    "codec_speed",
    "per_device_traffic",
    "run",
]

# label -> run-config overrides (RunSettings field names)
CASES: dict[str, dict[str, Any]] = {
    "none": {"compress": "none"},
    "fp16": {"compress": "fp16"},
    "int8": {"compress": "int8"},
    "topk-10%": {"compress": "topk", "compress_ratio": 0.1},
    "topk-1%": {"compress": "topk", "compress_ratio": 0.01},
    "adaptive-10%": {"compress": "adaptive", "compress_ratio": 0.1},
    "adaptive-1%": {"compress": "adaptive", "compress_ratio": 0.01},
    "int8+fp16-down": {"compress": "int8", "compress_broadcast": "fp16"},
    "topk-1%+fp16-down": {"compress": "topk", "compress_ratio": 0.01, "compress_broadcast": "fp16"},
}


@dataclass(frozen=True)
class ModelCase:
    """One model the modes are compared on, and how long each of its runs is.

    Attributes
    ----------
    name : str
        How tables name it.
    model : str
        The run config's ``model``.
    width : int
        The run config's ``model-width`` (0: the model's default).
    rounds, quick_rounds : int
        Rounds of a full and of a ``--quick`` run.
    modes, quick_modes : tuple of str
        The :data:`CASES` run in full and in ``--quick``.
    """

    name: str
    model: str
    width: int
    rounds: int
    quick_rounds: int
    modes: tuple[str, ...]
    quick_modes: tuple[str, ...]

    def parameters(self) -> int:
        """Its number of parameters on the task's samples."""
        built = build_model(self.model, DEFAULT_SHAPE, DEFAULT_NUM_CLASSES, width=self.width)
        return sum(p.numel() for p in built.parameters())


SMALL_MODES = tuple(m for m in CASES if m != "topk-1%+fp16-down")
QUICK_SMALL_MODES = ("none", "int8", "topk-1%", "adaptive-10%", "int8+fp16-down")
SMALL = ModelCase("cnn", "cnn", 0, 100, 15, SMALL_MODES, QUICK_SMALL_MODES)
LARGE_MODES = ("none", "int8", "topk-1%", "adaptive-10%", "topk-1%+fp16-down")
LARGE = ModelCase("mlp-1M", "mlp", 5050, 20, 6, LARGE_MODES, ("none", "int8", "topk-1%"))
MODELS = (SMALL, LARGE)

# label -> (minimum bytes-up ratio vs none, largest accuracy drop allowed), on every model
GOALS = {"topk-1%": (50.0, 0.01), "int8": (3.5, 0.005)}
SPEED_GOAL_MBPS = 100.0
SLOWDOWNS = (1.0, 1.0, 2.0, 4.0)
TARGET_ACCURACY = 0.9
LOCAL_STEPS = 20
GLOBAL_BATCH = 128
EVAL_SAMPLES = 2000


def codec_speed(
    mode: str, ratio: float, values: int = 1_000_000, reps: int = 5
) -> dict[str, float]:
    """Median encode, decode and encode+decode speed of one codec mode (wall clock).

    Parameters
    ----------
    mode : str
        A codec mode (``none``, ``fp16``, ``int8``, ``topk``).
    ratio : float
        The top-k fraction (``topk`` only).
    values : int
        Float32 values of the delta coded.
    reps : int
        Repetitions; the median is kept.

    Returns
    -------
    dict
        ``encode_mbps``, ``decode_mbps`` and ``roundtrip_mbps``: MB of float32 input per
        second.
    """
    rng = np.random.default_rng(0)
    delta = {"w": (rng.standard_normal(values) * 0.01).astype(np.float32)}
    mb = values * 4 / 1e6
    enc, dec = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        frame = encode(delta, mode, ratio)
        t1 = time.perf_counter()
        decode(frame)
        t2 = time.perf_counter()
        enc.append(t1 - t0)
        dec.append(t2 - t1)
    e, d = statistics.median(enc), statistics.median(dec)
    return {"encode_mbps": mb / e, "decode_mbps": mb / d, "roundtrip_mbps": mb / (e + d)}


def per_device_traffic(records: Sequence[RoundRecord]) -> dict[str, dict[str, int]]:
    """Each device's traffic over a run, uplink and downlink apart.

    Parameters
    ----------
    records : sequence of RoundRecord
        The run's rounds.

    Returns
    -------
    dict
        Device -> ``{"up": bytes, "down": bytes}``: the frames it sent that the aggregator
        received, and one copy of the model as broadcast for every round whose plan it was
        sent.
    """
    up: Counter[str] = Counter()
    down: Counter[str] = Counter()
    for r in records:
        for device in r.planned:
            down[device] += r.broadcast_bytes
        for device, m in r.devices.items():
            up[device] += m.bytes_up
    return {d: {"up": up[d], "down": down[d]} for d in sorted(set(up) | set(down))}


def bytes_to_target(
    records: Sequence[RoundRecord], target: float
) -> tuple[int, int] | tuple[None, None]:
    """Bytes up, and bytes down to every device, until the target accuracy is reached.

    Parameters
    ----------
    records : sequence of RoundRecord
        The run's rounds.
    target : float
        The accuracy; reached at the first round of two in a row at or above it
        (:func:`~deploy.bench.common.rounds_to_target`).

    Returns
    -------
    tuple
        ``(up, down)`` summed over the rounds up to and including that one; ``(None, None)``
        when the run never reached it.
    """
    reached = common.rounds_to_target(records, target)
    if reached is None:
        return None, None
    upto = [r for r in records if r.round <= reached]
    return (
        sum(r.bytes_up for r in upto),
        sum(r.broadcast_bytes * len(r.planned) for r in upto),
    )


def _settings(case: ModelCase, mode: str, rounds: int, seed: int) -> RunSettings:
    return RunSettings(
        num_rounds=rounds,
        local_steps=LOCAL_STEPS,
        global_batch=GLOBAL_BATCH,
        controller="fixed",
        aggregation="fedavg",
        availability_cap=False,  # streams always ahead: nothing but the codec differs
        model=case.model,
        model_width=case.width,
        eval_data="synthetic",
        eval_samples=EVAL_SAMPLES,
        seed=seed,
        **CASES[mode],
    )


def run(quick: bool = False, seeds: Sequence[int] | None = None) -> common.Result:
    """Train every mode of each model over the seeds; compare each with ``none``.

    Parameters
    ----------
    quick : bool
        Fewer rounds and modes, the first seed only.
    seeds : sequence of int, optional
        Overrides the seeds (default: :data:`~deploy.bench.common.SEEDS`, or its first with
        ``quick``).

    Returns
    -------
    Result
    """
    seeds = tuple(seeds) if seeds is not None else (common.SEEDS[:1] if quick else common.SEEDS)
    # Streams always ahead of training: each round takes exactly its b x K fresh samples.
    fleet = [
        VirtualDevice(f"dev-{i}", slowdown=s, rate=math.inf, initial=0)
        for i, s in enumerate(SLOWDOWNS)
    ]
    batch = GLOBAL_BATCH // len(fleet)  # the fixed controller's equal share
    entries: list[dict[str, Any]] = []
    curves: dict[str, dict[str, list[list[RoundRecord]]]] = {}
    models: list[dict[str, Any]] = []
    for case in MODELS:
        rounds = case.quick_rounds if quick else case.rounds
        modes = case.quick_modes if quick else case.modes
        cost = common.measure_step_cost(
            build_model(case.model, DEFAULT_SHAPE, DEFAULT_NUM_CLASSES, width=case.width),
            DEFAULT_SHAPE,
            DEFAULT_NUM_CLASSES,
            batches=(batch // 2, batch, batch * 2),
            repeats=15,
        )
        runs: dict[str, list[list[RoundRecord]]] = {}
        for mode in modes:
            for seed in seeds:
                runs.setdefault(mode, []).append(
                    common.run_fleet(
                        f"compression {case.name} {mode} seed {seed}",
                        fleet,
                        _settings(case, mode, rounds, seed),
                        seed,
                        step_time=cost.line,
                    ).records
                )
        curves[case.name] = runs
        params = case.parameters()
        models.append(
            {
                "model": case.name,
                "arch": case.model,
                "width": case.width,
                "parameters": params,
                "rounds": rounds,
                "modes": list(modes),
                "step_s": cost.line(batch),
            }
        )
        entries += [_entry(case.name, params, mode, runs[mode], runs["none"]) for mode in modes]
    speeds = _codec_speeds(entries)
    table = _table(entries) + "\n\n" + _speed_table(speeds) + _footnote(models, seeds, batch)
    meta = {
        "quick": quick,
        "seeds": list(seeds),
        "target_accuracy": TARGET_ACCURACY,
        "models": models,
        "codec_speed": speeds,
    }
    return common.Result(
        "compression", entries, table, meta, [lambda out: _plot(curves, seeds, out)]
    )


def _entry(
    model: str,
    params: int,
    mode: str,
    runs: list[list[RoundRecord]],
    refs: list[list[RoundRecord]],
) -> dict[str, Any]:
    """One mode on one model over the seeds (``refs``: ``none`` on the same seeds)."""
    case = CASES[mode]
    codec = case["compress"]
    up = [sum(r.bytes_up for r in records) for records in runs]
    ref_up = [sum(r.bytes_up for r in records) for records in refs]
    acc = [records[-1].test_accuracy for records in runs]
    ref_acc = [records[-1].test_accuracy for records in refs]
    to_target = [bytes_to_target(records, TARGET_ACCURACY) for records in runs]
    traffic = [per_device_traffic(records) for records in runs]
    device_rounds = [sum(len(r.planned) for r in records) for records in runs]
    replies = [sum(len(r.devices) for r in records) for records in runs]
    entry: dict[str, Any] = {
        "model": model,
        "parameters": params,
        "mode": mode,
        "codec": codec,
        "compress_ratio": case.get("compress_ratio") if codec in ("topk", "adaptive") else None,
        "broadcast": case.get("compress_broadcast", "none"),
        "rounds": len(runs[0]),
        "bytes_up_per_seed": up,
        "bytes_down_per_seed": [sum(d["down"] for d in t.values()) for t in traffic],
        "ratio_per_seed": [a / b for a, b in zip(ref_up, up, strict=True)],
        "final_accuracy_per_seed": acc,
        "accuracy_delta_per_seed": [a - b for a, b in zip(acc, ref_acc, strict=True)],
        "last5_accuracy_per_seed": [
            float(np.mean([r.test_accuracy for r in rs[-5:]])) for rs in runs
        ],
        "rounds_to_target_per_seed": [common.rounds_to_target(rs, TARGET_ACCURACY) for rs in runs],
        "bytes_up_to_target_per_seed": [u for u, _ in to_target],
        "bytes_both_to_target_per_seed": [
            None if u is None or d is None else u + d for u, d in to_target
        ],
        "time_to_target_s_per_seed": [common.time_to_target(rs, TARGET_ACCURACY) for rs in runs],
        "topk_rounds_per_seed": [sum(r.compress == "topk" for r in rs) for rs in runs],
        "per_device_first_seed": traffic[0],
        "accuracy_curve_mean": [
            float(np.mean([rs[i].test_accuracy for rs in runs])) for i in range(len(runs[0]))
        ],
    }
    entry.update(
        bytes_up=statistics.mean(up),
        bytes_down=statistics.mean(entry["bytes_down_per_seed"]),
        up_per_device_round=statistics.mean(u / n for u, n in zip(up, replies, strict=True)),
        down_per_device_round=statistics.mean(
            d / n for d, n in zip(entry["bytes_down_per_seed"], device_rounds, strict=True)
        ),
        ratio=statistics.mean(entry["ratio_per_seed"]),
        final_accuracy=statistics.mean(acc),
        accuracy_delta=statistics.mean(entry["accuracy_delta_per_seed"]),
        rounds_to_target=common.mean_or_none(entry["rounds_to_target_per_seed"]),
        bytes_up_to_target=common.mean_or_none(entry["bytes_up_to_target_per_seed"]),
        bytes_both_to_target=common.mean_or_none(entry["bytes_both_to_target_per_seed"]),
        time_to_target_s=common.mean_or_none(entry["time_to_target_s_per_seed"]),
        topk_rounds=statistics.mean(entry["topk_rounds_per_seed"]),
    )
    goal = GOALS.get(mode)
    entry["goal"] = f">= {goal[0]:g}x, accuracy within {goal[1] * 100:g} pt" if goal else None
    entry["goal_met"] = goal_met(entry)
    return entry


def goal_met(entry: dict[str, Any]) -> bool | None:
    """Whether an entry meets its mode's goal (:data:`GOALS`) in every seed: the ratio and
    the accuracy lost each seed's, not their means; None for a mode without a goal."""
    goal = GOALS.get(entry["mode"])
    if goal is None:
        return None
    ratio, lost = goal
    return common.every_seed(entry["ratio_per_seed"], lambda r: r >= ratio) and common.every_seed(
        entry["accuracy_delta_per_seed"], lambda d: d >= -lost
    )


def _codec_speeds(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Codec speed of every coding the entries used (adaptive codes as top-k)."""
    codings = list(  # in the order of first use, each once
        dict.fromkeys(
            ("topk" if e["codec"] == "adaptive" else e["codec"], e["compress_ratio"])
            for e in entries
        )
    )
    speeds = []
    for codec, ratio in codings:
        speed = codec_speed(codec, ratio if ratio is not None else 0.1)
        speeds.append(
            {
                "codec": codec,
                "compress_ratio": ratio,
                **{k: round(v, 1) for k, v in speed.items()},
                "speed_goal_met": speed["roundtrip_mbps"] >= SPEED_GOAL_MBPS,
            }
        )
    return speeds


def _kb(value: float | None) -> str:
    """Bytes as kB: one decimal, two below 10 kB."""
    if value is None:
        return "-"
    return f"{value / 1e3:,.1f}" if value >= 10e3 else f"{value / 1e3:.2f}"


def _signed(values: Sequence[float], scale: float = 100.0) -> str:
    """``mean (min to max)`` of signed values, e.g. accuracy points."""

    def signed(v: float) -> str:
        return f"{round(v * scale, 1) + 0.0:+.1f}"  # + 0.0: no "-0.0"

    text = signed(statistics.mean(values))
    if min(values) != max(values):
        text += f" ({signed(min(values))} to {signed(max(values))})"
    return text


def _table(entries: list[dict[str, Any]]) -> str:
    t = f"{TARGET_ACCURACY:g}"
    rows = [
        [
            f"{e['model']} ({e['parameters']:,})",
            e["mode"],
            _kb(e["up_per_device_round"]),
            _kb(e["down_per_device_round"]),
            _kb(e["bytes_up"]),
            f"{e['ratio']:.1f}x",
            common.spread([_kb_value(v) for v in e["bytes_up_to_target_per_seed"]], "{:,.0f}"),
            common.spread([_kb_value(v) for v in e["bytes_both_to_target_per_seed"]], "{:,.0f}"),
            common.spread(e["rounds_to_target_per_seed"], "{:.0f}"),
            common.spread(e["time_to_target_s_per_seed"], "{:.1f}"),
            common.spread(e["final_accuracy_per_seed"], "{:.3f}"),
            _signed(e["accuracy_delta_per_seed"]),
            f"{e['topk_rounds']:.0f}",
            "-" if e["goal"] is None else f"{e['goal']}: {common.verdict(bool(goal_met(e)))}",
        ]
        for e in entries
    ]
    return common.markdown_table(
        [
            "model (parameters)",
            "mode",
            "kB up / device / round",
            "kB down / device / round",
            "kB up, run",
            "vs none",
            f"kB up to {t}",
            f"kB up+down to {t}",
            f"rounds to {t}",
            f"virtual s to {t}",
            "final accuracy",
            "vs none, pt",
            "top-k rounds",
            "goal",
        ],
        rows,
    )


def _kb_value(value: int | None) -> float | None:
    return None if value is None else value / 1e3


def _speed_table(speeds: list[dict[str, Any]]) -> str:
    rows = [
        [
            s["codec"] + ("" if s["compress_ratio"] is None else f" {s['compress_ratio']:.0%}"),
            f"{s['encode_mbps']:.0f}",
            f"{s['decode_mbps']:.0f}",
            f"{s['roundtrip_mbps']:.0f}",
            f">= {SPEED_GOAL_MBPS:.0f}: {common.verdict(s['speed_goal_met'])}",
        ]
        for s in speeds
    ]
    return "Codec speed (wall clock, one core, 1M float32 values, median of 5):\n\n" + (
        common.markdown_table(["coding", "encode MB/s", "decode MB/s", "both MB/s", "goal"], rows)
    )


def _footnote(models: list[dict[str, Any]], seeds: Sequence[int], batch: int) -> str:
    described = "; ".join(
        f"{m['model']} ({m['parameters']:,} parameters): {m['rounds']} rounds, step "
        f"{m['step_s'] * 1e3:.1f} ms at b={batch}"
        for m in models
    )
    uplink = RunSettings().uplink_mbps
    named = ", ".join(map(str, seeds))
    over = (
        f"Seeds {named}: figures are the mean over seeds, with (min-max) where they differ; "
        "'vs none' pairs each seed with none's"
        if len(seeds) > 1
        else f"Seed {named} only"
    )
    return common.footnote(
        f"4 devices (slowdowns 1/1/2/4), {LOCAL_STEPS} local steps, B={GLOBAL_BATCH} "
        f"(b={batch} each), fixed controller, streams always ahead, {EVAL_SAMPLES} held-out "
        f"samples; {described}. {over}. "
        "Up = update frames as received; down = one copy of the model per device per round. "
        f"To {TARGET_ACCURACY:g} = through the first of two evaluations in a row at or above "
        f"it. Virtual time: compute charged from the step time measured for the model, times "
        f"the slowdown, the model down and frames up both at {uplink:g} Mbit/s, and the "
        "aggregator's aggregation and evaluation (a measured cost line), all charged by the "
        "runner. Codec speeds are wall time on a shared host",
        "; ".join(f"{k} {g[0]:g}x up at most {g[1] * 100:g} pt lost" for k, g in GOALS.items())
        + f"; encode+decode >= {SPEED_GOAL_MBPS:g} MB/s",
    )


def _plot(
    curves: dict[str, dict[str, list[list[RoundRecord]]]], seeds: Sequence[int], out: Path
) -> Path:
    def mean_of(runs: list[list[RoundRecord]], value: Any) -> np.ndarray:
        return np.asarray(np.mean([[value(r) for r in records] for records in runs], axis=0))

    def draw(axes: list[Axes]) -> None:
        for i, runs in enumerate(curves.values()):
            for mode, seeds_runs in runs.items():
                acc = mean_of(seeds_runs, lambda r: r.test_accuracy)
                up = np.cumsum(mean_of(seeds_runs, lambda r: r.bytes_up))
                both = up + np.cumsum(
                    mean_of(seeds_runs, lambda r: r.broadcast_bytes * len(r.planned))
                )
                color = f"C{list(CASES).index(mode) % 10}"  # a mode's colour on every panel
                axes[3 * i].plot(np.arange(1, len(acc) + 1), acc, label=mode, color=color)
                axes[3 * i + 1].plot(up / 1e3, acc, label=mode, color=color)
                axes[3 * i + 2].plot(both / 1e3, acc, label=mode, color=color)

    of_seeds = f"mean of seeds {', '.join(map(str, seeds))}"
    panels = []
    for name in curves:
        panels += [
            common.Panel("round", "accuracy", title=f"{name}: {of_seeds}"),
            common.Panel("cumulative kB up", "accuracy", xscale="log", title=f"{name}: up"),
            common.Panel(
                "cumulative kB up + down", "accuracy", xscale="log", title=f"{name}: both ways"
            ),
        ]
    return common.save_figure(out / "compression.png", panels, draw, width=4.2)
