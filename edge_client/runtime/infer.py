"""``fedstream infer``: the newest model version run on every sample of the device's stream.

The daemon subscribes to what the ingest daemon subscribes to (sample frames and JSON
samples on ``fedstream/v1/<device-id>/samples``, or per-reading JSON on any topics, cut into
windows by the same :class:`~edge_client.runtime.windowing.WindowAssembler`), predicts each
sample with the newest version in its model directory, and publishes one message per batch
to ``fedstream/v1/<device-id>/predictions``::

    {"device-id": "pi-1", "model-version": 12, "output": "probabilities",
     "predictions": [{"ts": 1733.2, "label": 3, "probabilities": [...],
                      "latency-s": 0.004}, ...]}

(``"forecast": [[...], ...]``, channels x horizon, for a forecasting task; ``"outputs"``
for a user's task). ``latency-s`` is from the sample's arrival to its prediction being
handed to the broker. A message is decoded and checked as ingest checks it; one that does
not fit the model's sample shape is counted and logged by reason, never predicted.

The model directory is the device's own (``model-dir`` in the SuperNode's node config: the
ClientApp keeps each global model it receives) or any export directory (``export-dir`` of
the aggregator, copied or mounted); the daemon looks for a newer version every
:data:`~edge_client.runtime.constants.MODEL_POLL_S` seconds and switches between batches.
Before the first version it drops samples (counted as ``no-model``).

Prequential error and drift: a sample that carries its own answer (a label, or for a
forecast the last ``H`` readings of a ``W + H`` window) is scored before anything else, and
its error goes to the drift watcher (:mod:`edge_client.runtime.drift_watch`), kept in the
buffer file when ``--buffer`` is given (so the ingest status and the ClientApp's replies
report it). A forecasting task's predictions are for the ``H`` readings after each sample.

The broker connection is paho's: it reconnects with back-off after the broker goes away and
subscribes again on every connect (a clean session: predictions are for live samples). A
predictions message is never bigger than ``max_payload`` (a broker's largest message): a
batch whose predictions would be goes as several messages.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import paho.mqtt.client as mqtt
import torch

from edge_client.runtime.constants import INFER_BATCH_MAX, INFER_STATUS_S, MODEL_POLL_S
from edge_client.runtime.drift_watch import DEFAULT_DELTA, DETECTORS, DriftWatch, errors_of
from edge_client.runtime.mqtt import (
    BrokerURL,
    Connection,
    Subscriptions,
    connect_async,
    describe_reason,
    make_client,
)
from edge_client.runtime.signals import Subscribed, run_connected
from edge_client.runtime.windowing import WindowAssembler, WindowSpec
from edge_client.task.manifest import SAMPLE_SHAPE
from edge_client.task.preprocess import ChannelStandardizer
from edge_client.wire.artifact import (
    ArtifactError,
    LoadedModel,
    latest_version,
    load_version,
)
from edge_client.wire.constants import DEFAULT_MAX_PAYLOAD_BYTES
from edge_client.wire.frames import decode_messages
from edge_client.wire.topics import client_id, predictions_topic, samples_topic

__all__ = ["InferConfig", "InferenceDaemon"]

log = logging.getLogger(__name__)

_Item = tuple[str, bytes, float]  # topic, payload, arrival time


@dataclass(frozen=True)
class InferConfig:
    """How ``fedstream infer`` runs.

    Attributes
    ----------
    broker : BrokerURL
        Where the samples are (and the predictions go); a
        :class:`~edge_client.runtime.mqtt.BrokerOptions` also gives the credentials, TLS
        files and the connect timeout (``run()`` exits when not connected by then).
    device_id : str
        This device: its samples topic and its predictions topic.
    model_dir : Path
        The model directory followed (newest version).
    buffer : Path, optional
        The device's buffer file: the preprocessing statistics the ClientApp keeps there
        (a task with ``preprocess = "standardize"``) and the drift watcher's state.
    topics : tuple of str
        Topics instead of the samples topic (per-reading JSON with ``windowing``).
    windowing : WindowSpec, optional
        Per-reading JSON cut into windows, as ``fedstream ingest --window`` cuts them.
    drift : {"adwin", "none"}
        Watch the prequential error for changes.
    drift_delta : float
        ADWIN's confidence.
    poll_interval : float
        Seconds between looks for a newer model version.
    max_payload : int
        Bytes a predictions message may take at most (more predictions go as several).
    """

    broker: BrokerURL
    device_id: str
    model_dir: Path
    buffer: Path | None = None
    topics: tuple[str, ...] = ()
    windowing: WindowSpec | None = None
    drift: str = "adwin"
    drift_delta: float = DEFAULT_DELTA
    poll_interval: float = MODEL_POLL_S
    max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES

    def __post_init__(self) -> None:
        if self.drift not in DETECTORS:
            raise ValueError(f"drift must be one of {DETECTORS}, got {self.drift!r}")
        if not 0 < self.drift_delta < 1:
            raise ValueError(f"drift delta must lie in (0, 1), got {self.drift_delta}")
        if self.poll_interval <= 0:
            raise ValueError(f"poll interval must be > 0, got {self.poll_interval}")
        if self.max_payload < 1:
            raise ValueError(f"max payload must be >= 1 byte, got {self.max_payload}")
        if self.windowing is not None and self.windowing.labelled:
            raise ValueError(
                "inference predicts every window as it forms: give no --label-field or "
                "--label-topic"
            )

    @property
    def subscriptions(self) -> tuple[str, ...]:
        """The topics subscribed to."""
        if self.windowing is not None:  # label-free: its streams' (or an edge node's)
            return self.windowing.subscriptions
        return self.topics or (samples_topic(self.device_id),)


@dataclass
class InferStats:
    """What the daemon has done (logged every :data:`INFER_STATUS_S` seconds)."""

    messages: int = 0
    predicted: int = 0
    published: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    versions: list[int] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)  # the last batch's


class InferenceDaemon(Subscribed):
    """Subscribe, predict, publish (see the module notes).

    Use :meth:`start` / :meth:`stop` to embed it, or :meth:`run` to block until SIGTERM or
    SIGINT.

    Raises
    ------
    ValueError
        If the configuration is inconsistent.
    """

    def __init__(self, config: InferConfig) -> None:
        self.config = config
        self.stats = InferStats()
        self.model: LoadedModel | None = None
        self._failed: dict[int, str] = {}  # version -> content hash that failed to load
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._connected = threading.Event()
        self._topic = predictions_topic(config.device_id)
        self._assembler = WindowAssembler(config.windowing) if config.windowing else None
        self._watch: DriftWatch | None = None
        self._standardizer: ChannelStandardizer | None = None
        self._next_poll = 0.0
        # A clean session: predictions are for live samples, there is nothing to catch up on.
        self._client = make_client(client_id(config.device_id, "infer"), config.broker)
        self._subscriptions = Subscriptions(config.subscriptions)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = self._on_message
        self._client.on_subscribe = self._on_subscribe
        #: The attempts to reach the broker: made before connecting, since paho's thread may
        #: call the callbacks that read it before connect_async returns.
        self.connection = Connection(v5=self._client.protocol == mqtt.MQTTv5)
        self._worker = threading.Thread(target=self._loop, name="infer", daemon=True)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Load the newest version (if any), start the worker and connect."""
        self._poll_model(force=True)
        if self.config.drift == "adwin":
            self._watch = self._load_watch()
        self._worker.start()
        connect_async(self._client, self.config.broker, self.connection)
        log.info(
            "inference on %s from %s, model %s, predictions to %s",
            ", ".join(self.config.subscriptions),
            self.config.broker,
            self.config.model_dir,
            self._topic,
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Predict what has arrived, save the drift watcher, disconnect."""
        self._stopping.set()
        self._worker.join(timeout)
        self._save_watch()
        self._client.disconnect()
        self._client.loop_stop()
        log.info("inference for %s stopped: %s", self.config.device_id, self._summary())

    def run(self) -> None:
        """Run until SIGTERM or SIGINT, as
        :func:`~edge_client.runtime.signals.run_connected` runs a daemon (which says what it
        raises)."""
        run_connected(self, self.config.broker, self._worker, "inference worker")

    # -- paho callbacks (network thread) --------------------------------------------------

    def _on_connect(self, client: mqtt.Client, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        if rc.is_failure:
            self.connection.refused(self.config.broker, rc)
            return
        self._subscriptions.send(client)

    def _on_subscribe(self, _c: mqtt.Client, _u: Any, mid: int, reasons: Any, _p: Any) -> None:
        if self._subscriptions.acknowledged(mid, reasons, self.connection):
            log.info("connected to %s", self.config.broker)
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
        assembler = self._assembler  # its spec only: read-only, safe from paho's thread
        if msg.retain and assembler is not None and assembler.arrival_stamped(msg.topic):
            return  # the broker's old copy, delivered on subscribing: no fresh reading
        self._queue.put((msg.topic, bytes(msg.payload), time.time()))

    # -- worker ---------------------------------------------------------------------------

    def _loop(self) -> None:
        next_log = time.monotonic() + INFER_STATUS_S
        while True:
            items = self._drain()
            if items:
                try:
                    self._handle(items)
                except Exception:  # one bad batch must not stop inference
                    log.exception("could not predict %d message(s)", len(items))
                    self.stats.refused["predict-error"] += len(items)
            now = time.monotonic()
            if now >= self._next_poll:
                self._poll_model()
            if now >= next_log:
                log.info("%s", self._summary())
                self._save_watch()
                next_log = now + INFER_STATUS_S
            if self._stopping.is_set() and self._queue.empty():
                return

    def _drain(self) -> list[_Item]:
        try:
            items = [self._queue.get(timeout=0.2)]
        except queue.Empty:
            return []
        while len(items) < INFER_BATCH_MAX:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _handle(self, items: list[_Item]) -> None:
        self.stats.messages += len(items)
        model = self.model
        if model is None:
            self.stats.refused["no-model"] += len(items)
            return
        x, y, ts, arrived = self._samples(items, model)
        if len(x) == 0:
            return
        self._predict_and_publish(model, x, y, ts, arrived)

    def _samples(
        self, items: list[_Item], model: LoadedModel
    ) -> tuple[
        npt.NDArray[np.float32],
        npt.NDArray[np.int64],
        npt.NDArray[np.float64],
        npt.NDArray[np.float64],
    ]:
        """Decode the messages as ingest would: samples, labels, timestamps, arrival times."""
        manifest = model.version.manifest
        shape = tuple(int(v) for v in manifest[SAMPLE_SHAPE])
        # Latency is counted from the earliest arrival among the batch's messages (an upper
        # bound for each sample: decoding them together is what keeps up with a fast stream).
        first = min(now for _t, _p, now in items)
        if self._assembler is not None:
            made = self._assembler.feed(items)  # label-free spec: every window at once
            self.stats.refused.update(made.rejected)
            if made.x.shape[1:] != shape:
                self.stats.refused["shape-mismatch"] += len(made.x)
                made.x = made.x[:0]
            n = len(made.x)
            return made.x, made.y[:n], made.ts[:n], np.full(n, first)
        classes = int(manifest.get("num-classes") or 0) or 2**31 - 1
        arrivals, rejected = decode_messages([(p, now) for _t, p, now in items], shape, classes)
        self.stats.refused.update(rejected)
        return arrivals.x, arrivals.y, arrivals.ts, np.full(len(arrivals.x), first)

    @torch.no_grad()
    def _predict_and_publish(
        self,
        model: LoadedModel,
        x: npt.NDArray[np.float32],
        y: npt.NDArray[np.int64],
        ts: npt.NDArray[np.float64],
        arrived: npt.NDArray[np.float64],
    ) -> None:
        manifest = model.version.manifest
        output = manifest.get("output", "outputs")
        x = self._preprocess(x, manifest)
        inputs = torch.from_numpy(np.ascontiguousarray(x))
        errors: list[float] = []
        if output == "forecast":
            horizon = int(manifest["forecast-horizon"])
            forecast = model(inputs[..., horizon:])  # the next H readings after each sample
            past = model(inputs[..., :-horizon])  # the sample's own last H: scored
            errors = (
                (past - inputs[..., -horizon:].reshape(past.shape))
                .abs()
                .flatten(1)
                .mean(1)
                .tolist()
            )
            entries = [{"forecast": f.tolist()} for f in forecast]
        else:
            out = model(inputs)
            if output == "probabilities":
                labels = out.argmax(1)
                entries = [
                    {"label": int(k), "probabilities": [round(float(p), 6) for p in row]}
                    for k, row in zip(labels.tolist(), out, strict=True)
                ]
                known = y >= 0
                if known.any():
                    right = (labels.numpy()[known] == y[known]).astype(np.float64)
                    errors = errors_of(right, higher_is_better=True)
            else:
                entries = [{"outputs": row.tolist()} for row in out]
        if self._watch is not None and errors:
            before = self._watch.status.changes
            self._watch.update(errors)
            if self._watch.status.changes > before:
                log.warning(
                    "drift: the prequential error rose to %.3f (%d changes so far)",
                    self._watch.status.error,
                    self._watch.status.changes,
                )
                self._save_watch()
        now = time.time()
        for entry, t, a in zip(entries, ts.tolist(), arrived.tolist(), strict=True):
            entry["ts"] = t
            entry["latency-s"] = round(now - a, 6)
        head: dict[str, Any] = {
            "device-id": self.config.device_id,
            "model-version": model.version.version,
            "output": output,
        }
        if self._watch is not None:
            head["drift"] = self._watch.status.to_dict()
        for payload in _within(head, entries, self.config.max_payload):
            self._client.publish(self._topic, payload, qos=1)
            self.stats.published += 1
        self.stats.predicted += len(entries)
        self.stats.latency_s = [e["latency-s"] for e in entries]

    def _preprocess(
        self, x: npt.NDArray[np.float32], manifest: dict[str, Any]
    ) -> npt.NDArray[np.float32]:
        """Standardise as the device's training did (its statistics, in the buffer file)."""
        if manifest.get("preprocess", "none") != "standardize":
            return x
        if self.config.buffer is None:
            raise ValueError(
                "this model expects inputs standardised by the device's own statistics: "
                "give --buffer (the device's buffer file, where the ClientApp keeps them)"
            )
        if self._standardizer is None:
            from edge_client.runtime.device_state import DeviceStateStore

            self._standardizer = ChannelStandardizer()
            with DeviceStateStore(self.config.buffer) as state:
                state.load_preprocessor(self._standardizer)
        return self._standardizer(x)

    # -- model versions -------------------------------------------------------------------

    def _poll_model(self, force: bool = False) -> None:
        self._next_poll = time.monotonic() + self.config.poll_interval
        newest = latest_version(self.config.model_dir)
        current = self.model.version.version if self.model is not None else -1
        if newest is None or (newest.version <= current and not force):
            return
        if self._failed.get(newest.version) == newest.manifest.get("content-hash"):
            return  # tried already; a rewrite of that version gets another try
        try:
            loaded = load_version(newest)
        except ArtifactError as err:
            self._failed[newest.version] = str(newest.manifest.get("content-hash"))
            log.error("cannot load model version %d (keeping %s): %s", newest.version, current, err)
            return
        self.model = loaded
        self._standardizer = None  # re-read with the new version: the ClientApp updated them
        self.stats.versions.append(newest.version)
        log.info(
            "model version %d (%s, round %s)",
            newest.version,
            newest.manifest.get("program-format"),
            newest.manifest.get("round"),
        )

    # -- drift state ----------------------------------------------------------------------

    def _load_watch(self) -> DriftWatch:
        if self.config.buffer is None:
            return DriftWatch(self.config.drift_delta)
        from edge_client.runtime.device_state import DeviceStateStore

        with DeviceStateStore(self.config.buffer) as state:
            return state.drift_watch(self.config.drift_delta)

    def _save_watch(self) -> None:
        if self._watch is None or self.config.buffer is None:
            return
        from edge_client.runtime.device_state import DeviceStateStore

        try:
            with DeviceStateStore(self.config.buffer) as state:
                state.save_drift_watch(self._watch)
        except Exception as err:
            log.warning("could not save the drift state to %s: %s", self.config.buffer, err)

    def _summary(self) -> str:
        s = self.stats
        version = self.model.version.version if self.model is not None else None
        drift = self._watch.status.to_dict() if self._watch is not None else None
        return (
            f"model {version}, {s.messages} messages, {s.predicted} predicted, "
            f"{s.published} published, refused {dict(s.refused)}, drift {drift}"
        )


def _within(head: dict[str, Any], entries: list[dict[str, Any]], max_payload: int) -> list[str]:
    """``head`` with ``"predictions": entries`` as JSON messages of at most ``max_payload``
    bytes each (the entries split in order where one message would be bigger; one entry too
    big alone still goes, and the broker says if it refuses it)."""
    payload = json.dumps({**head, "predictions": entries})
    if len(payload.encode()) <= max_payload or len(entries) <= 1:
        return [payload]
    half = len(entries) // 2
    return _within(head, entries[:half], max_payload) + _within(head, entries[half:], max_payload)
