"""What a device keeps between rounds besides samples: its error feedback, its
preprocessing statistics, the first loss it measured in the run, and counters.

A ClientApp process lives one round (Flower starts one per message), so the codec's
error-feedback residual, the device's top-k gap estimate, the state of the task's
preprocessing (:mod:`edge_client.task.preprocess`) and the sequence number of the frames it
shares for data injection (and, for a simulated device, the last round whose shared frames
it received) are kept in the buffer file's ``state`` table. The
residual is tagged with the run it belongs to: a new run, or a model of another layout,
starts from none.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from edge_client.runtime.constants import DRIFT_STATUS_KEY, DRIFT_WATCH_KEY
from edge_client.runtime.drift_watch import DriftWatch
from edge_client.runtime.schema import SqliteStore, transaction
from edge_client.task.preprocess import Preprocessor
from edge_client.wire.codec import CodecError, FeedbackState, decode, encode

__all__ = ["DeviceState", "DeviceStateStore", "MemoryDeviceState"]

log = logging.getLogger(__name__)

# Keys of the state table (layout 0 and 1 of the buffer file use the same).
_FEEDBACK_RUN = "codec-run"
_FEEDBACK_RESIDUAL = "codec-residual"
_FEEDBACK_GAP = "codec-gap"
_INJECT_SEQ = "inject-seq"
_INJECT_RECEIVED = "inject-received"  # a simulated device: frames of rounds up to it are in
_PREPROCESS = "preprocess-state"  # JSON: {"kind": ..., "state": ...}
_FIRST_LOSS = "first-loss"  # JSON: {"run": ..., "loss": ...}
_PERSONAL = "personal-layers"  # the personal tensors, as an uncompressed codec frame
_SECAGG = "secagg-round"  # JSON: secure aggregation's secrets and progress this round
_SECAGG_INPUT = "secagg-input"  # the quantised update, until it is masked


class DeviceState:
    """The device state's reads and writes over a key/value table (:meth:`_get`, :meth:`_set`):
    a buffer file's (:class:`DeviceStateStore`) or a simulated device's in memory
    (:class:`MemoryDeviceState`)."""

    def feedback(self, run_id: int, like: Mapping[str, np.ndarray]) -> FeedbackState:
        """The residual and gap EWMA kept for run ``run_id``; empty for another run, or when
        the residual does not fit ``like`` (the update's tensor names and shapes)."""
        if self._get(_FEEDBACK_RUN) != str(run_id).encode():
            return FeedbackState()
        shapes = {k: v.shape for k, v in like.items()}
        try:
            residual = decode(self._get(_FEEDBACK_RESIDUAL) or b"", shapes)
            gap = float(self._get(_FEEDBACK_GAP) or b"nan")
        except (CodecError, ValueError) as err:
            log.warning("dropping an unreadable error-feedback residual: %s", err)
            return FeedbackState()
        return FeedbackState(residual, gap if math.isfinite(gap) else None)

    def save_feedback(self, run_id: int, state: FeedbackState) -> None:
        """Keep ``state`` for the next round of run ``run_id`` (one transaction)."""
        self._set(
            {
                _FEEDBACK_RUN: str(run_id).encode(),
                _FEEDBACK_RESIDUAL: encode(state.residual or {}, "none"),
                _FEEDBACK_GAP: repr(state.gap).encode(),
            }
        )

    def load_preprocessor(self, preprocessor: Preprocessor) -> None:
        """Restore ``preprocessor``'s state as the last round left it (kept as it is when
        there is none, or it was saved by another kind of preprocessing)."""
        raw = self._get(_PREPROCESS)
        if raw is None:
            return
        try:
            saved = json.loads(raw)
            if saved.get("kind") == _kind(preprocessor):
                preprocessor.load_state_dict(saved["state"])
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            log.warning("dropping an unreadable preprocessing state: %s", err)

    def save_preprocessor(self, preprocessor: Preprocessor) -> None:
        """Keep ``preprocessor``'s state for the next round (one transaction)."""
        saved = {"kind": _kind(preprocessor), "state": preprocessor.state_dict()}
        self._set({_PREPROCESS: json.dumps(saved).encode()})

    def drift_watch(self, delta: float) -> DriftWatch:
        """The device's drift watcher as last saved (a fresh one when there is none, or it
        was made with another ``delta``). Imports River."""
        return DriftWatch.from_bytes(self._get(DRIFT_WATCH_KEY) or b"", delta)

    def save_drift_watch(self, watch: DriftWatch) -> None:
        """Keep ``watch`` and its status (which the buffer's stats, and so the device's
        status and replies, report) in one transaction."""
        self._set(
            {
                DRIFT_WATCH_KEY: watch.to_bytes(),
                DRIFT_STATUS_KEY: json.dumps(watch.status.to_dict()).encode(),
            }
        )

    def first_loss(self, run_id: int) -> float | None:
        """The first loss the device measured in run ``run_id`` (what a diverged loss is
        measured against), or None when it has none for that run."""
        raw = self._get(_FIRST_LOSS)
        try:
            saved = json.loads(raw) if raw is not None else {}
            return float(saved["loss"]) if saved.get("run") == run_id else None
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            log.warning("dropping an unreadable first loss: %s", err)
            return None

    def save_first_loss(self, run_id: int, loss: float) -> None:
        """Keep ``loss`` as the first loss of run ``run_id``."""
        self._set({_FIRST_LOSS: json.dumps({"run": run_id, "loss": loss}).encode()})

    def personal(self, like: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """The device's personal tensors as last saved, or None when it has none, or they
        do not fit ``like`` (another model's names or shapes: they start afresh). Kept in
        name order, whatever order the caller's mappings have."""
        frame = self._get(_PERSONAL)
        if not frame:
            return None
        try:
            return decode(frame, {k: like[k].shape for k in sorted(like)})
        except CodecError as err:
            log.info("personal layers of another model kept aside, starting afresh: %s", err)
            return None

    def save_personal(self, values: Mapping[str, np.ndarray]) -> None:
        """Keep the personal tensors ``values`` for the next round (one transaction)."""
        self._set({_PERSONAL: encode({k: values[k] for k in sorted(values)}, "none")})

    def inject_seq(self) -> int:
        """The sequence number of the last frame this device shared (0: none yet)."""
        return int(self._get(_INJECT_SEQ) or b"0")

    def set_inject_seq(self, seq: int) -> None:
        """Record the sequence number of the frame just shared."""
        self._set({_INJECT_SEQ: str(seq).encode()})

    def inject_received(self) -> int:
        """The last round whose shared frames this device received (0: none yet): a
        simulated device's, whose broker is :mod:`edge_client.emulation.shared_topic`."""
        return int(self._get(_INJECT_RECEIVED) or b"0")

    def set_inject_received(self, server_round: int) -> None:
        """Record that the frames shared up to round ``server_round`` were received."""
        self._set({_INJECT_RECEIVED: str(server_round).encode()})

    def secure_round(self) -> dict[str, Any]:
        """Secure aggregation's state of the round in progress (:mod:`edge_client.runtime.
        secure_stages`): its keys, seed, neighbours and the shares it holds; empty when
        there is none."""
        raw = self._get(_SECAGG)
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            log.warning("dropping an unreadable secure-aggregation state")
            return {}
        return doc if isinstance(doc, dict) else {}

    def save_secure_round(self, doc: Mapping[str, Any], vector: bytes | None = None) -> None:
        """Keep ``doc`` as the round's secure-aggregation state and, when given, ``vector``
        (the quantised update; ``b""`` forgets it) in one transaction."""
        values = {_SECAGG: json.dumps(doc).encode()}
        if vector is not None:
            values[_SECAGG_INPUT] = vector
        self._set(values)

    def secure_input(self) -> bytes:
        """The quantised update kept for masking (empty: none)."""
        return self._get(_SECAGG_INPUT) or b""

    def _get(self, key: str) -> bytes | None:
        raise NotImplementedError

    def _set(self, values: Mapping[str, bytes]) -> None:
        raise NotImplementedError


class DeviceStateStore(SqliteStore, DeviceState):
    """The device state in the buffer file at ``path`` (which must exist).

    Raises
    ------
    BufferStoreError
        If there is no buffer file at ``path``, or it is not one.
    """

    def _get(self, key: str) -> bytes | None:
        row = self._db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def _set(self, values: Mapping[str, bytes]) -> None:
        with transaction(self._db) as db:
            db.executemany("INSERT OR REPLACE INTO state VALUES (?, ?)", list(values.items()))


class MemoryDeviceState(DeviceState):
    """The device state in a dict (``values``): a simulated device's, which the simulation
    engine keeps in the node's ``context.state`` between rounds instead of a file."""

    def __init__(self, values: Mapping[str, bytes] | None = None) -> None:
        self.values: dict[str, bytes] = dict(values or {})

    def _get(self, key: str) -> bytes | None:
        return self.values.get(key)

    def _set(self, values: Mapping[str, bytes]) -> None:
        self.values.update(values)


def _kind(preprocessor: Preprocessor) -> str:
    return f"{type(preprocessor).__module__}.{type(preprocessor).__qualname__}"
