"""Compressed updates end to end through the in-process runner (real ServerApp + ClientApp)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from aggregator.server_app import run_rounds
from aggregator.settings import RunSettings
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.buffer import BufferStore
from edge_client.client_app import FEEDBACK_RESIDUAL, FEEDBACK_RUN
from edge_client.client_app import train as fedstream_train
from edge_client.codec import decode, encode
from edge_client.protocol import ARRAYS, CONFIG, FRAME, METRICS, UPDATE

FAST: dict[str, Any] = {
    "local_steps": 5,
    "global_batch": 64,
    "b_min": 4,
    "b_max": 64,
    "eval_samples": 500,
    "controller": "fixed",
}


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def fleet(n: int) -> list[VirtualDevice]:
    return [VirtualDevice(f"dev-{i}", rate=20_000) for i in range(n)]


class Spy:
    """A ClientApp around fedstream's that records what went down and up, and can corrupt."""

    def __init__(self, corrupt: tuple[str, int] | None = None) -> None:
        self.app = ClientApp()
        self.down: dict[int, dict[str, np.ndarray]] = {}  # round -> global model received
        self.modes: dict[int, str] = {}
        self.up: dict[int, dict[str, tuple[bytes, int]]] = {}  # round -> device -> (frame, n)
        self.corrupt = corrupt
        self.app.train()(self._train)

    def _train(self, msg: Message, context: Context) -> Message:
        rnd = int(msg.content.config_records[CONFIG]["server-round"])  # type: ignore[arg-type]
        self.modes[rnd] = str(msg.content.config_records[CONFIG]["compress"])
        arrays = msg.content.array_records[ARRAYS]
        self.down[rnd] = {k: a.numpy() for k, a in arrays.items()}
        reply = fedstream_train(msg, context)
        device = str(context.node_config["device-id"])
        frame = reply.content.config_records[UPDATE][FRAME]
        assert isinstance(frame, bytes)
        used = int(reply.content.metric_records[METRICS]["num-examples"])  # type: ignore[arg-type]
        if self.corrupt == (device, rnd):
            frame = frame[:30] + bytes([frame[30] ^ 0x10]) + frame[31:]
            reply.content.config_records[UPDATE] = ConfigRecord({FRAME: frame})
        self.up.setdefault(rnd, {})[device] = (frame, used)
        return reply


def test_the_aggregate_is_built_from_decoded_updates_and_a_corrupt_one_is_left_out(
    tmp_path: Path,
) -> None:
    # Prepare: top-k 5 % updates; dev-1's frame gets a flipped bit in round 2.
    spy = Spy(corrupt=("dev-1", 2))
    grid = InProcessGrid(fleet(3), tmp_path / "buffers", client_app=spy.app)
    settings = RunSettings(**FAST, num_rounds=3, compress="topk", compress_ratio=0.05)
    # Execute
    records = run_rounds(grid, settings)
    # Assert: round 2's result (what round 3 received) = G1 + sum n_i d_i / sum n_i, valid only
    g1, g2 = spy.down[2], spy.down[3]
    valid = {d: fn for d, fn in spy.up[2].items() if d != "dev-1"}
    total = sum(n for _, n in valid.values())
    shapes = {k: v.shape for k, v in g1.items()}
    for k in g1:
        expected = g1[k] + sum(n * decode(f, shapes)[k] for f, n in valid.values()) / total
        np.testing.assert_allclose(g2[k], expected, rtol=1e-5, atol=1e-6)
        assert np.isfinite(g2[k]).all()
    assert records[1]["rejected"] == {"dev-1": 1}
    assert records[1]["rejected-reasons"] == {"checksum": 1}
    assert set(records[1]["devices"]) == {"dev-0", "dev-2"}
    assert set(records[2]["devices"]) == {"dev-0", "dev-1", "dev-2"}  # the run went on
    # bytes up are the frames as received; top-k 5 % is far below a dense float32 model
    dense = sum(v.size * 4 for v in g1.values())
    for rnd, record in enumerate(records, start=1):
        for dev, info in record["devices"].items():
            assert info["bytes"] == len(spy.up[rnd][dev][0]) < dense / 8
        assert record["bytes-up"] == sum(i["bytes"] for i in record["devices"].values())
        assert record["compress"] == "topk"


def test_the_residual_outlives_the_clientapp_in_the_buffer_file(tmp_path: Path) -> None:
    grid = InProcessGrid(fleet(1), tmp_path / "buffers")

    run_rounds(grid, RunSettings(**FAST, num_rounds=2, compress="topk", compress_ratio=0.01))
    grid.close()

    with BufferStore(tmp_path / "buffers" / "dev-0.sqlite") as store:
        assert store.get_state(FEEDBACK_RUN) == b"1"
        residual = decode(store.get_state(FEEDBACK_RESIDUAL) or b"")
    assert sum(float(np.abs(r).sum()) for r in residual.values()) > 0  # 99 % was held back


@pytest.mark.parametrize(("delta", "modes"), [(1.0, ["none", "topk", "topk"]), (0.0, ["none"] * 3)])
def test_adaptive_mode_follows_the_reported_gaps(
    tmp_path: Path, delta: float, modes: list[str]
) -> None:
    # Round 1 has no reports (dense); then top-k iff most gaps <= delta (gaps are in (0, 1)).
    spy = Spy()
    grid = InProcessGrid(fleet(3), tmp_path / "buffers", client_app=spy.app)
    settings = RunSettings(
        **FAST, num_rounds=3, compress="adaptive", compress_ratio=0.1, compress_delta=delta
    )

    records = run_rounds(grid, settings)

    assert [r["compress"] for r in records] == modes
    assert [spy.modes[r] for r in (1, 2, 3)] == modes
    gaps = [info["gap"] for info in records[0]["devices"].values()]
    assert all(0 < g < 1 for g in gaps)


def test_an_fp16_broadcast_halves_the_bytes_down_and_still_trains(tmp_path: Path) -> None:
    spy = Spy()
    grid = InProcessGrid(fleet(2), tmp_path / "half", client_app=spy.app)
    longer = {**FAST, "local_steps": 20, "num_rounds": 4}
    full = run_rounds(InProcessGrid(fleet(2), tmp_path / "full"), RunSettings(**longer))

    half = run_rounds(grid, RunSettings(**longer, compress_broadcast="fp16"))

    assert all(v.dtype == np.float16 for v in spy.down[1].values())
    assert half[0]["broadcast-bytes"] < 0.6 * full[0]["broadcast-bytes"]
    # Both learn (the benchmark measures the accuracy cost over a full run).
    assert min(full[-1]["accuracy"], half[-1]["accuracy"]) > 1 / 6 + 0.2


def test_a_new_run_starts_without_the_old_runs_residual(tmp_path: Path) -> None:
    # Prepare: a buffer holding run 7's residual
    path = tmp_path / "dev.sqlite"
    with BufferStore(path, shape=(2,)) as store:
        store.set_state(
            {FEEDBACK_RUN: b"7", FEEDBACK_RESIDUAL: encode({"w": np.ones(3, np.float32)})}
        )
        from edge_client.client_app import _load_feedback

        # Execute / Assert
        like = {"w": np.zeros(3, np.float32)}
        assert _load_feedback(store, 7, like).residual is not None
        assert _load_feedback(store, 8, like).residual is None  # another run
        assert _load_feedback(store, 7, {"v": np.zeros(3, np.float32)}).residual is None


def test_bad_compression_settings_fail_fast() -> None:
    for kw, match in (
        ({"compress": "zip"}, "compress must be"),
        ({"compress_ratio": 0.0}, "compress-ratio"),
        ({"compress_delta": 2.0}, "compress-delta"),
        ({"compress_broadcast": "int8"}, "compress-broadcast"),
    ):
        with pytest.raises(ValueError, match=match):
            RunSettings(**kw)
