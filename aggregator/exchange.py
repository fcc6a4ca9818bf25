"""How the ServerApp talks to the grid: waiting for nodes, pushing messages and pulling
their replies as they come (the same calls on Flower's deployment and simulation engines and
on the in-process runner)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterator

import httpx
from flwr.app import Message
from flwr.serverapp import Grid

__all__ = [
    "PULL_BATCH",
    "PULL_INTERVAL_S",
    "Exchange",
    "SuperLinkUnreachableError",
    "exchange",
    "superlink_outage_bound",
    "wait_for_nodes",
]

log = logging.getLogger(__name__)
#: Seconds between pulls while replies are awaited.
PULL_INTERVAL_S = 0.2
#: Message ids per pull: a pull's replies are held together until each is handed over, so
#: this bounds the replies in memory at once (Flower's grids return a pull's replies as a list).
PULL_BATCH = 32


def wait_for_nodes(grid: Grid, count: int, timeout: float) -> None:
    """Wait until ``count`` nodes are connected (SuperNodes register after the run starts).

    Raises
    ------
    RuntimeError
        If fewer than ``count`` (and none at all) are there after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    nodes = list(grid.get_node_ids())
    while len(nodes) < count and time.monotonic() < deadline:
        time.sleep(PULL_INTERVAL_S)
        nodes = list(grid.get_node_ids())
    if not nodes:
        raise RuntimeError(f"no SuperNode connected within {timeout:.0f} s")
    if len(nodes) < count:
        log.warning("only %d of %d nodes connected; going on with them", len(nodes), count)


class Exchange:
    """One round's message exchange: the messages pushed, and their replies as they come.

    Iterating over :attr:`replies` pulls from the grid, at most :data:`PULL_BATCH` message
    ids at a time, and hands each reply over as it is pulled, until every message has its
    reply or the timeout has passed (a pull started after it is the last). Nothing keeps a
    reply once it is handed over, so a consumer that adds each reply in before it reads the
    next (:meth:`~aggregator.strategy.StreamStrategy.aggregate_train`) holds one pull's worth
    of replies at most, however large the fleet. The replies can be read once.

    Attributes
    ----------
    sent : dict of str to int
        Message id -> destination node of every message pushed.
    pending : dict of str to int
        The messages still without a reply (all of :attr:`sent` before the replies are
        read; those that timed out after).
    replies : iterator of Message
        The replies (error replies included), pulled as they are read.
    pushed : float
        When the messages were pushed (``time.monotonic()``).
    arrived : dict of str to float
        Message id -> seconds from the push to the pull that brought its reply.
    """

    def __init__(
        self,
        grid: Grid,
        sent: dict[str, int],
        timeout: float,
        pushed: float | None = None,
        interval: float = PULL_INTERVAL_S,
    ) -> None:
        self.sent = sent
        self.pending = dict(sent)
        self.pushed = time.monotonic() if pushed is None else pushed
        self.arrived: dict[str, float] = {}
        self.interval = interval
        self.replies: Iterator[Message] = self._pull(grid, time.monotonic() + timeout)

    def __iter__(self) -> Iterator[Message]:
        return self.replies

    def _pull(self, grid: Grid, deadline: float) -> Iterator[Message]:
        while self.pending:
            started = time.monotonic()
            ids = list(self.pending)
            for first in range(0, len(ids), PULL_BATCH):
                batch = deque(grid.pull_messages(ids[first : first + PULL_BATCH]))
                pulled = time.monotonic() - self.pushed
                while batch:  # popped: a reply handed over is no longer held here
                    reply = batch.popleft()
                    answers = reply.metadata.reply_to_message_id
                    if self.pending.pop(answers, None) is None:
                        log.warning("dropped a message that answers none pending: %r", answers)
                        continue
                    self.arrived[answers] = pulled
                    yield reply
            if not self.pending or started >= deadline:
                return
            time.sleep(max(0.0, min(self.interval, deadline - time.monotonic())))


def exchange(
    grid: Grid, messages: list[Message], timeout: float, interval: float = PULL_INTERVAL_S
) -> Exchange:
    """Push the round's messages; their replies are pulled as :attr:`Exchange.replies` is
    read, every ``interval`` seconds, until all are in or ``timeout`` (from now) passes.

    Unlike ``Grid.send_and_receive`` this keeps the message ids (an error reply names
    the SuperLink as its source, so the ids are how a failed device is found), polls
    every 0.2 s instead of every 3 s, and never holds all the replies at once: each is
    handed to the strategy as it is pulled (a message without a reply by the timeout is
    in :attr:`Exchange.sent` and not answered: a failure of its device).
    """
    pushed = time.monotonic()
    ids = list(grid.push_messages(messages))
    sent = {i: m.metadata.dst_node_id for i, m in zip(ids, messages, strict=True)}
    return Exchange(grid, sent, timeout, pushed, interval)


class SuperLinkUnreachableError(RuntimeError):
    """The SuperLink has not answered the ServerApp for longer than the run allows."""


@contextlib.contextmanager
def superlink_outage_bound(grid: Grid, seconds: float) -> Iterator[None]:
    """End the run with :class:`SuperLinkUnreachableError` once the SuperLink has been
    unreachable for ``seconds`` (0: retry for ever, Flower's default).

    Flower's deployment grid retries a SuperLink that does not answer for ever, so a
    ServerApp whose SuperLink died (killed, or its host gone) would otherwise wait for ever
    too, holding its model and its port. Each call to the SuperLink gives up after
    ``seconds`` of failed attempts; the run then ends with an error that says why (its last
    checkpoint is kept: ``fedstream resume`` continues it). Other grids (simulation, the
    in-process runner) do not retry and are left as they are.

    Raises
    ------
    SuperLinkUnreachableError
        When a call to the SuperLink gave up.
    """
    invoker = getattr(grid, "_retry_invoker", None)  # HttpGrid's (flwr 1.42)
    if seconds > 0 and invoker is not None and hasattr(invoker, "max_time"):
        invoker.max_time = seconds
    try:
        yield
    except httpx.TransportError as err:
        raise SuperLinkUnreachableError(
            f"the SuperLink has not answered for {seconds:g} s ({type(err).__name__}: {err}):"
            " ending the run; its last checkpoint is kept (fedstream resume continues it)"
        ) from err
