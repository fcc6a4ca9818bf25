"""Sample frames: the wire format of samples on ``fedstream/v1/<device-id>/samples``.

Two forms are accepted:

* **Binary** (many samples per message), little endian::

      header  <4s B B B B I Q>  magic "FSSF", version, dtype, ndim, len(publisher), count, seq
      publisher id            utf-8, len(publisher) bytes (may be empty)
      shape   <ndim x u32>    per-sample feature shape
      ts      <count x f64>   timestamps, seconds since the epoch
      y       <count x i64>   integer labels
      x       <count x prod(shape) x f32>  features

  ``(publisher, seq)`` identifies the message so that QoS 1 redeliveries can be dropped.

* **JSON** for simple sensors: ``{"x": [...], "y": 3, "ts": 1700000000.1}`` or a list of such
  objects. ``x`` is flat or nested, with ``prod(shape)`` numbers; ``ts`` is optional (arrival
  time is used). A single object may carry ``"pub"`` and ``"seq"`` for de-duplication.

Decoding validates everything and raises :class:`FrameError` with a kebab-case ``reason``.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_client.constants import (
    FRAME_DTYPE_FLOAT32,
    FRAME_MAGIC,
    FRAME_MAX_NDIM,
    FRAME_MAX_SAMPLES,
    FRAME_VERSION,
    MAX_PAYLOAD_BYTES,
    PUBLISHER_ID_MAX_BYTES,
)

__all__ = [
    "REJECT_REASONS",
    "FrameError",
    "SampleBatch",
    "decode_payload",
    "encode_frame",
    "encode_json",
]

_HEADER = struct.Struct("<4sBBBBIQ")
_SMALL = 16  # messages up to this many samples are validated without numpy reductions

#: Every reason :class:`FrameError` can carry (also the keys of the rejected counters).
REJECT_REASONS = (
    "empty",
    "too-large",
    "truncated",
    "bad-magic",
    "bad-version",
    "bad-dtype",
    "bad-shape",
    "shape-mismatch",
    "count-too-large",
    "length-mismatch",
    "bad-publisher",
    "non-finite",
    "bad-label",
    "bad-timestamp",
    "bad-utf8",
    "bad-json",
)


class FrameError(ValueError):
    """A payload that is not a valid sample frame.

    Parameters
    ----------
    reason : str
        One of :data:`REJECT_REASONS`; used as the counter key.
    detail : str
        Human-readable explanation.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(slots=True)
class SampleBatch:
    """Samples decoded from one message (or taken from a buffer).

    Attributes
    ----------
    x : ndarray, float32, shape ``(n, *shape)``
    y : ndarray, int64, shape ``(n,)``
    ts : ndarray, float64, shape ``(n,)``
    publisher : str or None
        Publisher id for de-duplication; None when the message carries none.
    seq : int
        Publisher's sequence number of the message (meaningful only with a publisher).
    """

    x: npt.NDArray[np.float32]
    y: npt.NDArray[np.int64]
    ts: npt.NDArray[np.float64]
    publisher: str | None = None
    seq: int = 0

    def __len__(self) -> int:
        return int(self.y.shape[0])


def encode_frame(
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    ts: npt.ArrayLike,
    *,
    publisher: str = "",
    seq: int = 0,
) -> bytes:
    """Encode samples as one binary frame.

    Parameters
    ----------
    x : array_like, shape ``(n, *shape)``
        Features; converted to float32.
    y : array_like, shape ``(n,)``
        Integer labels.
    ts : array_like, shape ``(n,)``
        Timestamps in seconds since the epoch.
    publisher : str
        Publisher id (at most 128 utf-8 bytes); empty disables de-duplication.
    seq : int
        Sequence number of this message for ``publisher``.

    Returns
    -------
    bytes
        The frame.
    """
    xa = np.ascontiguousarray(x, dtype="<f4")
    ya = np.ascontiguousarray(y, dtype="<i8")
    ta = np.ascontiguousarray(ts, dtype="<f8")
    n = ya.shape[0]
    if xa.ndim < 2 or xa.shape[0] != n or ta.shape != (n,) or ya.ndim != 1:
        raise ValueError(f"inconsistent shapes x={xa.shape} y={ya.shape} ts={ta.shape}")
    shape = xa.shape[1:]
    if len(shape) > FRAME_MAX_NDIM:
        raise ValueError(f"at most {FRAME_MAX_NDIM} feature dimensions, got {len(shape)}")
    pub = publisher.encode()
    if len(pub) > PUBLISHER_ID_MAX_BYTES:
        raise ValueError(f"publisher id longer than {PUBLISHER_ID_MAX_BYTES} bytes")
    head = _HEADER.pack(
        FRAME_MAGIC, FRAME_VERSION, FRAME_DTYPE_FLOAT32, len(shape), len(pub), n, seq
    )
    dims = struct.pack(f"<{len(shape)}I", *shape)
    return b"".join((head, pub, dims, ta.tobytes(), ya.tobytes(), xa.tobytes()))


def encode_json(x: npt.ArrayLike, y: int, ts: float | None = None) -> bytes:
    """Encode one sample in the JSON form (for tests, docs and simple sensors)."""
    obj: dict[str, Any] = {"x": np.asarray(x, dtype=float).ravel().tolist(), "y": int(y)}
    if ts is not None:
        obj["ts"] = float(ts)
    return json.dumps(obj).encode()


def decode_payload(
    payload: bytes | bytearray,
    shape: Sequence[int],
    num_classes: int,
    *,
    now: float,
) -> SampleBatch:
    """Decode and validate one MQTT payload (binary or JSON form).

    Parameters
    ----------
    payload : bytes or bytearray
        The message payload.
    shape : sequence of int
        The device's declared per-sample feature shape.
    num_classes : int
        Labels must lie in ``[0, num_classes)``.
    now : float
        Arrival time, used for JSON samples without ``ts``.

    Returns
    -------
    SampleBatch

    Raises
    ------
    FrameError
        With the reason the payload was refused.
    """
    if not payload:
        raise FrameError("empty", "empty payload")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise FrameError("too-large", f"{len(payload)} bytes > {MAX_PAYLOAD_BYTES}")
    first = payload[:1]
    if first in (b"{", b"[") or (first.isspace() and payload.lstrip()[:1] in (b"{", b"[")):
        batch = _decode_json(bytes(payload), tuple(shape), now)
    else:
        batch = _decode_binary(bytes(payload), tuple(shape))
    _check_values(batch, num_classes)
    return batch


def _decode_binary(payload: bytes, shape: tuple[int, ...]) -> SampleBatch:
    if len(payload) < _HEADER.size:
        if not FRAME_MAGIC.startswith(payload[: len(FRAME_MAGIC)]):
            raise FrameError("bad-magic", "not a fedstream frame")
        raise FrameError("truncated", f"{len(payload)} bytes, header needs {_HEADER.size}")
    magic, version, dtype, ndim, publen, count, seq = _HEADER.unpack_from(payload)
    if magic != FRAME_MAGIC:
        raise FrameError("bad-magic", f"magic {magic!r} is not {FRAME_MAGIC!r}")
    if version != FRAME_VERSION:
        raise FrameError("bad-version", f"version {version}, this build reads {FRAME_VERSION}")
    if dtype != FRAME_DTYPE_FLOAT32:
        raise FrameError("bad-dtype", f"dtype code {dtype}; only float32 ({FRAME_DTYPE_FLOAT32})")
    if not 1 <= ndim <= FRAME_MAX_NDIM:
        raise FrameError("bad-shape", f"ndim {ndim} not in 1..{FRAME_MAX_NDIM}")
    if count == 0:
        raise FrameError("empty", "frame declares 0 samples")
    if count > FRAME_MAX_SAMPLES:
        raise FrameError("count-too-large", f"{count} samples > {FRAME_MAX_SAMPLES} per message")
    off = _HEADER.size
    if len(payload) < off + publen + 4 * ndim:
        raise FrameError("truncated", "frame ends inside its header")
    try:
        publisher = payload[off : off + publen].decode()
    except UnicodeDecodeError as err:
        raise FrameError("bad-publisher", "publisher id is not utf-8") from err
    off += publen
    dims = struct.unpack_from(f"<{ndim}I", payload, off)
    off += 4 * ndim
    if dims != shape:
        raise FrameError("shape-mismatch", f"sample shape {dims}, device declares {shape}")
    per = math.prod(shape)
    expected = off + count * (8 + 8 + 4 * per)
    if len(payload) < expected:
        raise FrameError("truncated", f"{len(payload)} bytes, {count} samples need {expected}")
    if len(payload) > expected:
        raise FrameError("length-mismatch", f"{len(payload) - expected} trailing bytes")
    ts = np.frombuffer(payload, dtype="<f8", count=count, offset=off)
    off += 8 * count
    y = np.frombuffer(payload, dtype="<i8", count=count, offset=off)
    off += 8 * count
    x = np.frombuffer(payload, dtype="<f4", count=count * per, offset=off).reshape(count, *shape)
    return SampleBatch(x=x, y=y, ts=ts, publisher=publisher or None, seq=seq)


def _decode_json(payload: bytes, shape: tuple[int, ...], now: float) -> SampleBatch:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FrameError("bad-utf8", f"JSON payload is not utf-8 ({err.reason})") from err
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise FrameError("bad-json", f"not JSON: {err}") from err
    items = obj if isinstance(obj, list) else [obj]
    if not items:
        raise FrameError("empty", "empty JSON list")
    if len(items) > FRAME_MAX_SAMPLES:
        raise FrameError("count-too-large", f"{len(items)} samples > {FRAME_MAX_SAMPLES}")
    per = math.prod(shape)
    xs = np.empty((len(items), per), dtype=np.float32)
    ys = np.empty(len(items), dtype=np.int64)
    ts = np.empty(len(items), dtype=np.float64)
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "x" not in item or "y" not in item:
            raise FrameError("bad-json", 'each sample must be an object with "x" and "y"')
        try:
            xi = np.asarray(item["x"], dtype=np.float32)
        except (ValueError, TypeError) as err:
            raise FrameError("bad-json", f'"x" is not a numeric array: {err}') from err
        if xi.size != per or (xi.ndim > 1 and xi.shape != shape):
            raise FrameError("shape-mismatch", f'"x" has shape {xi.shape}, device declares {shape}')
        xs[i] = xi.ravel()
        label = item["y"]
        if isinstance(label, bool) or not isinstance(label, int):
            raise FrameError("bad-label", f'"y" must be an integer, got {label!r:.40}')
        if not -(2**63) <= label < 2**63:
            raise FrameError("bad-label", f"label {label} out of range")
        ys[i] = label
        stamp = item.get("ts", now)
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)):
            raise FrameError("bad-timestamp", f'"ts" must be a number, got {stamp!r:.40}')
        ts[i] = stamp
    publisher: str | None = None
    seq = 0
    if isinstance(obj, dict) and "pub" in obj:
        pub, seq_v = obj.get("pub"), obj.get("seq")
        if not isinstance(pub, str) or not pub or isinstance(seq_v, bool):
            raise FrameError("bad-publisher", '"pub" must be a non-empty string')
        if not isinstance(seq_v, int) or not 0 <= seq_v < 2**63:
            raise FrameError("bad-publisher", '"seq" must be a non-negative integer with "pub"')
        if len(pub.encode()) > PUBLISHER_ID_MAX_BYTES:
            raise FrameError("bad-publisher", "publisher id too long")
        publisher, seq = pub, seq_v
    return SampleBatch(x=xs.reshape(len(items), *shape), y=ys, ts=ts, publisher=publisher, seq=seq)


def _check_values(batch: SampleBatch, num_classes: int) -> None:
    # A float64 sum of float32 values cannot overflow, so it is finite iff every value is:
    # one reduction instead of an isfinite pass plus an all().
    if not math.isfinite(float(batch.x.sum(dtype=np.float64))):
        raise FrameError("non-finite", "features contain NaN or Inf")
    if len(batch.y) <= _SMALL:  # 1-sample messages are the hot path: plain Python is faster
        stamps, labels = batch.ts.tolist(), batch.y.tolist()
        ts_ok = all(math.isfinite(t) and t >= 0 for t in stamps)
        y_ok = min(labels) >= 0 and max(labels) < num_classes
    else:
        ts_ok = bool(np.isfinite(batch.ts).all()) and batch.ts.min() >= 0
        y_ok = batch.y.min() >= 0 and batch.y.max() < num_classes
    if not ts_ok:
        raise FrameError("bad-timestamp", "timestamps must be finite and non-negative")
    if not y_ok:
        raise FrameError("bad-label", f"labels must lie in [0, {num_classes})")
