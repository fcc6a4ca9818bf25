"""The second, real dataset: scikit-learn's digits streamed as 8x8 camera frames."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from aggregator.server_app import run_rounds
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.emulation.sources import dataset_source
from edge_client.task.datasets import load_dataset
from edge_client.wire.run_config import RunSettings


def test_digits_are_real_frames_with_a_fixed_held_out_split() -> None:
    data = load_dataset("digits", (8, 8), 10)

    x_test, y_test = data.eval_set(10_000, seed=0)
    x_again, _ = load_dataset("digits", (8, 8), 10).eval_set(10_000, seed=5)
    stream_x, stream_y = dataset_source(data, np.random.default_rng(0)).next(3000)

    assert data.shape == (8, 8) and data.num_classes == 10
    assert x_test.shape == (400, 8, 8) and set(y_test.tolist()) == set(range(10))
    assert np.array_equal(x_test, x_again)  # the split does not move with the seed
    assert stream_x.shape == (3000, 8, 8) and -1.0 <= stream_x.min() < stream_x.max() <= 1.0
    held_out = {x.tobytes() for x in x_test}
    assert not any(x.tobytes() in held_out for x in stream_x)  # never streamed
    assert np.abs(np.bincount(stream_y, minlength=10) / 3000 - 0.1).max() < 0.03


def test_digits_need_ten_classes_and_known_names_only() -> None:
    with pytest.raises(ValueError, match="sample-shape='8,8' and num-classes=10"):
        RunSettings(dataset="digits")
    with pytest.raises(ValueError, match="dataset must be one of"):
        RunSettings(dataset="mnist")
    with pytest.raises(ValueError, match="10 classes"):
        load_dataset("digits", (8, 8), 6)
    with pytest.raises(ValueError, match="sample-shape"):
        load_dataset("synthetic", (64,), 6)


def test_federated_training_on_digit_streams(tmp_path: Path) -> None:
    # Prepare
    devices = [VirtualDevice(f"cam-{i}", rate=20_000) for i in range(3)]
    settings = RunSettings(
        dataset="digits",
        sample_shape="8,8",
        num_classes=10,
        num_rounds=6,
        local_steps=20,
        eval_data="digits",
        eval_samples=400,
    )
    grid = InProcessGrid(devices, tmp_path, settings)
    # Execute
    records = run_rounds(grid, settings)
    grid.close()
    # Assert
    assert records[-1].test_accuracy > 0.4  # chance is 0.1
    assert records[-1].accuracy > 0.3  # prequential, one round behind
