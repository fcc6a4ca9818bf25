"""Divergence is caught everywhere: a device whose training loss is not finite, or above
1000x the first loss it measured in the run, says so and sends no update; the aggregator
refuses it (or a NaN update) by reason, counts the round's diverged devices in its record,
logs the round in one line, and ends the run with an error after ``max-diverged-rounds``
such rounds in a row."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from aggregator.divergence import RunDivergedError
from aggregator.round_log import read_metrics
from aggregator.server_app import run_rounds
from deploy.demo_view import divergence_line as _divergence_line
from deploy.demo_view import run_diverged as _diverged
from deploy.inprocess import InProcessGrid, VirtualDevice
from deploy.report import summarize
from edge_client.emulation.sources import SensorChange
from edge_client.runtime.device_state import DeviceStateStore, MemoryDeviceState
from edge_client.runtime.trainer import diverged
from edge_client.wire.constants import DIVERGED_LOSS_RATIO
from edge_client.wire.run_config import RunSettings

Fast = Callable[..., RunSettings]


@pytest.mark.parametrize(
    ("loss", "first", "expected"),
    [
        (math.nan, 2.0, True),  # not finite: always
        (math.inf, None, True),
        (2.0 * DIVERGED_LOSS_RATIO + 1, 2.0, True),  # above 1000x the device's first
        (2.0 * DIVERGED_LOSS_RATIO - 1, 2.0, False),
        (1e9, None, False),  # no first loss yet: finiteness only
        (1e9, 0.0, False),  # a first loss of 0 (a perfect start) bounds nothing
    ],
)
def test_a_loss_not_finite_or_above_1000x_the_first_is_divergence(
    loss: float, first: float | None, expected: bool
) -> None:
    assert diverged(loss, first) is expected


def test_a_devices_first_loss_is_kept_for_its_run_only() -> None:
    # Prepare
    state = MemoryDeviceState()
    # Execute
    state.save_first_loss(7, 1.25)
    # Assert: run 7 reads it back; another run (a resumed one: a new run id) starts afresh
    assert state.first_loss(7) == 1.25
    assert state.first_loss(8) is None


ABSURD_LR = 5.0  # on raw units: the first round's loss leaves 1000x its start far behind


def _raw_units(settings: RunSettings, tmp_path: Path) -> InProcessGrid:
    """Two devices streaming the sensor task in raw units (every value x 1000)."""
    devices = [VirtualDevice(f"dev-{i}", change=SensorChange(0, gain=1000.0)) for i in range(2)]
    return InProcessGrid(devices, tmp_path / "buffers", settings)


def test_a_run_whose_training_diverges_ends_with_an_error_after_max_diverged_rounds(
    tmp_path: Path, fast: Fast, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: raw-unit samples at an absurd learning rate, ending after 2 such rounds
    settings = fast(
        num_rounds=5, lr=ABSURD_LR, controller="fixed", max_diverged_rounds=2,
        out_dir=str(tmp_path / "out"),
    )  # fmt: skip
    grid = _raw_units(settings, tmp_path)
    # Execute
    with caplog.at_level(logging.WARNING, "aggregator"), pytest.raises(RunDivergedError) as err:
        run_rounds(grid, settings)
    grid.close()
    # Assert: 2 rounds recorded, each with both devices diverged and refused (no update:
    # the model is kept); one clear line per round; the error says why and what to do
    records = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [(r.round, r.diverged, r.diverged_rounds) for r in records] == [(1, 2, 1), (2, 2, 2)]
    assert [r.skipped for r in records] == ["diverged", "diverged"]
    assert records[-1].rejected_reasons == {"diverged": 4}
    lines = [r.getMessage() for r in caplog.records if "diverged on" in r.getMessage()]
    assert lines == [
        f"round {n}: the model diverged on 2 of 2 devices: lower lr (now 5) or standardise the "
        "inputs"
        for n in (1, 2)
    ]
    assert "2 rounds in a row (max-diverged-rounds = 2); in round 2, the model" in str(err.value)
    # ... and the demo's summary and last line say so
    summary = summarize(records, 0.0)
    assert (summary["diverged_per_round"], summary["diverged_rounds"]) == ([2, 2], 2)
    assert _diverged(records, settings)
    assert _divergence_line(records, settings) == (
        "the model diverged on 2 of 2 devices in round 2, 2 rounds in a row "
        "(max-diverged-rounds = 2): lower lr (now 5) or standardise the inputs "
        "(--run-config lr=...)"
    )


def test_with_max_diverged_rounds_0_a_diverging_run_goes_on(tmp_path: Path, fast: Fast) -> None:
    # Prepare: the same diverging fleet; the run is told never to end on divergence
    settings = fast(num_rounds=3, lr=ABSURD_LR, controller="fixed", max_diverged_rounds=0)
    grid = _raw_units(settings, tmp_path)
    # Execute
    records = run_rounds(grid, settings)
    grid.close()
    # Assert: every round ran, each counted as diverged; the run did not end on it
    assert [(r.diverged, r.diverged_rounds) for r in records] == [(2, 1), (2, 2), (2, 3)]
    assert not _diverged(records, settings)


def test_each_device_is_held_to_its_own_first_loss(tmp_path: Path, fast: Fast) -> None:
    # Prepare: dev-1's sensor jumps to raw units (x 10,000) after its first round's
    # samples; dev-0 streams on as before.
    settings = fast(num_rounds=3, controller="fixed", controller_probe=0, max_diverged_rounds=0)
    per_round = settings.global_batch // 2 * settings.local_steps
    devices = [
        VirtualDevice(
            f"dev-{i}",
            rate=math.inf,
            initial=0,
            change=SensorChange(after=per_round, gain=1e4) if i == 1 else None,
        )
        for i in range(2)
    ]
    grid = InProcessGrid(devices, tmp_path / "buffers", settings)
    # Execute
    records = run_rounds(grid, settings)
    grid.close()
    # Assert: round 1 trained both and set each one's first loss (the sensor task's
    # cross-entropy at the start, about ln 6); from round 2 dev-1 diverges against its own,
    # is refused and left out, and dev-0's updates go on moving the model
    for dev in ("dev-0", "dev-1"):
        with DeviceStateStore(tmp_path / "buffers" / f"{dev}.sqlite") as state:
            first = state.first_loss(1)  # the in-process runner's run id
        assert first is not None and 1.0 < first < 3.0
    assert [r.diverged for r in records] == [0, 1, 1]
    assert [r.aggregated for r in records] == [["dev-0", "dev-1"], ["dev-0"], ["dev-0"]]
    assert records[-1].rejected == {"dev-1": 2}
    assert records[-1].rejected_reasons == {"diverged": 2}
    assert all(not r.skipped for r in records)


def test_an_asynchronous_run_whose_training_diverges_everywhere_ends_as_diverged(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: the diverging fleet in asynchronous mode: no update is usable, so no version
    # is ever made to count the divergence by
    settings = fast(mode="async", num_rounds=3, lr=ABSURD_LR, round_timeout=1.0)
    grid = _raw_units(settings, tmp_path)
    # Execute / Assert: after round-timeout without a usable update, the run ends as
    # diverged (not as a loop that never ends, nor as a bare stall)
    with pytest.raises(RunDivergedError, match=r"training diverged on dev-\d, dev-\d: lower lr"):
        run_rounds(grid, settings)
    grid.close()
