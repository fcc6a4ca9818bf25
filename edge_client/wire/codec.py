"""The update codec: what a device sends up, small and checked on arrival.

A device sends the *delta* of its model against the round's global model. A frame is::

    prefix  <4sBBHQI   magic b"FSUP", version, mode, tensor count, raw length, CRC-32
    body    zstd(raw)  raw = table + values

The table lists every tensor: name, dtype, shape, the number ``k`` of values sent (its size
unless top-k) and the width of its index gaps. The CRC-32 covers the prefix up to itself and
the compressed body, so a flipped bit anywhere is caught before anything is decompressed.
The raw length must be under a hard cap and match the zstd frame's own size field, and
decompression stops one byte past it: a decompression bomb costs at most the cap.

Modes code the values as ``none`` (float32, exact), ``fp16``, ``int8`` (symmetric, one
float32 scale per tensor) or ``topk``: the ``k = ceil(ratio * n)`` largest magnitudes of the
whole update, as index gaps (1, 2 or 4 bytes, whichever fits the largest) and float16 values.
With :func:`compress` the device keeps what a frame did not carry (the error-feedback
residual) and adds it to its next delta, so nothing is lost, only delayed. Under
differential privacy it clips what it sends (delta plus residual) to a norm first; what the
clip cut is dropped, never carried, so the residual holds only what the codec left out and
the frame decodes to a norm within the clip, rounding included.

ScaDLES adaptive compression: each device reports an EWMA of the top-k *gap*
``| ||g|| - ||topk(g)|| | / ||g||`` (:func:`topk_gap`) and the aggregator picks the round's
mode (:mod:`aggregator.compression`).
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import zstandard as zstd

from edge_client.wire.clipping import clip_to, l2_norm
from edge_client.wire.constants import (
    CODEC_MAGIC,
    CODEC_MAX_RAW_BYTES,
    CODEC_MODES,
    CODEC_VERSION,
    CODEC_ZSTD_LEVEL,
    DEFAULT_TOPK_RATIO,
    GAP_EWMA_WEIGHT,
)

__all__ = [
    "NON_FINITE",
    "REASONS",
    "CodecError",
    "Compressed",
    "FeedbackState",
    "compress",
    "decode",
    "encode",
    "raw_size_limit",
    "reseal",
    "seal",
    "topk_gap",
]

#: The reason an update holding NaN or Inf is refused (a diverged device must not send it).
NON_FINITE = "non-finite"
REASONS = (
    "truncated",
    "bad-magic",
    "bad-version",
    "bad-mode",
    "checksum",
    "too-large",
    "corrupt",
    "shape-mismatch",
    NON_FINITE,
)

_PREFIX = struct.Struct("<4sBBHQI")  # magic, version, mode, tensors, raw length, crc32
_CRC_AT = _PREFIX.size - 4
_ENTRY = struct.Struct("<BB")  # dtype code, ndim (after the name)
_TAIL = struct.Struct("<IB")  # k, index-gap width
_DTYPE_FLOAT32 = 1
_FP16_MAX = float(np.finfo(np.float16).max)
_VALUE_BYTES = {"none": 4, "fp16": 2, "int8": 1, "topk": 2}


class CodecError(ValueError):
    """A frame (or an update to encode) that cannot be accepted.

    Attributes
    ----------
    reason : str
        One of :data:`REASONS`; what the aggregator counts.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


# -- encoding -------------------------------------------------------------------------------


def encode(
    tensors: Mapping[str, np.ndarray],
    mode: str = "none",
    ratio: float = DEFAULT_TOPK_RATIO,
    level: int = CODEC_ZSTD_LEVEL,
) -> bytes:
    """Code float tensors into one frame.

    Parameters
    ----------
    tensors : mapping of str to ndarray
        Name -> values (cast to float32), in the order they are to travel.
    mode : {"none", "fp16", "int8", "topk"}
        How values are coded.
    ratio : float
        Top-k only: the fraction of all values sent, in (0, 1].
    level : int
        zstd level.

    Raises
    ------
    CodecError
        ``non-finite`` if a value is NaN or Inf (a diverged device must not send it).
    ValueError
        On an unknown mode, a bad ratio, or a name longer than 255 bytes.
    """
    if mode not in CODEC_MODES:
        raise ValueError(f"codec mode must be one of {CODEC_MODES}, got {mode!r}")
    if not 0 < ratio <= 1:
        raise ValueError(f"top-k ratio must be in (0, 1], got {ratio}")
    arrays = {name: np.asarray(t, dtype=np.float32) for name, t in tensors.items()}
    if not all(np.isfinite(a).all() for a in arrays.values()):
        raise CodecError(NON_FINITE, "the update holds NaN or Inf")
    if mode == "topk":
        table, values = _code_topk(arrays, ratio)
    else:
        table = [_entry(name, a.shape, a.size, 0) for name, a in arrays.items()]
        values = [_code_dense(a.ravel(), mode) for a in arrays.values()]
    raw = b"".join(table) + b"".join(values)
    return seal(mode, len(arrays), raw, level)


def seal(mode: str, count: int, raw: bytes, level: int = CODEC_ZSTD_LEVEL) -> bytes:
    """Wrap a raw body (table + values) in a frame: zstd, prefix, CRC-32.

    Public so that tools and tests can build frames with arbitrary bodies.
    """
    body = zstd.ZstdCompressor(level=level, write_content_size=True).compress(raw)
    head = _PREFIX.pack(CODEC_MAGIC, CODEC_VERSION, CODEC_MODES.index(mode), count, len(raw), 0)
    crc = zlib.crc32(body, zlib.crc32(head[:_CRC_AT]))
    return head[:_CRC_AT] + struct.pack("<I", crc) + body


def reseal(frame: bytes, edit: Callable[[bytes], bytes]) -> bytes:
    """Re-frame an update frame after editing its raw body (valid prefix and CRC).

    A tool for building hostile frames that pass the checksum (tests, the reliability
    report); decoding the result is what checks the body.
    """
    raw = zstd.ZstdDecompressor().decompress(frame[_PREFIX.size :])
    return seal(CODEC_MODES[frame[5]], int.from_bytes(frame[6:8], "little"), edit(raw))


def _entry(name: str, shape: tuple[int, ...], k: int, width: int) -> bytes:
    raw_name = name.encode()
    if not 0 < len(raw_name) < 256:
        raise ValueError(f"tensor name must be 1-255 bytes, got {name!r}")
    return (
        struct.pack("<B", len(raw_name))
        + raw_name
        + _ENTRY.pack(_DTYPE_FLOAT32, len(shape))
        + struct.pack(f"<{len(shape)}I", *shape)
        + _TAIL.pack(k, width)
    )


def _code_dense(flat: np.ndarray, mode: str) -> bytes:
    if mode == "none":
        return flat.astype("<f4").tobytes()
    if mode == "fp16":
        return _fp16(flat)
    peak = float(np.abs(flat).max()) if flat.size else 0.0
    scale = peak / 127.0
    q = np.rint(flat / scale) if scale > 0 else np.zeros_like(flat)
    return struct.pack("<f", scale) + q.astype(np.int8).tobytes()


def _fp16(values: np.ndarray) -> bytes:
    return bytes(np.clip(values, -_FP16_MAX, _FP16_MAX).astype("<f2").tobytes())


def _code_topk(arrays: Mapping[str, np.ndarray], ratio: float) -> tuple[list[bytes], list[bytes]]:
    flat = np.concatenate([a.ravel() for a in arrays.values()]) if arrays else np.zeros(0)
    k = min(flat.size, max(1, math.ceil(ratio * flat.size)))
    chosen = np.sort(np.argpartition(np.abs(flat), flat.size - k)[flat.size - k :])
    table: list[bytes] = []
    values: list[bytes] = []
    offset = 0
    for name, a in arrays.items():
        lo, hi = np.searchsorted(chosen, [offset, offset + a.size])
        idx = np.asarray(chosen[lo:hi], dtype=np.int64) - offset
        gaps = np.diff(idx, prepend=0)
        width = 1 if gaps.size == 0 or gaps.max() < 2**8 else 2 if gaps.max() < 2**16 else 4
        table.append(_entry(name, a.shape, idx.size, width))
        values.append(gaps.astype(f"<u{width}").tobytes() + _fp16(a.ravel()[idx]))
        offset += a.size
    return table, values


# -- decoding -------------------------------------------------------------------------------


def decode(
    frame: bytes | bytearray | memoryview,
    expected: Mapping[str, Sequence[int]] | None = None,
    max_raw_bytes: int = CODEC_MAX_RAW_BYTES,
) -> dict[str, np.ndarray]:
    """Check and decode a frame into dense float32 tensors (zeros where top-k sent nothing).

    Parameters
    ----------
    frame : bytes
        What :func:`encode` made (or anything else: it is checked).
    expected : mapping of str to shape, optional
        The model's tensor names and shapes, in order; anything else is refused.
    max_raw_bytes : int
        Cap on the decompressed size (never above :data:`CODEC_MAX_RAW_BYTES`).

    Raises
    ------
    CodecError
        With ``reason`` one of :data:`REASONS`.
    """
    frame = memoryview(frame).cast("B")
    if len(frame) < _PREFIX.size:
        raise CodecError("truncated", f"{len(frame)} bytes is shorter than a frame prefix")
    magic, version, mode_code, count, raw_len, crc = _PREFIX.unpack_from(frame)
    if magic != CODEC_MAGIC:
        raise CodecError("bad-magic", f"magic {bytes(magic)!r} is not {CODEC_MAGIC!r}")
    if version != CODEC_VERSION:
        raise CodecError("bad-version", f"version {version}, this codec reads {CODEC_VERSION}")
    if mode_code >= len(CODEC_MODES):
        raise CodecError("bad-mode", f"mode code {mode_code}")
    body = frame[_PREFIX.size :]
    if zlib.crc32(body, zlib.crc32(frame[:_CRC_AT])) != crc:
        raise CodecError("checksum", "CRC-32 mismatch: the frame was damaged or cut")
    cap = min(max_raw_bytes, CODEC_MAX_RAW_BYTES)
    if raw_len > cap:
        raise CodecError("too-large", f"declares {raw_len} raw bytes, the cap is {cap}")
    raw = _decompress(body, raw_len)
    tensors = _parse(raw, CODEC_MODES[mode_code], count)
    if expected is not None:
        _check_layout(tensors, expected)
    return tensors


def _decompress(body: memoryview, raw_len: int) -> bytes:
    try:
        declared = zstd.frame_content_size(body)
    except zstd.ZstdError as err:
        raise CodecError("corrupt", f"not a zstd frame: {err}") from err
    if declared > raw_len:
        raise CodecError("too-large", f"zstd frame declares {declared} > {raw_len} bytes")
    out = bytearray()
    try:
        with zstd.ZstdDecompressor().stream_reader(body) as reader:
            while len(out) <= raw_len:  # read at most one byte past the declared length
                chunk = reader.read(raw_len + 1 - len(out))
                if not chunk:
                    break
                out += chunk
    except zstd.ZstdError as err:
        raise CodecError("corrupt", f"zstd: {err}") from err
    if len(out) > raw_len:
        raise CodecError("too-large", f"decompresses past the declared {raw_len} bytes")
    if len(out) < raw_len:
        raise CodecError("truncated", f"{len(out)} of {raw_len} raw bytes")
    return bytes(out)


def _parse(raw: bytes, mode: str, count: int) -> dict[str, np.ndarray]:
    """Table then values; every length checked against what is there."""
    pos = 0
    entries: list[tuple[str, tuple[int, ...], int, int]] = []
    try:
        for _ in range(count):
            (length,) = struct.unpack_from("<B", raw, pos)
            name = raw[pos + 1 : pos + 1 + length].decode()
            pos += 1 + length
            dtype, ndim = _ENTRY.unpack_from(raw, pos)
            pos += _ENTRY.size
            shape = struct.unpack_from(f"<{ndim}I", raw, pos)
            pos += 4 * ndim
            k, width = _TAIL.unpack_from(raw, pos)
            pos += _TAIL.size
            if dtype != _DTYPE_FLOAT32:
                raise CodecError("shape-mismatch", f"{name}: dtype code {dtype} is not float32")
            entries.append((name, tuple(shape), k, width))
    except (struct.error, UnicodeDecodeError) as err:
        raise CodecError("corrupt", f"bad tensor table: {err}") from err
    out: dict[str, np.ndarray] = {}
    for name, shape, k, width in entries:
        size = math.prod(shape)
        if name in out:
            raise CodecError("corrupt", f"tensor {name!r} appears twice")
        dense_bad = mode != "topk" and (k != size or width != 0)
        if dense_bad or k > size or (mode == "topk" and width not in (1, 2, 4)):
            raise CodecError("corrupt", f"{name}: {k} values for {size} entries")
        need = k * (width + _VALUE_BYTES[mode]) + (4 if mode == "int8" else 0)
        if pos + need > len(raw):
            raise CodecError("corrupt", f"{name}: values run past the body")
        out[name] = _values(raw, pos, mode, shape, k, width)
        pos += need
    if pos != len(raw):
        raise CodecError("corrupt", f"{len(raw) - pos} stray bytes after the values")
    if not all(np.isfinite(t).all() for t in out.values()):
        raise CodecError(NON_FINITE, "the update holds NaN or Inf")
    return out


def _values(
    raw: bytes, pos: int, mode: str, shape: tuple[int, ...], k: int, width: int
) -> np.ndarray:
    if mode == "none":
        return np.frombuffer(raw, "<f4", k, pos).astype(np.float32).reshape(shape)
    if mode == "fp16":
        return np.frombuffer(raw, "<f2", k, pos).astype(np.float32).reshape(shape)
    if mode == "int8":
        (scale,) = struct.unpack_from("<f", raw, pos)
        q = np.frombuffer(raw, np.int8, k, pos + 4)
        return (q.astype(np.float32) * np.float32(scale)).reshape(shape)
    gaps = np.frombuffer(raw, f"<u{width}", k, pos).astype(np.int64)
    if k and (gaps[1:].min(initial=1) < 1 or int(gaps.sum()) >= math.prod(shape)):
        raise CodecError("corrupt", "top-k indices out of order or out of range")
    dense = np.zeros(math.prod(shape), np.float32)
    dense[np.cumsum(gaps)] = np.frombuffer(raw, "<f2", k, pos + k * width)
    return dense.reshape(shape)


def _check_layout(tensors: Mapping[str, np.ndarray], expected: Mapping[str, Sequence[int]]) -> None:
    got = [(n, tuple(t.shape)) for n, t in tensors.items()]
    want = [(n, tuple(s)) for n, s in expected.items()]
    if got != want:
        raise CodecError("shape-mismatch", f"tensors {got} do not match the model's {want}")


def raw_size_limit(shapes: Mapping[str, Sequence[int]]) -> int:
    """The largest raw body any mode can produce for a model with these tensors."""
    table = sum(
        1 + len(n.encode()) + _ENTRY.size + 4 * len(s) + _TAIL.size for n, s in shapes.items()
    )
    return table + sum(6 * math.prod(s) + 4 for s in shapes.values())


# -- error feedback and adaptive compression ------------------------------------------------


@dataclass
class FeedbackState:
    """What a device keeps between rounds: the unsent residual and its top-k gap EWMA."""

    residual: dict[str, np.ndarray] | None = None
    gap: float | None = None


@dataclass(frozen=True)
class Compressed:
    """One compressed update: the frame, what it decodes to, and the device's new state."""

    frame: bytes
    sent: dict[str, np.ndarray]
    state: FeedbackState
    gap: float  # this round's top-k gap (before the EWMA)
    within_clip: bool = True  # under a clip: the update needed no clipping


def topk_gap(tensors: Mapping[str, np.ndarray], ratio: float) -> float:
    """ScaDLES' loss of top-k: ``| ||g|| - ||topk(g)|| | / ||g||`` over the whole update."""
    flat = np.concatenate([np.asarray(t, np.float64).ravel() for t in tensors.values()])
    norm = float(np.linalg.norm(flat))
    if flat.size == 0 or norm == 0.0:
        return 0.0
    k = min(flat.size, max(1, math.ceil(ratio * flat.size)))
    top = np.partition(flat**2, flat.size - k)[flat.size - k :]
    return abs(norm - math.sqrt(float(top.sum()))) / norm


def compress(
    delta: Mapping[str, np.ndarray],
    state: FeedbackState,
    mode: str,
    ratio: float = DEFAULT_TOPK_RATIO,
    clip: float = 0.0,
    noise: float = 0.0,
    rng: np.random.Generator | None = None,
) -> Compressed:
    """Encode ``delta`` plus the carried residual; keep what the frame lost for next time.

    The residual is exactly ``(delta + old residual) - decode(frame)``, so over any number
    of rounds what was sent plus the residual equals the sum of the true deltas. A dense
    ``none`` round sends everything and leaves a zero residual (folded in and reset).

    Parameters
    ----------
    clip : float
        Differential privacy: clip ``delta + residual`` to this L2 norm before coding (0:
        no clip). What the clip cut is dropped, not carried: the residual keeps only what
        the codec left out, so its norm stays within the clip. Without ``noise`` the frame
        is made again, scaled down, until it decodes to a norm within the clip (top-k's
        float16 values and int8's rounding may push it over).
    noise : float
        Local differential privacy: add Gaussian noise of standard deviation ``noise x
        clip`` to the clipped update before coding (coding it is then post-processing).
    rng : numpy.random.Generator, optional
        The noise's generator; one seeded by the operating system's entropy by default (a
        seeded one would let whoever knows the seed take the noise off).
    """
    g = {k: np.asarray(v, np.float32) for k, v in delta.items()}
    if state.residual is not None:
        g = {k: v + state.residual[k] for k, v in g.items()}
    within = True
    if clip > 0:
        g, within = clip_to(g, clip)
        if noise > 0:
            draw = rng or np.random.default_rng()
            g = {
                k: v + draw.normal(0.0, noise * clip, v.shape).astype(np.float32)
                for k, v in g.items()
            }
    frame = encode(g, mode, ratio)
    sent = decode(frame)
    if clip > 0 and noise == 0:
        g, frame, sent = _within_clip(g, frame, sent, clip, mode, ratio)
    residual = {k: v - sent[k] for k, v in g.items()}
    gap = topk_gap(g, ratio)
    ewma = gap if state.gap is None else GAP_EWMA_WEIGHT * gap + (1 - GAP_EWMA_WEIGHT) * state.gap
    return Compressed(frame, sent, FeedbackState(residual, ewma), gap, within)


_CLIP_RETRIES = 8  # rescalings of a frame whose rounding took it past the clip


def _within_clip(
    g: dict[str, np.ndarray],
    frame: bytes,
    sent: dict[str, np.ndarray],
    clip: float,
    mode: str,
    ratio: float,
) -> tuple[dict[str, np.ndarray], bytes, dict[str, np.ndarray]]:
    """Scale ``g`` down and code it again until its frame decodes within ``clip``.

    Coding scales with its input (int8's scale is the tensor's peak, float16 is relative),
    so one rescaling by ``clip / ||sent||`` nearly always lands within; the margin and the
    retries cover float rounding. The part scaled away is clipping's, so it is dropped.
    """
    for _ in range(_CLIP_RETRIES):
        norm = l2_norm(sent)
        if norm <= clip:
            return g, frame, sent
        scale = np.float32(clip / norm * (1 - 1e-4))
        g = {k: v * scale for k, v in g.items()}
        frame = encode(g, mode, ratio)
        sent = decode(frame)
    if l2_norm(sent) > clip:  # never seen; a frame over the clip must not leave the device
        raise ValueError(f"could not code the update within the clip {clip}")
    return g, frame, sent
