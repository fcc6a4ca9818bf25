"""Asynchronous mode through the in-process runner: the real ServerApp loop (FedBuff) and
ClientApp, each virtual device on its own clock."""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Message

from aggregator.asynchronous import FEDBUFF_STATE, default_buffer_size
from aggregator.checkpoint import read_state
from aggregator.round_log import RoundRecord, read_metrics, rounds_only
from aggregator.server_app import run_rounds
from deploy.inprocess import FIRST_NODE_ID, InProcessGrid, VirtualDevice
from edge_client.wire.run_config import RunSettings

Fast = Callable[..., RunSettings]
Fleet = Callable[..., list[VirtualDevice]]


def step_time(b: int) -> float:
    """A virtual step cost: every device's cycle is known to the microsecond."""
    return 0.001 + 1e-5 * b


def run(
    tmp_path: Path, devices: list[VirtualDevice], settings: RunSettings, **kw: object
) -> tuple[list[RoundRecord], InProcessGrid]:
    grid = InProcessGrid(devices, tmp_path / "buffers", settings, step_time=step_time, **kw)  # type: ignore[arg-type]
    try:
        return run_rounds(grid, settings), grid
    finally:
        grid.close()


def asynchronous(fast: Fast, **overrides: object) -> RunSettings:
    """Async settings with equal batches and no probe (each device's cycle is then fixed by
    its slowdown alone) and a fast uplink (uploads do not reorder the arrivals)."""
    base: dict[str, object] = {
        "mode": "async",
        "controller": "fixed",
        "controller_probe": 0,
        "uplink_mbps": 10_000.0,
    }
    return fast(**{**base, **overrides})


def test_updates_are_applied_in_order_of_their_virtual_arrival(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: A's cycle is c, B's 2.5c; one update per aggregation. By hand: A at c and
    # 2c, B at 2.5c (trained from version 0, two versions old by then), A at 3c (trained
    # from version 2, after its second update made it), A at 4c, B at 5c-ish...
    settings = asynchronous(fast, num_rounds=4, async_buffer=1)
    # Execute
    records, grid = run(tmp_path, fleet(1, 2.5, rate=math.inf, initial=0), settings)
    # Assert
    order = [(u.device, u.base_version, u.staleness) for r in records for u in r.updates]
    assert order == [("dev-0", 0, 0), ("dev-0", 1, 0), ("dev-1", 0, 2), ("dev-0", 2, 1)]
    assert [r.round for r in records] == [1, 2, 3, 4]
    assert all(r.mode == "async" for r in records)
    cycle = records[0].virtual_s  # A's first reply is the first aggregation
    assert records[1].virtual_s == pytest.approx(cycle, rel=1e-3)
    assert sum(r.virtual_s for r in records[:3]) == pytest.approx(2.5 * cycle, rel=0.05)
    assert grid.clock == pytest.approx(sum(r.virtual_s for r in records), abs=1e-5)


def test_fast_devices_do_not_wait_for_a_straggler(tmp_path: Path, fast: Fast, fleet: Fleet) -> None:
    # Prepare: three devices and one five times slower; two updates per aggregation
    settings = asynchronous(fast, num_rounds=20, async_buffer=2, out_dir=str(tmp_path / "out"))
    # Execute
    records, _ = run(tmp_path, fleet(1, 1, 1, 5, rate=math.inf, initial=0), settings)
    # Assert: versions 1..20, each of two updates; the model moved several times before the
    # straggler's first update came in, and that update was weighed down by its staleness.
    assert [r.round for r in records] == list(range(1, 21))
    assert all(len(r.updates) == 2 for r in records)
    first_slow = next(i for i, r in enumerate(records) if "dev-3" in r.aggregated)
    assert first_slow >= 4
    slow = next(u for u in records[first_slow].updates if u.device == "dev-3")
    assert slow.staleness >= 4 and slow.weight == pytest.approx((1 + slow.staleness) ** -0.5)
    assert records[-1].test_accuracy > 1 / 6 + 0.15  # learning, well above chance
    assert read_metrics(tmp_path / "out" / "metrics.jsonl") == records


def test_every_update_is_counted_once_under_offline_spans_and_refusals(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: a device off for a while; staleness beyond 2 refused
    devices = fleet(1, 1, 8, rate=math.inf, initial=0)
    devices[1].offline = [(0.01, 0.05)]
    settings = asynchronous(fast, num_rounds=10, async_buffer=2, max_staleness=2)
    # Execute
    records, grid = run(tmp_path, devices, settings)
    # Assert: each update in exactly one aggregation; stale ones refused and counted
    taken = [(u.device, u.base_version) for r in records for u in r.updates]
    assert len(taken) == 2 * len(records)
    assert all(u.staleness <= 2 for r in records for u in r.updates)
    too_stale = records[-1].rejected_reasons.get("too-stale", 0)
    assert too_stale >= 1  # the slow device's updates arrive more than 2 versions late
    # every message served was taken, refused, or still out when the run ended
    assert len(taken) + too_stale + records[-1].in_flight == grid.served
    # the device that was off contributed again once it came back
    assert any(u.device == "dev-1" and u.base_version > 0 for r in records for u in r.updates)


def test_an_async_run_resumes_at_the_version_it_checkpointed(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: a run stopped after version 3 (as a kill after its checkpoint)
    ckpt = str(tmp_path / "ckpt")
    settings = asynchronous(fast, num_rounds=6, async_buffer=2, checkpoint_dir=ckpt)
    grid = InProcessGrid(fleet(1, 2, rate=math.inf, initial=0), tmp_path / "b1", settings)
    first = run_rounds(grid, settings, stop=lambda r: r.round == 3)
    grid.close()
    state = read_state(ckpt)
    # Execute
    resumed, _ = run(
        tmp_path, fleet(1, 2, rate=math.inf, initial=0), replace(settings, resume=True)
    )
    # Assert
    assert [r.round for r in first] == [1, 2, 3]
    assert state is not None and state[FEDBUFF_STATE]["version"] == 3
    assert [r.round for r in resumed] == [4, 5, 6]
    assert all(u.base_version >= 3 for r in resumed for u in r.updates)


def test_the_default_buffer_is_half_the_fleet() -> None:
    assert [default_buffer_size(n) for n in (1, 2, 3, 4, 9, 1000)] == [1, 1, 1, 2, 4, 500]


def test_robust_rules_are_refused_in_async_mode() -> None:
    with pytest.raises(ValueError, match="async mode takes adaptive, fedavg or fednova"):
        RunSettings(mode="async", aggregation="krum")


def test_a_sync_round_with_a_deadline_drops_the_late_reply(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: equal batches; the straggler needs ten times the others' time
    settings = fast(num_rounds=2, controller="fixed", controller_probe=0, uplink_mbps=10_000.0)
    devices = fleet(1, 1, 10, rate=math.inf, initial=0)
    fast_round = 5 * step_time(64 // 3 + 1)  # K steps at the largest equal share
    # Execute
    records, grid = run(tmp_path, devices, settings, deadline_s=3 * fast_round)
    # Assert
    assert all(set(r.devices) == {"dev-0", "dev-1"} for r in records)
    assert records[-1].failed == {"node-102": 2}  # never replied: known by its node
    assert grid.missed == 2
    # each round waited the deadline out, then the aggregator did its part
    server = grid.server_s / len(records)
    assert all(r.virtual_s == pytest.approx(3 * fast_round + server, rel=1e-4) for r in records)
    assert grid.clock == pytest.approx(2 * (3 * fast_round + server))


def test_offline_devices_answer_sync_rounds_with_an_error(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    devices = fleet(1, 1, rate=math.inf, initial=0)
    devices[1].offline = [(0.0, 1e9)]
    records, _ = run(tmp_path, devices, fast(num_rounds=1, controller_probe=0))
    assert set(records[0].devices) == {"dev-0"} and records[0].failed == {
        "node-101": 1
    }  # never replied: known by its node


def test_a_sync_round_with_every_device_off_lasts_until_one_is_back(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: both devices off from the start, one back at 2.0 s, the other at 3.0 s
    devices = fleet(1, 1, rate=math.inf, initial=0)
    devices[0].offline, devices[1].offline = [(0.0, 3.0)], [(0.0, 2.0)]
    # Execute
    records, _ = run(tmp_path, devices, fast(num_rounds=2, controller_probe=0))
    # Assert: round 1 had nobody and waited until 2.0 s; round 2 had dev-1 only
    assert records[0].devices == {} and records[0].virtual_s == pytest.approx(2.0, abs=1e-2)
    assert set(records[1].devices) == {"dev-1"}


def test_a_message_to_an_offline_device_waits_until_it_is_back() -> None:
    dev = VirtualDevice("d", offline=[(1.0, 2.0), (2.0, 3.5), (10.0, 11.0)])
    assert [dev.online_from(t) for t in (0.5, 1.0, 2.5, 3.5, 10.2)] == [0.5, 3.5, 3.5, 3.5, 11.0]
    assert not dev.online_at(1.0) and dev.online_at(3.5)
    assert Counter(dev.online_at(t / 10) for t in range(0, 40)) == Counter({True: 15, False: 25})


def test_codec_injection_and_the_stream_cap_keep_working_in_async_mode(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: slow streams that cap batches, two labels per device, top-k with error
    # feedback, an fp16 broadcast, ScaDLES injection; the dynamic controller with its probe
    devices = [
        VirtualDevice(f"dev-{i}", slowdown=s, rate=r, initial=150, inject=True, labels=[i, i + 2])
        for i, (s, r) in enumerate(zip((1, 1, 2, 4), (60, 40, 30, 20), strict=True))
    ]
    settings = fast(
        mode="async",
        num_rounds=8,
        compress="topk",
        compress_broadcast="fp16",
        inject_alpha=0.5,
        wait_policy="adapt",
    )
    # Execute
    every, grid = run(tmp_path, devices, settings)
    records = rounds_only(every)
    # Assert: every version made of top-k frames; the cap held batches under what the
    # streams give; samples shared between devices; no reply refused
    assert [r.round for r in records] == list(range(1, 9))
    assert all(r.compress == "topk" for r in records)
    assert all(r.broadcast_bytes < 20_000 for r in records)  # fp16: half of the float32 model
    assert any(r.sum_b < settings.global_batch for r in records)  # the streams capped B
    assert sum(r.inject_bytes for r in records) > 0 and grid.inject_delivered > 0
    assert records[-1].rejected == {}
    assert all(math.isfinite(r.test_accuracy) for r in records)


class RejoiningGrid(InProcessGrid):
    """dev-1's node dies after a few replies, its message lost, and the device comes back at
    once on a new node id (a SuperNode restarted without node authentication)."""

    OLD = FIRST_NODE_ID + 1
    NEW = FIRST_NODE_ID + 100

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pulls = 0
        self.moved = False
        self.sent_to: dict[str, int] = {}

    def _start(self, msg: Message, message_id: str) -> Message:
        self.sent_to[message_id] = msg.metadata.dst_node_id
        return super()._start(msg, message_id)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = list(super().pull_messages(message_ids))
        self.pulls += 1
        lost = [e for e in self._arrivals if self.sent_to[e[2]] == self.OLD]
        if self.pulls >= 6 and lost and not self.moved:  # dies with a message out
            self.moved = True
            self.devices[self.NEW] = self.devices.pop(self.OLD)
            self.stores[self.NEW] = self.stores.pop(self.OLD)
            self.streams[self.NEW] = self.streams.pop(self.OLD)
            self.outboxes[self.NEW] = self.outboxes.pop(self.OLD)
            self._arrivals.remove(lost[0])  # the message dies with it
            heapq.heapify(self._arrivals)
        return replies


def test_a_device_back_on_a_new_node_gets_work_and_its_lost_message_counts_against_it(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: a short round-timeout (wall seconds) for the lost message
    settings = asynchronous(fast, num_rounds=500, async_buffer=1, round_timeout=1.0)
    devices = fleet(1, 1, rate=math.inf, initial=0)
    grid = RejoiningGrid(devices, tmp_path / "b", settings, step_time=step_time)
    # Execute: until the lost message has timed out
    records = run_rounds(grid, settings, stop=lambda r: sum(r.failed.values()) >= 1)
    grid.close()
    # Assert: the failure is dev-1's (not an anonymous node's), and dev-1 trained on its new
    # node both before and after it
    assert records[-1].failed == {"dev-1": 1}
    contributed = [i for i, r in enumerate(records) if "dev-1" in r.aggregated]
    assert contributed[0] < 6 < contributed[-1]


def test_a_fleet_that_sends_nothing_usable_ends_the_run_with_the_reasons(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: every device's buffer holds samples of another shape than the run's
    settings = asynchronous(fast, num_rounds=5, round_timeout=1.0)
    theirs = replace(settings, sample_shape="6,16")
    grid = InProcessGrid(fleet(1, 1, rate=math.inf, initial=0), tmp_path / "b", theirs)
    # Execute / Assert: refused as shape-mismatch over and over, then a clear error (not a
    # loop that never ends)
    with pytest.raises(RuntimeError, match=r"no usable update.*shape-mismatch"):
        run_rounds(grid, settings)
    grid.close()


def test_each_device_s_stream_conserves_samples_on_its_own_clock(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: finite streams that make the devices wait, each device on its own clock
    settings = asynchronous(fast, num_rounds=6, async_buffer=1, wait_policy="wait")
    devices = fleet(1, 3, rate=400.0, initial=50)
    grid = InProcessGrid(devices, tmp_path / "b", settings, step_time=step_time)
    # Execute
    records = run_rounds(grid, settings)
    # Assert, per device: what arrived is initial + rate x the device's own clock (to the
    # sample), and every sample that arrived is in the buffer, trained on, or counted dropped
    for node, dev in grid.devices.items():
        stream, stats = grid.streams[node], grid.stores[node].stats()
        assert stream.arrived == dev.initial + math.floor(dev.rate * stream.clock + 1e-9)
        assert stats["received"] == stream.arrived
        assert stats["fill"] + stats["consumed"] + stats["dropped"] == stream.arrived
    trained = sum(u.num_examples for r in records for u in r.updates)
    consumed = sum(grid.stores[n].stats()["consumed"] for n in grid.devices)
    assert trained <= consumed  # the rest: messages still out, or refused
    grid.close()


class OutageGrid(InProcessGrid):
    """A wall-clock grid (as Flower's) whose streams deliver nothing for the first 1.5 s of
    wall time, then everything (a broker outage, over)."""

    virtual_clock = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started = time.monotonic()

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        if time.monotonic() - self.started > 1.5:
            for node, dev in self.devices.items():
                dev.rate = math.inf
                self.streams[node].set_rate(math.inf, self.clock)
        return super().pull_messages(message_ids)


def test_on_a_wall_clock_an_outage_is_logged_and_the_run_goes_on(
    tmp_path: Path, fast: Fast, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: empty streams (each device trains nothing) for longer than round-timeout
    settings = asynchronous(fast, num_rounds=2, round_timeout=1.0, wait_policy="adapt")
    grid = OutageGrid(fleet(1, 1, rate=0.0, initial=0), tmp_path / "b", settings)
    # Execute
    with caplog.at_level(logging.WARNING, logger="aggregator.asynchronous"):
        records = run_rounds(grid, settings)
    grid.close()
    # Assert: the stall was reported, not fatal; once the streams came back the run finished
    assert "no usable update for 1 s" in caplog.text
    assert [r.round for r in records] == [1, 2]
