"""The second, real dataset: scikit-learn's digits streamed as 8x8 camera frames."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from aggregator.server_app import run_rounds
from aggregator.settings import RunSettings
from bench.probes import buffer_stats as stats
from bench.probes import start_ingest
from deploy.inprocess import InProcessGrid, VirtualDevice
from deploy.local import ProcessGroup, fedstream_command, wait_until
from edge_client.buffer import BufferStore
from edge_client.datasets import load_dataset


def test_digits_are_real_frames_with_a_fixed_held_out_split() -> None:
    data = load_dataset("digits", 10)

    x_test, y_test = data.eval_set(10_000, seed=0)
    x_again, _ = load_dataset("digits", 10).eval_set(10_000, seed=5)
    stream_x, stream_y = data.source(np.random.default_rng(0)).next(3000)

    assert data.shape == (8, 8) and data.num_classes == 10
    assert x_test.shape == (400, 8, 8) and set(y_test.tolist()) == set(range(10))
    assert np.array_equal(x_test, x_again)  # the split does not move with the seed
    assert stream_x.shape == (3000, 8, 8) and -1.0 <= stream_x.min() < stream_x.max() <= 1.0
    held_out = {x.tobytes() for x in x_test}
    assert not any(x.tobytes() in held_out for x in stream_x)  # never streamed
    assert np.abs(np.bincount(stream_y, minlength=10) / 3000 - 0.1).max() < 0.03


def test_digits_need_ten_classes_and_known_names_only() -> None:
    with pytest.raises(ValueError, match="num-classes=10"):
        RunSettings(dataset="digits")
    with pytest.raises(ValueError, match="dataset must be one of"):
        RunSettings(dataset="mnist")
    with pytest.raises(ValueError, match="10 classes"):
        load_dataset("digits", 6)


def test_federated_training_on_digit_streams(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    devices = [VirtualDevice(f"cam-{i}", rate=20_000) for i in range(3)]
    grid = InProcessGrid(devices, tmp_path, run_config={"num-classes": 10}, dataset="digits")
    settings = RunSettings(
        dataset="digits", num_classes=10, num_rounds=6, local_steps=20, eval_samples=400
    )

    records = run_rounds(grid, settings)
    grid.close()

    assert records[-1]["accuracy"] > 0.4  # chance is 0.1


def test_publish_streams_digit_frames_into_a_buffer(
    tmp_path: Path, broker: Any, procs: ProcessGroup
) -> None:
    buffer = tmp_path / "cam-1.sqlite"
    start_ingest(procs, broker.url, buffer, "cam-1", "--shape", "8,8", "--num-classes", "10")

    proc = subprocess.run(
        fedstream_command(
            "publish",
            "--broker",
            broker.url,
            "--device-id",
            "cam-1",
            "--source",
            "digits",
            "--num-classes",
            "10",
            "--classes",
            "3",
            "--rate",
            "500",
            "--count",
            "200",
            "--batch",
            "10",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert proc.returncode == 0, proc.stderr
    assert wait_until(lambda: stats(buffer)["accepted"] == 200, 20)
    with BufferStore(buffer) as store:
        taken = store.take(200)
    assert taken.x.shape == (200, 8, 8) and set(taken.y.tolist()) == {3}
