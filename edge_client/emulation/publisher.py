"""The stream publisher: sends samples to ``fedstream/v1/<device-id>/samples`` at a rate.

Messages are binary frames stamped with a publisher id (unique per run) and a sequence
number, so that the ingest daemon can drop QoS 1 redeliveries; or, from a
:class:`~edge_client.emulation.reading_replay.SeriesReadings`, per-reading JSON as a simple sensor
sends it (told apart by their timestamps). paho keeps QoS 1 messages
while the broker is away and resends them after it reconnects, so publishing goes on
through broker restarts.

No message is bigger than the broker takes (``max_payload``, AWS IoT Core's 128 KB by
default): a batch that would be goes as several frames (or reading lists). Under MQTT 5 the
broker says why it refuses a message (PUBACK reason codes: not authorised, quota exceeded,
...); refusals are counted in the report and logged once per reason.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import paho.mqtt.client as mqtt

from edge_client.emulation.constants import (
    PUBLISH_CONNECT_TIMEOUT_S,
    PUBLISH_MAX_INFLIGHT,
    PUBLISH_MAX_OUTSTANDING,
    PUBLISH_STOP_DRAIN_S,
)
from edge_client.emulation.reading_replay import SeriesReadings
from edge_client.emulation.schedule import arrival_offsets
from edge_client.emulation.sources import SampleSource
from edge_client.runtime.mqtt import (
    BrokerOptions,
    BrokerURL,
    connect_async,
    describe_reason,
    make_client,
)
from edge_client.wire.constants import DEFAULT_MAX_PAYLOAD_BYTES
from edge_client.wire.frames import encode_frames, frame_capacity
from edge_client.wire.topics import check_topic, client_id, samples_topic

__all__ = ["Prefetched", "PublishReport", "PublisherConfig", "run_publisher"]

log = logging.getLogger(__name__)

#: Samples a publisher draws from its source at once. (Here, not in the emulation's
#: constants: the in-process benchmarks' results name that file among their sources.)
PREFETCH_SAMPLES = 64


class Prefetched:
    """A source drawn ``chunk`` samples at a time and handed out in order: one vectorised
    draw instead of one per message (a publisher sending one sample a message spent a
    quarter of its CPU drawing them one by one). The samples differ from the base source's
    own one-at-a-time draws (the random numbers are taken in another order), not their
    distribution."""

    def __init__(self, base: SampleSource, chunk: int) -> None:
        if chunk < 1:
            raise ValueError(f"chunk must be at least 1, got {chunk}")
        self.base = base
        self.chunk = chunk
        self.shape: tuple[int, ...] = base.shape
        self._x: npt.NDArray[np.float32] = np.empty((0, *self.shape), np.float32)
        self._y: npt.NDArray[np.int64] = np.empty(0, np.int64)
        self._at = 0

    def next(self, n: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        if self._at + n > len(self._y):
            x, y = self.base.next(max(self.chunk, n))
            self._x = np.concatenate([self._x[self._at :], x])
            self._y = np.concatenate([self._y[self._at :], y])
            self._at = 0
        x, y = self._x[self._at : self._at + n], self._y[self._at : self._at + n]
        self._at += n
        return x, y


@dataclass
class PublisherConfig:
    """What to publish, where and how fast (rates in samples, or readings, per second), and
    for how long: ``count`` samples, ``duration`` seconds, or neither (until stopped).

    ``broker``: a :class:`~edge_client.runtime.mqtt.BrokerOptions` also gives the credentials,
    TLS files and how long to wait for the connection (default
    :data:`~edge_client.emulation.constants.PUBLISH_CONNECT_TIMEOUT_S`)."""

    broker: BrokerURL
    device_id: str
    rate: float
    count: int | None = None
    duration: float | None = None
    batch: int = 1
    distribution: str = "constant"
    qos: int = 1
    seed: int = 0
    drain_timeout: float = 60.0
    publisher_id: str = field(default_factory=lambda: secrets.token_hex(6))
    topic: str | None = None  # default: the device's samples topic
    max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES  # bytes: bigger batches go as several

    def __post_init__(self) -> None:
        if self.count is not None and self.duration is not None:
            raise ValueError("give at most one of count and duration (neither: until stopped)")
        if self.count is not None and self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")
        if self.duration is not None and not self.duration > 0:
            raise ValueError(f"duration must be > 0, got {self.duration}")
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1, got {self.batch}")
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")
        if self.qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, got {self.qos}")
        if self.topic is not None:
            check_topic(self.topic)
        if self.max_payload < 1:
            raise ValueError(f"max payload must be >= 1 byte, got {self.max_payload}")


@dataclass
class PublishReport:
    """What a publisher run did."""

    device_id: str
    publisher_id: str
    samples: int
    messages: int
    acknowledged: int
    elapsed_s: float
    target_rate: float
    refused: dict[str, int] = field(default_factory=dict)  # by the broker's reason (MQTT 5)

    @property
    def achieved_rate(self) -> float:
        """Samples per second over the sending period."""
        return self.samples / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form with kebab-case keys."""
        return {
            "device-id": self.device_id,
            "publisher-id": self.publisher_id,
            "samples": self.samples,
            "messages": self.messages,
            "acknowledged": self.acknowledged,
            "elapsed-s": round(self.elapsed_s, 3),
            "target-rate": round(self.target_rate, 3),
            "achieved-rate": round(self.achieved_rate, 3),
            "refused": dict(self.refused),
        }


class _Acks:
    """Counts broker acknowledgements and connection state from paho's thread."""

    def __init__(self) -> None:
        self.count = 0
        self.connected = threading.Event()
        self.refused: str | None = None
        #: Messages the broker acknowledged with a refusal (MQTT 5), by reason.
        self.refusals: Counter[str] = Counter()

    def on_connect(self, client: mqtt.Client, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        if rc.is_failure:
            self.refused = str(rc)
            log.error("broker refused the connection: %s", rc)
        else:
            self.refused = None
            self.connected.set()

    def on_disconnect(self, client: mqtt.Client, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        self.connected.clear()
        if rc.is_failure:
            log.warning("lost the broker (%s); paho reconnects and resends", rc)

    def on_publish(self, client: mqtt.Client, _u: Any, _mid: int, rc: Any, _p: Any) -> None:
        self.count += 1
        if rc.is_failure:  # MQTT 5: acknowledged, but not taken (a 3.1.1 broker never says)
            reason = describe_reason(rc, v5=True)
            if not self.refusals[reason]:
                log.error("the broker refused a message: %s (counted; logged once)", reason)
            self.refusals[reason] += 1


def run_publisher(
    config: PublisherConfig,
    source: SampleSource | SeriesReadings,
    *,
    stop: threading.Event | None = None,
    on_progress: Callable[[int, int, float], None] | None = None,
    progress_interval: float = 1.0,
) -> PublishReport:
    """Publish samples from ``source`` until ``count`` samples, ``duration`` seconds, or (with
    neither) until ``stop`` is set.

    Parameters
    ----------
    config : PublisherConfig
        Broker, device, rate and amount.
    source : SampleSource or SeriesReadings
        Where the samples come from (frames), or the readings (per-reading JSON).
    stop : threading.Event, optional
        Set it to stop early (samples sent so far are still drained).
    on_progress : callable, optional
        Called every ``progress_interval`` seconds with ``(samples sent, messages the broker
        acknowledged, elapsed seconds)``.
    progress_interval : float
        Seconds between ``on_progress`` calls.

    Returns
    -------
    PublishReport

    Raises
    ------
    ConnectionError
        If no connection is made within the broker's ``connect_timeout`` seconds.
    ValueError
        If one sample is bigger than ``max_payload`` (or a reading, when sent).
    """
    stop = stop or threading.Event()
    if not isinstance(source, SeriesReadings):  # too big a sample: say so before connecting
        frame_capacity(source.shape, config.publisher_id, config.max_payload)
    acks = _Acks()
    client = make_client(
        client_id(config.device_id, "publish", config.publisher_id),
        config.broker,
    )
    client.on_connect = acks.on_connect
    client.on_disconnect = acks.on_disconnect
    client.on_publish = acks.on_publish
    client.max_inflight_messages_set(PUBLISH_MAX_INFLIGHT)
    client.max_queued_messages_set(0)  # unbounded: keep every sample while the broker is away
    connection = connect_async(client, config.broker)
    try:
        timeout = BrokerOptions.of(config.broker).connect_timeout or PUBLISH_CONNECT_TIMEOUT_S
        waited = time.monotonic() + timeout
        while not acks.connected.wait(0.1) and time.monotonic() < waited:
            if stop.is_set():  # stopped before the broker answered: nothing was sent
                return PublishReport(
                    config.device_id, config.publisher_id, 0, 0, 0, 0.0, config.rate
                )
        if not acks.connected.is_set():
            why = (
                f"the broker refused the connection: {acks.refused}"
                if acks.refused
                else connection.last_error or "no answer"
            )
            raise ConnectionError(
                f"could not connect to {config.broker} within {timeout:g} s: {why}"
            )
        progress = None if on_progress is None else (on_progress, progress_interval)
        if not isinstance(source, SeriesReadings):
            source = Prefetched(source, max(config.batch, PREFETCH_SAMPLES))
        return _publish_loop(config, source, client, acks, stop, progress)
    finally:
        client.disconnect()
        client.loop_stop()


def _publish_loop(
    config: PublisherConfig,
    source: SampleSource | SeriesReadings,
    client: mqtt.Client,
    acks: _Acks,
    stop: threading.Event,
    progress: tuple[Callable[[int, int, float], None], float] | None,
) -> PublishReport:
    topic = config.topic or samples_topic(config.device_id)
    rng = np.random.default_rng([config.seed, 7])
    offsets = arrival_offsets(config.rate / config.batch, config.distribution, rng)
    total = config.count
    sent = messages = 0
    start = time.monotonic()
    next_report = start + (progress[1] if progress else 0.0)
    for offset in offsets:
        if stop.is_set() or (total is not None and sent >= total):
            break
        if config.duration is not None and offset >= config.duration:
            break
        delay = start + offset - time.monotonic()
        if delay > 0 and stop.wait(delay):
            break
        # Bound what paho holds (its message ids are 16 bit) if the broker is away long.
        while messages - acks.count > PUBLISH_MAX_OUTSTANDING and not stop.wait(0.05):
            pass
        n = config.batch if total is None else min(config.batch, total - sent)
        if isinstance(source, SeriesReadings):
            styled = source.messages(n, config.max_payload, topic)
        else:
            x, y = source.next(n)
            ts = np.full(n, time.time())
            styled = [
                (topic, payload)
                for payload in encode_frames(
                    x,
                    y,
                    ts,
                    publisher=config.publisher_id,
                    seq=messages,
                    max_payload=config.max_payload,
                )
            ]
        for where, payload in styled:
            client.publish(where, payload, qos=config.qos)
        sent += n
        messages += len(styled)
        now = time.monotonic()
        if progress is not None and now >= next_report:
            progress[0](sent, acks.count, now - start)
            next_report = now + progress[1]
    elapsed = time.monotonic() - start
    if config.qos > 0:
        _drain(config, acks, messages, stop)
    return PublishReport(
        device_id=config.device_id,
        publisher_id=config.publisher_id,
        samples=sent,
        messages=messages,
        acknowledged=acks.count if config.qos > 0 else messages,
        elapsed_s=elapsed,
        target_rate=config.rate,
        refused=dict(acks.refusals),
    )


def _drain(config: PublisherConfig, acks: _Acks, messages: int, stop: threading.Event) -> None:
    """Wait until the broker has acknowledged every message: up to ``drain_timeout``, or
    :data:`PUBLISH_STOP_DRAIN_S` once stopped, and not at all once stopped while the broker
    is away (a stopped sensor exits within seconds; what was not acknowledged is lost with
    it and said so)."""
    deadline = time.monotonic() + config.drain_timeout
    shortened = False
    while acks.count < messages and time.monotonic() < deadline:
        if stop.is_set():
            if not acks.connected.is_set():
                break
            if not shortened:
                deadline, shortened = min(deadline, time.monotonic() + PUBLISH_STOP_DRAIN_S), True
        time.sleep(0.02)
    if acks.count < messages:
        log.warning(
            "%d of %d messages not acknowledged by %s%s: not delivered",
            messages - acks.count,
            messages,
            config.broker,
            "" if acks.connected.is_set() else " (not connected)",
        )
