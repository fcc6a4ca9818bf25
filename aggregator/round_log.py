"""What the aggregator records per round: one :class:`RoundRecord` per line of
``metrics.jsonl``.

Each device's entry is its reply's metrics exactly as the device reported them (keys of
:class:`~edge_client.wire.records.ReplyMetrics`, ``bytes-up`` as received), nothing renamed
on the way. Round-level keys are the fields below in kebab case.

A line carries its ``format-version``, and older lines are read as if written now, so a run
resumed across an upgrade keeps one readable ``metrics.jsonl``:

- format 0 (no version) renamed the device keys on the way (``batch`` for ``batch-size``,
  ``rate`` for ``stream-rate``, ...);
- formats 0 and 1 had only the aggregator's own evaluation, as ``accuracy`` and ``loss``:
  it is read as ``test-accuracy`` and ``test-loss`` (the prequential ``accuracy`` is NaN).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edge_client.wire.mapping import MappingError, from_mapping, kebab, to_mapping
from edge_client.wire.records import ReplyMetrics

__all__ = [
    "FORMAT_VERSION",
    "HOME_ENV",
    "METRICS_FILE",
    "PROBE_ROUND",
    "RoundRecord",
    "RoundTiming",
    "UpdateInfo",
    "append_record",
    "divergence_hint",
    "read_metrics",
    "read_rotated",
    "rotate",
    "rounds_only",
    "runs_home",
    "virtual_round_s",
]

#: The layout of a line of ``metrics.jsonl``.
FORMAT_VERSION = 2

#: A run's records, in its ``out-dir``.
METRICS_FILE = "metrics.jsonl"

#: The ``round`` of the timing probe's record: the exchange before round 1 (the batch
#: controller's probe of each device's step time), charged on the clock like a round, so
#: that a run's time counts from 0. Only a fresh run that probes has one.
PROBE_ROUND = 0

#: Where runs Flower starts keep their ``out-dir`` by default: ``$FEDSTREAM_HOME/runs/<id>``.
HOME_ENV = "FEDSTREAM_HOME"
_DEFAULT_HOME = "~/.fedstream"


def runs_home() -> Path:
    """The folder that holds each Flower-started run's default ``out-dir``, one per run id:
    ``$FEDSTREAM_HOME/runs`` (``~/.fedstream/runs``) on the machine the ServerApp runs on."""
    return Path(os.environ.get(HOME_ENV) or _DEFAULT_HOME).expanduser() / "runs"


# Format 0 named these device keys differently: old key -> ReplyMetrics field.
_FORMAT_0_DEVICE_KEYS = {
    "batch": "batch_size",
    "steps": "local_steps",
    "rate": "stream_rate",
    "fill": "buffer_fill",
    "dropped": "buffer_dropped",
    "bytes": "bytes_up",
    "loss": "train_loss",
    "gap": "compress_gap",
}


@dataclass(frozen=True)
class UpdateInfo:
    """One update as an asynchronous aggregation took it (``updates`` of its record).

    Attributes
    ----------
    device : str
        Who trained it.
    base_version : int
        The model version it was trained from.
    staleness : int
        Versions applied between that one and the aggregation.
    weight : float
        Its staleness weight.
    num_examples : int
        Samples it was trained on.
    """

    device: str
    base_version: int
    staleness: int
    weight: float
    num_examples: int


@dataclass(frozen=True)
class RoundTiming:
    """Where a synchronous round's wall time went on the aggregator; the parts add up to
    the round's ``wall-s``.

    Attributes
    ----------
    plan_s : float
        Planning the round: its nodes, batches, injection and messages.
    replies_s : float
        From pushing the messages to pulling the last reply (the devices' time, and
        Flower's); replies are read, decoded and added as they come, within this time.
    aggregate_s : float
        From the last reply's pull to the new model: the last updates read and added.
    eval_s : float
        Scoring the new model on ``eval-data``.
    checkpoint_s : float
        Writing the checkpoint.
    export_s : float
        Writing a model export (rounds that make one: ``export-every``).
    secagg_s : float
        Secure aggregation's stages after training (share keys, masked input, unmask: their
        exchanges and the aggregator's unmasking); 0 without it.
    """

    plan_s: float = 0.0
    replies_s: float = 0.0
    aggregate_s: float = 0.0
    eval_s: float = 0.0
    checkpoint_s: float = 0.0
    export_s: float = 0.0
    secagg_s: float = 0.0

    @property
    def total(self) -> float:
        """The parts' sum."""
        return (
            self.plan_s
            + self.replies_s
            + self.aggregate_s
            + self.eval_s
            + self.checkpoint_s
            + self.export_s
        )


@dataclass(frozen=True)
class RoundRecord:
    """One round as ``metrics.jsonl`` holds it.

    Attributes
    ----------
    round : int
        The server round.
    accuracy, loss : float
        Prequential evaluation: the devices' scores of the model they received this round
        on the samples they then trained on, weighted by samples (NaN without any).
        ``accuracy`` holds the task's metric (named by ``metric``).
    eval_count : int
        The samples behind ``accuracy``.
    test_accuracy, test_loss : float
        The aggregator's evaluation of the new model on ``eval-data`` (NaN without).
    metric : str
        The task's metric.
    higher_is_better : bool
        Whether a higher ``metric`` is better (accuracy) or worse (a forecast's error).
    test_by_group : dict of str to float
        The aggregator's score of the new model on each group of ``eval-data``
        (``eval-group-by``: e.g. each held-out person), empty without.
    global_batch, sum_b : int
        B, and the sum of the planned batches (less than B when streams cap them).
    lr_scale : float
        The learning-rate scale of the plan.
    planned : dict of str to int
        Planned batch per device.
    devices : dict of str to ReplyMetrics
        What each device that replied reported.
    failed, rejected : dict of str to int
        Failures (error or no reply) and refusals per device, counted over the run.
    rejected_reasons : dict of str to int
        Refusals per reason, over the run.
    compress : str
        The round's codec mode.
    aggregation : str
        The aggregation rule.
    aggregated : list of str
        Devices whose update went into the model.
    bytes_up, broadcast_bytes : int
        Update frames received; one copy of the model sent down.
    inject_picked : list of str
        Devices asked to share samples.
    inject_bytes : int
        Bytes they queued for sharing.
    virtual_s : float
        The round on the virtual clock: the slowest device's model download + wait +
        compute + update upload, and the aggregator's aggregation and evaluation (on the
        in-process runner, the grid's clock over the round; elsewhere the slowest reply's
        compute + wait + upload). The timing probe's record (``round`` 0,
        :data:`PROBE_ROUND`) holds the probe's time: the records of a run sum to its clock.
    wall_s, run_wall_s : float
        The round's wall time, and the run's so far.
    mode : str
        ``sync``, or ``async``: then ``round`` is the model version this aggregation made,
        ``devices`` holds each contributing device's latest reply, ``bytes-up`` every
        update's frame, and ``virtual-s`` the time since the previous aggregation (virtual
        on the in-process runner, else wall).
    updates : list of UpdateInfo
        Asynchronous mode: every update the aggregation took, in arrival order.
    in_flight : int
        Asynchronous mode: messages out without a reply when the aggregation was made.
    timing : RoundTiming
        Where the round's wall time went on the aggregator (synchronous rounds; an
        asynchronous aggregation has only its checkpoint).
    latency : dict of str to float
        Per device, seconds from pushing its message to pulling its reply: Flower's
        delivery, the ClientApp process (its reply's ``start-s`` + ``handler-s``) and the
        reply's way back.
    skipped : str
        Why the round's updates were not applied (the model is kept): ``no-replies``,
        ``too-few-fresh-samples`` (fewer than ``min-fresh-samples`` trained on in all), or
        ``diverged`` (that, because training diverged on the other devices); empty for a
        round that moved the model.
    skipped_rounds : dict of str to int
        Skipped rounds per reason, over the run.
    diverged : int
        Devices whose training diverged this round: their updates refused as ``diverged``
        (their replies are in ``devices``, with ``train-diverged``) or ``non-finite`` (an
        update holding NaN or Inf), counted in ``rejected-reasons`` too.
    diverged_rounds : int
        Rounds in a row, up to this one, in which some device's training diverged (the run
        ends with an error when it reaches ``max-diverged-rounds``).
    exported : int
        The model version exported after this round (``export-dir``), 0 for none.
    drift : dict of str to int
        Devices that reported a change in their stream this round
        (:mod:`aggregator.drift_reaction`), with the number of changes each has detected so far.
    live : int
        Live devices before ``fraction-train``'s draw (``planned`` holds those drawn).
    weight_ratio : float, optional
        ``aggregation = "adaptive"``: the ratio ``r`` (samples) each update was weighted by,
        ``n / (n + r)`` for ``n`` samples (:mod:`aggregator.heterogeneity`): 0 weighs every
        device the same (skewed streams, or no estimate yet), 1e9 weighs by samples (alike
        streams); None under another rule, or under differential privacy (equal weights).
    dp_epsilon_spent : float, optional
        Differential privacy: the epsilon spent at ``dp-delta`` after this round, by the
        RDP accountant (:mod:`aggregator.privacy`); None without DP.
    dp_clip : float
        Differential privacy: the clip of this round (adaptive clipping moves it); 0: off.
    dp_clipped_here : int
        Central DP: updates that decoded over the clip (the aggregator clipped them).
    secagg_survivors, secagg_dropped : int, optional
        Secure aggregation (:mod:`aggregator.secure_round`): devices whose update is in the
        sum, and devices that trained but were lost or refused at a later stage (before
        their masked input: not in the sum; after it: in it); None without it.
    secagg_bytes_up, secagg_bytes_down : int
        Secure aggregation's payload bytes: keys, sealed shares and masked vectors up (the
        whole of the round's ``bytes-up`` then: no update frame travels); neighbours' keys
        and shares down.
    secagg_device_cpu_s : float
        CPU seconds a device spent on the stages after training (mean over those that
        answered).
    secagg_unmask_s : float
        The aggregator's CPU seconds rebuilding secrets and taking the masks off.
    planned_count, replied_count, aggregated_count : int
        The round's counts: devices planned, devices that replied, updates in the model
        (the sizes of ``planned``, ``devices`` and ``aggregated``; the only trace of them in
        a record whose devices are hidden).
    devices_hidden : bool
        Differential privacy without ``dp-device-records``: the record carries no device's
        identity or figure (``planned``, ``devices``, ``failed``, ``rejected``,
        ``aggregated``, ``latency``, ``drift``, ``updates`` empty), only the counts above
        (:meth:`without_devices`).
    format_version : int
        The line's layout (:data:`FORMAT_VERSION`).
    """

    round: int
    accuracy: float
    loss: float
    global_batch: int
    sum_b: int
    lr_scale: float
    planned: dict[str, int]
    devices: dict[str, ReplyMetrics]
    failed: dict[str, int]
    rejected: dict[str, int]
    rejected_reasons: dict[str, int]
    compress: str
    aggregation: str
    aggregated: list[str]
    bytes_up: int
    broadcast_bytes: int
    inject_picked: list[str]
    inject_bytes: int
    virtual_s: float
    wall_s: float
    run_wall_s: float = 0.0
    eval_count: int = 0
    test_accuracy: float = math.nan
    test_loss: float = math.nan
    metric: str = "accuracy"
    higher_is_better: bool = True
    test_by_group: dict[str, float] = field(default_factory=dict)
    mode: str = "sync"
    updates: list[UpdateInfo] = field(default_factory=list)
    in_flight: int = 0
    timing: RoundTiming = field(default_factory=RoundTiming)
    latency: dict[str, float] = field(default_factory=dict)
    skipped: str = ""
    skipped_rounds: dict[str, int] = field(default_factory=dict)
    diverged: int = 0
    diverged_rounds: int = 0
    exported: int = 0
    drift: dict[str, int] = field(default_factory=dict)
    live: int = 0
    weight_ratio: float | None = None
    dp_epsilon_spent: float | None = None
    dp_clip: float = 0.0
    dp_clipped_here: int = 0
    secagg_survivors: int | None = None
    secagg_dropped: int | None = None
    secagg_bytes_up: int = 0
    secagg_bytes_down: int = 0
    secagg_device_cpu_s: float = 0.0
    secagg_unmask_s: float = 0.0
    planned_count: int = 0
    replied_count: int = 0
    aggregated_count: int = 0
    devices_hidden: bool = False
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if not self.devices_hidden:  # the counts are the sizes (older lines had none)
            object.__setattr__(self, "planned_count", len(self.planned))
            object.__setattr__(self, "replied_count", len(self.devices))
            object.__setattr__(self, "aggregated_count", len(self.aggregated))

    def without_devices(self) -> RoundRecord:
        """The record as a differentially private run publishes it: every device's
        identity and figure left out, the round's counts kept (``devices-hidden``).

        Which devices took part, their batches, step times, fills, latencies and failures
        are not covered by the noise; published, they would also let a reader see who was
        drawn, which the accountant's amplification by sampling assumes nobody can.
        """
        return replace(
            self,
            planned={},
            devices={},
            failed={},
            rejected={},
            aggregated=[],
            inject_picked=[],
            latency={},
            drift={},
            updates=[],
            devices_hidden=True,
        )

    @property
    def sum_trained(self) -> int:
        """Sum of the batches the devices actually trained (below ``sum_b`` when a device
        trained less than planned; each such device scaled its learning rate to match)."""
        return sum(m.batch_size for m in self.devices.values() if m.num_examples > 0)

    def divergence(self) -> str:
        """How many of the round's devices training diverged on, as a phrase (``the model
        diverged on 3 of 4 devices``; empty when none did). The devices are those that
        replied with their training: in ``devices`` (a diverged one with
        ``train-diverged``), or refused for an update holding NaN or Inf."""
        if not self.diverged:
            return ""
        if self.devices_hidden:
            return f"the model diverged on {self.diverged} devices"
        flagged = sum(1 for m in self.devices.values() if m.train_diverged)
        replied = len(self.devices) + self.diverged - flagged
        return f"the model diverged on {self.diverged} of {replied} devices"

    def progress(self, num_rounds: int = 0, asked: int = 0) -> str:
        """The record as one progress line (what the ServerApp logs, so that ``flwr run
        --stream`` and ``flwr log`` show it).

        Parameters
        ----------
        num_rounds : int
            The run's rounds (0: continuous, shown without a total).
        asked : int
            Devices asked to train (0: not shown).

        Examples
        --------
        ``round 3/10: accuracy 0.812 (prequential, 512 samples), 0.800 on eval-data;
        4 of 4 devices, 1.20 MB up, model 0.40 MB; 13.1 s``
        """
        what = "version" if self.mode == "async" else "round"
        head = f"{what} {self.round}" + (f"/{num_rounds}" if num_rounds else "")
        score = (
            f"{self.metric} {self.accuracy:.3f} (prequential, {self.eval_count} samples)"
            if math.isfinite(self.accuracy)
            else f"{self.metric} n/a (no samples scored)"
        )
        if math.isfinite(self.test_accuracy):
            score += f", {self.test_accuracy:.3f} on eval-data"
        if self.mode == "async":
            staleness = "/".join(str(u.staleness) for u in self.updates)
            who = f"{len(self.updates)} updates (staleness {staleness or '-'})"
        else:
            who = f"{self.replied_count}" + (f" of {asked}" if asked else "") + " devices"
        traffic = f"{self.bytes_up / 1e6:.2f} MB up, model {self.broadcast_bytes / 1e6:.2f} MB"
        tail = f"; skipped: {self.skipped}" if self.skipped else ""
        drift = f"; drift on {', '.join(sorted(self.drift))}" if self.drift else ""
        broke = f"; diverged on {self.diverged}" if self.diverged else ""
        return f"{head}: {score}; {who}, {traffic}; {self.wall_s:.1f} s{drift}{broke}{tail}"

    def to_json(self) -> str:
        """The record as one line of ``metrics.jsonl`` (strict JSON: NaN, a score over no
        samples, is written as ``null`` and read back as NaN)."""
        return json.dumps(_finite(to_mapping(self)), allow_nan=False)

    @classmethod
    def from_json(cls, line: str) -> RoundRecord:
        """Read one line of ``metrics.jsonl``.

        Raises
        ------
        ValueError
            If the line is not a round record.
        """
        try:
            data = json.loads(line)
            version = int(data.get(kebab("format_version"), 0))
            if version > FORMAT_VERSION:
                raise ValueError(
                    f"format {version}; this fedstream reads up to {FORMAT_VERSION}: upgrade it"
                )
            if version == 0:
                data = _from_format_0(data)
            if version < 2:
                data = _from_format_1(data)
            return from_mapping(cls, {**data, kebab("format_version"): FORMAT_VERSION})
        except (MappingError, json.JSONDecodeError, TypeError, AttributeError) as err:
            raise ValueError(f"not a round record: {err}") from err


def _from_format_0(data: dict[str, Any]) -> dict[str, Any]:
    """A format-0 line (device keys renamed on the way) as the current format."""
    devices = {
        device: {
            kebab(_FORMAT_0_DEVICE_KEYS.get(key, key.replace("-", "_"))): value
            for key, value in entry.items()
            if value is not None
        }
        for device, entry in data.get(kebab("devices"), {}).items()
    }
    return {**data, kebab("devices"): devices}


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _from_format_1(data: dict[str, Any]) -> dict[str, Any]:
    """A format-0 or 1 line as the current format: its ``accuracy`` and ``loss`` were the
    aggregator's own evaluation."""
    return {
        **data,
        kebab("test_accuracy"): data.get("accuracy", math.nan),
        kebab("test_loss"): data.get("loss", math.nan),
        "accuracy": math.nan,
        "loss": math.nan,
    }


def divergence_hint(lr: float) -> str:
    """What to change when training diverges, for a run at learning rate ``lr``."""
    return f"lower lr (now {lr:g}) or standardise the inputs"


def virtual_round_s(replies: Iterable[ReplyMetrics], uplink_mbps: float) -> float:
    """A synchronous round on the virtual clock: the slowest device's time.

    Parameters
    ----------
    replies : iterable of ReplyMetrics
        The round's replies.
    uplink_mbps : float
        The uplink the update frames are charged at, Mbit/s.

    Returns
    -------
    float
        The largest ``compute-s + wait-s + bytes-up * 8 / uplink``, seconds (0 without
        replies).
    """
    return max(
        (m.compute_s + m.wait_s + m.bytes_up * 8 / (uplink_mbps * 1e6) for m in replies),
        default=0.0,
    )


def append_record(path: Path, record: RoundRecord, max_bytes: int = 0, keep: int = 3) -> None:
    """Append a round to ``metrics.jsonl``.

    With ``max_bytes``, a file that has reached that size is first rotated as loggers do:
    ``metrics.jsonl`` becomes ``metrics.jsonl.1``, ``.1`` becomes ``.2``, and so on, and
    files past ``keep`` are removed, so a run that never ends keeps its log bounded.
    """
    if max_bytes > 0 and path.exists() and path.stat().st_size >= max_bytes:
        rotate(path, keep)
    with path.open("a") as fh:
        fh.write(record.to_json() + "\n")


def rounds_only(records: Iterable[RoundRecord]) -> list[RoundRecord]:
    """The records of rounds (asynchronous mode: aggregations), the timing probe's left out:
    what per-round series and counts are made of. Times summed over a run take them all."""
    return [r for r in records if r.round != PROBE_ROUND]


def read_rotated(path: Path) -> list[RoundRecord]:
    """The rounds of ``metrics.jsonl`` and the rotated files that are still there
    (``metrics.jsonl.N`` ... ``.1``, oldest first), in order.

    Raises
    ------
    ValueError
        If a line is not a round record.
    """
    rotated = sorted(
        (p for p in path.parent.glob(f"{path.name}.*") if p.suffix[1:].isdigit()),
        key=lambda p: -int(p.suffix[1:]),
    )
    return [r for p in [*rotated, path] for r in read_metrics(p)]


def rotate(path: Path, keep: int) -> None:
    """Shift ``path`` to ``path.1`` (and each ``path.N`` to ``path.N+1``), keeping ``keep``
    rotated files (0: the current file is removed)."""
    if keep <= 0:
        path.unlink(missing_ok=True)
        return
    path.with_name(f"{path.name}.{keep}").unlink(missing_ok=True)
    for n in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{n + 1}"))
    path.replace(path.with_name(f"{path.name}.1"))


def read_metrics(path: Path) -> list[RoundRecord]:
    """The rounds of a ``metrics.jsonl`` (none when the file does not exist yet).

    A last line still being written (no newline yet) is left for the next read.

    Raises
    ------
    ValueError
        If a line is not a round record (the message gives its number).
    """
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()
    records = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                records.append(RoundRecord.from_json(line))
            except ValueError as err:
                raise ValueError(f"{path}:{number}: {err}") from err
    return records
