"""The run config: every tunable of a run, declared once, checked in one place.

Flower hands the same run config (``[tool.flwr.app.config]`` in pyproject.toml, overridden
by ``flwr run --run-config``) to the ServerApp and to every ClientApp, so its declaration is
part of what both sides agree on and lives here. Each key is a field of :class:`RunSettings`
(the key is the field name with dashes) declared with :func:`knob`: type, default, bounds or
choices, and a line of help. :meth:`RunSettings.from_run_config` reads and checks a run
config; ``fedstream demo`` checks its training options the same way, and a test holds
pyproject.toml to these declarations.

The batch controller's knobs are :class:`ControllerSettings`, which :class:`RunSettings`
extends: the controller is configured by the run settings themselves.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from edge_client.task.constants import (
    BUILTIN_TASKS,
    DATASETS,
    DEFAULT_NUM_CLASSES,
    DIGITS_CLASSES,
    DIGITS_SHAPE,
    IMPORT_PATH,
    MODELS,
    PREPROCESSING,
)
from edge_client.wire.constants import (
    AGGREGATIONS,
    BROADCAST_MODES,
    COMPRESS_MODES,
    CONTROLLER_MODES,
    DEFAULT_TOPK_RATIO,
    DIVERGED_LOSS_RATIO,
    DRIFT_REACTIONS,
    MODES,
    ROBUST_AGGREGATIONS,
    SIM_BUFFERS,
    STALENESS_RULES,
    WAIT_POLICIES,
)
from edge_client.wire.mapping import MappingError, from_mapping, kebab, to_mapping
from edge_client.wire.population import parse_population

__all__ = [
    "ControllerSettings",
    "RunSettings",
    "check_setting",
    "default",
    "knob",
    "knobs",
    "number_list",
    "parse_shape",
    "upgrade_saved",
]

MAX_INT = 10**7  # no count in a run config (rounds, steps, batch, samples) is anywhere near
MAX_AXES = 4  # a sample: a vector, a window (channels, steps), an image, a clip


def knob(
    default: Any,
    help: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """Declare one run-config key: its default, a line of help, and what values it takes.

    Parameters
    ----------
    default : int, float, bool or str
        The default (its type is the key's type).
    help : str
        What the key does, for ``fedstream run-config`` and the docs.
    ge, gt, le, lt : float, optional
        Bounds: >=, >, <=, <.
    choices : tuple of str, optional
        The allowed values of a string key.
    """
    bounds = {"ge": ge, "gt": gt, "le": le, "lt": lt}
    return field(
        default=default,
        metadata={
            "help": help,
            "choices": choices,
            **{k: v for k, v in bounds.items() if v is not None},
        },
    )


@dataclass(frozen=True)
class ControllerSettings:
    """The batch controller's knobs (:mod:`aggregator.controller`)."""

    global_batch: int = knob(128, "B, the global batch per step summed over devices", ge=1)
    b_min: int = knob(8, "smallest batch a device is given", ge=1)
    b_max: int = knob(256, "largest batch a device is given", ge=1)
    deadband: float = knob(
        0.05,
        "spread of the devices' step times (relative) below which the plan is kept",
        ge=0,
        lt=1,
    )
    controller_period: int = knob(1, "rounds between controller updates", ge=1)
    controller: str = knob(
        "dynamic",
        "fixed (equal batches), static (by first speed), dynamic (OmniLearn's closed loop)",
        choices=CONTROLLER_MODES,
    )
    controller_smoothing: float = knob(
        0.5, "weight of the newest step-time measurement against older ones", gt=0, le=1
    )
    controller_probe: int = knob(
        3,
        "timed SGD steps per batch size each device runs before round 1, so that the first "
        "plan follows its speed instead of splitting B equally (0: no probe)",
        ge=0,
    )

    def __post_init__(self) -> None:
        _check_knobs(self)
        if self.b_min > self.b_max:
            raise ValueError(f"b-min ({self.b_min}) must not exceed b-max ({self.b_max})")
        if self.global_batch < self.b_min:
            raise ValueError(f"global-batch ({self.global_batch}) must be >= b-min ({self.b_min})")


@dataclass(frozen=True)
class RunSettings(ControllerSettings):
    """Every tunable of a run; the run-config key is the field name with dashes.

    Defaults here are those of ``[tool.flwr.app.config]`` in pyproject.toml (a test holds
    the two together).
    """

    num_rounds: int = knob(
        10,
        "federated rounds (async mode: model versions, one per aggregation); 0: until "
        "stopped (SIGTERM, or a STOP file in checkpoint-dir or out-dir: fedstream stop)",
        ge=0,
    )
    min_fresh_samples: int = knob(
        1,
        "a round whose devices trained on fewer fresh samples in all is skipped (the model "
        "is kept; counted in metrics.jsonl as skipped)",
        ge=1,
    )
    max_diverged_rounds: int = knob(
        3,
        "the run ends with an error after this many rounds in a row (async: versions) in "
        "which a device's training diverged (a non-finite loss, or one above "
        f"{DIVERGED_LOSS_RATIO:g}x its first); 0: never",
        ge=0,
    )
    mode: str = knob(
        "sync",
        "sync (rounds that wait for every device) or async (FedBuff: a device gets new work "
        "as soon as it replies; the model moves every async-buffer updates)",
        choices=MODES,
    )
    async_buffer: int = knob(
        0, "async: updates per aggregation (M; 0: half the devices connected at the start)", ge=0
    )
    staleness: str = knob(
        "polynomial",
        "async: weight of an update trained from a model s versions old: constant (1), "
        "polynomial ((1 + s)^-a) or hinge (1 up to s = b, then 1 / (a (s - b) + 1))",
        choices=STALENESS_RULES,
    )
    staleness_exponent: float = knob(
        0.5, "async: a, the polynomial's exponent or the hinge's slope", gt=0
    )
    staleness_hinge: int = knob(4, "async: b, the staleness the hinge weighs fully", ge=0)
    server_lr: float = knob(1.0, "async: step the aggregator takes along the buffered mean", gt=0)
    max_staleness: int = knob(
        50, "async: an update more versions old than this is refused (counted as too-stale)", ge=0
    )
    local_steps: int = knob(20, "SGD steps a device trains per round (K)", ge=1)
    lr: float = knob(0.05, "learning rate (scaled by sum(b)/B when streams cap batches)", gt=0)
    task: str = knob(
        "classification",
        "what is learned: classification or forecast (built in; forecast needs no labels), "
        "or a user's Task by import path ('my_pkg.task:HarTask')",
    )
    forecast_horizon: int = knob(
        1,
        "forecast: readings predicted (H) from the rest of each window (sample-shape holds "
        "the window's W + H readings per channel)",
        ge=1,
    )
    model: str = knob(
        "cnn",
        "classification's model: cnn (1D-CNN over (channels, steps) windows), mlp (any "
        "shape), or a user's nn.Module by import path ('my_pkg.task:Net')",
    )
    model_width: int = knob(
        0, "CNN channels or MLP hidden units (0: the model's default, 32 or 64)", ge=0
    )
    sample_shape: str = knob(
        "6,32",
        "shape of one sample as the devices' buffers hold it, comma-separated (a device "
        "whose buffer holds another shape is left out, counted as shape-mismatch)",
    )
    num_classes: int = knob(DEFAULT_NUM_CLASSES, "classes of the task (its outputs)", ge=2)
    preprocess: str = knob(
        "none",
        "classification: none, or standardize (each device standardises every channel by "
        "running statistics of its own stream)",
        choices=PREPROCESSING,
    )
    dataset: str = knob(
        "synthetic",
        "emulated streams only (simulation engine, in-process runner): synthetic (sensor "
        "windows of sample-shape) or digits (8x8 frames: sample-shape 8,8, num-classes 10)",
        choices=DATASETS,
    )
    wait_policy: str = knob(
        "adapt",
        "wait (for b*K samples, up to the deadline) or adapt (train on what is there)",
        choices=WAIT_POLICIES,
    )
    availability_cap: bool = knob(True, "ScaDLES: cap batches at fill + rate * round time")
    round_timeout: float = knob(120.0, "seconds a round waits for replies", gt=0)
    superlink_timeout: float = knob(
        60.0,
        "seconds the ServerApp keeps trying a SuperLink that does not answer before it ends "
        "the run with an error (its checkpoint kept); 0: for ever, as Flower does",
        ge=0,
    )
    min_nodes: int = knob(1, "a round starts once this many SuperNodes are connected", ge=1)
    checkpoint_dir: str = knob("", "where checkpoints go; empty: none")
    resume: bool = knob(False, "continue from the checkpoint in checkpoint-dir")
    out_dir: str = knob(
        "",
        "where metrics.jsonl goes; empty: $FEDSTREAM_HOME/runs/<run-id> (~/.fedstream) "
        "on the ServerApp's machine when Flower runs it, nowhere on the in-process runner; "
        "none: nowhere",
    )
    metrics_max_mb: float = knob(
        64.0, "metrics.jsonl is rotated to metrics.jsonl.1 (.2, ...) past this size", gt=0
    )
    metrics_keep: int = knob(3, "rotated metrics.jsonl files kept", ge=0)
    prometheus_port: int = knob(
        0, "the ServerApp serves each round's figures as Prometheus metrics here; 0: off",
        ge=0, le=65535,
    )  # fmt: skip
    prometheus_listen: str = knob("0.0.0.0", "the address the Prometheus endpoint binds to")
    tensorboard_dir: str = knob(
        "",
        "each round's figures go to TensorBoard event files here (needs tensorboard); empty: off",
    )
    mlflow_uri: str = knob(
        "", "each round's figures go to this MLflow tracking URI (needs mlflow); empty: off"
    )
    mlflow_experiment: str = knob("fedstream", "the MLflow experiment the run is logged under")
    export_dir: str = knob(
        "", "where versioned model exports go (fedstream models DIR lists them); empty: none"
    )
    export_every: int = knob(
        5, "rounds (async: model versions) between exports; 0: only at the end", ge=0
    )
    export_keep: int = knob(5, "exported versions kept (the newest)", ge=1)
    drift_reaction: str = knob(
        "none",
        "when a device reports drift (a rise of its prequential error), for drift-rounds "
        "rounds: learning-rate (every device's learning rate x drift-boost), boost (that device's "
        "updates weigh x drift-boost) or none (only log it)",
        choices=DRIFT_REACTIONS,
    )
    drift_boost: float = knob(2.0, "the drift reaction's multiplier", ge=1)
    drift_rounds: int = knob(3, "rounds a drift reaction lasts", ge=0)
    eval_data: str = knob(
        "",
        "server-side evaluation besides the devices' prequential one: empty (none), a "
        "built-in dataset's held-out set (synthetic, digits), or a .npz/.csv file on the "
        "aggregator",
    )
    eval_samples: int = knob(
        2000, "most samples of eval-data the aggregator evaluates on", ge=1, le=100_000
    )
    uplink_mbps: float = knob(10.0, "uplink charged on the virtual clock, Mbit/s", gt=0)
    seed: int = knob(0, "seed of the model, the held-out set and the draws", ge=0)
    compress: str = knob(
        "none",
        "update codec: none, fp16, int8, topk, adaptive (ScaDLES)",
        choices=COMPRESS_MODES,
    )
    compress_ratio: float = knob(DEFAULT_TOPK_RATIO, "top-k: fraction of values sent", gt=0, le=1)
    compress_delta: float = knob(
        0.3, "adaptive: top-k when most devices' gap EWMA <= this", ge=0, le=1
    )
    compress_broadcast: str = knob(
        "none", "model sent down: none (float32) or fp16", choices=BROADCAST_MODES
    )
    proximal_mu: float = knob(0.0, "FedProx term on the devices; 0: plain FedAvg", ge=0)
    inject_alpha: float = knob(
        0.0, "ScaDLES injection: fraction of opted-in devices sharing per round", ge=0, le=1
    )
    inject_beta: float = knob(
        0.25, "... each shares this fraction of the samples it just trained on", ge=0, le=1
    )
    inject_budget: int = knob(
        16_384,
        "... all of them together queue at most this many bytes per round (the broker then "
        "delivers each frame to every other opted-in device)",
        ge=0,
    )
    inject_mix: float = knob(
        0.25, "fraction of each batch drawn from a device's injection pool", ge=0, lt=1
    )
    aggregation: str = knob(
        "fednova",
        "fedavg (weighted by samples trained) | fednova (each device's steps weigh the same, "
        "whatever its batch) | trimmed-mean | median | krum | multi-krum",
        choices=AGGREGATIONS,
    )
    trim_fraction: float = knob(0.2, "trimmed-mean: cut at each end", ge=0, lt=0.5)
    krum_malicious: int = knob(1, "krum, multi-krum: updates that may be hostile (f)", ge=0)
    sim_dir: str = knob("", "simulation only: state of the virtual devices (default: tmp)")
    sim_buffers: str = knob(
        "lazy",
        "simulation: lazy (a virtual device's stream kept as counts, samples made only when a "
        "round takes them) or files (a buffer file per device, filled as the stream delivers)",
        choices=SIM_BUFFERS,
    )
    sim_population: str = knob(
        "",
        "simulation: the virtual devices' slowdown, rate and availability, e.g. "
        "'slowdown=omnilearn(HL4) rate=scadles(S2) availability=churn(600,60)' or "
        "'trace=fleet.csv' (edge_client/emulation/population.py); empty: sim-rates, sim-slowdowns",
    )
    sim_rates: str = knob("400,400,200,100", "simulation: stream rate per virtual device")
    sim_slowdowns: str = knob("1,1,2,4", "simulation: slowdown per virtual device")
    sim_initial: int = knob(2000, "simulation: samples buffered before the first round", ge=0)
    sim_labels: int = knob(0, "simulation skew: classes per virtual device (0: all)", ge=0)
    sim_dirichlet: float = knob(0.0, "... or Dirichlet(alpha) label mix (0: off)", ge=0)
    sim_feature_shift: float = knob(0.0, "... and per-device sensor gain/bias", ge=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        shape = self.shape  # checks sample-shape
        if self.dataset == "digits" and (self.num_classes, shape) != (DIGITS_CLASSES, DIGITS_SHAPE):
            raise ValueError(
                f"dataset digits streams 8x8 frames of {DIGITS_CLASSES} classes: set "
                f"sample-shape='8,8' and num-classes={DIGITS_CLASSES}"
            )
        if self.task not in BUILTIN_TASKS and not IMPORT_PATH.match(self.task):
            raise ValueError(
                f"task must be one of {BUILTIN_TASKS} or an import path 'package.module:Name', "
                f"got {self.task!r}"
            )
        if self.model not in MODELS and not IMPORT_PATH.match(self.model):
            raise ValueError(
                f"model must be one of {MODELS} or an import path 'package.module:Name', "
                f"got {self.model!r}"
            )
        if self.mode == "async" and self.aggregation in ROBUST_AGGREGATIONS:
            raise ValueError(
                f"aggregation {self.aggregation} needs every update of a round: async mode "
                "takes fedavg or fednova"
            )
        if self.sim_labels > self.num_classes:
            raise ValueError(f"sim-labels must be in 0..num-classes ({self.num_classes})")
        number_list(self.sim_rates, "sim-rates", 1e-9)
        number_list(self.sim_slowdowns, "sim-slowdowns", 1.0)
        parse_population(self.sim_population)  # its syntax (a trace file: where it is read)

    @property
    def shape(self) -> tuple[int, ...]:
        """``sample-shape`` as a tuple.

        Raises
        ------
        ValueError
            If it is not one or more comma-separated whole numbers >= 1.
        """
        return parse_shape(self.sample_shape, kebab("sample_shape"))

    def to_run_config(self) -> dict[str, Any]:
        """The settings as a run config (kebab-case keys): what a resume submits again."""
        return to_mapping(self)

    @classmethod
    def from_run_config(cls, config: Mapping[str, Any]) -> RunSettings:
        """Read settings from a run config; keys it does not set take their defaults.

        Raises
        ------
        ValueError
            On an unknown key (likely a typo), a value of the wrong type, or one out of
            bounds; the message names the key.
        """
        try:
            return from_mapping(cls, config, strict=True)
        except MappingError as err:
            raise ValueError(f"run config: {err}") from err


def upgrade_saved(config: Mapping[str, Any]) -> dict[str, Any]:
    """A run config saved by an earlier fedstream (a checkpoint's), with the keys added since
    set to what that release did: before ``sample-shape`` and ``eval-data`` existed, the
    model's shape was the ``dataset``'s and the aggregator scored every round on the
    ``dataset``'s held-out set."""
    out = dict(config)
    dataset = out.get(kebab("dataset"), default("dataset"))
    if kebab("sample_shape") not in out and dataset == "digits":
        out[kebab("sample_shape")] = ",".join(map(str, DIGITS_SHAPE))
    if kebab("eval_data") not in out:
        out[kebab("eval_data")] = dataset
    return out


def knobs(settings: type[ControllerSettings] = RunSettings) -> dict[str, dict[str, Any]]:
    """Every run-config key and what is declared about it.

    Parameters
    ----------
    settings : type
        The settings class (all of a run's by default).

    Returns
    -------
    dict
        Key -> ``default``, ``help`` and ``allowed`` (the choices or the bounds, as text;
        empty when any value of the key's type goes), in declaration order.
    """
    out: dict[str, dict[str, Any]] = {}
    for f in fields(settings):
        meta = f.metadata
        if meta.get("choices"):
            allowed = " | ".join(meta["choices"])
        elif any(b in meta for b in _BOUNDS):
            allowed = _span(meta)
        else:
            allowed = ""
        out[kebab(f.name)] = {"default": f.default, "help": meta["help"], "allowed": allowed}
    return out


def parse_shape(text: str, key: str = "shape") -> tuple[int, ...]:
    """A sample shape written ``"6,32"`` (or ``"6x32"``).

    Raises
    ------
    ValueError
        If it is not one to four whole numbers >= 1; the message names ``key``.
    """
    parts = [p.strip() for p in str(text).replace("x", ",").split(",")]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{key} must be comma-separated whole numbers, got {text!r}") from None
    if not 1 <= len(shape) <= MAX_AXES or min(shape) < 1 or math.prod(shape) > MAX_INT:
        raise ValueError(f"{key} needs 1 to {MAX_AXES} sizes >= 1, got {text!r}")
    return shape


def number_list(text: str, key: str, minimum: float) -> list[float]:
    """Parse a comma-separated run-config list such as ``sim-rates = "200,100"``.

    Raises
    ------
    ValueError
        If it is empty, not numbers, or a value is below ``minimum``.
    """
    try:
        values = [float(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{key} must be comma-separated numbers, got {text!r}") from None
    if not values or not all(math.isfinite(v) and v >= minimum for v in values):
        raise ValueError(f"{key} needs values >= {minimum}, got {text!r}")
    return values


def _check_knobs(settings: ControllerSettings) -> None:
    """Types, bounds and choices of every declared key; the message names the key."""
    for f in fields(settings):
        _check(kebab(f.name), getattr(settings, f.name), f.metadata)


def check_setting(name: str, value: Any) -> None:
    """Check ``value`` as run-config key ``name`` (a field name) would be checked: for
    records that carry a setting on its way (a device's plan).

    Raises
    ------
    ValueError
        If it is out of the key's bounds or choices; the message names the key.
    """
    _check(kebab(name), value, _FIELDS[name].metadata)


def default(name: str) -> Any:
    """The declared default of run-config key ``name`` (a field name)."""
    return _FIELDS[name].default


def _check(key: str, value: Any, meta: Mapping[str, Any]) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{key} must be finite, got {value}")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise ValueError(f"{key} is out of range: {value}")
    choices = meta.get("choices")
    if choices and value not in choices:
        raise ValueError(f"{key} must be one of {choices}, got {value!r}")
    if any(b in meta and not _BOUNDS[b][0](value, meta[b]) for b in _BOUNDS):
        raise ValueError(f"{key} must be {_span(meta)}, got {value}")


# bound -> (test, sign, bracket)
_BOUNDS: dict[str, tuple[Callable[[Any, Any], bool], str, str]] = {
    "ge": (operator.ge, ">=", "["),
    "gt": (operator.gt, ">", "("),
    "le": (operator.le, "<=", "]"),
    "lt": (operator.lt, "<", ")"),
}


def _span(meta: Mapping[str, Any]) -> str:
    """``in [0, 1)`` for a range, ``> 0`` for one bound."""
    low = next((b for b in ("ge", "gt") if b in meta), None)
    high = next((b for b in ("le", "lt") if b in meta), None)
    if low and high:
        return f"in {_BOUNDS[low][2]}{meta[low]:g}, {meta[high]:g}{_BOUNDS[high][2]}"
    bound = low or high
    return f"{_BOUNDS[bound][1]} {meta[bound]:g}" if bound else "valid"


_FIELDS = {f.name: f for f in fields(RunSettings)}
