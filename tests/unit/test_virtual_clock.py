"""The in-process runner's clock charges everything once: a run's records sum to its clock.

Hand-computed cases: the timing probe (round 0), the model's download and the update's
upload, compute, and the aggregator's own work, each charged once and in the record of the
round it belongs to; in both modes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from aggregator.round_log import PROBE_ROUND, RoundRecord, read_metrics, rounds_only
from aggregator.server_app import run_rounds
from deploy.inprocess import InProcessGrid, ServerCost, VirtualDevice
from edge_client.task import init_model
from edge_client.task.loading import load_task
from edge_client.wire.run_config import RunSettings

Fast = Callable[..., RunSettings]


def step_time(b: int) -> float:
    return 0.002 + 1e-4 * b


def _model_values(settings: RunSettings) -> int:
    learning = settings.learning
    model = init_model(load_task(settings), learning.shape, learning.num_classes, 0)
    return sum(math.prod(p.shape) for p in model.state_dict().values())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_records_of_a_probed_run_sum_to_the_grid_clock(
    tmp_path: Path, fast: Fast, fleet: Callable[..., list[VirtualDevice]], mode: str
) -> None:
    # Prepare: the dynamic controller (it probes), a slow device, streams that wait.
    settings = fast(num_rounds=4, controller="dynamic", mode=mode, out_dir=str(tmp_path / "out"))
    devices = fleet(1, 3, rate=400.0, initial=50)
    grid = InProcessGrid(devices, tmp_path / "buffers", settings, step_time=step_time)
    # Execute
    records = run_rounds(grid, settings)
    grid.close()
    # Assert: the probe is round 0, charged, in the file too; the records sum to the clock
    probe = records[0]
    assert probe.round == PROBE_ROUND and probe.virtual_s > 0 and math.isnan(probe.accuracy)
    assert [r.round for r in rounds_only(records)] == [1, 2, 3, 4]
    assert sum(r.virtual_s for r in records) == pytest.approx(grid.clock, rel=0.01)
    assert read_metrics(tmp_path / "out" / "metrics.jsonl")[0].round == PROBE_ROUND
    assert grid.server_s > 0
    # the clock charges no scoring: no device reports wall seconds of it to the controller
    replies = [m for r in rounds_only(records) for m in r.devices.values()]
    assert replies and all(m.eval_s == 0.0 and m.eval_count > 0 for m in replies)


def test_the_probe_costs_its_slowest_device_steps_warm_up_included(
    tmp_path: Path, fast: Fast, fleet: Callable[..., list[VirtualDevice]]
) -> None:
    # Prepare: 2 devices, the slower 3x; B = 64 makes batches 32, 16, 8 (share, half,
    # quarter); the probe times `controller-probe` steps of each after one warm-up step.
    settings = fast(num_rounds=1, controller="dynamic", controller_probe=3)
    grid = InProcessGrid(fleet(1, 3, rate=math.inf), tmp_path / "b", settings, step_time=step_time)
    # Execute
    records = run_rounds(grid, settings)
    grid.close()
    # Assert
    expected = 3 * (3 + 1) * sum(step_time(b) for b in (32, 16, 8))
    assert records[0].virtual_s == pytest.approx(expected)


def test_a_round_charges_download_wait_compute_upload_and_the_aggregator_once(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: one device, a stream always ahead (no wait), equal batches (no probe), a
    # slow link (1 Mbit/s) so that transfers weigh; no compression either way.
    settings = fast(num_rounds=2, controller="fixed", uplink_mbps=1.0, eval_samples=200)
    grid = InProcessGrid(
        [VirtualDevice("d", slowdown=2.0, rate=math.inf)],
        tmp_path / "b",
        settings,
        step_time=step_time,
    )
    # Execute
    records = run_rounds(grid, settings)
    grid.close()
    # Assert: every record is a round; each is download + compute + upload + the server's
    values = _model_values(settings)
    server = ServerCost().seconds(1, values, 200)
    for r in records:
        m = r.devices["d"]
        down = r.broadcast_bytes * 8 / 1e6
        up = m.bytes_up * 8 / 1e6
        compute = settings.local_steps * step_time(m.batch_size) * 2.0
        assert r.broadcast_bytes >= 4 * values and m.wait_s == 0.0  # float32, with headers
        assert r.virtual_s == pytest.approx(down + compute + up + server), r.round
    assert grid.clock == pytest.approx(sum(r.virtual_s for r in records))


def test_an_asynchronous_device_pays_for_each_model_it_receives(tmp_path: Path, fast: Fast) -> None:
    # Prepare: one device, async, one update per aggregation, a 1 Mbit/s link.
    settings = fast(num_rounds=3, controller="fixed", mode="async", async_buffer=1, uplink_mbps=1.0)
    grid = InProcessGrid(
        [VirtualDevice("d", rate=math.inf)], tmp_path / "b", settings, step_time=step_time
    )
    # Execute
    records: list[RoundRecord] = run_rounds(grid, settings)
    grid.close()
    # Assert: each version's time holds one download, its training, its upload and the
    # aggregator's work (one device: nothing overlaps)
    values = _model_values(settings)
    server = ServerCost().seconds(1, values, settings.evaluation.eval_samples)
    for r in records:
        m = r.devices["d"]
        transfers = (r.broadcast_bytes + m.bytes_up) * 8 / 1e6
        compute = settings.local_steps * step_time(m.batch_size)
        assert r.virtual_s == pytest.approx(transfers + compute + server), r.round
