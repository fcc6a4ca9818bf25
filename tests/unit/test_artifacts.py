"""Versioned model exports: what the aggregator and the ClientApp write, what a device with
torch alone reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from edge_client.runtime.model_store import store_model
from edge_client.task.forecasting import Forecast
from edge_client.task.interface import Classification, init_model
from edge_client.wire.artifact import (
    EXPORT_DYNAMIC,
    PICKLE,
    PROGRAMS,
    ArtifactError,
    latest_version,
    list_versions,
    load_version,
    write_version,
)
from edge_client.wire.run_config import RunSettings


def _classifier(seed: int = 0) -> tuple[Classification, nn.Module, RunSettings]:
    settings = RunSettings(model_width=8)
    task = Classification(width=8)
    return task, init_model(task, settings.shape, settings.num_classes, seed), settings


def test_a_version_round_trips_with_a_dynamic_batch_and_the_same_outputs(tmp_path: Path) -> None:
    # Prepare
    task, model, settings = _classifier()
    x = torch.randn(7, *settings.shape)
    # Execute
    written = write_version(tmp_path, 3, task.predictor(model), x[:2], {"task-name": "c"})
    loaded = load_version(latest_version(tmp_path))  # type: ignore[arg-type]
    # Assert: the program is torch.export's, batches of any size, softmax outputs, and the
    # manifest's hashes are the files'.
    assert written.manifest["program-format"] == EXPORT_DYNAMIC
    assert loaded.version.version == 3 and loaded.version.manifest["input-shape"] == [6, 32]
    with torch.no_grad():
        expected = torch.softmax(model(x), 1)
    assert torch.allclose(loaded(x), expected, atol=1e-5)
    assert loaded(x[:1]).shape == (1, settings.num_classes)


def test_versions_are_listed_in_order_pruned_to_keep_and_corrupt_ones_refused(
    tmp_path: Path,
) -> None:
    # Prepare
    task, model, settings = _classifier()
    example = torch.randn(2, *settings.shape)
    for version in (1, 2, 10, 11):
        write_version(tmp_path, version, task.predictor(model), example, {}, keep=3)
    (tmp_path / "v00000099").mkdir()  # no manifest: not a version
    # Execute
    versions = [v.version for v in list_versions(tmp_path)]
    newest = latest_version(tmp_path)
    weights = newest.path / "weights.pt"  # type: ignore[union-attr]
    weights.write_bytes(weights.read_bytes()[:-10] + b"0123456789")
    # Assert
    assert versions == [2, 10, 11]
    with pytest.raises(ArtifactError, match="corrupt"):
        load_version(newest)  # type: ignore[arg-type]


class _Unexportable(nn.Module):
    """Data-dependent control flow on a tensor's value: torch.export refuses it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.linear(x)  # type: ignore[no-any-return]
        return -self.linear(x)  # type: ignore[no-any-return]


def test_a_model_torch_export_refuses_is_saved_pickled_and_still_loads(tmp_path: Path) -> None:
    # Prepare
    module = _Unexportable()
    x = torch.ones(3, 4)
    # Execute
    written = write_version(tmp_path, 1, module, x, {})
    loaded = load_version(written)
    # Assert
    assert written.manifest["program-format"] == PICKLE
    assert torch.allclose(loaded(x), module(x))


def test_the_device_store_exports_once_per_architecture_then_writes_weights(
    tmp_path: Path,
) -> None:
    # Prepare
    task, model, settings = _classifier()
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    # Execute: three rounds' models, then a fourth whose weights differ.
    for version in range(4):
        scaled = {k: v * (1 + version) for k, v in weights.items()}
        store_model(tmp_path, task, settings, scaled, version, "dev-a", None)
    # Assert: one program, linked into the kept versions (3); each version its own weights.
    programs = list((tmp_path / PROGRAMS).glob("*/program.pt2"))
    kept = list_versions(tmp_path)
    assert len(programs) == 1 and [v.version for v in kept] == [1, 2, 3]
    assert all(os.path.samefile(v.path / "program.pt2", programs[0]) for v in kept)
    assert len({v.manifest["content-hash"] for v in kept}) == 3
    x = torch.randn(4, *settings.shape)
    model.load_state_dict({k: torch.from_numpy(v * 4) for k, v in weights.items()})
    with torch.no_grad():
        assert torch.allclose(load_version(kept[-1])(x), torch.softmax(model(x), 1), atol=1e-5)


def test_a_forecast_export_takes_past_readings_and_returns_readings_ahead(
    tmp_path: Path,
) -> None:
    # Prepare: a forecaster whose MLP is zero and whose linear part copies the last
    # reading's change (0): the naive forecast, so the export must repeat the last reading.
    settings = RunSettings(task="forecast", sample_shape="2,10", forecast_horizon=3)
    task = Forecast(horizon=3)
    model = init_model(task, settings.shape, settings.num_classes, 0)
    windows = torch.randn(5, 2, 7)
    # Execute
    written = write_version(
        tmp_path, 1, task.predictor(model), torch.randn(2, *task.input_shape(settings.shape)), {}
    )
    forecast = load_version(written)(windows)
    # Assert
    assert written.manifest["input-shape"] == [2, 7]
    assert forecast.shape == (5, 2, 3)
    assert torch.allclose(forecast, windows[..., -1:].expand(5, 2, 3))


def test_an_export_loads_and_predicts_without_fedstreams_training_code(tmp_path: Path) -> None:
    # Prepare: an export, and a fresh interpreter in which importing fedstream, Flower or
    # the training modules fails.
    task, model, settings = _classifier()
    written = write_version(
        tmp_path, 5, task.predictor(model), torch.randn(2, *settings.shape), {"output": "p"}
    )
    x = np.random.default_rng(0).normal(size=(3, *settings.shape)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    script = textwrap.dedent(
        f"""
        import sys, json, hashlib
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("edge_client", "aggregator", "deploy", "flwr"):
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        import numpy as np, torch
        d = {str(written.path)!r}
        manifest = json.load(open(d + "/manifest.json"))
        module = torch.export.load(d + "/" + manifest["program"]).module()
        module.load_state_dict(torch.load(d + "/weights.pt", weights_only=True))
        out = module(torch.from_numpy(np.load({str(tmp_path / "x.npy")!r})))
        print(json.dumps(out.tolist()))
        """
    )
    # Execute
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd="/"
    )
    # Assert
    assert done.returncode == 0, done.stderr
    with torch.no_grad():
        expected = torch.softmax(model(torch.from_numpy(x)), 1)
    assert np.allclose(json.loads(done.stdout), expected.numpy(), atol=1e-5)
