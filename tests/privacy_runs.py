"""Private runs in process, as the differential-privacy tests make them
(``tests/unit/test_privacy.py``, ``tests/unit/test_privacy_accounting.py``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from aggregator import sampling
from aggregator.round_log import RoundRecord, rounds_only
from aggregator.server_app import run_rounds
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.wire.run_config import RunSettings

__all__ = [
    "PRIVATE",
    "SECRET_DRAW_SEED",
    "Fast",
    "library_epsilon",
    "pin_secret_draws",
    "private_run",
]

Fast = Callable[..., RunSettings]

#: A private run's keys: central DP, half the fleet a round, compressed updates.
PRIVATE = {
    "dp": "central",
    "dp_clip": 0.5,
    "dp_noise": 0.8,
    "fraction_train": 0.5,
    "compress": "topk",
    "controller_probe": 0,
}

#: The seeded generator the tests put in place of the secret draw's (see the fixture).
SECRET_DRAW_SEED = 11


def library_epsilon(fraction: float, noise: float, rounds: int, delta: float) -> float:
    """What Google's RDP accountant says, computed here apart from fedstream's."""
    accountant = rdp_privacy_accountant.RdpAccountant()
    event = dp_event.PoissonSampledDpEvent(fraction, dp_event.GaussianDpEvent(noise))
    accountant.compose(event, rounds)
    return float(accountant.get_epsilon(delta))


def pin_secret_draws(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under DP the draw of a round's devices is secret (the OS's entropy): pin it to a
    seeded generator, so that a test's rounds repeat (none drawn empty), except in a test
    marked ``secret_draw`` (about the secret draw itself)."""
    if "secret_draw" in request.keywords:
        return
    rng = np.random.default_rng(SECRET_DRAW_SEED)
    monkeypatch.setattr(sampling, "secret_rng", lambda: rng)


def private_run(
    tmp_path: Path, fast: Fast, devices: int = 6, **keys: Any
) -> tuple[list[RoundRecord], RunSettings]:
    """A run of :data:`PRIVATE` (with ``keys``) over ``devices`` virtual devices, its
    ``metrics.jsonl`` in ``tmp_path / "out"``: its round records and settings."""
    settings = fast(**{**PRIVATE, "out_dir": str(tmp_path / "out"), **keys})
    grid = InProcessGrid(
        [VirtualDevice(f"dev-{i}", rate=20_000) for i in range(devices)],
        tmp_path / "buffers",
    )
    try:
        return rounds_only(run_rounds(grid, settings)), settings
    finally:
        grid.close()
