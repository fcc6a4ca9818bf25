"""The ingest daemon: MQTT samples in, durable buffer out, at line rate.

paho's network thread only queues each payload (receiving is the bottleneck, so it does
little else); a writer thread gathers messages for ~10 ms, decodes and validates them in
one pass, commits them in one transaction and only then releases their acknowledgements.

Acknowledging after the commit, with a session the broker keeps while the daemon is away
(MQTT 5's session expiry, a stable client id) and de-duplication by ``(publisher, seq)``
inside the same transaction, makes the buffer hold each published sample exactly once, even
across ``kill -9``: a message is either committed (and a redelivery is dropped) or
unacknowledged (and redelivered).

Bursts: under MQTT 5 the daemon takes up to 65,535 unacknowledged messages (Receive
Maximum), so a burst waits in flight to it rather than in the broker's bounded queue; the
writer lets paho's thread read first while the socket holds a backlog, because a broker
also drops what it cannot write to a slow reader; past
:data:`~edge_client.runtime.constants.INGEST_MAX_UNCOMMITTED_BYTES` of payloads not yet
committed, paho's network thread waits for the writer's next commit (the broker keeps the
rest in flight), so memory stays bounded. Under MQTT 3.1.1 the broker's in-flight limit
applies instead, and a burst past it and the broker's queue is dropped by the broker: the
daemon says so at start. What it can see of such a loss (gaps in a publisher's sequence
numbers, readings missing at a declared rate) is counted in the buffer and logged as a
warning that names the likely cause (:class:`~edge_client.runtime.ingest_status.LossLog`).

With a :class:`~edge_client.runtime.windowing.WindowSpec` the daemon takes per-reading JSON
instead and cuts samples as windows of readings; the readings of unfinished windows are
committed with the samples (:mod:`edge_client.runtime.windowing.assembler`), so the same
holds for them, and a redelivered reading is known by its timestamp.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import queue
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

import paho.mqtt.client as mqtt

from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.constants import (
    ACK_FLUSH_MAX_S,
    COMMIT_INTERVAL_S,
    DEFAULT_CAPACITY,
    DEFAULT_POLICY,
    IDLE_GAPS,
    INGEST_GATHER_S,
    INGEST_MAX_BATCH,
    INGEST_MAX_BYTES,
    INGEST_MAX_UNCOMMITTED_BYTES,
    INGEST_SESSION_EXPIRY_S,
    INGEST_SUBSCRIBED_LOG,
    MAX_COMMIT_INTERVAL_S,
    MQTT_311,
    OUTBOX_PUBLISH_S,
    RATE_LOG_S,
    READER_BACKLOG_MESSAGES,
    READER_YIELD_MAX_S,
    READER_YIELD_S,
    RECEIVE_MAXIMUM,
    RECENT_TIMESTAMPS,
    REJECT_LOG_INTERVAL_S,
    STATUS_INTERVAL_S,
    STOP_FLUSH_S,
)
from edge_client.runtime.ingest_status import LossLog, RateLog, RejectLog
from edge_client.runtime.injection import InjectionRelay
from edge_client.runtime.mqtt import (
    BrokerOptions,
    BrokerURL,
    Connection,
    Subscriptions,
    connect_async,
    describe_reason,
    make_client,
    unread_bytes,
)
from edge_client.runtime.rate import RateEstimator
from edge_client.runtime.schema import connect
from edge_client.runtime.signals import Subscribed, run_connected
from edge_client.runtime.status_metrics import serve_statuses
from edge_client.runtime.windowing import WindowAssembler, WindowSpec
from edge_client.task.constants import DEFAULT_NUM_CLASSES, DEFAULT_SHAPE
from edge_client.wire.frames import decode_messages
from edge_client.wire.readings import availability_state
from edge_client.wire.sparkplug import rebirth_request
from edge_client.wire.topics import client_id, samples_topic, status_topic

__all__ = ["IngestConfig", "IngestDaemon"]

log = logging.getLogger(__name__)

# (ack tag, qos, payload, arrival time, topic, retained). The ack tag is the MQTT message id
# (16 bits) plus the connection it arrived on (above bit 16): see _send_acks.
_Item = tuple[int, int, bytes | bytearray, float, str, bool]
_MID_BITS = 16


@dataclass
class IngestConfig:
    """Settings of one device's ingest daemon (``broker``: a
    :class:`~edge_client.runtime.mqtt.BrokerOptions` for credentials, TLS files and a connect
    timeout)."""

    broker: BrokerURL
    device_id: str
    buffer: Path
    policy: str = DEFAULT_POLICY
    capacity: int = DEFAULT_CAPACITY
    capacity_bytes: int | None = None
    shape: tuple[int, ...] = DEFAULT_SHAPE
    num_classes: int = DEFAULT_NUM_CLASSES
    status_interval: float = STATUS_INTERVAL_S
    log_interval: float = RATE_LOG_S  # seconds between the log's rate lines
    # Longest a transaction gathers messages: longer writes less per sample (SD cards) and
    # loses nothing (a message is acknowledged only once committed).
    commit_interval: float = COMMIT_INTERVAL_S
    client_id: str | None = None  # default: <device-id>.ingest
    # Seconds the broker keeps the daemon's session while it is away (MQTT 5; under 3.1.1
    # any value above 0 keeps it as the broker likes)
    session_expiry: int = INGEST_SESSION_EXPIRY_S
    inject: bool = False  # opted in to ScaDLES data injection (see edge_client.runtime.injection)
    topics: tuple[str, ...] = ()  # sample frames on these topics (default: the device's)
    windowing: WindowSpec | None = None  # per-reading JSON, cut into windows
    # Prometheus metrics of the device's status on this port (None: off), bound to this address
    metrics_port: int | None = None
    metrics_listen: str = "0.0.0.0"
    # Sensors' availability topics (``online``/``offline``, wildcards allowed): their last
    # state goes into the status (``availability``, ``sensors-offline``), not the buffer
    availability: tuple[str, ...] = ()
    subscriptions: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.status_interval <= 0:
            raise ValueError(f"status interval must be > 0, got {self.status_interval}")
        if self.log_interval <= 0:
            raise ValueError(f"log interval must be > 0, got {self.log_interval}")
        if not 0 < self.commit_interval <= MAX_COMMIT_INTERVAL_S:
            raise ValueError(
                f"commit interval must be in (0, {MAX_COMMIT_INTERVAL_S:g}] s, "
                f"got {self.commit_interval}"
            )
        if self.metrics_port is not None and not 0 < self.metrics_port < 65536:
            raise ValueError(f"metrics port must be in 1..65535, got {self.metrics_port}")
        if self.num_classes < 1:
            raise ValueError(f"num-classes must be >= 1, got {self.num_classes}")
        if self.session_expiry < 0:
            raise ValueError(f"session expiry must be >= 0 s, got {self.session_expiry}")
        default = samples_topic(self.device_id)  # validates the id
        spec = self.windowing
        if spec is None:
            self.subscriptions = (*(self.topics or (default,)), *self.availability)
            return
        if self.topics:
            raise ValueError("with windowing, the topics are the windowing spec's")
        if tuple(self.shape) not in (DEFAULT_SHAPE, spec.shape):
            raise ValueError(
                f"--shape {','.join(map(str, self.shape))} but {spec.channels} channels x "
                f"window {spec.window} make samples of shape {spec.shape[0]},{spec.shape[1]}"
            )
        self.shape = spec.shape
        self.num_classes = max(spec.num_classes, 1)
        self.subscriptions = (*spec.subscriptions, *self.availability)


class IngestDaemon(Subscribed):
    """Subscribes to a device's samples topic and commits them to its buffer store.

    Parameters
    ----------
    config : IngestConfig
        Broker, device, buffer file and policy.

    Notes
    -----
    Use :meth:`start` / :meth:`stop` to embed it, or :meth:`run` to block until SIGTERM or
    SIGINT, which flushes, acknowledges and exits cleanly.
    """

    def __init__(self, config: IngestConfig) -> None:
        self.config = config
        self.store = BufferStore(
            config.buffer,
            shape=config.shape,
            policy=config.policy,
            capacity=config.capacity,
            capacity_bytes=config.capacity_bytes,
        )
        #: The pool and outbox of data injection (None: not opted in).
        self.injection = (
            InjectionRelay(config.buffer, config.shape, config.device_id, config.num_classes)
            if config.inject
            else None
        )
        self._last_retry_log = -1e18
        self._next_outbox = 0.0
        self._status_topic = status_topic(config.device_id)
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._acks: collections.deque[tuple[int, int]] = collections.deque()  # (tag, qos)
        self._connection = 0  # counts successful connects; tags acks (see _send_acks)
        self._ack_lock = threading.Lock()
        self._stopping = threading.Event()
        self._connected = threading.Event()
        self._rate = RateEstimator(time.monotonic())
        self._gap = 0.0  # the stream's mean seconds between messages (see _drain)
        # Per-reading JSON has no sequence numbers: a reading redelivered after a crash (its
        # transaction committed, the acknowledgements not yet sent) is known as a duplicate
        # only among its topic's RECENT_TIMESTAMPS, so a transaction holds no more messages
        # and its acknowledgements are written before the next one commits (_flush_acks).
        self._max_batch = INGEST_MAX_BATCH if config.windowing is None else RECENT_TIMESTAMPS
        self._cycle: tuple[float, int] | None = None  # the last gather's first arrival, size
        self._rejects = RejectLog()
        self._rate_log = RateLog(config.device_id, config.log_interval)
        self.protocol = BrokerOptions.of(config.broker).protocol
        self._losses = LossLog(self.protocol)
        self._metrics: WSGIServer | None = None
        #: The last status published (what the metrics endpoint exports).
        self.last_status: dict[str, Any] = {}
        self.assembler = self._load_assembler()
        #: The last state of each availability topic seen (``online``, ``offline``, ...).
        self.availability: dict[str, str] = {}
        # Payload bytes received (paho's thread counts) and committed (the writer counts):
        # their difference is what the daemon holds; past the bound, paho's thread waits.
        self._received_bytes = 0
        self._received = 0  # messages, with their bytes: their mean size
        self._released_bytes = 0
        self._held_changed = threading.Condition()
        self._subscriptions = Subscriptions(
            config.subscriptions + ((InjectionRelay.topic,) if config.inject else ())
        )
        self._session_present = False
        self._subscribe_error: str | None = None
        self._client = make_client(
            config.client_id or client_id(config.device_id, "ingest"),
            config.broker,
            session_expiry=config.session_expiry,  # the broker queues for us while away
            manual_ack=True,  # ack only what is committed
            receive_maximum=RECEIVE_MAXIMUM,  # a burst waits in flight, not in its queue
        )
        self._client.will_set(
            self._status_topic,
            json.dumps({"device-id": config.device_id, "online": False}),
            qos=1,
            retain=True,
        )
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = self._on_message
        self._client.on_subscribe = self._on_subscribe
        #: The attempts to reach the broker: made before connecting, since paho's thread may
        #: call the callbacks that read it before connect_async returns.
        self.connection = Connection(v5=self._client.protocol == mqtt.MQTTv5)
        self._writer = threading.Thread(target=self._write_loop, name="ingest-writer", daemon=True)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Serve the metrics (``metrics_port``), start the writer thread and connect
        (retrying with back-off until connected).

        Raises
        ------
        OSError
            If the metrics port cannot be bound.
        """
        port = self.config.metrics_port
        if port is not None:
            self._metrics = serve_statuses(
                port, lambda: {self.config.device_id: self.last_status}, self.config.metrics_listen
            )
            log.info("metrics on http://%s:%d/metrics", self.config.metrics_listen, port)
        self._writer.start()
        connect_async(self._client, self.config.broker, self.connection)
        log.info(
            "ingesting %s from %s into %s (%s, capacity %d; MQTT %s)",
            ", ".join(self.config.subscriptions),
            self.config.broker,
            self.config.buffer,
            self.store.policy,
            self.store.capacity,
            self.protocol,
        )
        if self.protocol == MQTT_311:
            log.warning(
                "MQTT 3.1.1: the broker sends at most its in-flight limit of messages before "
                "this daemon acknowledges them (on commit) and queues at most its queue limit "
                "behind them (Mosquitto's defaults: max_inflight_messages 20, "
                "max_queued_messages 1000); it drops the rest of a burst. Use MQTT 5 "
                "(--mqtt-version 5) where the broker has it, or raise both limits on the "
                "broker (broker_config/mosquitto-dev.conf)"
            )

    def stop(self, timeout: float = 30.0) -> None:
        """Commit and acknowledge everything received, publish a last status, disconnect."""
        self._stopping.set()
        with self._held_changed:
            self._held_changed.notify_all()  # paho's thread may wait for room
        self._writer.join(timeout)
        self._send_acks()
        last = self._publish_status(online=False)
        with contextlib.suppress(RuntimeError, ValueError):  # not sent: nothing to wait for
            last.wait_for_publish(STOP_FLUSH_S)  # the broker holds the last status
        self._client.disconnect()  # after the queued PUBACKs: paho sends packets in order
        # Let paho's thread send the DISCONNECT before it is stopped: a connection that
        # just drops makes the broker publish the will, which would replace the last status
        # (and its counters) with a bare "offline".
        deadline = time.monotonic() + STOP_FLUSH_S
        while self._connected.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._client.loop_stop()
        if self._metrics is not None:
            self._metrics.shutdown()
            self._metrics.server_close()
        self.store.close()
        if self.injection is not None:
            self.injection.close()
        log.info("ingest for %s stopped", self.config.device_id)

    def run(self) -> None:
        """Run until SIGTERM or SIGINT, then stop cleanly (flush, acknowledge, exit).

        Raises
        ------
        ConnectionError
            If the first connection did not come within the broker's connect timeout.
        """
        run_connected(self, self.config.broker, self._writer, "ingest writer")

    # -- paho callbacks (network thread: never block here) ---------------------------------

    def _on_connect(self, client: mqtt.Client, _u: Any, flags: Any, rc: Any, _p: Any) -> None:
        if rc.is_failure:
            self.connection.refused(self.config.broker, rc)
            return
        with self._ack_lock:
            self._connection += 1  # acks still due for the previous connection are void
        self._session_present = bool(flags.session_present)
        # Subscribing again is harmless when the session survived, and needed when it did not.
        self._subscriptions.send(client)

    def _on_subscribe(self, _c: mqtt.Client, _u: Any, mid: int, reasons: Any, _p: Any) -> None:
        granted = self._subscriptions.acknowledged(mid, reasons, self.connection)
        if granted is None:
            return
        if not granted:  # logged; the status says it too
            self._subscribe_error = self.connection.last_error
            return
        self._subscribe_error = None
        log.info(
            "connected to %s (MQTT %s, session present: %s), " + INGEST_SUBSCRIBED_LOG + " %s",
            self.config.broker,
            self.protocol,
            self._session_present,
            ", ".join(self._subscriptions.topics),
        )
        self._connected.set()

    def _on_disconnect(self, _c: mqtt.Client, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        self._connected.clear()
        if not self._stopping.is_set():
            log.warning(
                "disconnected from %s (%s); reconnecting",
                self.config.broker,
                describe_reason(rc, self.connection.v5),
            )

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        tag = (self._connection << _MID_BITS) | msg.mid
        self._queue.put((tag, msg.qos, msg.payload, time.time(), msg.topic, bool(msg.retain)))
        if self._acks:
            self._send_acks()
        self._received_bytes += len(msg.payload)  # only this thread writes these: no lock
        self._received += 1
        if self.held_bytes > INGEST_MAX_UNCOMMITTED_BYTES:
            # Bounded memory: wait for the writer's commit (the broker keeps what follows in
            # flight: TCP pushes back). Acks go out meanwhile (the writer hands them to paho's
            # queue without this thread).
            with self._held_changed:
                while (
                    self.held_bytes > INGEST_MAX_UNCOMMITTED_BYTES and not self._stopping.is_set()
                ):
                    self._held_changed.wait(1.0)

    @property
    def held_bytes(self) -> int:
        """Payload bytes received and not yet committed (or dropped)."""
        return self._received_bytes - self._released_bytes

    def _release(self, items: list[_Item]) -> None:
        """Messages committed (or dropped): their bytes no longer count as held."""
        released = sum(len(item[2]) for item in items)
        with self._held_changed:
            self._released_bytes += released  # only the writer writes it
            self._held_changed.notify_all()

    # -- writer thread --------------------------------------------------------------------

    def _write_loop(self) -> None:
        next_status = time.monotonic()
        pending: list[_Item] = []
        while True:
            if not pending:
                pending = self._drain()
                self._let_reader_catch_up()
            now = time.monotonic()
            if pending or now >= next_status:
                try:
                    self._commit(pending)
                except sqlite3.OperationalError as err:  # disk full, locked: keep them, retry
                    self._log_retry(err, len(pending))
                    if now >= next_status:  # say so where operators look, too
                        self._publish_status(online=True, error=f"cannot write the buffer: {err}")
                        next_status = now + self.config.status_interval
                    time.sleep(1.0)
                    continue
                except Exception:  # a message the store cannot take must not stall the rest
                    log.exception("could not commit %d message(s); one by one", len(pending))
                    if not self._commit_each(pending):
                        time.sleep(1.0)
                        continue
                self._release(pending)
                if pending and self.assembler is not None:
                    self._flush_acks()
                pending = []
            if self.injection is not None and now >= self._next_outbox:
                self._publish_outbox()
                self._next_outbox = now + OUTBOX_PUBLISH_S
            if now >= next_status:
                self._publish_status(online=True)
                next_status = now + self.config.status_interval
            if self._stopping.is_set() and self._queue.empty():
                return

    def _let_reader_catch_up(self) -> None:
        """Reader first: while a backlog waits unread in the socket, give paho's thread the
        interpreter (a broker drops what it cannot write to a slow reader; see
        :data:`~edge_client.runtime.constants.READER_BACKLOG_BYTES`). Bounded per batch, so
        that commits, and with them acknowledgements, go on under a steady overload."""
        if not self._received:
            return
        # A message's bytes on the wire: its payload, its topic and a few of header.
        size = self._received_bytes / self._received + len(self._status_topic) + 8
        deadline = time.monotonic() + READER_YIELD_MAX_S
        while (
            unread_bytes(self._client) > READER_BACKLOG_MESSAGES * size
            and time.monotonic() < deadline
        ):
            time.sleep(READER_YIELD_S)

    def _commit_each(self, items: list[_Item]) -> bool:
        """Commit messages one at a time; count one that fails as ``decode-error`` and drop it
        (acknowledged, or the broker would redeliver it forever). False: retry them all."""
        for item in items:
            try:
                self._commit([item])
            except sqlite3.OperationalError as err:
                self._log_retry(err, len(items))
                return False
            except Exception:
                log.exception("dropping a message the buffer cannot store")
                self.store.append([], rejected={"decode-error": 1}, messages=1)
                if item[1] > 0:
                    self._acks.append((item[0], item[1]))
        return True

    def _log_retry(self, err: Exception, n: int) -> None:
        """One line per minute while the buffer cannot be written (e.g. the disk is full)."""
        now = time.monotonic()
        if now - self._last_retry_log >= REJECT_LOG_INTERVAL_S:
            log.error("cannot write the buffer (%s); holding %d message(s), retrying", err, n)
            self._last_retry_log = now

    def _send_acks(self) -> None:
        """Acknowledge committed messages; the lock keeps them in arrival order, as MQTT
        requires, whichever thread sends them.

        Only messages of the current connection are acknowledged. Message ids are per
        connection: after a reconnect (above all to a broker restored from its persistence
        file, whose id counter went back) an old id can name a *new* message, and acking it
        would tell the broker a message was stored that this daemon never saw. The broker
        redelivers the old ones instead; they are committed already and count as duplicates.
        """
        with self._ack_lock:
            acks = self._acks
            while acks:
                tag, qos = acks.popleft()
                if tag >> _MID_BITS == self._connection:
                    self._client.ack(tag & ((1 << _MID_BITS) - 1), qos)

    def _flush_acks(self) -> None:
        """Acknowledge a committed transaction of per-reading JSON before the next one.

        A reading redelivered after a crash is known as a duplicate only among its topic's
        RECENT_TIMESTAMPS, so at most one transaction may be committed and unacknowledged at
        any time. paho's thread sends acks with its next message; when the messages of the
        next transaction are already queued (a burst, or a stream that comes in chunks) none
        may come before that one commits too, and a kill -9 then made the broker redeliver
        two transactions' readings: the older ones were refused as ``late``, lost. The
        writer hands the acks to paho itself and waits, bounded, until they are written.
        """
        self._send_acks()
        deadline = time.monotonic() + ACK_FLUSH_MAX_S
        while (
            self._client.want_write() and self._connected.is_set() and time.monotonic() < deadline
        ):
            time.sleep(0.001)

    def _drain(self) -> list[_Item]:
        """Gather messages for one transaction: up to a batch or the commit interval, ending
        early once no message has come for a few of the stream's usual gaps (at least
        :data:`INGEST_GATHER_S`): the stream paused, or the broker's in-flight window is
        full and waits for this commit's acknowledgements."""
        try:
            items = [self._queue.get(timeout=INGEST_GATHER_S)]
        except queue.Empty:
            self._send_acks()  # the stream paused: no message will carry them out
            try:
                items = [self._queue.get(timeout=0.2)]
            except queue.Empty:
                return []
        # Waiting costs nothing (messages are unacknowledged meanwhile, the broker keeps
        # sending up to its in-flight window) and turns many small transactions, each
        # rewriting whole pages, into few large ones.
        idle = min(self.config.commit_interval, max(INGEST_GATHER_S, IDLE_GAPS * self._gap))
        deadline = time.monotonic() + self.config.commit_interval
        size = len(items[0][2])
        while len(items) < self._max_batch and size < INGEST_MAX_BYTES:
            left = deadline - time.monotonic()
            try:
                items.append(
                    self._queue.get(timeout=min(left, idle))
                    if left > 0
                    else self._queue.get_nowait()
                )
            except queue.Empty:
                break
            size += len(items[-1][2])
        # The stream's mean gap between messages, from one gather's first arrival to the
        # next's over the messages between: pauses and commits included, so bursts (a
        # busy host delivering the network thread's messages in batches) do not shrink it.
        first = items[0][3]
        if self._cycle is not None:
            self._gap = max(0.0, first - self._cycle[0]) / self._cycle[1]
        self._cycle = (first, len(items))
        return items

    def _load_assembler(self) -> WindowAssembler | None:
        """The windowing state as last committed (None without windowing)."""
        if self.config.windowing is None:
            return None
        db = connect(self.config.buffer)
        try:
            return WindowAssembler.load(self.config.windowing, db)
        finally:
            db.close()

    def _commit(self, items: list[_Item]) -> None:
        inject = InjectionRelay.topic  # never a sample stream, opted in or not
        # Availability messages go into the status, not the buffer (acknowledged below,
        # with the rest: unacknowledged QoS 1 messages would stall the broker's flow)
        stream = self._note_availability(items)
        shared = [payload for _, _, payload, _, topic, _ in stream if topic == inject]
        if shared and self.injection is not None:
            refused = self.injection.receive(shared)
            if refused:
                self._rejects.record(refused, 0)
        rate = self._rate.rate  # as of the last commit: this one's samples are added below
        if self.assembler is None:
            arrivals, reasons = decode_messages(
                [(payload, now) for _, _, payload, now, topic, _ in stream if topic != inject],
                self.config.shape,
                self.config.num_classes,
            )
            result = self.store.append(arrivals, rejected=reasons, messages=len(stream), rate=rate)
        else:
            assembler = self.assembler
            own = [(t, payload, now, kept) for _, _, payload, now, t, kept in stream if t != inject]
            # A retained message is the broker's last copy, delivered on subscribing: no
            # fresh reading where readings are stamped on arrival (with a timestamp of its
            # own, it is one like any other, a duplicate once taken).
            fresh = [
                (t, payload, now)
                for t, payload, now, kept in own
                if not (kept and assembler.arrival_stamped(t))
            ]
            try:
                made = assembler.feed(fresh)
                if len(fresh) < len(own):
                    made.counts["retained-skipped"] += len(own) - len(fresh)
                reasons = made.rejected
                result = self.store.append(
                    made.arrivals(),
                    rejected=reasons,
                    messages=len(stream),
                    rate=rate,
                    counts=made.counts,
                    also=made.save,
                )
            except BaseException:  # not committed: back to what is, so a retry starts there
                self.assembler = self._load_assembler()
                raise
            if made.rebirth is not None:  # --sparkplug-rebirth: aliases no birth has named
                log.info("asking the Sparkplug B edge node for its births (%s)", made.rebirth)
                self._client.publish(made.rebirth, rebirth_request(), qos=0)
        # Counted when committed, then the window closed: a window then holds the samples
        # that arrived within it (a commit gathers for up to commit-interval seconds).
        now = time.monotonic()
        self._rate.add(result.received, now)
        self._rate.update(now)
        # Committed: now they may be acknowledged. paho's thread sends the acks with its next
        # message (no thread hand-off per ack); when the stream pauses, _drain sends them.
        self._acks.extend((mid, qos) for mid, qos, _, _, _, _ in items if qos > 0)
        if reasons:
            self._rejects.record(reasons, time.monotonic())

    def _note_availability(self, items: list[_Item]) -> list[_Item]:
        """Keep the state of each availability topic's message (acknowledged with the
        batch; the broker retains them, so a restart learns them again); return the rest."""
        rest = []
        for item in items:
            topic = item[4]
            if any(mqtt.topic_matches_sub(f, topic) for f in self.config.availability):
                self.availability[topic] = availability_state(item[2])
            else:
                rest.append(item)
        return rest

    def _publish_outbox(self) -> None:
        """Publish what the ClientApp queued for injection (only when opted in)."""
        if self.injection is None or not self._connected.is_set():
            return  # stays queued in the buffer file
        self.injection.publish(self._client)

    def _publish_status(self, *, online: bool, error: str | None = None) -> mqtt.MQTTMessageInfo:
        """The retained status message: counters, fill, rate, and ``error`` while the buffer
        cannot be written."""
        try:
            status = self.store.stats()
        except sqlite3.OperationalError as err:  # the status must go out even then
            status, error = {}, error or f"cannot read the buffer: {err}"
        if self.injection is not None:
            status["inject"] = self.injection.status()
        if self.assembler is not None:
            status["readings-waiting"] = self.assembler.windower.waiting
        if self.config.availability:
            states = dict(sorted(self.availability.items()))
            status["availability"] = states
            status["sensors-offline"] = [t for t, state in states.items() if state != "online"]
        status.update(
            {
                "device-id": self.config.device_id,
                "online": online,
                "ts": time.time(),
                "mqtt-version": self.protocol,
            }
        )
        error = error or self._subscribe_error
        if error is not None:
            status["error"] = error
        sent = self._client.publish(self._status_topic, json.dumps(status), qos=1, retain=True)
        self.last_status = status
        self._rate_log.record(status, self._connected.is_set())
        self._losses.record(status)
        return sent
