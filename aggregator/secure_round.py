"""Secure aggregation on fedstream's message exchange: SecAgg+ (Bell et al. 2020) after a
round's training, so that the aggregator learns the sum of the updates and nothing about
any one of them.

The round's training message is the usual one, its plan saying how to weigh the update
(:meth:`~aggregator.strategy.StreamStrategy.configure_train`); the devices keep their
quantised updates and reply with public keys (:mod:`edge_client.runtime.secure_stages`).
Then :class:`SecureRound` drives three more exchanges (``query.secagg`` messages,
:mod:`edge_client.wire.secagg_records`):

1. ``share-keys``: each device gets its neighbours' keys (a random graph of
   ``secagg-neighbours`` neighbours, every other device in a small round) and sends back
   its secrets' Shamir shares, each sealed to one neighbour; the aggregator passes them on
   unopened;
2. ``masked-input``: each device still in gets the shares addressed to it and sends its
   masked vector; the aggregator adds each into a running sum modulo the field and keeps
   no vector;
3. ``unmask``: each device that sent masked input is told which of its neighbours did
   (their self-mask seeds' shares are asked) and which did not (their mask keys' shares);
   the aggregator rebuilds the seeds (checked against each device's commitment) and keys
   (checked against its public key), takes every mask off the sum, and dequantises it.

Devices lost before the masked input are unmasked from their neighbours' shares; a round
left with fewer than ``secagg-min-survivors`` devices, or a secret that no set of shares
rebuilds, is skipped with the model kept (counted in ``skipped-rounds``). A reply of the
wrong stage, a masked vector of the wrong length or outside the field, a share that failed
authentication on a device, shares the device was not asked for: refused and counted by
reason (``secagg-*`` in ``rejected-reasons``).

How the sum becomes the update: FedNova's devices each send ``delta / steps`` (the sum over
the survivors, times their mean steps); FedAvg's send ``samples x scale x delta`` and the
sum is divided by their weights, which each states in the clear; under central DP each
sends its clipped update with weight 1 and the aggregator adds the Gaussian noise to the
unmasked sum (:class:`~aggregator.aggregation.PrivateMean`): the aggregator is trusted to
add the noise, not to see any update.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from aggregator.aggregation import PrivateMean
from aggregator.exchange import exchange
from aggregator.secure_figures import SecureRoundFigures
from aggregator.strategy import RoundReport, StreamStrategy
from edge_client.wire import masking
from edge_client.wire.records import RecordError, ReplyMetrics
from edge_client.wire.secagg_records import (
    MASKED_INPUT,
    SECAGG_ACTION,
    SHARE_KEYS,
    UNMASK,
    Advert,
    MaskAsk,
    MaskReply,
    ShareKeysAsk,
    ShareKeysReply,
    StageReply,
    UnmaskAsk,
    UnmaskReply,
)

__all__ = [
    "SECAGG_MESSAGE",
    "SecureRound",
    "SecureRoundFigures",
    "neighbour_graph",
    "payload_bytes",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The message type of stages 2-4.
SECAGG_MESSAGE = f"{MessageType.QUERY}.{SECAGG_ACTION}"
#: Skip reasons of a secure round.
TOO_FEW = "secagg-too-few"
UNMASK_FAILED = "secagg-unmask-failed"
#: Seconds between pulls in a stage: its replies take the devices milliseconds (no
#: training), so the training exchange's 0.2 s would be most of a stage's wait.
STAGE_PULL_INTERVAL_S = 0.05
#: Bytes of a training reply's advert: two keys, a commitment, the weight and a count.
ADVERT_BYTES = 3 * masking.KEY_BYTES + 16
#: Secrets a round rebuilds from which worker processes do it (pycryptodome's Shamir is
#: pure Python: about 6 ms a seed on one core, 19 s a round at 1,000 devices).
POOL_LEAST = 32


@dataclass(frozen=True)
class _Entrant:
    node: int
    device: str
    advert: Advert
    metrics: ReplyMetrics


@dataclass(frozen=True)
class _Plan:
    """A secure round's numbering, graph, threshold and field."""

    server_round: int
    by_index: dict[int, _Entrant]  # the devices, numbered 1..n
    graph: dict[int, list[int]]
    threshold: int
    width: int  # the field's bits
    size: int  # values in an update

    @property
    def field_mask(self) -> np.uint64:
        return np.uint64((1 << self.width) - 1) if self.width < 64 else np.uint64(2**64 - 1)


def neighbour_graph(count: int, neighbours: int, rng: random.Random) -> dict[int, list[int]]:
    """SecAgg+'s graph over devices ``1..count``: each joined to ``neighbours`` others
    (rounded up to even), the ring neighbours of a random permutation (a Harary graph);
    the complete graph when that is every other device."""
    everyone = list(range(1, count + 1))
    k = neighbours + neighbours % 2
    if k >= count - 1:
        return {i: [j for j in everyone if j != i] for i in everyone}
    order = everyone[:]
    rng.shuffle(order)
    graph: dict[int, list[int]] = {}
    for at, device in enumerate(order):
        near = [order[(at + d) % count] for d in range(1, k // 2 + 1)]
        near += [order[(at - d) % count] for d in range(1, k // 2 + 1)]
        graph[device] = sorted(near)
    return graph


class SecureRound:
    """SecAgg+ after each round's training: :meth:`run` once a round, :meth:`close` at the
    end of the run.

    Parameters
    ----------
    grid : Grid
        Flower's grid.
    strategy : StreamStrategy
        The run's strategy, which planned the round (its fleet counts refusals and failures).
    """

    def __init__(self, grid: Grid, strategy: StreamStrategy) -> None:
        self.grid = grid
        self.strategy = strategy
        self.settings = strategy.settings
        self.timeout = self.settings.exchange.round_timeout
        self.rebuilder = ShareRebuilder()

    def close(self) -> None:
        """Stop the rebuilder's worker processes (at the end of the run)."""
        self.rebuilder.close()

    def run(
        self, replies: Iterable[Message], sent: Mapping[str, int]
    ) -> tuple[ArrayRecord | None, RoundReport]:
        """Read the training replies, run stages 2-4, and return the new model (None when
        the round is skipped) and the round's report (with :attr:`RoundReport.secagg`)."""
        strategy = self.strategy
        current = strategy.current_round
        report = strategy.round_report()
        figures = SecureRoundFigures()
        report.secagg = figures
        entrants: dict[int, _Entrant] = {}
        for msg, node, update in strategy.read_replies(replies, sent, report):
            if update is None or update.metrics.num_examples <= 0:
                continue
            try:
                advert = Advert.from_content(msg.content)
            except RecordError as err:
                strategy.refuse(report, update.device, f"secagg-{err.reason}")
                continue
            entrants[node] = _Entrant(node, update.device, advert, update.metrics)
        report.close()
        started = time.monotonic()
        summed = self._protocol(report, figures, entrants)
        figures.stages_s = time.monotonic() - started
        figures.dropped = len(figures.lost)
        report.bytes_up += figures.bytes_up  # the round's update bytes: keys, shares, vectors
        privacy = strategy.privacy
        private = privacy.accumulator(current.shapes, current.live)
        step = None
        if summed is not None:
            total, nodes = summed
            survivors = [entrants[n] for n in nodes]
            step = self._step(total, survivors, private)
            report.aggregated = [e.device for e in survivors]
        if privacy.on:  # the round is accounted whether or not its sum was released
            report.dp_clip = privacy.clip
            privacy.after_round(private)
        if step is None:
            return None, report
        new = {
            k: (g + step[k] if k in step else g).astype(np.float32)
            for k, g in current.model.items()
        }
        return ArrayRecord({k: Array(v) for k, v in new.items()}), report

    # -- the stages ---------------------------------------------------------------------------

    def _protocol(
        self, report: RoundReport, figures: SecureRoundFigures, entrants: dict[int, _Entrant]
    ) -> tuple[np.ndarray, list[int]] | None:
        """Stages 2-4: the dequantised sum of the survivors' updates and their nodes (None:
        the round is skipped)."""
        secure = self.settings.secure
        minimum = secure.secagg_min_survivors
        figures.bytes_up += ADVERT_BYTES * len(entrants)
        if len(entrants) < minimum:
            self._skip(figures, TOO_FEW, len(entrants), "trained")
            return None
        plan = self._plan(report.server_round, entrants)
        sealed = self._share_keys(plan, report, figures)
        if len(sealed) < minimum:
            self._skip(figures, TOO_FEW, len(sealed), "shared keys")
            return None
        total, masked = self._masked_input(plan, sealed, report, figures)
        if len(masked) < minimum:
            self._skip(figures, TOO_FEW, len(masked), "masked input")
            return None
        try:
            total = self._unmask(plan, total, set(sealed), masked, report, figures)
        except masking.MaskingError as err:
            log.warning("round %d: %s", report.server_round, err)
            self._skip(figures, UNMASK_FAILED, len(masked), "unmask")
            return None
        figures.survivors = len(masked)
        figures.device_cpu_s = float(np.mean(list(figures.cpu.values()))) if figures.cpu else 0.0
        summed = masking.dequantise_sum(total, len(masked), self._range(), secure.secagg_bits)
        return summed, [plan.by_index[i].node for i in sorted(masked)]

    def _plan(self, server_round: int, entrants: dict[int, _Entrant]) -> _Plan:
        """Number the devices, draw the neighbour graph, and size the field."""
        secure = self.settings.secure
        nodes = sorted(entrants)
        # From the operating system's entropy, not the run seed (which is in the run
        # config): devices that collude cannot work out whose neighbours they are.
        rng = random.SystemRandom()
        k = masking.neighbourhood_size(len(nodes), secure.secagg_neighbours)
        graph = neighbour_graph(len(nodes), k, rng)
        return _Plan(
            server_round,
            {i: entrants[node] for i, node in enumerate(nodes, start=1)},
            graph,
            masking.threshold_of(len(graph[1]), secure.secagg_threshold),
            masking.field_bits(secure.secagg_bits, len(nodes)),
            sum(math.prod(s) for s in self.strategy.current_round.shapes.values()),
        )

    def _share_keys(
        self, plan: _Plan, report: RoundReport, figures: SecureRoundFigures
    ) -> dict[int, dict[int, bytes]]:
        """Stage 2: each device's sealed shares, by sender then destination."""
        asks = {
            i: ShareKeysAsk(
                plan.server_round,
                i,
                near,
                [plan.by_index[j].advert.share_key for j in near],
                [plan.by_index[j].advert.mask_key for j in near],
                plan.threshold,
                plan.width,
            ).to_content()
            for i, near in plan.graph.items()
        }
        sealed: dict[int, dict[int, bytes]] = {}
        stage = self._stage(SHARE_KEYS, asks, plan, report, figures, ShareKeysReply.from_content)
        for i, answer in stage:
            if sorted(answer.destinations) != plan.graph[i]:
                self._refuse(report, figures, plan, i, "secagg-wrong-shares")
                continue
            figures.bytes_up += sum(len(c) for c in answer.sealed)
            sealed[i] = dict(zip(answer.destinations, answer.sealed, strict=True))
        return sealed

    def _masked_input(
        self,
        plan: _Plan,
        sealed: dict[int, dict[int, bytes]],
        report: RoundReport,
        figures: SecureRoundFigures,
    ) -> tuple[np.ndarray, set[int]]:
        """Stage 3: the sum of the masked vectors (none of them kept) and who sent one."""
        contents = {}
        for i in sealed:
            sources = [j for j in plan.graph[i] if j in sealed]
            contents[i] = MaskAsk(
                plan.server_round, sources, [sealed[j][i] for j in sources]
            ).to_content()
        total = np.zeros(plan.size, np.uint64)
        words = masking.word_dtype(plan.width)
        masked: set[int] = set()
        replies = self._stage(MASKED_INPUT, contents, plan, report, figures, MaskReply.from_content)
        for i, reply in replies:
            figures.bytes_up += len(reply.masked)
            if len(reply.masked) != plan.size * words.itemsize:
                self._refuse(report, figures, plan, i, "secagg-masked-length")
                continue
            vector = np.frombuffer(reply.masked, dtype=words).astype(np.uint64)
            if vector.size and int(vector.max()) > int(plan.field_mask):
                self._refuse(report, figures, plan, i, "secagg-out-of-field")
                continue
            total = (total + vector) & plan.field_mask
            masked.add(i)
        return total, masked

    def _unmask(
        self,
        plan: _Plan,
        total: np.ndarray,
        shared: set[int],
        alive: set[int],
        report: RoundReport,
        figures: SecureRoundFigures,
    ) -> np.ndarray:
        """Stage 4: gather the shares, rebuild the survivors' seeds and the lost devices'
        mask keys, and take every mask off ``total``.

        Raises
        ------
        MaskingError
            When a secret cannot be rebuilt.
        """
        gone = shared - alive
        asks = {
            i: UnmaskAsk(
                plan.server_round,
                [j for j in plan.graph[i] if j in alive],
                [j for j in plan.graph[i] if j in gone],
            )
            for i in alive
        }
        contents = {i: a.to_content() for i, a in asks.items()}
        seeds: dict[int, list[bytes]] = {i: [] for i in alive}
        keys: dict[int, list[bytes]] = {j: [] for j in gone}
        shares = self._stage(UNMASK, contents, plan, report, figures, UnmaskReply.from_content)
        for i, got in shares:
            if not set(got.seed_of) <= set(asks[i].survivors) or not set(got.key_of) <= set(
                asks[i].dropped
            ):
                self._refuse(report, figures, plan, i, "secagg-wrong-shares")
                continue
            figures.bytes_up += sum(len(x) for x in (*got.seed_shares, *got.key_shares))
            for j, share in zip(got.seed_of, got.seed_shares, strict=True):
                seeds[j].append(share)
            for j, share in zip(got.key_of, got.key_shares, strict=True):
                keys[j].append(share)
        started = time.process_time()
        wall = time.monotonic()
        survivors, lost = sorted(alive), sorted(gone)
        secrets = self.rebuilder.rebuild(
            [
                (seeds[j], plan.threshold, plan.by_index[j].advert.seed_hash, "seed")
                for j in survivors
            ]
            + [(keys[j], plan.threshold, plan.by_index[j].advert.mask_key, "key") for j in lost]
        )
        for j, secret in zip(survivors + lost, secrets, strict=True):
            if secret is None:
                got_shares = len(seeds[j] if j in alive else keys[j])
                raise masking.MaskingError(_not_rebuilt(got_shares, plan.threshold))
        for seed in secrets[: len(survivors)]:
            total = (
                total - masking.self_mask(seed or b"", plan.size, plan.width)
            ) & plan.field_mask
        for j, key_seed in zip(lost, secrets[len(survivors) :], strict=True):
            key = masking.key_from_seed(key_seed or b"")
            for i in plan.graph[j]:
                if i in alive:
                    seed = masking.agree(key, plan.by_index[i].advert.mask_key, "mask")
                    pair = masking.mask(seed, plan.size, plan.width)
                    # i added the pair's mask when its number is below j's, else took it off
                    total = (total - pair if i < j else total + pair) & plan.field_mask
        # this process's CPU, or the wall time when worker processes rebuilt the secrets
        figures.unmask_s += max(time.process_time() - started, time.monotonic() - wall)
        return total

    def _stage(
        self,
        stage: str,
        contents: Mapping[int, RecordDict],
        plan: _Plan,
        report: RoundReport,
        figures: SecureRoundFigures,
        reader: Callable[[RecordDict], T],
    ) -> Iterator[tuple[int, T]]:
        """Send one stage's messages; yield (device number, reply read by ``reader``) of
        the replies that answer the stage (an error, a refusal, an unreadable reply or
        another stage's reply is counted and left out; a device that does not answer in
        time has dropped out)."""
        messages: list[Message] = []
        numbers: dict[int, int] = {}
        by_index = plan.by_index
        for i, content in contents.items():
            node = by_index[i].node
            numbers[node] = i
            msg = Message(
                content,
                node,
                SECAGG_MESSAGE,
                group_id=str(report.server_round),
                ttl=self.timeout,
            )
            figures.bytes_down += payload_bytes(msg)
            messages.append(msg)
        done = exchange(self.grid, messages, self.timeout, STAGE_PULL_INTERVAL_S)
        for msg in done.replies:
            node = done.sent.get(msg.metadata.reply_to_message_id, msg.metadata.src_node_id)
            if node not in numbers:
                continue
            i = numbers[node]
            entrant = by_index[i]
            if msg.has_error():
                log.info("secure aggregation: %s dropped out at %s", entrant.device, stage)
                figures.lost.add(i)
                continue
            try:
                head = StageReply.read(msg.content)
            except RecordError:
                self._refuse(report, figures, plan, i, "secagg-malformed")
                continue
            if head.stage != stage or head.server_round != report.server_round:
                self._refuse(report, figures, plan, i, "secagg-wrong-stage")
                continue
            figures.cpu[i] = figures.cpu.get(i, 0.0) + head.cpu_s
            if head.refused:
                self._refuse(report, figures, plan, i, f"secagg-{head.refused.split(':')[0]}")
                continue
            try:
                answer = reader(msg.content)
            except RecordError:
                self._refuse(report, figures, plan, i, "secagg-malformed")
                continue
            yield i, answer
        for node in done.pending.values():  # no answer in time
            figures.lost.add(numbers[node])

    def _refuse(
        self, report: RoundReport, figures: SecureRoundFigures, plan: _Plan, i: int, reason: str
    ) -> None:
        """Count device ``i``'s reply as refused, and the device as lost to the round."""
        device = plan.by_index[i].device
        log.warning("secure aggregation: %s refused (%s)", device, reason)
        self.strategy.refuse(report, device, reason)
        figures.lost.add(i)

    def _skip(self, figures: SecureRoundFigures, reason: str, left: int, stage: str) -> None:
        """Log and note why the round is skipped (returns None: no sum)."""
        minimum = self.settings.secure.secagg_min_survivors
        log.warning(
            "secure aggregation: %d devices left after %s (%s; secagg-min-survivors %d): "
            "the round is skipped, the model kept",
            left,
            stage,
            reason,
            minimum,
        )
        figures.skipped = reason
        return None

    def _range(self) -> float:
        privacy = self.strategy.privacy
        return privacy.clip if privacy.on else self.settings.secure.secagg_range

    def _step(
        self, total: np.ndarray, survivors: list[_Entrant], private: PrivateMean | None
    ) -> dict[str, np.ndarray]:
        """The global step from the survivors' dequantised sum, by the run's rule."""
        shapes = self.strategy.current_round.shapes
        sums = masking.unflatten(total, shapes)
        n = len(survivors)
        if private is not None:  # central DP: noise on the sum, over the expected count
            return {k: private.release(v) for k, v in sums.items()}
        if self.settings.aggregation_rule.aggregation == "fedavg":
            weight = sum(e.advert.weight for e in survivors)
            return {k: v / weight for k, v in sums.items()}
        steps = sum(max(1, e.metrics.local_steps) for e in survivors) / n
        return {k: v * (steps / n) for k, v in sums.items()}


def _not_rebuilt(shares: int, threshold: int) -> str:
    """Why a device's secret was not rebuilt."""
    if shares < threshold:
        return (
            f"{shares} of a device's neighbours returned its shares, {threshold} needed: more "
            "of its neighbourhood dropped out than secagg-threshold leaves room for (raise "
            "secagg-neighbours, or lower secagg-threshold)"
        )
    return f"no set of {threshold} of its {shares} shares rebuilt a secret that checks out"


class ShareRebuilder:
    """Rebuilds a round's secrets from their shares: in this process, or in worker
    processes (spawned once, at the first round with :data:`POOL_LEAST` secrets or more,
    kept until :meth:`close`) when there are many and more than one core.

    Parameters
    ----------
    workers : int
        Worker processes (default: the cores).
    """

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        self._pool: ProcessPoolExecutor | None = None

    def rebuild(self, tasks: list[tuple[list[bytes], int, bytes, str]]) -> list[bytes | None]:
        """:func:`~edge_client.wire.masking.rebuild_checked` of each task's (shares,
        threshold, expected, kind), in order."""
        if len(tasks) < POOL_LEAST or self.workers < 2:
            return [masking.rebuild_checked(*task) for task in tasks]
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=get_context("spawn"))
        chunk = max(1, math.ceil(len(tasks) / (4 * self.workers)))
        return list(
            self._pool.map(masking.rebuild_checked, *zip(*tasks, strict=True), chunksize=chunk)
        )

    def close(self) -> None:
        """Stop the worker processes (none: nothing to do)."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


def payload_bytes(msg: Message) -> int:
    """Bytes of the bytes values a stage message carries (keys, sealed shares)."""
    total = 0
    for record in msg.content.config_records.values():
        for value in record.values():
            if isinstance(value, bytes):
                total += len(value)
            elif isinstance(value, list):
                total += sum(len(v) for v in value if isinstance(v, bytes))
    return total
