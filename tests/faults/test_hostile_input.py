"""Hostile input, many seeds: every decoder refuses with a counted reason and never crashes.

Covers sample frames (binary and JSON), injection messages, compressed updates and run-config
values: random bytes, mutations of valid inputs (bit flips, cuts, splices, header fields) and
well-formed but lying structures.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_client.runtime.injection import INJECT_REJECT_REASONS, open_pool, receive
from edge_client.task.synthetic import SensorTask
from edge_client.wire.codec import REASONS, CodecError, decode, encode, seal
from edge_client.wire.frames import (
    REJECT_REASONS,
    FrameError,
    decode_messages,
    decode_payload,
    encode_frame,
)
from edge_client.wire.run_config import RunSettings

SEEDS = range(40)
SHAPE = (6, 32)


def valid_frame(rng: np.random.Generator, n: int = 3, publisher: str = "pub") -> bytes:
    x, y = SensorTask().sample(n, rng)
    return encode_frame(x, y, np.full(n, 1.7e9), publisher=publisher, seq=int(rng.integers(1, 99)))


def mutations(rng: np.random.Generator, good: bytes) -> list[bytes]:
    """Random bytes, bit flips, cuts, splices, repeated and zeroed regions of ``good``."""
    out = [bytes(rng.integers(0, 256, size=int(rng.integers(0, 300)), dtype=np.uint8))]
    for _ in range(20):
        b = bytearray(good)
        kind = int(rng.integers(0, 5))
        if kind == 0:  # bit flips
            for pos in rng.integers(0, len(b) * 8, size=int(rng.integers(1, 6))):
                b[pos // 8] ^= 1 << (pos % 8)
        elif kind == 1:  # cut
            b = b[: int(rng.integers(0, len(b)))]
        elif kind == 2:  # splice random bytes in
            at = int(rng.integers(0, len(b)))
            b[at:at] = rng.integers(0, 256, size=int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
        elif kind == 3:  # overwrite a header field with extremes
            at = int(rng.integers(0, min(len(b), 24)))
            b[at : at + 4] = struct.pack("<I", int(rng.choice([0, 1, 2**31 - 1, 2**32 - 1])))
        else:  # zero a region
            at = int(rng.integers(0, len(b)))
            b[at : at + int(rng.integers(1, 40))] = bytes(40)[: len(b[at : at + 40])]
        out.append(bytes(b))
    return out


def hostile_json(rng: np.random.Generator) -> bytes:
    pool: list[Callable[[], Any]] = [
        lambda: {"x": [1.0] * int(rng.integers(0, 400)), "y": int(rng.integers(-5, 10))},
        lambda: {"x": "not numbers", "y": 1},
        lambda: {"x": [[1.0, 2.0]] * 96, "y": 1.5},
        lambda: {"x": [float("nan")] * 192, "y": 0},
        lambda: {"y": 1},
        lambda: [{"x": [0.0] * 192, "y": 1}] * int(rng.integers(0, 3)) + [{"x": None}],
        lambda: {"x": [1e308] * 192, "y": 0, "ts": "yesterday"},
        lambda: {"x": [0.0] * 192, "y": 2**70},
        lambda: "a string",
        lambda: 42,
        lambda: {"x": [0.0] * 192, "y": 1, "pub": 7, "seq": -1},
    ]
    obj = pool[int(rng.integers(0, len(pool)))]()
    text = json.dumps(obj, allow_nan=True)
    if rng.random() < 0.3:  # and some that are not JSON at all
        text = text[: int(rng.integers(0, len(text) + 1))] + "}{"
    return text.encode()


@pytest.mark.parametrize("seed", SEEDS)
def test_sample_frames_are_refused_with_a_known_reason(seed: int) -> None:
    rng = np.random.default_rng(seed)
    inputs = [*mutations(rng, valid_frame(rng)), *(hostile_json(rng) for _ in range(10))]

    reasons = []
    for payload in inputs:
        try:
            decode_payload(payload, SHAPE, 6, now=1.7e9)
        except FrameError as err:
            reasons.append(err.reason)
    arrivals, counted = decode_messages([(p, 1.7e9) for p in inputs], SHAPE, 6)

    assert set(reasons) <= set(REJECT_REASONS)
    assert set(counted) <= set(REJECT_REASONS)
    assert sum(counted.values()) == len(reasons)  # the bulk path agrees message by message
    assert sum(counted.values()) + len(arrivals.counts) == len(inputs)


@pytest.mark.parametrize("seed", SEEDS[:15])
def test_injection_messages_are_refused_and_counted_in_the_pool(seed: int, tmp_path: Path) -> None:
    rng = np.random.default_rng(seed)
    inputs = [*mutations(rng, valid_frame(rng, publisher="dev-b")), hostile_json(rng)]
    pool = open_pool(tmp_path / "dev-a.sqlite", SHAPE)

    refused = receive(pool, inputs, "dev-a", 6, 1.7e9)
    counters = pool.stats()
    pool.close()

    assert set(refused) <= set(REJECT_REASONS) | set(INJECT_REJECT_REASONS)
    assert counters["rejected"] == sum(refused.values())
    assert counters["rejected-by-reason"] == dict(refused)


@pytest.mark.parametrize("seed", SEEDS)
def test_compressed_updates_are_refused_with_a_known_reason(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shapes = {"w": (16, 8), "b": (16,)}
    update = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    mode = ["none", "fp16", "int8", "topk"][seed % 4]
    inputs = mutations(rng, encode(update, mode, 0.2))
    # well-formed frames (valid CRC) around random bodies: the structure itself lies
    inputs += [
        seal(mode, int(rng.integers(0, 4)), rng.integers(0, 256, size=n, dtype=np.uint8).tobytes())
        for n in rng.integers(0, 400, size=10)
    ]

    for frame in inputs:
        try:
            out = decode(frame, shapes, max_raw_bytes=10_000)
        except CodecError as err:
            assert err.reason in REASONS
        else:  # accepted only if it is a whole, finite update of the model's shapes
            assert {k: v.shape for k, v in out.items()} == shapes
            assert all(np.isfinite(v).all() for v in out.values())


KEY_VALUES: list[Any] = ["", "abc", -1, 0, 1.5, -1e300, math.inf, math.nan, True, "1e9", 10**30]


@pytest.mark.parametrize("seed", SEEDS[:20])
def test_run_config_values_are_refused_with_a_message_never_a_crash(seed: int) -> None:
    rng = np.random.default_rng(seed)
    keys = [k.replace("_", "-") for k in RunSettings.__dataclass_fields__]
    config = {
        str(rng.choice(keys)): KEY_VALUES[int(rng.integers(0, len(KEY_VALUES)))]
        for _ in range(int(rng.integers(1, 4)))
    }

    try:
        settings = RunSettings.from_run_config(config)
    except ValueError as err:
        assert str(err)  # a clear message
    else:
        assert settings.num_rounds >= 1 and settings.lr > 0 and settings.global_batch >= 1
