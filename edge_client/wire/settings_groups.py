"""The run's settings by concern: one small frozen dataclass per group of run-config keys,
each checking its own keys (types, bounds, choices) and the rules among them.

:class:`~edge_client.wire.run_config.RunSettings` is composed of these groups (its
attribute for each is listed in :data:`GROUPS`), and each part of the aggregator is
constructed from the group it uses: the drift reaction from :class:`DriftSettings`, the
sinks from :class:`SinkSettings`, and so on. A key keeps its name inside its group
(``settings.drift.drift_boost`` is ``drift-boost``). The controller's knobs,
:class:`ControllerSettings`, are the base of the run settings themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_client.wire.constants import (
    AGGREGATIONS,
    BROADCAST_MODES,
    BUILTIN_TASKS,
    COMPRESS_MODES,
    CONTROLLER_MODES,
    DATASETS,
    DEFAULT_NUM_CLASSES,
    DEFAULT_TOPK_RATIO,
    DIGITS_CLASSES,
    DIGITS_SHAPE,
    DIVERGED_LOSS_RATIO,
    DP_MODES,
    DRIFT_REACTIONS,
    IMPORT_PATH,
    MODELS,
    MODES,
    PERSONALIZE,
    PREPROCESSING,
    SIM_BUFFERS,
    STALENESS_RULES,
    WAIT_POLICIES,
)
from edge_client.wire.knob_checks import check_knobs, knob, number_list, parse_shape
from edge_client.wire.mapping import kebab
from edge_client.wire.partitioning import scheme_of
from edge_client.wire.population import parse_population

__all__ = [
    "GROUPS",
    "AggregationSettings",
    "AsyncSettings",
    "CheckpointSettings",
    "CodecSettings",
    "ControllerSettings",
    "DriftSettings",
    "EvaluationSettings",
    "ExchangeSettings",
    "ExportSettings",
    "InjectionSettings",
    "LearningSettings",
    "MetricsLogSettings",
    "PrivacySettings",
    "RoundSettings",
    "SecureAggregationSettings",
    "SimulationSettings",
    "SinkSettings",
    "StreamSettings",
]


@dataclass(frozen=True)
class ControllerSettings:
    """The batch controller's knobs (:mod:`aggregator.controller`)."""

    global_batch: int = knob(512, "B, the global batch per step summed over devices", ge=1)
    b_min: int = knob(8, "smallest batch a device is given", ge=1)
    b_max: int = knob(512, "largest batch a device is given", ge=1)
    lr_batch: int = knob(
        128,
        "the global batch lr is meant for: when streams cap the batches below "
        "min(global-batch, lr-batch) in sum, lr scales down in proportion (ScaDLES' linear "
        "scaling rule); 0: global-batch",
        ge=0,
    )
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
        1,
        "timed SGD steps per batch size each device runs before round 1, so that the first "
        "plan follows its speed instead of splitting B equally (0: no probe; round 1 then "
        "splits B equally and times two step sizes)",
        ge=0,
    )

    def __post_init__(self) -> None:
        check_knobs(self, ControllerSettings)
        if self.b_min > self.b_max:
            raise ValueError(f"b-min ({self.b_min}) must not exceed b-max ({self.b_max})")
        if self.global_batch < self.b_min:
            raise ValueError(f"global-batch ({self.global_batch}) must be >= b-min ({self.b_min})")


@dataclass(frozen=True)
class RoundSettings:
    """How many rounds (asynchronous mode: model versions) a run makes, and when it
    skips one or gives up (:mod:`aggregator.session`)."""

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
    fraction_train: float = knob(
        1.0,
        "each live device takes part in a round with this probability, independently "
        "(Poisson sampling, seeded; the controller plans for those drawn); 1: every device",
        gt=0,
        le=1,
    )
    max_diverged_rounds: int = knob(
        3,
        "the run ends with an error after this many rounds in a row (async: versions) in "
        "which a device's training diverged (a non-finite loss, or one above "
        f"{DIVERGED_LOSS_RATIO:g}x its first); 0: never",
        ge=0,
    )

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class AsyncSettings:
    """Synchronous rounds or FedBuff's buffered asynchronous aggregation, and FedBuff's
    staleness rule (:mod:`aggregator.fedbuff`)."""

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

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class LearningSettings:
    """What is learned and how each device trains: the task, the model, the samples'
    shape, the local steps and learning rate (:mod:`edge_client.task`)."""

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
        "classification's model: cnn (1D-CNN over (channels, steps) windows), cnn-bn (the "
        "same with batch normalisation), mlp (any shape), or a user's nn.Module by import "
        "path ('my_pkg.task:Net')",
    )
    model_width: int = knob(
        0, "CNN channels or MLP hidden units (0: the model's default, 32 or 64)", ge=0
    )
    personalize: str = knob(
        "none",
        "what each device keeps to itself, trained locally and never sent: none, head (the "
        "output layer: FedPer/FedRep) or bn (normalisation layers: FedBN; model cnn-bn)",
        choices=PERSONALIZE,
    )
    personal_layers: str = knob(
        "",
        "further tensors each device keeps, by state-dict name pattern, comma-separated "
        "('head.*,adapter.*'; for a user's model)",
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

    def __post_init__(self) -> None:
        check_knobs(self)
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

    @property
    def shape(self) -> tuple[int, ...]:
        """``sample-shape`` as a tuple.

        Raises
        ------
        ValueError
            If it is not one or more comma-separated whole numbers >= 1.
        """
        return parse_shape(self.sample_shape, kebab("sample_shape"))


@dataclass(frozen=True)
class StreamSettings:
    """How a device's plan meets its stream: waiting for samples, and ScaDLES's
    availability cap on its batch."""

    wait_policy: str = knob(
        "adapt",
        "wait (for b*K samples, up to the deadline) or adapt (train on what is there)",
        choices=WAIT_POLICIES,
    )
    availability_cap: bool = knob(True, "ScaDLES: cap batches at fill + rate * round time")
    max_passes: int = knob(
        1,
        "most times a device trains on one sample within a round: a device whose stream "
        "brings fewer than b*K samples trains its K steps over the fresh ones it has, each "
        "at most this many times (local epochs over the round's window), and the "
        "availability cap grows as much; 1: every sample once",
        ge=1,
        le=64,
    )

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class ExchangeSettings:
    """Messages between the aggregator and the devices: how long a round waits, how long
    a silent SuperLink is tried, how many nodes a round needs
    (:mod:`aggregator.exchange`)."""

    round_timeout: float = knob(120.0, "seconds a round waits for replies", gt=0)
    superlink_timeout: float = knob(
        60.0,
        "seconds the ServerApp keeps trying a SuperLink that does not answer before it ends "
        "the run with an error (its checkpoint kept); 0: for ever, as Flower does",
        ge=0,
    )
    min_nodes: int = knob(1, "a round starts once this many SuperNodes are connected", ge=1)

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class CheckpointSettings:
    """Where the aggregator's checkpoints go, and whether a run resumes from one
    (:mod:`aggregator.resume`)."""

    checkpoint_dir: str = knob("", "where checkpoints go; empty: none")
    resume: bool = knob(False, "continue from the checkpoint in checkpoint-dir")

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class MetricsLogSettings:
    """Where ``metrics.jsonl`` goes and how it is rotated (:mod:`aggregator.round_log`)."""

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

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class SinkSettings:
    """Where each round's figures go besides ``metrics.jsonl``: Prometheus, TensorBoard,
    MLflow (:mod:`aggregator.sinks`)."""

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

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class ExportSettings:
    """Versioned model exports from the aggregator (:mod:`aggregator.exports`)."""

    export_dir: str = knob(
        "", "where versioned model exports go (fedstream models DIR lists them); empty: none"
    )
    export_every: int = knob(
        5, "rounds (async: model versions) between exports; 0: only at the end", ge=0
    )
    export_keep: int = knob(5, "exported versions kept (the newest)", ge=1)

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class DriftSettings:
    """The aggregator's reaction to drift its devices report
    (:mod:`aggregator.drift_reaction`)."""

    drift_reaction: str = knob(
        "none",
        "when a device reports drift (a rise of its prequential error), for drift-rounds "
        "rounds: learning-rate (every device's learning rate x drift-boost), boost (that device's "
        "updates weigh x drift-boost) or none (only log it)",
        choices=DRIFT_REACTIONS,
    )
    drift_boost: float = knob(2.0, "the drift reaction's multiplier", ge=1)
    drift_rounds: int = knob(3, "rounds a drift reaction lasts", ge=0)

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class EvaluationSettings:
    """Server-side evaluation on ``eval-data`` (:mod:`aggregator.server_eval`)."""

    eval_data: str = knob(
        "",
        "server-side evaluation besides the devices' prequential one: empty (none), a "
        "built-in dataset's held-out set (synthetic, digits), or a .npz/.csv file on the "
        "aggregator",
    )
    eval_samples: int = knob(
        2000, "most samples of eval-data the aggregator evaluates on", ge=1, le=100_000
    )
    eval_group_by: str = knob(
        "",
        "server-side evaluation: also score eval-data per group of this key (an array of the "
        ".npz or a column of the .csv, e.g. user): test-by-group in metrics.jsonl",
    )

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class CodecSettings:
    """How updates are coded up and the model down (:mod:`edge_client.wire.codec`,
    :mod:`aggregator.compression`)."""

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

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class InjectionSettings:
    """ScaDLES data injection: who shares samples, how many, and how much of a batch
    they make (:mod:`aggregator.injection`)."""

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

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class AggregationSettings:
    """How a round's updates are combined: the rule and its robust variants' parameters
    (:mod:`aggregator.aggregation`)."""

    aggregation: str = knob(
        "adaptive",
        "adaptive (FedNova's normalised mean, each device weighted n / (n + r) for n samples: "
        "r, estimated from the updates, goes to infinity (sample weights) on alike streams "
        "and to 0 (equal weights) on skewed ones) | fedavg (weighted by samples trained) | "
        "fednova (each device's steps weigh the same, whatever its batch) | trimmed-mean | "
        "median | krum | multi-krum",
        choices=AGGREGATIONS,
    )
    trim_fraction: float = knob(0.2, "trimmed-mean: cut at each end", ge=0, lt=0.5)
    krum_malicious: int = knob(1, "krum, multi-krum: updates that may be hostile (f)", ge=0)

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class PrivacySettings:
    """Differential privacy at the level of a device (:mod:`aggregator.privacy`): each device
    clips the update it sends; the aggregator (``central``) or the device (``local``) adds
    Gaussian noise; an RDP accountant counts what was spent."""

    dp: str = knob(
        "off",
        "differential privacy: off, central (DP-FedAvg: devices clip, the aggregator adds "
        "noise to the sum) or local (each device adds the noise before sending)",
        choices=DP_MODES,
    )
    dp_clip: float = knob(
        1.0,
        "the L2 norm a device's sent update is clipped to (with dp-clip-quantile: the first "
        "round's)",
        gt=0,
    )
    dp_noise: float = knob(
        1.0, "noise multiplier z: the noise's standard deviation is z x dp-clip", ge=0
    )
    dp_delta: float = knob(1e-5, "the delta the spent epsilon is stated at", gt=0, lt=1)
    dp_epsilon: float = knob(
        0.0,
        "privacy budget: the run stops (checkpointed, exported) before a round would spend "
        "more; 0: no budget",
        ge=0,
    )
    dp_clip_quantile: float = knob(
        0.0,
        "central: adaptive clipping (Andrew et al. 2021) to this quantile of the devices' "
        "update norms; 0: the clip stays dp-clip",
        ge=0,
        lt=1,
    )
    dp_clip_lr: float = knob(0.2, "adaptive clipping: the clip's geometric step", gt=0)
    dp_count_noise: float = knob(
        0.0,
        "adaptive clipping: standard deviation of the noise on the count of unclipped "
        "updates; 0: expected devices / 20 (Andrew et al.)",
        ge=0,
    )
    dp_device_records: bool = knob(
        False,
        "under DP, publish each device's identity and figures (plan, reply, latency, "
        "failures) in metrics.jsonl, the live table, Prometheus and summary.json; costs: who "
        "took part each round is then public, so epsilon is accounted without amplification "
        "by sampling (as if fraction-train were 1)",
    )
    dp_device_scores: bool = knob(
        False,
        "under DP with dp-device-records, keep each device's prequential score too (they are "
        "computed on its private samples and no noise covers them)",
    )

    @property
    def on(self) -> bool:
        """Whether the run is differentially private."""
        return self.dp != "off"

    def accounted_fraction(self, fraction: float) -> float:
        """The sampling rate the accountant amplifies by: ``fraction`` (``fraction-train``)
        while who is drawn stays secret, 1 once ``dp-device-records`` publishes it."""
        return 1.0 if self.dp_device_records else fraction

    def __post_init__(self) -> None:
        check_knobs(self)
        if self.on and self.dp_device_scores and not self.dp_device_records:
            raise ValueError(
                "dp-device-scores keeps each device's score among its published figures: "
                "it needs dp-device-records = true (and the epsilon without amplification)"
            )
        if self.dp == "local" and self.dp_clip_quantile > 0:
            raise ValueError(
                "dp-clip-quantile (adaptive clipping) works with dp = 'central' only: it "
                "reads each device's unclipped-or-not bit, which local DP does not noise"
            )


@dataclass(frozen=True)
class SecureAggregationSettings:
    """Secure aggregation (SecAgg+, Bell et al. 2020): each device masks its quantised update
    with secrets it shares with its neighbours, so that the aggregator learns only the sum
    (:mod:`aggregator.secure_round`, :mod:`edge_client.wire.masking`)."""

    secure_aggregation: bool = knob(
        False,
        "SecAgg+: devices mask their updates so that the aggregator learns only the round's "
        "sum (sync mode; 3 more exchanges a round)",
    )
    secagg_neighbours: int = knob(
        0,
        "devices each device shares its secrets with; 0: every other device when that is "
        "under 3 log2(devices), else the even number above it (SecAgg+'s O(log n) graph)",
        ge=0,
    )
    secagg_threshold: float = knob(
        0.5,
        "fraction of a device's neighbours whose shares rebuild its secrets (always more "
        "than half of them): the round survives the rest of any neighbourhood dropping out",
        ge=0.5,
        le=1,
    )
    secagg_min_survivors: int = knob(
        3,
        "the fewest devices a round's sum may hold (fewer: the round is skipped, the model "
        "kept): a sum of one device is its update",
        ge=2,
    )
    secagg_range: float = knob(
        1.0,
        "each coordinate of a device's weighted update is clipped to [-range, range] before "
        "quantisation (under dp: dp-clip)",
        gt=0,
    )
    secagg_bits: int = knob(
        16,
        "quantisation grid: 2^bits levels over the range; the field adds log2(devices) bits "
        "so that the sum cannot wrap",
        ge=2,
        le=48,
    )

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class SimulationSettings:
    """The virtual devices of the simulation engine and the in-process runner
    (:mod:`edge_client.emulation`)."""

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
    sim_source: str = knob(
        "",
        "simulation: a recording (.npz or .csv on the machine that runs the virtual devices) "
        "they stream, split by sim-partition, each part in recorded order; empty: the "
        "synthetic task",
    )
    sim_partition: str = knob(
        "",
        "simulation with sim-source: natural (one device per group of sim-partition-by), iid, "
        "dirichlet(ALPHA) or pathological(K) (Flower Datasets' partitioners); empty: natural "
        "with sim-partition-by, else iid",
    )
    sim_partition_by: str = knob(
        "",
        "simulation with sim-source: the key whose groups are the devices (an array of the "
        ".npz or a column of the .csv, e.g. user)",
    )
    sim_round_s: float = knob(
        10.0,
        "simulation: seconds a round lasts on the streams' virtual clock: a device's stream "
        "delivers rate x this many samples a round, so a seeded run repeats",
        gt=0,
    )

    sim_secagg_dropout: float = knob(
        0.0,
        "simulation: fraction of the devices that vanish in each round (drawn per round): "
        "under secure aggregation after sharing their keys, before their masked input (their "
        "masks are removed with their shares); in a plain run the same devices send no update",
        ge=0,
        lt=1,
    )

    def __post_init__(self) -> None:
        check_knobs(self)
        number_list(self.sim_rates, "sim-rates", 1e-9)
        number_list(self.sim_slowdowns, "sim-slowdowns", 1.0)
        parse_population(self.sim_population)  # its syntax (a trace file: where it is read)
        if self.sim_partition or self.sim_partition_by:
            scheme_of(self.sim_partition, self.sim_partition_by)
            if not self.sim_source:
                raise ValueError("sim-partition and sim-partition-by split a sim-source")


#: The groups of :class:`~edge_client.wire.run_config.RunSettings`: attribute -> class.
GROUPS: dict[str, type] = {
    "rounds": RoundSettings,
    "asynchrony": AsyncSettings,
    "learning": LearningSettings,
    "streams": StreamSettings,
    "exchange": ExchangeSettings,
    "checkpoints": CheckpointSettings,
    "metrics_log": MetricsLogSettings,
    "sinks": SinkSettings,
    "exports": ExportSettings,
    "drift": DriftSettings,
    "evaluation": EvaluationSettings,
    "codec": CodecSettings,
    "injection": InjectionSettings,
    "aggregation_rule": AggregationSettings,
    "privacy": PrivacySettings,
    "secure": SecureAggregationSettings,
    "simulation": SimulationSettings,
}
