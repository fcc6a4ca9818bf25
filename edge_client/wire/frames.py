"""Sample frames: the wire format of samples on ``fedstream/v1/<device-id>/samples``.

Two forms are accepted:

* **Binary** (many samples per message), little endian::

      header  <4s B B B B I Q>  magic "FSSF", version, dtype, ndim, len(publisher), count, seq
      publisher id            utf-8, len(publisher) bytes (may be empty)
      shape   <ndim x u32>    per-sample feature shape
      ts      <count x f64>   timestamps, seconds since the epoch
      y       <count x i64>   integer labels
      x       <count x prod(shape) x f32>  features

  ``(publisher, seq)`` identifies the message so that QoS 1 redeliveries can be dropped,
  and gaps in a publisher's numbers tell messages that never arrived. Samples that do not fit
  a broker's largest message go as several frames, numbered on (:func:`encode_frames`).

* **JSON** for simple sensors: ``{"x": [...], "y": 3, "ts": 1700000000.1}`` or a list of such
  objects. ``x`` is flat or nested, with ``prod(shape)`` numbers; ``ts`` is optional (arrival
  time is used). A single object may carry ``"pub"`` and ``"seq"`` for de-duplication.

Decoding validates everything and raises :class:`FrameError` with a kebab-case ``reason``.
"""

from __future__ import annotations

import json
import logging
import math
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_client.wire.constants import (
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
    "Arrivals",
    "FrameError",
    "SampleBatch",
    "decode_messages",
    "decode_payload",
    "encode_frame",
    "encode_frames",
    "encode_json",
    "frame_capacity",
    "json_items",
]

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<4sBBBBIQ")

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
    "bad-sequence",
    "bad-utf8",
    "bad-json",
    "decode-error",
    # per-reading JSON (edge_client.wire.readings) and windowing (edge_client.runtime.windowing)
    "missing-field",
    "not-a-number",
    "unknown-label",
    "bad-topic",
    "late",
    "clock-skew",
    # Sparkplug B (edge_client.wire.sparkplug)
    "bad-protobuf",
    "too-many-metrics",
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


def frame_capacity(shape: Sequence[int], publisher: str, max_payload: int) -> int:
    """The most samples of ``shape`` one frame of ``publisher`` holds in ``max_payload`` bytes.

    Raises
    ------
    ValueError
        If not even one sample fits.
    """
    head = _HEADER.size + len(publisher.encode()) + 4 * len(shape)
    per_sample = 8 + 8 + 4 * math.prod(shape)  # timestamp, label, float32 features
    if head + per_sample > max_payload:
        raise ValueError(
            f"one sample of shape {tuple(shape)} makes a {head + per_sample}-byte frame, more "
            f"than the largest message, {max_payload} bytes (--max-payload): raise it if the "
            "broker takes more"
        )
    return (max_payload - head) // per_sample


def encode_frames(
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    ts: npt.ArrayLike,
    *,
    publisher: str,
    seq: int,
    max_payload: int,
) -> list[bytes]:
    """Encode samples as frames of at most ``max_payload`` bytes each (a broker's largest
    message), numbered ``seq``, ``seq + 1``, ...: as one frame when they fit.

    Returns
    -------
    list of bytes
        The frames, in order; each is a frame of its own (its samples are stored once,
        whichever of them arrive, and a missing one is a gap in the numbers).

    Raises
    ------
    ValueError
        If one sample alone is bigger than ``max_payload``, or the arrays are inconsistent.
    """
    xa = np.asarray(x, dtype="<f4")
    if xa.ndim < 2:
        raise ValueError(f"samples must have a shape, got x of shape {xa.shape}")
    n = xa.shape[0]
    per_frame = frame_capacity(xa.shape[1:], publisher, max_payload)
    ya, ta = np.asarray(y), np.asarray(ts)
    return [
        encode_frame(
            xa[at : at + per_frame],
            ya[at : at + per_frame],
            ta[at : at + per_frame],
            publisher=publisher,
            seq=seq + part,
        )
        for part, at in enumerate(range(0, max(n, 1), per_frame))
    ]


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
    shape = tuple(shape)
    msg = _parse(payload, shape, now)
    x, y, ts = _arrays([msg], shape)
    _check_values(x, y, ts, num_classes)
    return SampleBatch(x=x, y=y, ts=ts, publisher=msg.publisher, seq=msg.seq)


@dataclass(slots=True)
class Arrivals:
    """Samples of several messages concatenated in arrival order, with each one's identity.

    This is what the ingest writer commits in one transaction: one array per field for the
    whole window keeps per-message work to bookkeeping.

    Attributes
    ----------
    x, y, ts : ndarray
        All samples, message after message.
    counts : list of int
        Samples per message.
    publishers : list of (str or None)
        Publisher id per message (None: no de-duplication).
    seqs : list of int
        Sequence number per message.
    """

    x: npt.NDArray[np.float32]
    y: npt.NDArray[np.int64]
    ts: npt.NDArray[np.float64]
    counts: list[int]
    publishers: list[str | None]
    seqs: list[int]

    def __len__(self) -> int:
        return len(self.counts)

    @classmethod
    def from_batches(cls, batches: Sequence[SampleBatch], shape: Sequence[int]) -> Arrivals:
        """Concatenate decoded messages (all of feature shape ``shape``)."""
        if not batches:
            return cls(
                x=np.empty((0, *shape), np.float32),
                y=np.empty(0, np.int64),
                ts=np.empty(0, np.float64),
                counts=[],
                publishers=[],
                seqs=[],
            )
        return cls(
            x=np.concatenate([b.x for b in batches]).astype(np.float32, copy=False),
            y=np.concatenate([b.y for b in batches]).astype(np.int64, copy=False),
            ts=np.concatenate([b.ts for b in batches]).astype(np.float64, copy=False),
            counts=[len(b) for b in batches],
            publishers=[b.publisher for b in batches],
            seqs=[b.seq for b in batches],
        )


def decode_messages(
    items: Sequence[tuple[bytes | bytearray, float]],
    shape: Sequence[int],
    num_classes: int,
) -> tuple[Arrivals, Counter[str]]:
    """Decode many payloads at once; the fast path of the ingest daemon.

    Each payload's structure is checked on its own; the values (finite, labels in range)
    are checked once over the concatenation, and message by message only when that finds
    something wrong. The result is the same as :func:`decode_payload` on each.

    Parameters
    ----------
    items : sequence of (payload, arrival time)
        The messages, in arrival order.
    shape : sequence of int
        The device's declared per-sample feature shape.
    num_classes : int
        Labels must lie in ``[0, num_classes)``.

    Returns
    -------
    arrivals : Arrivals
        The valid messages.
    rejected : collections.Counter
        Refused messages by reason.
    """
    shape = tuple(shape)
    parsed: list[_Parsed] = []
    rejected: Counter[str] = Counter()
    for payload, now in items:
        try:
            parsed.append(_parse(payload, shape, now))
        except FrameError as err:
            rejected[err.reason] += 1
        except Exception:  # a decoder bug must not stop ingest: count it, keep going
            log.exception("unexpected error decoding a message")
            rejected["decode-error"] += 1
    x, y, ts = _arrays(parsed, shape)
    try:
        _check_values(x, y, ts, num_classes)
    except FrameError:  # rare: find the culprits one by one
        good = []
        for msg in parsed:
            try:
                _check_values(*_arrays([msg], shape), num_classes)
                good.append(msg)
            except FrameError as err:
                rejected[err.reason] += 1
        parsed = good
        x, y, ts = _arrays(parsed, shape)
    arrivals = Arrivals(
        x=x,
        y=y,
        ts=ts,
        counts=[m.count for m in parsed],
        publishers=[m.publisher for m in parsed],
        seqs=[m.seq for m in parsed],
    )
    return arrivals, rejected


@dataclass(slots=True)
class _Parsed:
    """One structurally valid message: its fields as little-endian bytes, unchecked values."""

    publisher: str | None
    seq: int
    count: int
    ts: bytes | memoryview
    y: bytes | memoryview
    x: bytes | memoryview


def _parse(payload: bytes | bytearray, shape: tuple[int, ...], now: float) -> _Parsed:
    if not payload:
        raise FrameError("empty", "empty payload")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise FrameError("too-large", f"{len(payload)} bytes > {MAX_PAYLOAD_BYTES}")
    first = payload[:1]
    if first in (b"{", b"[") or (first.isspace() and payload.lstrip()[:1] in (b"{", b"[")):
        batch = _decode_json(bytes(payload), shape, now)
        return _Parsed(
            publisher=batch.publisher,
            seq=batch.seq,
            count=len(batch),
            ts=batch.ts.astype("<f8").tobytes(),
            y=batch.y.astype("<i8").tobytes(),
            x=batch.x.astype("<f4").tobytes(),
        )
    return _parse_binary(payload, shape)


def _arrays(
    parsed: Sequence[_Parsed], shape: tuple[int, ...]
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Concatenate parsed messages into (x, y, ts) arrays (one copy of the bytes)."""
    n = sum(m.count for m in parsed)
    if len(parsed) == 1:
        (m,) = parsed
        ts_b, y_b, x_b = m.ts, m.y, m.x
    else:
        ts_b = b"".join(m.ts for m in parsed)
        y_b = b"".join(m.y for m in parsed)
        x_b = b"".join(m.x for m in parsed)
    x = np.frombuffer(x_b, dtype="<f4").reshape(n, *shape)
    return x, np.frombuffer(y_b, dtype="<i8"), np.frombuffer(ts_b, dtype="<f8")


def _parse_binary(payload: bytes | bytearray, shape: tuple[int, ...]) -> _Parsed:
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
    if seq >= 2**63:  # the buffer stores it as a signed 64-bit integer
        raise FrameError("bad-publisher", f"sequence number {seq} is out of range")
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
    view = memoryview(payload)
    y_at = off + 8 * count
    x_at = y_at + 8 * count
    return _Parsed(
        publisher=publisher or None,
        seq=seq,
        count=count,
        ts=view[off:y_at],
        y=view[y_at:x_at],
        x=view[x_at:],
    )


def json_items(payload: bytes | bytearray, what: str = "samples") -> tuple[Any, list[Any]]:
    """A JSON payload as parsed, and its items: its list, or its one value as a list of one.

    Raises
    ------
    FrameError
        ``bad-utf8``, ``bad-json``, ``empty`` (an empty list) or ``count-too-large`` (more
        than :data:`~edge_client.wire.constants.FRAME_MAX_SAMPLES` of ``what``).
    """
    try:
        obj = json.loads(bytes(payload).decode("utf-8"))
    except UnicodeDecodeError as err:
        raise FrameError("bad-utf8", f"JSON payload is not utf-8 ({err.reason})") from err
    except (json.JSONDecodeError, RecursionError) as err:
        raise FrameError("bad-json", f"not JSON: {err}") from err
    items = obj if isinstance(obj, list) else [obj]
    if not items:
        raise FrameError("empty", "empty JSON list")
    if len(items) > FRAME_MAX_SAMPLES:
        raise FrameError("count-too-large", f"{len(items)} {what} > {FRAME_MAX_SAMPLES}")
    return obj, items


def _decode_json(payload: bytes, shape: tuple[int, ...], now: float) -> SampleBatch:
    obj, items = json_items(payload)
    per = math.prod(shape)
    xs = np.empty((len(items), per), dtype=np.float32)
    ys = np.empty(len(items), dtype=np.int64)
    ts = np.empty(len(items), dtype=np.float64)
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "x" not in item or "y" not in item:
            raise FrameError("bad-json", 'each sample must be an object with "x" and "y"')
        try:
            with np.errstate(over="ignore"):  # 1e300 -> inf, refused below as non-finite
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


def _check_values(
    x: npt.NDArray[np.float32],
    y: npt.NDArray[np.int64],
    ts: npt.NDArray[np.float64],
    num_classes: int,
) -> None:
    if not len(y):
        return
    # A float64 sum of float32 values cannot overflow, so it is finite iff every value is:
    # one reduction instead of an isfinite pass plus an all().
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: nan, refused below
        total = float(x.sum(dtype=np.float64))
    if not math.isfinite(total):
        raise FrameError("non-finite", "features contain NaN or Inf")
    if not (np.isfinite(ts).all() and ts.min() >= 0):
        raise FrameError("bad-timestamp", "timestamps must be finite and non-negative")
    if y.min() < 0 or y.max() >= num_classes:
        raise FrameError("bad-label", f"labels must lie in [0, {num_classes})")
