"""The update codec: round trips, error feedback, the adaptive rule, and every refusal."""

from __future__ import annotations

import math
import struct
import zlib

import numpy as np
import pytest
import zstandard

from aggregator.compression import choose_mode
from deploy.probes import nan_frame
from edge_client.wire.codec import (
    REASONS,
    CodecError,
    FeedbackState,
    compress,
    decode,
    encode,
    raw_size_limit,
    reseal,
    seal,
    topk_gap,
)

SHAPES = {"conv.weight": (8, 3, 5), "conv.bias": (8,), "head.weight": (4, 8)}


def delta(seed: int = 0, scale: float = 0.05) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (rng.standard_normal(s) * scale).astype(np.float32) for k, s in SHAPES.items()}


def refused(frame: bytes, **kw: object) -> str:
    with pytest.raises(CodecError) as err:
        decode(frame, **kw)  # type: ignore[arg-type]
    assert err.value.reason in REASONS
    return err.value.reason


def prefixed(mode: int, count: int, raw_len: int, body: bytes, version: int = 1) -> bytes:
    """A frame with any prefix values and a valid CRC (what a hostile sender can make)."""
    head = struct.pack("<4sBBHQ", b"FSUP", version, mode, count, raw_len)
    return head + struct.pack("<I", zlib.crc32(body, zlib.crc32(head))) + body


# -- round trips ----------------------------------------------------------------------------


def test_none_is_exact_and_keeps_names_shapes_and_order() -> None:
    d = delta()

    out = decode(encode(d, "none"), SHAPES)

    assert list(out) == list(SHAPES)
    for k in d:
        assert out[k].dtype == np.float32 and np.array_equal(out[k], d[k])


def test_fp16_and_int8_stay_within_their_error_bounds() -> None:
    d = delta(1)

    half = decode(encode(d, "fp16"), SHAPES)
    q8 = decode(encode(d, "int8"), SHAPES)

    for k, v in d.items():
        # float16: relative rounding error <= 2^-11 (normal range)
        assert np.all(np.abs(half[k] - v) <= np.abs(v) * 2.0**-11 + 1e-7)
        # int8: absolute error <= half a step, step = max|v| / 127 per tensor
        assert np.all(np.abs(q8[k] - v) <= np.abs(v).max() / 127 / 2 * (1 + 1e-5))


def test_topk_keeps_exactly_the_k_largest_magnitudes() -> None:
    d = delta(2)
    flat = np.concatenate([v.ravel() for v in d.values()])
    k = math.ceil(0.1 * flat.size)

    out = decode(encode(d, "topk", 0.1), SHAPES)

    got = np.concatenate([v.ravel() for v in out.values()])
    expected = set(np.argsort(-np.abs(flat))[:k].tolist())
    assert set(np.flatnonzero(got).tolist()) == expected
    kept = sorted(expected)
    np.testing.assert_allclose(got[kept], flat[kept], rtol=2.0**-11)


def test_compressed_modes_are_smaller() -> None:
    d = {"w": (np.random.default_rng(3).standard_normal(10_000) * 0.01).astype(np.float32)}

    size = {m: len(encode(d, m, 0.01)) for m in ("none", "fp16", "int8", "topk")}

    assert size["fp16"] < 0.55 * size["none"]
    assert size["int8"] < 0.3 * size["none"]
    assert size["topk"] < size["none"] / 50  # 1%: gaps + float16 values


def test_encode_refuses_non_finite_updates_and_bad_parameters() -> None:
    d = delta()
    d["conv.bias"][3] = np.inf

    with pytest.raises(CodecError) as err:
        encode(d, "int8")
    assert err.value.reason == "non-finite"
    with pytest.raises(ValueError, match="mode"):
        encode(delta(), "zip")
    with pytest.raises(ValueError, match="ratio"):
        encode(delta(), "topk", 0.0)


# -- error feedback and the adaptive rule ---------------------------------------------------


@pytest.mark.parametrize("mode", ["topk", "int8", "fp16", "none"])
def test_error_feedback_conserves_mass(mode: str) -> None:
    # Prepare: 12 rounds of deltas.
    deltas = [delta(seed) for seed in range(12)]
    state = FeedbackState()
    sent_sum = {k: np.zeros(s, np.float64) for k, s in SHAPES.items()}
    # Execute
    for d in deltas:
        packed = compress(d, state, mode, 0.05)
        state = packed.state
        for k in sent_sum:
            sent_sum[k] += packed.sent[k]
    # Assert: what was sent plus what is left equals all the true deltas.
    assert state.residual is not None
    for k in SHAPES:
        truth = sum(d[k].astype(np.float64) for d in deltas)
        np.testing.assert_allclose(sent_sum[k] + state.residual[k], truth, atol=1e-5)
    if mode == "none":
        assert all(not r.any() for r in state.residual.values())


def test_a_dense_round_folds_the_residual_in_and_resets_it() -> None:
    first = compress(delta(0), FeedbackState(), "topk", 0.05)
    assert any(r.any() for r in first.state.residual.values())  # type: ignore[union-attr]

    dense = compress(delta(1), first.state, "none")

    assert first.state.residual is not None
    for k in SHAPES:
        np.testing.assert_allclose(dense.sent[k], delta(1)[k] + first.state.residual[k], atol=1e-6)
    assert all(not r.any() for r in dense.state.residual.values())  # type: ignore[union-attr]


def test_topk_gap_is_the_relative_norm_lost() -> None:
    g = {"w": np.array([3.0, 4.0, 0.0, 0.0], np.float32)}  # ||g|| = 5

    assert topk_gap(g, 0.25) == pytest.approx((5 - 4) / 5)  # keeps the 4
    assert topk_gap(g, 0.5) == pytest.approx(0.0)
    assert topk_gap({"w": np.zeros(3, np.float32)}, 0.5) == 0.0


def test_the_gap_ewma_follows_each_round() -> None:
    a = compress(delta(0), FeedbackState(), "none", 0.1)
    b = compress(delta(1), a.state, "none", 0.1)

    assert a.state.gap == pytest.approx(a.gap)
    assert b.state.gap == pytest.approx(0.5 * b.gap + 0.5 * a.gap)


def test_the_adaptive_rule_switches_as_delta_crosses_the_measured_gap() -> None:
    # Prepare: the gap three devices would report for top-1%-of-a-real-update
    gaps = [topk_gap(delta(seed), 0.1) for seed in range(3)]
    middle = sorted(gaps)[1]
    # Execute / Assert: top-k once a majority is within delta, dense otherwise.
    assert choose_mode(gaps, max(gaps) + 1e-6) == "topk"
    assert choose_mode(gaps, middle) == "topk"  # 2 of 3 within
    assert choose_mode(gaps, middle - 1e-6) == "none"  # 1 of 3
    assert choose_mode(gaps, min(gaps) - 1e-6) == "none"
    assert choose_mode([], 1.0) == "none"  # nothing reported yet: dense


# -- refusals -------------------------------------------------------------------------------


def test_bad_magic_version_and_mode_are_refused() -> None:
    frame = encode(delta(), "int8")

    assert refused(b"XXXX" + frame[4:]) == "bad-magic"
    body = frame[20:]
    raw_len = int.from_bytes(frame[8:16], "little")
    assert refused(prefixed(1, 3, raw_len, body, version=9)) == "bad-version"
    assert refused(prefixed(7, 3, raw_len, body)) == "bad-mode"


def test_every_truncation_is_refused() -> None:
    frame = encode(delta(), "topk", 0.2)

    reasons = {refused(frame[:cut]) for cut in range(len(frame))}

    assert reasons <= {"truncated", "checksum"}


@pytest.mark.parametrize("mode", ["none", "fp16", "int8", "topk"])
def test_random_bit_flips_are_always_refused(mode: str) -> None:
    frame = encode(delta(), mode, 0.2)
    rng = np.random.default_rng(0)

    for _ in range(300):
        damaged = bytearray(frame)
        for pos in rng.integers(0, len(frame) * 8, size=rng.integers(1, 4)):
            damaged[pos // 8] ^= 1 << (pos % 8)
        if bytes(damaged) == frame:
            continue
        refused(bytes(damaged))


def test_shapes_names_and_dtypes_that_do_not_match_the_model_are_refused() -> None:
    d = delta()
    wrong_shape = {**d, "head.weight": np.zeros((8, 4), np.float32)}
    renamed = {("fc.weight" if k == "head.weight" else k): v for k, v in d.items()}
    missing = {k: v for k, v in d.items() if k != "conv.bias"}
    float64 = reseal(encode(d, "none"), lambda raw: raw.replace(bytes([1, 3]), bytes([2, 3]), 1))

    for frame in (encode(wrong_shape), encode(renamed), encode(missing), float64):
        assert refused(frame, expected=SHAPES) == "shape-mismatch"


def test_declared_sizes_above_the_cap_are_refused_before_decompressing() -> None:
    frame = encode(delta(), "none")
    raw_len = int.from_bytes(frame[8:16], "little")

    assert refused(frame, max_raw_bytes=raw_len - 1) == "too-large"
    assert refused(prefixed(0, 3, 1 << 40, frame[20:])) == "too-large"


def test_a_zstd_bomb_is_refused_without_inflating_it() -> None:
    # Prepare: 256 MiB of zeros compress to a few kB; the prefix claims 100 bytes.
    bomb = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(bytes(1 << 28))
    lying = zstandard.ZstdCompressor(level=1).compress(bytes(1 << 28))
    assert len(bomb) < 100_000
    # Execute / Assert: by the zstd header, or by reading one byte past the claim.
    assert refused(prefixed(0, 1, 100, lying)) == "too-large"
    assert refused(prefixed(0, 1, 100, bomb)) == "too-large"


def test_a_body_shorter_than_declared_is_refused() -> None:
    body = zstandard.ZstdCompressor(write_content_size=False).compress(b"\x00" * 50)

    assert refused(prefixed(0, 1, 100, body)) == "truncated"
    assert refused(prefixed(0, 1, 100, b"not zstd at all")) == "corrupt"


def test_inconsistent_tables_and_values_are_refused() -> None:
    d = delta()
    frame = encode(d, "topk", 0.1)
    stray = reseal(frame, lambda raw: raw + b"\x00")
    short = reseal(frame, lambda raw: raw[:-1])
    count_lies = seal("none", 2, zstandard.ZstdDecompressor().decompress(encode(d)[20:]))
    table = 1 + len("conv.weight") + 2 + 4 * 3
    k_lies = reseal(encode(d), lambda raw: raw[:table] + struct.pack("<I", 7) + raw[table + 4 :])

    for frame in (stray, short, count_lies, k_lies):
        assert refused(frame) == "corrupt"


def test_topk_indices_out_of_range_or_order_are_refused() -> None:
    d = {"w": np.arange(1, 101, dtype=np.float32)}
    frame = encode(d, "topk", 0.05)  # k = 5, gaps width 1
    head = 1 + 1 + 2 + 4 + 5  # name, dtype+ndim, dim, k+width

    def gaps(values: list[int]) -> bytes:
        return reseal(frame, lambda raw: raw[:head] + bytes(values) + raw[head + 5 :])

    assert decode(gaps([95, 1, 1, 1, 1]))["w"][95:].all()  # indices 95..99: valid
    assert refused(gaps([0, 1, 0, 1, 1])) == "corrupt"  # repeated index
    assert refused(gaps([96, 1, 1, 1, 1])) == "corrupt"  # index 100 is past the end


def test_nan_and_inf_values_are_refused() -> None:
    d = delta()
    half_inf = reseal(encode(d, "fp16"), lambda raw: raw[:-2] + b"\x00\x7c")  # +inf in fp16

    assert refused(nan_frame(d)) == "non-finite"
    assert refused(half_inf) == "non-finite"


def test_raw_size_limit_admits_every_mode() -> None:
    d = delta()
    cap = raw_size_limit(SHAPES)

    for mode in ("none", "fp16", "int8", "topk"):
        decode(encode(d, mode, 1.0), SHAPES, cap)
