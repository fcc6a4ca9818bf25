"""The fedstream strategy: a plan per device out, validated and weighted updates in.

It follows Flower's ``Strategy`` (``configure_train`` builds the round's messages,
``aggregate_train`` turns the replies into the next global model) with what fedstream adds:

* each device gets its own plan (:class:`~edge_client.wire.records.RoundPlan`, a fresh
  record per message): its batch from the controller (OmniLearn, capped by what its stream
  can deliver: ScaDLES), the round's codec mode, whether it shares samples for injection;
* everything is keyed by ``device-id`` (:class:`~aggregator.device_registry.FleetRegistry`);
* each update arrives as a codec frame (a delta against the round's global model) and is
  decoded, checked and fed to the run's accumulator (:mod:`aggregator.aggregation`) before
  the next is read: error replies, malformed replies, devices whose samples are not of the
  run's ``sample-shape``, devices whose training diverged (``diverged``: they say so, and
  send no update) and refused frames (a NaN or Inf update is ``non-finite``, a divergence
  too) are left out and counted per device and per reason;
* each reply's prequential scores (the received model on the samples then trained on)
  are averaged, weighted by samples, into the round's accuracy;
* ``aggregate_train`` returns the new model and a :class:`RoundReport` of the round.

In asynchronous mode (:mod:`aggregator.asynchronous`) the same pieces serve one message at a
time: :meth:`StreamStrategy.plan_async` plans the fleet once per model version,
:meth:`StreamStrategy.configure_async` gives one node its work, and
:meth:`StreamStrategy.read_update` reads and checks one reply (the loop buffers the update).

It does not derive from Flower's ``Strategy``: that fixes ``aggregate_train``'s second
result to a MetricRecord of averaged numbers, and the round report holds per-device records.
fedstream's ServerApp (:mod:`aggregator.server_app`) runs the rounds itself.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from aggregator.aggregation import AdaptiveMean, make_accumulator
from aggregator.compression import round_mode
from aggregator.controller import BatchController, Plan
from aggregator.device_registry import FleetRegistry
from aggregator.drift_reaction import DriftReaction
from aggregator.heterogeneity import Heterogeneity
from aggregator.injection import InjectionPlanner
from aggregator.privacy import Privacy
from aggregator.round_log import UpdateInfo
from aggregator.sampling import poisson_sample
from aggregator.secure_figures import SecureRoundFigures
from edge_client.wire.codec import NON_FINITE, CodecError, decode, raw_size_limit
from edge_client.wire.records import (
    ARRAYS,
    CONFIG,
    PLAN_REFUSED,
    DeviceReply,
    ProbePlan,
    ProbeReply,
    RecordError,
    ReplyMetrics,
    RoundPlan,
    model_layout,
    pack_model,
)
from edge_client.wire.run_config import ControllerSettings, RunSettings

__all__ = ["DIVERGED", "RoundReport", "StreamStrategy", "Update"]

log = logging.getLogger(__name__)

#: The refusal of a reply whose device says its training diverged (it sends no update).
DIVERGED = "diverged"


@dataclass
class RoundReport:
    """What one round of training did.

    Attributes
    ----------
    server_round : int
        The round.
    planned : dict of str to int
        Planned batch per device (a node that never named its device is left out).
    sum_b : int
        Sum of the planned batches (B, or less when streams cap them).
    lr_scale : float
        The learning-rate scale of the plan (sum(b) / B when capped, else 1).
    compress : str
        The round's codec mode.
    injectors : list of str
        Devices asked to share samples this round.
    broadcast_bytes : int
        One copy of the model as sent down.
    replies : dict of str to ReplyMetrics
        Accepted replies by device, in arrival order (``bytes-up`` as received); a device
        whose training diverged too (``train-diverged``: its update is refused, its training
        loss and samples left out of ``train_loss`` and ``num_examples``).
    aggregated : list of str
        Devices whose update went into the new model.
    failed : list of str
        Devices that sent an error or no reply in time.
    refused : dict of str to str
        Devices whose reply or update was refused, and why.
    diverged : list of str
        Devices whose training diverged (refused as ``diverged`` or ``non-finite``).
    num_examples : int
        Samples behind the new model (a sample trained twice counted twice).
    fresh_samples : int
        The devices' own samples behind it, each counted once (``fresh-samples``; a device
        that does not report it: its ``num-examples``).
    train_loss : float
        Their sample-weighted training loss (NaN without any).
    eval_count : int
        Samples the devices scored the received model on (prequential evaluation).
    eval_metric, eval_loss : float
        Their sample-weighted metric and loss (NaN without any).
    drift : dict of str to int
        Devices whose drift count rose with this round's reply, and the count.
    live : int
        Live devices before ``fraction-train``'s draw.
    weight_ratio : float, optional
        The ``adaptive`` rule's ratio ``r`` (samples) the round's updates were weighted by,
        ``n / (n + r)`` (:mod:`aggregator.heterogeneity`); None under another rule.
    dp_clip : float
        Differential privacy: the round's clip (0: off).
    dp_clipped_here : int
        Central DP: updates that decoded over the clip, which the aggregator clipped.
    secagg : SecureRoundFigures, optional
        Secure aggregation's figures of the round (None without it).
    """

    server_round: int
    planned: dict[str, int]
    sum_b: int
    lr_scale: float
    compress: str
    injectors: list[str]
    broadcast_bytes: int
    replies: dict[str, ReplyMetrics] = field(default_factory=dict)
    aggregated: list[str] = field(default_factory=list)
    drift: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    diverged: list[str] = field(default_factory=list)
    num_examples: int = 0
    fresh_samples: int = 0
    train_loss: float = math.nan
    eval_count: int = 0
    eval_metric: float = math.nan
    eval_loss: float = math.nan
    updates: list[UpdateInfo] = field(default_factory=list)
    bytes_up: int = 0
    inject_bytes: int = 0
    live: int = 0
    weight_ratio: float | None = None
    dp_clip: float = 0.0
    dp_clipped_here: int = 0
    secagg: SecureRoundFigures | None = None
    _sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0], repr=False)

    def add_reply(self, device: str, metrics: ReplyMetrics, planned: int) -> None:
        """Count an accepted reply: its metrics, its plan, its scores and its samples (a
        device that replies twice, as in asynchronous mode, is listed with its latest; the
        samples and loss of a diverged training are not counted)."""
        self.replies[device] = metrics
        self.planned[device] = planned
        self.bytes_up += metrics.bytes_up
        self.inject_bytes += metrics.inject_bytes
        if metrics.eval_count > 0 and math.isfinite(metrics.eval_metric):
            self.eval_count += metrics.eval_count
            self._sums[0] += metrics.eval_metric * metrics.eval_count
            self._sums[1] += metrics.eval_loss * metrics.eval_count
        if metrics.num_examples > 0 and not metrics.train_diverged:
            self.num_examples += metrics.num_examples
            fresh = metrics.fresh_samples
            self.fresh_samples += metrics.num_examples if fresh is None else fresh
            self._sums[2] += metrics.train_loss * metrics.num_examples

    def close(self) -> None:
        """Turn the sums into the sample-weighted scores and training loss."""
        if self.eval_count:
            self.eval_metric = self._sums[0] / self.eval_count
            self.eval_loss = self._sums[1] / self.eval_count
        if self.num_examples:
            self.train_loss = self._sums[2] / self.num_examples


@dataclass(frozen=True)
class Update:
    """A reply read and checked: the device, its decoded delta and its metrics."""

    device: str
    delta: dict[str, np.ndarray]
    metrics: ReplyMetrics


@dataclass
class _Round:
    """What configure_train planned, for aggregate_train."""

    server_round: int
    model: dict[str, np.ndarray]  # the global model the deltas are against
    shapes: dict[str, tuple[int, ...]]
    cap: int  # the largest decompressed frame a model of these shapes allows
    plan: Plan
    mode: str
    injectors: list[str]
    broadcast: ArrayRecord  # the model as sent down, packed
    broadcast_bytes: int
    layout: str  # the packed model's (RoundPlan.model_layout)
    planned: dict[int, int]  # node -> planned batch
    lr_factor: float = 1.0  # the drift reaction's (aggregator.drift_reaction)
    live: int = 0  # live devices before fraction-train's draw


class StreamStrategy:
    """Per-device batch plans (OmniLearn/ScaDLES) and sample-weighted aggregation (or a
    Byzantine-robust rule: ``aggregation`` in the run config).

    Parameters
    ----------
    settings : RunSettings
        The run's tunables: the strategy composes the parts each group configures (the
        controller, the drift reaction, injection, the aggregation rule, the codec).
    controller : BatchController, optional
        Batch sizes per device id (restored from a checkpoint on resume); a fresh one
        configured by ``settings`` by default.
    fleet : FleetRegistry, optional
        Nodes, devices and counters (restored from a checkpoint on resume).
    unshared : frozenset of str, optional
        The tensors no update carries (:func:`~edge_client.task.personal.unshared_keys`:
        the personal ones and step counters): the global model keeps their initial values.
    privacy : Privacy, optional
        Differential privacy's clip, noise and accountant (restored from a checkpoint on
        resume); a fresh one configured by ``settings`` by default.
    heterogeneity : Heterogeneity, optional
        The ``adaptive`` rule's estimate of how the devices' updates differ (restored from
        a checkpoint on resume); a fresh one by default.
    """

    def __init__(
        self,
        settings: RunSettings,
        controller: BatchController | None = None,
        fleet: FleetRegistry | None = None,
        unshared: frozenset[str] = frozenset(),
        privacy: Privacy | None = None,
        heterogeneity: Heterogeneity | None = None,
    ) -> None:
        self.settings = settings
        self.privacy = privacy or Privacy(settings.privacy, settings.rounds.fraction_train)
        self.heterogeneity = heterogeneity or Heterogeneity()
        self.unshared = unshared  # tensors no update carries: the global model keeps them
        self.controller = controller or BatchController(settings)
        self.fleet = fleet or FleetRegistry()
        self.drift = DriftReaction(settings.drift)
        self.injection = InjectionPlanner(settings.injection, settings.seed)
        self._round_s = 0.0  # the last round's duration: the availability cap's horizon
        self._cycle_s: dict[str, float] = {}  # async: each device's last cycle, its horizon
        self._round: _Round | None = None
        self._shape = settings.shape
        self._wrong_shape: dict[str, tuple[int, ...]] = {}  # device -> shape logged

    # -- the first round's timings ------------------------------------------------------------

    def configure_probe(self, grid: Grid) -> list[Message]:
        """Query messages that ask every live node to time a few SGD steps at three batch
        sizes (the equal share, a half and a quarter of it: three, so that the controller
        can tell a real slope from timing noise), so that its first plan follows the
        devices' speeds. None when the run does not probe (``controller-probe``
        0) or its controller does not use timings (``fixed``)."""
        s: ControllerSettings = self.settings
        nodes = list(self.fleet.live_nodes(grid.get_node_ids()))
        if s.controller_probe == 0 or s.controller == "fixed" or not nodes:
            return []
        share = max(s.b_min, min(s.b_max, s.global_batch // len(nodes)))
        batches = sorted({max(s.b_min, share // d) for d in (1, 2, 4)}, reverse=True)
        record = ProbePlan(batches, s.controller_probe).to_record()
        return [
            Message(
                RecordDict({CONFIG: record}),
                node,
                MessageType.QUERY,
                group_id="probe",
                ttl=self.settings.exchange.round_timeout,  # refused once the run stopped waiting
            )
            for node in nodes
        ]

    def read_probe(self, replies: Iterable[Message], sent: Mapping[str, int]) -> list[str]:
        """Give the controller the probed timings; return the devices that answered.

        A device that sent an error or an unreadable answer is left to the controller's
        equal share, as before any probe.
        """
        probed = []
        for msg in replies:
            node = sent.get(msg.metadata.reply_to_message_id, msg.metadata.src_node_id)
            if msg.has_error():
                continue
            try:
                reply = ProbeReply.from_content(msg.content)
            except RecordError:
                continue
            self._learn(node, reply.device_id)
            self.controller.calibrate(
                reply.device_id, list(zip(reply.batches, reply.step_s, strict=True))
            )
            probed.append(reply.device_id)
        return probed

    # -- training ---------------------------------------------------------------------------

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One message per live node drawn for the round (``fraction-train``): the global
        model and this device's plan.

        ``config`` entries are added to every device's plan record.
        """
        live = list(self.fleet.live_nodes(grid.get_node_ids()))
        nodes = poisson_sample(
            {n: self.fleet.device_of(n) for n in live},
            self.settings.rounds.fraction_train,
            None if self.privacy.on else self.settings.seed,  # under DP the draw is secret
            server_round,
        )
        self._round = replace(self._plan_round(server_round, arrays, nodes), live=len(live))
        return [self._message(node, self._round, config) for node in nodes]

    def plan_async(self, arrays: ArrayRecord, version: int, nodes: Sequence[int]) -> None:
        """Asynchronous mode: plan the work towards version ``version + 1`` for the live
        ``nodes`` (batches, codec mode, who shares samples), from the model of ``version``."""
        self._round = self._plan_round(version + 1, arrays, nodes)

    def configure_async(
        self, node: int, arrays: ArrayRecord, version: int, nodes: Sequence[int]
    ) -> Message:
        """Asynchronous mode: the message that gives ``node`` the model of ``version`` and
        its device's plan (``server-round`` is ``version + 1``, the version it works
        towards). The plan of :meth:`plan_async` is used, made again when it is for another
        version or does not name ``node`` (a newcomer)."""
        current = self._round
        if current is None or current.server_round != version + 1 or node not in current.planned:
            self.plan_async(arrays, version, nodes)
        assert self._round is not None
        return self._message(node, self._round, ConfigRecord())

    def planned_batch(self, node: int) -> int:
        """The batch the current plan gives ``node`` (0 when it names no such node)."""
        return 0 if self._round is None else self._round.planned.get(node, 0)

    def async_report(self) -> RoundReport:
        """A fresh report for the aggregation the current plan works towards."""
        if self._round is None:
            raise RuntimeError("nothing was configured yet (configure_async)")
        return self._report(self._round)

    def _plan_round(self, server_round: int, arrays: ArrayRecord, nodes: Sequence[int]) -> _Round:
        """The fleet's plan for ``server_round``: each device's batch (controller, capped by
        its stream), the codec mode, and who shares samples."""
        codec = self.settings.codec
        model = {k: a.numpy().astype(np.float32) for k, a in arrays.items()}
        devices = {n: self.fleet.device_of(n) for n in nodes}
        plan = self.controller.plan(list(devices.values()), server_round, self._available())
        gaps = [
            m.compress_gap
            for d in devices.values()
            if (m := self.fleet.last_replies.get(d)) is not None and m.compress_gap is not None
        ]
        mode = round_mode(codec.compress, gaps, codec.compress_delta)
        injectors = self.injection.pick(self.fleet.opted_in(devices.values()), server_round)
        down = self._broadcast(model)
        shapes = {k: v.shape for k, v in model.items() if k not in self.unshared}
        return _Round(
            server_round=server_round,
            model=model,
            shapes=shapes,
            cap=raw_size_limit(shapes),
            plan=plan,
            mode=mode,
            injectors=injectors,
            broadcast=down,
            broadcast_bytes=sum(len(a.data) for a in down.values()),
            layout=model_layout(model),
            planned={node: plan.batches[device] for node, device in devices.items()},
            lr_factor=self.drift.next_lr_factor(),
        )

    def _message(self, node: int, current: _Round, config: ConfigRecord) -> Message:
        """The message that gives ``node`` its device's plan in ``current``."""
        s, learning = self.settings, self.settings.learning
        injection = self.injection.for_device(self.fleet.device_of(node), current.injectors)
        dp_clip, dp_noise = self.privacy.plan()
        local = RoundPlan(
            server_round=current.server_round,
            batch_size=current.planned[node],
            local_steps=learning.local_steps,
            lr=learning.lr * current.plan.lr_scale * current.lr_factor,
            wait_policy=s.streams.wait_policy,
            max_passes=s.streams.max_passes,
            b_min=s.b_min,
            deadline_s=s.exchange.round_timeout / 2,
            compress=current.mode,
            compress_ratio=s.codec.compress_ratio,
            proximal_mu=s.proximal_mu,
            inject_mix=injection.mix,
            inject_publish=injection.publish,
            inject_beta=injection.beta,
            inject_budget=injection.budget,
            time_spread=self.controller.time_spread(self.fleet.device_of(node)),
            model_layout=current.layout,
            dp_clip=dp_clip,
            dp_noise=dp_noise,
            **self._secure_plan(current),
        )
        record = local.to_record()  # a fresh record per message
        for key, value in config.items():
            record[key] = value
        content = RecordDict({ARRAYS: current.broadcast, CONFIG: record})
        # Its TTL is the round's timeout: Flower delivers it no later, and a device refuses it
        # after (a crashed aggregator's queued messages must not spend samples).
        return Message(
            content,
            node,
            MessageType.TRAIN,
            group_id=str(current.server_round),
            ttl=s.exchange.round_timeout,
        )

    def _secure_plan(self, current: _Round) -> dict[str, Any]:
        """The plan's secure-aggregation keys (none without it): how a device weighs its
        update before masking (FedNova's 1 / steps, FedAvg's samples over the round's
        planned total, or DP's equal weights), the shared range (DP's clip under DP) and
        the grid. ``adaptive`` weighs as FedNova does here: its weights come from the
        updates apart, which the aggregator does not see under masking."""
        secure = self.settings.secure
        if not secure.secure_aggregation:
            return {}
        if self.privacy.on:
            weighting, value_range = "equal", self.privacy.clip
        else:
            rule = self.settings.aggregation_rule.aggregation
            weighting = "samples" if rule == "fedavg" else "steps"
            value_range = secure.secagg_range
        planned = current.plan.total * self.settings.learning.local_steps
        return {
            "secagg_weighting": weighting,
            "secagg_weight_scale": 1.0 / max(1, planned),
            "secagg_range": value_range,
            "secagg_bits": secure.secagg_bits,
        }

    def _broadcast(self, model: Mapping[str, np.ndarray]) -> ArrayRecord:
        """The model as sent down, packed into one array (a message's every array is an
        object Flower moves with requests of its own): float32, or float16 when the
        broadcast is compressed."""
        fp16 = self.settings.codec.compress_broadcast == "fp16"
        return pack_model(model, np.float16 if fp16 else np.float32)

    def _available(self) -> dict[str, float]:
        """ScaDLES cap, per step: what each device can have by the time it trains again (its
        fill plus its rate times that horizon) over the ``K`` steps that share it, times
        ``max-passes`` (the times it may train on each). The horizon is the device's own
        last cycle in asynchronous mode, else the last round's duration. None when the run
        asks for conventional, stream-blind batches."""
        streams = self.settings.streams
        if not streams.availability_cap:
            return {}
        horizon = self._round_s or self.settings.exchange.round_timeout / 2
        per_step = streams.max_passes / self.settings.learning.local_steps
        return {
            d: (m.buffer_fill + m.stream_rate * self._cycle_s.get(d, horizon)) * per_step
            for d, m in self.fleet.last_replies.items()
        }

    def record_round_time(self, seconds: float) -> None:
        """How long the round just run took: the horizon of the next round's availability
        cap (each device's fill plus its stream rate times this)."""
        self._round_s = seconds

    def record_cycle(self, device: str, seconds: float) -> None:
        """Asynchronous mode: how long ``device`` took from being sent work to replying, the
        horizon of its availability cap."""
        self._cycle_s[device] = seconds

    def aggregate_train(
        self,
        server_round: int,
        replies: Iterable[Message],
        sent: Mapping[str, int] | None = None,
    ) -> tuple[ArrayRecord | None, RoundReport]:
        """Add the valid deltas to the global model, weighted by samples used.

        Parameters
        ----------
        server_round : int
            The round :meth:`configure_train` planned.
        replies : iterable of Message
            The replies, possibly a generator: each frame is decoded and added to the
            accumulator before the next reply is read.
        sent : mapping of str to int, optional
            Message id -> node of every message sent this round. An error reply names the
            SuperLink as its source, so this is how its device is found; a message without
            a reply counts as a failure of its device.

        Returns
        -------
        tuple
            The new global model (None when no update had any weight) and the round's
            report.
        """
        current = self._round
        if current is None or current.server_round != server_round:
            raise RuntimeError(f"round {server_round} was not configured (configure_train)")
        private = self.privacy.accumulator(current.shapes, current.live)
        accumulator = private or make_accumulator(
            self.settings.aggregation_rule, current.shapes, self.heterogeneity
        )
        report = self._report(current)
        if isinstance(accumulator, AdaptiveMean):
            report.weight_ratio = accumulator.ratio
        for _msg, node, update in self.read_replies(replies, sent or {}, report):
            if update is not None and update.metrics.num_examples > 0:
                m = update.metrics
                boost = self.boost_of(update, report)
                accumulator.update(
                    update.delta,
                    self.weighed_samples(m, current.planned.get(node, 0)),
                    update.device,
                    m.local_steps,
                    boost=boost,
                )
                if private is not None:
                    private.count_within(bool(m.dp_within_clip))
        report.close()
        if self.privacy.on:
            report.dp_clip = self.privacy.clip
            report.dp_clipped_here = private.clipped_here if private is not None else 0
            self.privacy.after_round(private)
        result = accumulator.result()
        if result is None:
            return None, report
        step, report.aggregated = result
        new = {
            k: (g + step[k] if k in step else g).astype(np.float32)
            for k, g in current.model.items()
        }
        return ArrayRecord({k: Array(v) for k, v in new.items()}), report

    def weighed_samples(self, metrics: ReplyMetrics, planned: int) -> int:
        """The samples an update weighs as (``fedavg``, ``adaptive``): those it reports,
        at most its plan's ``planned x local-steps``. A device never trains more than it
        was planned (``adapt`` trains less), so a larger claim buys no weight: the plan is
        the aggregator's own, the count the device's."""
        if planned <= 0:
            return metrics.num_examples
        return min(metrics.num_examples, planned * self.settings.learning.local_steps)

    def read_replies(
        self, replies: Iterable[Message], sent: Mapping[str, int], report: RoundReport
    ) -> Iterator[tuple[Message, int, Update | None]]:
        """Read the round's training replies one at a time (:meth:`read_update`): each
        reply, its node and its update (None when refused or failed); once they are read,
        a message without a reply counts as a failure of its device."""
        current = self._current()
        answered: set[str] = set()
        for msg in replies:  # may be a generator: each reply is dropped once added in
            answered.add(msg.metadata.reply_to_message_id)
            node = sent.get(msg.metadata.reply_to_message_id, msg.metadata.src_node_id)
            yield msg, node, self.read_update(msg, node, report, current.planned.get(node, 0))
        for message_id, node in sent.items():  # no reply before the round's timeout
            if message_id not in answered:
                self.fail(report, self.fleet.device_of(node))

    def round_report(self) -> RoundReport:
        """A fresh report of the round :meth:`configure_train` planned."""
        return self._report(self._current())

    @property
    def current_round(self) -> _Round:
        """What :meth:`configure_train` planned (the model, its shared tensors, devices)."""
        return self._current()

    def boost_of(self, update: Update, report: RoundReport) -> float:
        """How much more than the rule's weight an update weighs: more while its device
        reports drift (:class:`~aggregator.drift_reaction.DriftReaction`), else 1."""
        m = update.metrics
        boost, rose = self.drift.boost_of(update.device, m.drift_changes)
        if rose:
            report.drift[update.device] = m.drift_changes
        return boost

    def _report(self, current: _Round) -> RoundReport:
        return RoundReport(
            server_round=current.server_round,
            planned={d: b for d, b in current.plan.batches.items() if not d.startswith("node-")},
            sum_b=current.plan.total,
            lr_scale=current.plan.lr_scale,
            compress=current.mode,
            injectors=current.injectors,
            broadcast_bytes=current.broadcast_bytes,
            live=current.live,
        )

    def read_update(
        self, msg: Message, node: int, report: RoundReport, planned: int, sent_to: str = ""
    ) -> Update | None:
        """Read and check one reply to a training message sent to ``node``.

        An error reply is a failure of its device; an unreadable reply, samples of another
        shape than the run's, or a frame the codec refuses is a refusal (counted by reason).
        A reply that says its device's training diverged is recorded (its scores of the
        model it received, its timings) but its update, which it does not send, is refused
        as ``diverged``; it and a NaN or Inf update (``non-finite``) are listed in
        ``report.diverged``.
        Otherwise the device is learned, its reply recorded in the fleet and in ``report``
        (with the batch it was ``planned``), its step time given to the controller, and its
        decoded update returned (its delta is against the model it was sent). ``sent_to``:
        the device the node served when the message was sent, charged with a failure when
        the node has been retired since (its device came back on another node).
        """
        if msg.has_error():
            sender = self.sender(node, sent_to)
            if (msg.error.reason or "").startswith(PLAN_REFUSED):  # below its owner's floor
                log.warning("%s refused its plan: %s", sender, msg.error.reason)
                self.refuse(report, sender, "plan-refused")
            else:
                self.fail(report, sender)
            return None
        try:
            reply = DeviceReply.from_content(msg.content)
        except RecordError as err:
            self.refuse(report, self.sender(node, sent_to), err.reason)
            return None
        device = reply.device_id
        self._learn(node, device)
        if not self._shape_fits(device, reply.metrics):
            self.refuse(report, device, "shape-mismatch")
            return None
        current = self._current()
        delta = None
        if self.settings.secure.secure_aggregation and not reply.metrics.train_diverged:
            delta = {}  # kept on the device, masked in the stages that follow
        elif not reply.metrics.train_diverged:  # a diverged device sends no update
            try:
                delta = decode(reply.frame, current.shapes, current.cap)
            except CodecError as err:
                self.refuse(report, device, err.reason)
                return None
        metrics = replace(reply.metrics, bytes_up=len(reply.frame))  # as received
        self.fleet.record_reply(device, metrics)
        report.add_reply(device, metrics, planned)
        for batch, step_s in metrics.costs():  # a spread round's two sizes: the slope
            self.controller.observe(device, batch, step_s)  # its samples' scoring included
        if delta is None:  # its scores of the model it received count, its training not
            self.refuse(report, device, DIVERGED)
            return None
        return Update(device, delta, metrics)

    def _current(self) -> _Round:
        if self._round is None:
            raise RuntimeError("nothing was configured yet")
        return self._round

    def _learn(self, node: int, device: str) -> None:
        """A node named its device: the fleet maps it, and the controller forgets the
        placeholder name it knew the node by."""
        placeholder = self.fleet.learn(node, device)
        if placeholder is not None:
            self.controller.forget(placeholder)

    def _shape_fits(self, device: str, metrics: ReplyMetrics) -> bool:
        """Whether the device's samples are of the run's shape (a reply that does not say,
        from a fedstream before the key, is taken as fitting: its frame is still checked
        against the model's shapes). A device of another shape is logged once per shape."""
        if metrics.sample_shape is None or tuple(metrics.sample_shape) == self._shape:
            self._wrong_shape.pop(device, None)
            return True
        shape = tuple(metrics.sample_shape)
        if self._wrong_shape.get(device) != shape:
            self._wrong_shape[device] = shape
            log.warning(
                "device %s left out: its samples have shape %s, the run's sample-shape is %s",
                device,
                "x".join(map(str, shape)),
                "x".join(map(str, self._shape)),
            )
        return False

    def sender(self, node: int, sent_to: str = "") -> str:
        """The device behind ``node``: as the fleet knows it now, else ``sent_to`` (what it
        was when a message went out), else the node's placeholder name."""
        return self.fleet.node_devices.get(node) or sent_to or self.fleet.device_of(node)

    def fail(self, report: RoundReport, device: str) -> None:
        """Count a failure of ``device`` (an error reply, or none in time)."""
        self.fleet.record_failure(device)
        report.failed.append(device)

    def refuse(self, report: RoundReport, device: str, reason: str) -> None:
        """Count a refusal of ``device``'s reply or update, and why (a divergence is also
        listed as one)."""
        self.fleet.record_refusal(device, reason)
        report.refused[device] = reason
        if reason in (DIVERGED, NON_FINITE) and device not in report.diverged:
            report.diverged.append(device)
