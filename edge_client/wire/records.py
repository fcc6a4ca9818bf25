"""The round protocol: what the aggregator sends a device, and what the device replies.

Server -> device, one message per device and round:

- ``arrays`` (ArrayRecord): the global model, float32 (float16 when the broadcast is
  compressed), packed into one array (:func:`pack_model`; the plan's ``model-layout`` names
  its tensors' names and shapes, which the device's own model must have): Flower moves every
  array of a message as objects of their own, one request each, SuperLink to SuperNode and
  SuperNode to its ClientApp, so six tensors cost 16 objects and one costs 6. A record of
  tensors by name (a plan without ``model-layout``: a ServerApp of one's own) is read too;
- ``config`` (ConfigRecord): the device's :class:`RoundPlan`.

Device -> server, the reply (:class:`DeviceReply`):

- ``update`` (ConfigRecord): ``frame``, the model delta coded by :mod:`edge_client.wire.codec`;
- ``metrics`` (MetricRecord): :class:`ReplyMetrics`;
- ``device`` (ConfigRecord): ``device-id`` and the reply's ``format-version`` (metric records
  hold numbers only).

Before the first round, when the controller has no timings yet, the aggregator may send a
query (:class:`ProbePlan` in ``config``, no model) that a device answers with
:class:`ProbeReply` (``metrics``, and ``device``): the seconds one SGD step of the run's
model takes it at a few batch sizes, on inputs of its buffer's shape.

Keys are the fields' names in kebab case (:mod:`edge_client.wire.mapping`), as Flower's are.
Both records carry a ``format-version`` (:data:`~edge_client.wire.constants.RECORD_VERSION`);
a record without one is of version 1, the layout before the key existed. A reader takes any
version up to its own (keys it does not know are ignored, keys a record lacks take their
defaults) and refuses newer ones.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from edge_client.wire.constants import CODEC_MODES, RECORD_VERSION, SECAGG_WEIGHTINGS
from edge_client.wire.mapping import from_mapping, kebab, to_mapping
from edge_client.wire.run_config import check_setting, default
from edge_client.wire.topics import validate_device_id

__all__ = [
    "ARRAYS",
    "CONFIG",
    "DEVICE",
    "METRICS",
    "PACKED",
    "PLAN_REFUSED",
    "UPDATE",
    "DeviceReply",
    "ProbePlan",
    "ProbeReply",
    "RecordError",
    "ReplyMetrics",
    "RoundPlan",
    "model_layout",
    "pack_model",
    "unpack_model",
]

T = TypeVar("T")
R = TypeVar("R", ConfigRecord, MetricRecord)

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
DEVICE = "device"
UPDATE = "update"
PACKED = "packed"  # the one array of a packed model, in ``arrays``
#: How the error reply of a device that refuses its plan (below its owner's privacy floor,
#: the node config's ``dp-min-noise``, ``dp-max-clip``, ``secure-required``) begins.
PLAN_REFUSED = "plan refused"


class RecordError(ValueError):
    """A plan or reply that cannot be read.

    Attributes
    ----------
    reason : str
        ``malformed`` (missing or ill-typed keys, a wrong record type) or ``newer-format``
        (written by a newer fedstream); what the aggregator counts.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class _Record:
    """What every record of the protocol can do: be read back from its mapping."""

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Self:
        """Read the record from its mapping (a Flower record, or a ``metrics.jsonl`` entry).

        Raises
        ------
        RecordError
            If a required key is missing, a value is ill-typed or out of range
            (``malformed``), or the record was written by a newer fedstream
            (``newer-format``).
        """
        return _read(cls, record)


def model_layout(state: Mapping[str, Any]) -> str:
    """A digest of a model's tensor names and shapes, in order (``state``: name -> anything
    with a ``shape``): what a packed model is unpacked by."""
    digest = hashlib.sha256()
    for name, value in state.items():
        digest.update(f"{name}:{tuple(value.shape)};".encode())
    return digest.hexdigest()[:16]


def pack_model(state: Mapping[str, np.ndarray], dtype: type = np.float32) -> ArrayRecord:
    """The model's tensors, in order, as one flat array of ``dtype`` (see the module notes)."""
    flat = np.concatenate([np.asarray(v, dtype).ravel() for v in state.values()])
    return ArrayRecord({PACKED: Array(flat)})


def unpack_model(
    record: ArrayRecord, like: Mapping[str, Any], layout: str
) -> dict[str, np.ndarray]:
    """The tensors of ``record`` by name, float32: cut from its packed array by the names
    and shapes of ``like`` (the device's own model, whose :func:`model_layout` must be
    ``layout``), or as they are when ``layout`` is empty (tensors by name).

    Raises
    ------
    RecordError
        If the device's model is not the one packed (another task or model width), or the
        packed array is not the size of that model.
    """
    if not layout:
        return {k: np.asarray(a.numpy(), np.float32) for k, a in record.items()}
    if PACKED not in record:
        raise RecordError("malformed", f"a packed model ({layout}) but no {PACKED!r} array")
    mine = model_layout(like)
    if layout != mine:
        raise RecordError(
            "malformed",
            f"the model sent is not this device's model (layout {layout}, here {mine}): the "
            "run's task or model width differ between the ServerApp and this device",
        )
    flat = record[PACKED].numpy()
    sizes = [int(np.prod(v.shape)) for v in like.values()]
    if flat.ndim != 1 or flat.size != sum(sizes):
        raise RecordError(
            "malformed", f"the packed model holds {flat.size} values, this model {sum(sizes)}"
        )
    out, at = {}, 0
    for (name, value), size in zip(like.items(), sizes, strict=True):
        out[name] = np.array(flat[at : at + size], np.float32).reshape(tuple(value.shape))
        at += size
    return out


@dataclass(frozen=True)
class RoundPlan(_Record):
    """One round's work for one device (the ``config`` record).

    Attributes
    ----------
    batch_size, local_steps, lr
        Train ``local_steps`` SGD steps at batch ``batch_size`` with learning rate ``lr``.
    server_round : int
        The round (seeds the device's draws).
    wait_policy : {"wait", "adapt"}
        ``wait``: until ``batch_size * local_steps`` samples are buffered, up to the
        deadline; ``adapt``: train on what is there, never below ``b_min`` per step.
    max_passes : int
        The most times one fresh sample is trained on in the round: the ``K`` steps need
        at least ``ceil(batch_size * local_steps / max_passes)`` fresh samples, and go over
        them more than once only when fewer than ``batch_size * local_steps`` are there
        (1: each once).
    b_min : int
        The smallest batch worth a step.
    deadline_s : float
        How long the device may wait for samples.
    proximal_mu : float
        FedProx term; 0: plain local SGD.
    compress, compress_ratio
        How the update travels (:mod:`edge_client.wire.codec`).
    inject_mix : float
        Fraction of each batch drawn from the device's injection pool.
    inject_publish, inject_beta, inject_budget
        Picked this round to share a fraction ``inject_beta`` of the samples it trains on,
        in at most ``inject_budget`` bytes.
    time_spread : float
        ``s`` in [0, 1): alternate steps train ``(1 - s) * b`` and ``(1 + s) * b`` samples
        (the same ``b * K`` in all) and the reply times each size, so that the controller
        learns the slope of the device's step time from one round; 0: every step at ``b``.
    dp_clip : float
        Differential privacy: the L2 norm the sent update (delta plus error-feedback
        residual, as decoded) is clipped to; 0: no clip.
    dp_noise : float
        Local differential privacy: the device adds Gaussian noise of ``dp_noise x dp_clip``
        to its clipped update before coding it; 0: none (central DP adds it at the
        aggregator).
    secagg_weighting : str
        Secure aggregation (:mod:`edge_client.wire.masking`): what the device multiplies its
        update by before quantising it: ``steps`` (1 / its local steps: fednova, adaptive),
        ``samples`` (its samples x ``secagg_weight_scale``: fedavg), ``equal`` (1, after the
        DP clip); empty: the update travels as a codec frame.
    secagg_weight_scale : float
        ``samples``: the scale that keeps a device's weight at most 1.
    secagg_range, secagg_bits : float, int
        The shared range each coordinate is clipped to, and the grid's bits.
    model_layout : str
        The layout of the packed model in ``arrays`` (:func:`model_layout`); empty: the
        record holds the tensors by name.
    format_version : int
        The record layout.
    """

    batch_size: int
    local_steps: int
    lr: float
    server_round: int = 0
    wait_policy: str = default("wait_policy")
    max_passes: int = default("max_passes")
    b_min: int = default("b_min")
    deadline_s: float = 60.0
    proximal_mu: float = 0.0  # off
    compress: str = "none"
    compress_ratio: float = default("compress_ratio")
    inject_mix: float = 0.0  # off: no batch drawn from the pool
    inject_publish: bool = False
    inject_beta: float = default("inject_beta")
    inject_budget: int = 0  # off: nothing shared
    time_spread: float = 0.0  # off: every step at batch_size
    dp_clip: float = 0.0  # off: no clip
    dp_noise: float = 0.0  # off: no noise on the device
    secagg_weighting: str = ""  # off: a codec frame
    secagg_weight_scale: float = 0.0
    secagg_range: float = 0.0
    secagg_bits: int = 0
    model_layout: str = ""  # tensors by name
    format_version: int = RECORD_VERSION

    #: Fields that carry a run-config setting: checked as the run config checks it.
    _SETTINGS: ClassVar[tuple[str, ...]] = (
        "local_steps",
        "lr",
        "wait_policy",
        "max_passes",
        "b_min",
        "proximal_mu",
        "compress_ratio",
        "inject_mix",
        "inject_beta",
        "inject_budget",
    )

    def __post_init__(self) -> None:
        for name in self._SETTINGS:
            check_setting(name, getattr(self, name))
        if self.batch_size < 1:
            raise ValueError(f"batch-size must be >= 1, got {self.batch_size}")
        if self.compress not in CODEC_MODES:
            raise ValueError(f"compress must be one of {CODEC_MODES}, got {self.compress!r}")
        if self.deadline_s < 0:
            raise ValueError(f"deadline-s must be >= 0, got {self.deadline_s}")
        if not 0.0 <= self.time_spread < 1.0:
            raise ValueError(f"time-spread must be in [0, 1), got {self.time_spread}")
        if self.dp_clip < 0 or self.dp_noise < 0 or (self.dp_noise > 0 and self.dp_clip == 0):
            raise ValueError(
                f"dp-clip and dp-noise must be >= 0, noise only with a clip; got "
                f"{self.dp_clip}, {self.dp_noise}"
            )
        if self.secagg_weighting and (
            self.secagg_weighting not in SECAGG_WEIGHTINGS
            or self.secagg_range <= 0
            or not 2 <= self.secagg_bits <= 48
        ):
            raise ValueError(
                f"secure aggregation: weighting {self.secagg_weighting!r} (one of "
                f"{SECAGG_WEIGHTINGS}), range {self.secagg_range} (> 0), bits "
                f"{self.secagg_bits} (2..48)"
            )

    def samples_to_wait_for(self) -> int:
        """How many buffered samples the device waits for before it trains (the wait rule).

        ``wait``: the whole plan, ``batch_size * local_steps``; ``adapt``: the least worth
        training, ``min(b_min, batch_size) * local_steps``; either over ``max_passes`` (each
        fresh sample trained on up to that many times), rounded up. The device waits at most
        ``deadline_s`` and trains on what it has then.
        """
        per_step = (
            self.batch_size if self.wait_policy == "wait" else min(self.b_min, self.batch_size)
        )
        return -(-per_step * self.local_steps // self.max_passes)  # rounded up

    def to_record(self) -> ConfigRecord:
        """The ``config`` record that carries the plan (a fresh one each call)."""
        return ConfigRecord(to_mapping(self))


@dataclass(frozen=True)
class ReplyMetrics(_Record):
    """What a device reports with its update (the ``metrics`` record).

    Attributes
    ----------
    num_examples : int
        Samples trained on, a sample trained twice counted twice (0: the device trained
        nothing this round).
    fresh_samples : int, optional
        Own samples it took from its buffer and trained on, each counted once: below
        ``num_examples`` less ``inject_used`` when its stream brought fewer than the plan
        and it trained over them more than once (``max-passes``); None from a device of a
        fedstream before it was reported.
    batch_size, local_steps : int
        The batch and the steps it actually trained.
    step_s : float
        Median steady-state seconds per step (no imports, warm-up or waiting); under a
        plan's ``time_spread``, the mean of the two sizes' medians (the time at the batch).
    step_batches, step_times : list, optional
        Under a plan's ``time_spread``: the step sizes trained and each one's median
        seconds per step (the controller's slope); None otherwise.
    train_loss : float
        Mean training loss (NaN when nothing was trained).
    train_diverged : int
        1 when training diverged this round: its loss was not finite, or above
        :data:`~edge_client.wire.constants.DIVERGED_LOSS_RATIO` times the first loss the
        device measured in the run (its model as received, before its first step). The
        reply then carries no update (an empty frame): the aggregator keeps its scores and
        refuses its update (``diverged``).
    lr : float
        The learning rate it trained with: the plan's, scaled by the batch it trained over
        the planned batch when that was smaller (0 when nothing was trained).
    compute_s : float
        Steady-state compute of the round (``step_s * local_steps``).
    wait_s : float
        Seconds spent waiting for samples.
    stream_rate : float
        The buffer's arrival-rate EWMA, samples/s.
    buffer_fill, buffer_dropped : int
        Samples buffered after training; samples the buffer's policy dropped so far.
    bytes_up : int
        Size of the update frame.
    compress_gap : float, optional
        EWMA of the top-k gap (ScaDLES' adaptive rule), once known.
    inject_used : int
        Samples of ``num_examples`` drawn from the injection pool.
    inject_opt_in : int
        1 when the device takes part in data injection.
    inject_bytes, inject_samples : int
        What it queued for sharing this round.
    dp_within_clip : int
        Under the plan's ``dp_clip``: 1 when the update was within the clip before clipping
        (adaptive clipping counts these, with noise), else 0.
    eval_metric, eval_loss : float
        Prequential evaluation (test, then train): the task's metric and loss of the global
        model it received, on the samples of its own stream it then trained on (NaN when
        it evaluated none).
    eval_count : int
        How many samples that is (injected samples are never evaluated).
    eval_s : float
        Seconds the evaluation took (not part of ``compute_s``).
    sample_shape : list of int, optional
        The shape of the samples its buffer holds (the aggregator refuses an update for
        another shape than the run's ``sample-shape``).
    start_s : float
        Where the ClientApp process's time went, in wall seconds: from its start to the
        handler (interpreter, Flower, imports, loading the app, receiving the message) ...
    setup_s : float
        ... reading the settings, building the model, opening the buffer ...
    take_s : float
        ... taking and preparing the samples (waiting for them is ``wait_s``) ...
    train_s : float
        ... the local steps, warm-up and emulated slowdown included (``eval_s`` before
        them) ...
    encode_s : float
        ... the delta, its encoding, the device state and injection after training.
    handler_s : float
        The handler from entry to reply (every part above but ``start_s``).
    cpu_s : float
        CPU seconds of the ClientApp process, start included.
    peak_rss : int
        Peak resident bytes of the ClientApp process.
    write_bytes : int
        Bytes the ClientApp process sent to storage (the buffer file, its WAL).
    drift_changes : int
        Rises of the prequential error the device's drift watcher has detected so far
        (:mod:`edge_client.runtime.drift_watch`; 0 without a watcher).
    agent_cpu_s : float
        CPU seconds the device's agent spent on this message (0: trained in the ClientApp's
        own process, which ``cpu_s`` then covers).
    agent_peak_rss : int
        Peak resident bytes of the agent (0 without one).
    """

    num_examples: int
    batch_size: int
    step_s: float
    train_loss: float
    local_steps: int = 0
    lr: float = 0.0
    compute_s: float = 0.0
    wait_s: float = 0.0
    stream_rate: float = 0.0
    buffer_fill: int = 0
    buffer_dropped: int = 0
    bytes_up: int = 0
    compress_gap: float | None = None
    inject_used: int = 0
    fresh_samples: int | None = None
    inject_opt_in: int = 0
    inject_bytes: int = 0
    inject_samples: int = 0
    dp_within_clip: int = 0
    eval_metric: float = math.nan
    eval_loss: float = math.nan
    eval_count: int = 0
    eval_s: float = 0.0
    sample_shape: list[int] | None = None
    start_s: float = 0.0
    setup_s: float = 0.0
    take_s: float = 0.0
    train_s: float = 0.0
    encode_s: float = 0.0
    handler_s: float = 0.0
    cpu_s: float = 0.0
    peak_rss: int = 0
    write_bytes: int = 0
    drift_changes: int = 0
    train_diverged: int = 0
    agent_cpu_s: float = 0.0
    agent_peak_rss: int = 0
    step_batches: list[int] | None = None
    step_times: list[float] | None = None

    def timings(self) -> list[tuple[int, float]]:
        """The ``(batch, seconds per step)`` pairs this reply measured: each size of a
        spread round, else the one batch it trained (none when it trained nothing)."""
        if self.step_batches and self.step_times and len(self.step_batches) == len(self.step_times):
            return list(zip(self.step_batches, self.step_times, strict=True))
        return [(self.batch_size, self.step_s)] if self.num_examples > 0 else []

    def costs(self) -> list[tuple[int, float]]:
        """The controller's ``(batch, seconds per step)`` pairs: :meth:`timings`, each with
        the prequential evaluation's cost of its samples (``eval_s / eval_count`` a sample,
        ``batch`` samples a step) added.

        Every sample a step trains on is scored once before training, so a device's round
        costs its steps and the scoring of their samples, both in proportion to the batch;
        balancing the steps alone leaves the devices with the largest batches (the fastest)
        scoring while the others wait. Under ``max-passes`` > 1 a starved stream's samples
        are scored once and trained up to P times, so this overstates its scoring (it is
        capped by its stream then anyway).
        """
        per_sample = self.eval_s / self.eval_count if self.eval_count > 0 else 0.0
        if not (math.isfinite(per_sample) and per_sample > 0):
            per_sample = 0.0
        return [(b, t + per_sample * b) for b, t in self.timings()]

    def to_record(self) -> MetricRecord:
        """The ``metrics`` record (an unknown gap is left out)."""
        return MetricRecord(to_mapping(self))

    @classmethod
    def amend(cls, content: RecordDict, **values: float) -> None:
        """Set fields of a reply's ``metrics`` record in place (by field name), where the
        reply has one: what the process that returns a reply knows and the one that built
        it did not (the device agent builds it, the ClientApp returns it)."""
        record = content.metric_records.get(METRICS)
        if record is None:
            return
        names = {f.name for f in fields(cls)}
        for name, value in values.items():
            if name not in names:
                raise ValueError(f"ReplyMetrics has no field {name!r}")
            record[kebab(name)] = value


@dataclass(frozen=True)
class ProbePlan(_Record):
    """A timing probe (the ``config`` record of a query): time ``steps`` SGD steps of the
    run's model at each batch in ``batches``."""

    batches: list[int]
    steps: int
    format_version: int = RECORD_VERSION

    def __post_init__(self) -> None:
        if not self.batches or min(self.batches) < 1:
            raise ValueError(f"probe batches must be >= 1, got {self.batches}")
        if self.steps < 1:
            raise ValueError(f"probe steps must be >= 1, got {self.steps}")

    def to_record(self) -> ConfigRecord:
        """The ``config`` record of the query."""
        return ConfigRecord(to_mapping(self))


@dataclass(frozen=True)
class ProbeReply:
    """A device's answer to a probe: the median seconds per step at each probed batch."""

    device_id: str
    batches: list[int]
    step_s: list[float]

    def to_content(self) -> RecordDict:
        """The reply's records, as a ClientApp returns them."""
        timings = MetricRecord({kebab("batches"): self.batches, kebab("step_s"): self.step_s})
        return RecordDict(
            {METRICS: timings, DEVICE: ConfigRecord(to_mapping(_DeviceTag(self.device_id)))}
        )

    @classmethod
    def from_content(cls, content: RecordDict) -> ProbeReply:
        """Read a probe reply.

        Raises
        ------
        RecordError
            If a record or key is missing or ill-typed, the lists differ in length, or the
            reply is of a newer format.
        """
        tag = _read(_DeviceTag, _record(content, DEVICE, ConfigRecord))
        timings = _record(content, METRICS, MetricRecord)
        try:
            batches = [int(b) for b in timings[kebab("batches")]]  # type: ignore[union-attr]
            step_s = [float(t) for t in timings[kebab("step_s")]]  # type: ignore[union-attr]
        except (KeyError, TypeError, ValueError) as err:
            raise RecordError("malformed", f"ProbeReply: {err}") from err
        if len(batches) != len(step_s):
            raise RecordError("malformed", "ProbeReply: batches and step-s differ in length")
        return cls(tag.device_id, batches, step_s)

    def compute_s(self, steps: int) -> float:
        """The seconds the probe trained for on the device: at each batch, a warm-up step
        and ``steps`` timed ones, at the median step time it reported."""
        return (steps + 1) * sum(self.step_s)


@dataclass(frozen=True)
class _DeviceTag:
    """The ``device`` record: who replies, in which layout."""

    device_id: str
    format_version: int = RECORD_VERSION

    def __post_init__(self) -> None:
        validate_device_id(self.device_id)


@dataclass(frozen=True)
class _Update:
    """The ``update`` record: the codec frame."""

    frame: bytes


@dataclass(frozen=True)
class DeviceReply:
    """A device's reply to its round plan: its id, its metrics and its update frame."""

    device_id: str
    metrics: ReplyMetrics
    frame: bytes

    def to_content(self) -> RecordDict:
        """The reply's records, as a ClientApp returns them."""
        return RecordDict(
            {
                UPDATE: ConfigRecord(to_mapping(_Update(self.frame))),
                METRICS: self.metrics.to_record(),
                DEVICE: ConfigRecord(to_mapping(_DeviceTag(self.device_id))),
            }
        )

    @classmethod
    def from_content(cls, content: RecordDict) -> DeviceReply:
        """Read a reply (the frame itself is checked by the codec).

        Raises
        ------
        RecordError
            If a record or key is missing, ill-typed, or of a newer format.
        """
        tag = _read(_DeviceTag, _record(content, DEVICE, ConfigRecord))
        metrics = ReplyMetrics.from_record(_record(content, METRICS, MetricRecord))
        return cls(
            tag.device_id, metrics, _read(_Update, _record(content, UPDATE, ConfigRecord)).frame
        )


def _record(content: RecordDict, name: str, kind: type[R]) -> R:
    """The record ``name`` of a message, of type ``kind`` (indexing the RecordDict itself:
    its typed views are rebuilt at each access, a cost per reply on the aggregator)."""
    record = content.get(name)
    if not isinstance(record, kind):
        raise RecordError("malformed", f"the reply lacks its {name!r} record ({kind.__name__})")
    return record


_VERSION_KEY = kebab("format_version")


def _read(cls: type[T], record: Mapping[str, Any]) -> T:
    """A record from its mapping, or a RecordError that says what is wrong."""
    name = cls.__name__.strip("_")
    try:
        version = int(record.get(_VERSION_KEY, 1))
    except (TypeError, ValueError, OverflowError) as err:
        raise RecordError("malformed", f"{name}: {_VERSION_KEY}: {err}") from err
    if version > RECORD_VERSION:
        raise RecordError(
            "newer-format",
            f"{name} of format {version}; this side reads up to {RECORD_VERSION}: "
            "upgrade fedstream here",
        )
    try:
        return from_mapping(cls, {**record, _VERSION_KEY: version})  # absent: version 1
    except ValueError as err:  # MappingError included
        raise RecordError("malformed", f"{name}: {err}") from err
