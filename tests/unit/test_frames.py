"""Sample frames: round trips and every rejection reason."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from edge_client.wire.constants import FRAME_MAX_SAMPLES, MAX_PAYLOAD_BYTES
from edge_client.wire.frames import (
    REJECT_REASONS,
    FrameError,
    decode_messages,
    decode_payload,
    encode_frame,
    encode_frames,
    frame_capacity,
)

SHAPE = (6, 32)
NOW = 1.7e9


def decode(payload: bytes):
    return decode_payload(payload, SHAPE, 6, now=NOW)


def reason_of(payload: bytes) -> str:
    with pytest.raises(FrameError) as info:
        decode(payload)
    assert info.value.reason in REJECT_REASONS
    return info.value.reason


def sample_arrays(n: int = 3):
    rng = np.random.default_rng(1)
    return (
        rng.standard_normal((n, *SHAPE)).astype(np.float32),
        rng.integers(0, 6, n),
        NOW + np.arange(n, dtype=np.float64),
    )


def test_binary_round_trip_keeps_values_and_identity() -> None:
    # Prepare
    x, y, ts = sample_arrays(5)
    # Execute
    batch = decode(encode_frame(x, y, ts, publisher="pub-1", seq=42))
    # Assert
    np.testing.assert_array_equal(batch.x, x)
    np.testing.assert_array_equal(batch.y, y)
    np.testing.assert_array_equal(batch.ts, ts)
    assert (batch.publisher, batch.seq, len(batch)) == ("pub-1", 42, 5)


def test_json_forms_round_trip() -> None:
    x, y, _ = sample_arrays(2)
    single = json.dumps({"x": x[0].tolist(), "y": int(y[0]), "ts": 5.0}).encode()
    many = json.dumps([{"x": x[i].ravel().tolist(), "y": int(y[i])} for i in range(2)]).encode()

    one = decode(single)
    two = decode(many)

    np.testing.assert_allclose(one.x[0], x[0])
    assert one.ts[0] == 5.0 and one.publisher is None
    np.testing.assert_allclose(two.x, x)
    assert list(two.ts) == [NOW, NOW]  # arrival time when ts is absent


def test_json_publisher_identity_is_read() -> None:
    payload = json.dumps({"x": [0.0] * 192, "y": 1, "pub": "s-1", "seq": 9}).encode()
    batch = decode(payload)
    assert (batch.publisher, batch.seq) == ("s-1", 9)


def _good(n: int = 2) -> bytes:
    x, y, ts = sample_arrays(n)
    return encode_frame(x, y, ts, publisher="p", seq=1)


def _with_header(**fields: int) -> bytes:
    good = bytearray(_good())
    names = ["magic", "version", "dtype", "ndim", "publen", "count", "seq"]
    values = list(struct.unpack_from("<4sBBBBIQ", good))
    for k, v in fields.items():
        values[names.index(k)] = v
    struct.pack_into("<4sBBBBIQ", good, 0, *values)
    return bytes(good)


REJECTED = [
    (b"", "empty"),
    (b"\x00" * 3, "bad-magic"),
    (b"FSS", "truncated"),
    (b"XXXX" + _good()[4:], "bad-magic"),
    (_with_header(version=9), "bad-version"),
    (_with_header(dtype=7), "bad-dtype"),
    (_with_header(ndim=0), "bad-shape"),
    (_with_header(ndim=9), "bad-shape"),
    (_with_header(count=0), "empty"),
    (_with_header(count=FRAME_MAX_SAMPLES + 1), "count-too-large"),
    (_with_header(count=2**32 - 1), "count-too-large"),
    (_with_header(count=3), "truncated"),
    (_with_header(seq=2**63), "bad-publisher"),  # SQLite stores seq as a signed 64-bit int
    (_with_header(publen=200)[:40], "truncated"),
    (_good()[:-1], "truncated"),
    (_good()[:25], "truncated"),
    (_good() + b"\x00", "length-mismatch"),
    (b"\xff" * (MAX_PAYLOAD_BYTES + 1), "too-large"),
    (b'{"x": [1, 2', "bad-json"),
    (b"\xff{\xfe", "bad-magic"),
    (b'{"x": "\xff\xfe"}', "bad-utf8"),
    (b"[]", "empty"),
    (b'{"y": 1}', "bad-json"),
    (b"[1, 2]", "bad-json"),
    (b'{"x": [[1, 2], [3]], "y": 1}', "bad-json"),
    (b'{"x": [1, 2, 3], "y": 1}', "shape-mismatch"),
    (json.dumps({"x": [0] * 192, "y": 1.5}).encode(), "bad-label"),
    (json.dumps({"x": [0] * 192, "y": True}).encode(), "bad-label"),
    (json.dumps({"x": [0] * 192, "y": 6}).encode(), "bad-label"),
    (json.dumps({"x": [0] * 192, "y": -1}).encode(), "bad-label"),
    (json.dumps({"x": [0] * 192, "y": 10**30}).encode(), "bad-label"),
    (json.dumps({"x": [0] * 192, "y": 1, "ts": "now"}).encode(), "bad-timestamp"),
    (b'{"x": [NaN' + b", 0" * 191 + b'], "y": 1}', "non-finite"),
    (json.dumps({"x": [0] * 192, "y": 1, "pub": 3, "seq": 1}).encode(), "bad-publisher"),
    (json.dumps({"x": [0] * 192, "y": 1, "pub": "a", "seq": -1}).encode(), "bad-publisher"),
    (b"[" * 100_000, "bad-json"),
]


@pytest.mark.parametrize(
    ("payload", "reason"), REJECTED, ids=[f"{i}-{r}" for i, (_, r) in enumerate(REJECTED)]
)
def test_each_rejection_reason(payload: bytes, reason: str) -> None:
    assert reason_of(payload) == reason


def test_binary_value_checks() -> None:
    x, y, ts = sample_arrays(3)
    bad_x = x.copy()
    bad_x[1, 2, 3] = np.inf
    bad_ts = ts.copy()
    bad_ts[0] = np.nan

    assert reason_of(encode_frame(bad_x, y, ts)) == "non-finite"
    assert reason_of(encode_frame(x, y, bad_ts)) == "bad-timestamp"
    assert reason_of(encode_frame(x, np.array([0, 6, 1]), ts)) == "bad-label"
    other_shape = np.zeros((3, 3, 64), np.float32)
    assert reason_of(encode_frame(other_shape, y, ts)) == "shape-mismatch"
    bad_pub = bytearray(encode_frame(x, y, ts, publisher="ab"))
    bad_pub[20:22] = b"\xff\xfe"
    assert reason_of(bytes(bad_pub)) == "bad-publisher"


def test_random_bytes_never_crash_the_decoder() -> None:
    rng = np.random.default_rng(7)
    good = _good(3)
    for _ in range(2000):
        if rng.random() < 0.5:
            payload = rng.bytes(int(rng.integers(0, 300)))
        else:  # flip bytes of a valid frame
            buf = bytearray(good)
            for pos in rng.integers(0, len(buf), int(rng.integers(1, 6))):
                buf[pos] = int(rng.integers(0, 256))
            payload = bytes(buf)
        try:
            batch = decode(payload)
        except FrameError as err:
            assert err.reason in REJECT_REASONS
        else:  # a flip inside the feature values can stay valid: then it must be well-formed
            assert batch.x.shape == (len(batch), *SHAPE) and np.isfinite(batch.x).all()


def test_encoder_refuses_inconsistent_arrays() -> None:
    x, y, ts = sample_arrays(3)
    with pytest.raises(ValueError, match="inconsistent"):
        encode_frame(x, y[:2], ts)
    with pytest.raises(ValueError, match="publisher"):
        encode_frame(x, y, ts, publisher="p" * 200)


def test_decode_messages_matches_decoding_one_by_one() -> None:
    # Prepare: valid frames of several sizes, JSON, and hostile payloads, interleaved.
    x, y, ts = sample_arrays(4)
    nan_x = x.copy()
    nan_x[2, 0, 0] = np.nan
    payloads = [
        encode_frame(x[:1], y[:1], ts[:1], publisher="a", seq=0),
        b"garbage",
        encode_frame(nan_x, y, ts, publisher="a", seq=1),
        json.dumps({"x": x[1].tolist(), "y": int(y[1])}).encode(),
        encode_frame(x, np.array([0, 1, 9, 2]), ts),
        encode_frame(x, y, ts, publisher="b", seq=5),
    ]
    expected_reasons: dict[str, int] = {}
    expected = []
    for p in payloads:
        try:
            expected.append(decode(p))
        except FrameError as err:
            expected_reasons[err.reason] = expected_reasons.get(err.reason, 0) + 1
    # Execute
    arrivals, rejected = decode_messages([(p, NOW) for p in payloads], SHAPE, 6)
    # Assert
    assert dict(rejected) == expected_reasons == {"bad-magic": 1, "non-finite": 1, "bad-label": 1}
    assert arrivals.counts == [len(b) for b in expected] == [1, 1, 4]
    assert arrivals.publishers == ["a", None, "b"] and arrivals.seqs == [0, 0, 5]
    np.testing.assert_array_equal(arrivals.x, np.concatenate([b.x for b in expected]))
    np.testing.assert_array_equal(arrivals.y, np.concatenate([b.y for b in expected]))
    np.testing.assert_array_equal(arrivals.ts, np.concatenate([b.ts for b in expected]))


def test_samples_bigger_than_the_largest_message_go_as_numbered_frames_that_fit() -> None:
    # Prepare: 200 samples of 6x32 (784 bytes each) for a broker that takes 64 KiB
    x, y, ts = sample_arrays(200)
    # Execute
    parts = encode_frames(x, y, ts, publisher="p", seq=7, max_payload=65_536)
    decoded = [decode(part) for part in parts]
    # Assert: 3 frames, each within the limit, numbered on from 7, the samples in order
    assert len(parts) == 3 and all(len(part) <= 65_536 for part in parts)
    assert [d.seq for d in decoded] == [7, 8, 9] and {d.publisher for d in decoded} == {"p"}
    assert np.array_equal(np.concatenate([d.x for d in decoded]), x)
    assert np.array_equal(np.concatenate([d.y for d in decoded]), y)
    assert encode_frames(x[:5], y[:5], ts[:5], publisher="p", seq=0, max_payload=65_536) == [
        encode_frame(x[:5], y[:5], ts[:5], publisher="p", seq=0)
    ]  # what fits stays one frame


def test_a_sample_bigger_than_any_message_is_refused_with_the_sizes() -> None:
    assert frame_capacity(SHAPE, "p", 65_536) == 83
    with pytest.raises(ValueError, match="makes a 813-byte frame, more than the largest message"):
        frame_capacity(SHAPE, "p", 800)
