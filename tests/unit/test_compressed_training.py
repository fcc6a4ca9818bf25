"""Compressed updates end to end through the in-process runner (real ServerApp + ClientApp)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from aggregator.compression import choose_mode
from aggregator.round_log import RoundRecord
from aggregator.server_app import run_rounds
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.device_state import DeviceStateStore
from edge_client.runtime.rounds import received_model
from edge_client.runtime.rounds import train_round as fedstream_train
from edge_client.task.constants import DEFAULT_SHAPE
from edge_client.task.models import build_model
from edge_client.wire.codec import FeedbackState, decode
from edge_client.wire.records import ARRAYS, CONFIG, DeviceReply, RoundPlan
from edge_client.wire.run_config import RunSettings

Fast = Callable[..., RunSettings]
Fleet = Callable[..., list[VirtualDevice]]


class Spy:
    """A ClientApp around fedstream's that records what went down and up, and can corrupt."""

    def __init__(self, corrupt: tuple[str, int] | None = None) -> None:
        self.app = ClientApp()
        self.down: dict[int, dict[str, np.ndarray]] = {}  # round -> global model received
        self.dtypes: dict[int, set[np.dtype[Any]]] = {}
        self.modes: dict[int, str] = {}
        self.up: dict[int, dict[str, tuple[bytes, int]]] = {}  # round -> device -> (frame, n)
        self.corrupt = corrupt
        self.app.train()(self._train)

    def _train(self, msg: Message, context: Context) -> Message:
        plan = RoundPlan.from_record(msg.content.config_records[CONFIG])
        self.modes[plan.server_round] = plan.compress
        self.down[plan.server_round] = received_model(msg, context)
        arrays = msg.content.array_records[ARRAYS].values()
        self.dtypes[plan.server_round] = {a.numpy().dtype for a in arrays}  # as it travelled
        reply = DeviceReply.from_content(fedstream_train(msg, context).content)
        frame = reply.frame
        if self.corrupt == (reply.device_id, plan.server_round):
            frame = frame[:30] + bytes([frame[30] ^ 0x10]) + frame[31:]
        self.up.setdefault(plan.server_round, {})[reply.device_id] = (
            frame,
            reply.metrics.num_examples,
        )
        sent = DeviceReply(reply.device_id, reply.metrics, frame)
        return Message(sent.to_content(), reply_to=msg)


def test_the_aggregate_is_built_from_decoded_updates_and_a_corrupt_one_is_left_out(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: top-k 5 % updates; dev-1's frame gets a flipped bit in round 2.
    spy = Spy(corrupt=("dev-1", 2))
    settings = fast(controller="fixed", compress="topk", compress_ratio=0.05, aggregation="fedavg")
    grid = InProcessGrid(fleet(1, 1, 1, rate=20_000), tmp_path / "buffers", client_app=spy.app)
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
    assert records[1].rejected == {"dev-1": 1}
    assert records[1].rejected_reasons == {"checksum": 1}
    assert set(records[1].devices) == {"dev-0", "dev-2"}
    assert set(records[2].devices) == {"dev-0", "dev-1", "dev-2"}  # the run went on
    # bytes up are the frames as received; top-k 5 % is far below a dense float32 model
    dense = sum(v.size * 4 for v in g1.values())
    for rnd, record in enumerate(records, start=1):
        for dev, metrics in record.devices.items():
            assert metrics.bytes_up == len(spy.up[rnd][dev][0]) < dense / 8
        assert record.bytes_up == sum(m.bytes_up for m in record.devices.values())
        assert record.compress == "topk"


def test_the_residual_outlives_the_clientapp_in_the_buffer_file(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare
    grid = InProcessGrid(fleet(1, rate=20_000), tmp_path / "buffers")
    settings = fast(controller="fixed", num_rounds=2, compress="topk", compress_ratio=0.01)
    # Execute
    run_rounds(grid, settings)
    grid.close()
    # Assert: run 1's residual is in the buffer file: 99 % of the update was held back.
    like = {k: v.numpy() for k, v in build_model("cnn", DEFAULT_SHAPE, 6).state_dict().items()}
    with DeviceStateStore(tmp_path / "buffers" / "dev-0.sqlite") as state:
        feedback = state.feedback(1, like)
    assert feedback.residual is not None and feedback.gap is not None
    assert sum(float(np.abs(r).sum()) for r in feedback.residual.values()) > 0


@pytest.mark.parametrize(("delta", "modes"), [(1.0, ["none", "topk", "topk"]), (0.0, ["none"] * 3)])
def test_adaptive_mode_follows_the_reported_gaps(
    tmp_path: Path, delta: float, modes: list[str], fast: Fast, fleet: Fleet
) -> None:
    # Prepare: round 1 has no reports (dense); then top-k iff most gaps <= delta (gaps are
    # in (0, 1)).
    spy = Spy()
    grid = InProcessGrid(fleet(1, 1, 1, rate=20_000), tmp_path / "buffers", client_app=spy.app)
    settings = fast(
        controller="fixed", compress="adaptive", compress_ratio=0.1, compress_delta=delta
    )
    # Execute
    records = run_rounds(grid, settings)
    # Assert
    assert [r.compress for r in records] == modes
    assert [spy.modes[r] for r in (1, 2, 3)] == modes
    gaps = [m.compress_gap for m in records[0].devices.values()]
    assert all(g is not None and 0 < g < 1 for g in gaps)


def test_an_fp16_broadcast_halves_the_bytes_down_and_still_trains(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare
    spy = Spy()
    longer = fast(controller="fixed", local_steps=20, num_rounds=4)
    full = run_rounds(InProcessGrid(fleet(1, 1, rate=20_000), tmp_path / "full"), longer)
    grid = InProcessGrid(fleet(1, 1, rate=20_000), tmp_path / "half", client_app=spy.app)
    # Execute
    half = run_rounds(grid, replace(longer, compress_broadcast="fp16"))
    # Assert
    assert spy.dtypes[1] == {np.dtype(np.float16)}
    assert half[0].broadcast_bytes < 0.6 * full[0].broadcast_bytes
    # Both learn (the benchmark measures the accuracy cost over a full run).
    assert min(full[-1].accuracy, half[-1].accuracy) > 1 / 6 + 0.2


def test_a_new_run_starts_without_the_old_runs_residual(tmp_path: Path) -> None:
    # Prepare: a buffer holding run 7's residual
    path = tmp_path / "dev.sqlite"
    BufferStore(path, shape=(2,)).close()
    with DeviceStateStore(path) as state:
        state.save_feedback(7, FeedbackState({"w": np.ones(3, np.float32)}, 0.2))
        like = {"w": np.zeros(3, np.float32)}
        # Execute / Assert
        assert state.feedback(7, like).residual is not None
        assert state.feedback(7, like).gap == 0.2
        assert state.feedback(8, like).residual is None  # another run
        assert state.feedback(7, {"v": np.zeros(3, np.float32)}).residual is None  # other model


def test_the_adaptive_rule_follows_the_majority_of_the_reported_gaps(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: round 1 goes dense everywhere (no reports yet) whatever delta is, so its gaps
    # are the same in every run; delta is then put between them, not only at 0 or 1.
    def adaptive(delta: float, name: str) -> list[RoundRecord]:
        grid = InProcessGrid(fleet(1, 1, 1, rate=20_000), tmp_path / name)
        settings = fast(
            controller="fixed",
            num_rounds=4,
            compress="adaptive",
            compress_ratio=0.1,
            compress_delta=delta,
        )
        try:
            return run_rounds(grid, settings)
        finally:
            grid.close()

    def gaps(r: RoundRecord) -> list[float]:
        return [g for m in r.devices.values() if (g := m.compress_gap) is not None]

    probe = adaptive(1.0, "probe")
    low, middle, high = sorted(gaps(probe[0]))
    assert low < middle < high  # three distinct gaps: the majority is a real decision
    deltas = {"2 of 3 within": (middle + high) / 2, "1 of 3 within": (low + middle) / 2}
    # Execute
    runs = {name: adaptive(delta, name.replace(" ", "-")) for name, delta in deltas.items()}
    # Assert: round 2 follows the majority of round 1's gaps ...
    assert [r.compress for r in runs["2 of 3 within"]][:2] == ["none", "topk"]
    assert [r.compress for r in runs["1 of 3 within"]][:2] == ["none", "none"]
    # ... and every later round the majority of the gap EWMAs its devices last reported.
    for name, records in runs.items():
        for before, after in pairwise(records):
            expected = choose_mode(gaps(before), deltas[name])
            assert after.compress == expected, (name, after.round)
