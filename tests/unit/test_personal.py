"""Personal layers: which tensors stay on a device, and a run that keeps them there."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from aggregator.server_app import run_rounds
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.runtime.device_state import DeviceStateStore, MemoryDeviceState
from edge_client.task.interface import Classification, init_model
from edge_client.task.models import build_model
from edge_client.task.personal import personal_keys
from edge_client.wire.artifact import latest_version, load_version, read_manifest
from edge_client.wire.run_config import RunSettings

Fast = Callable[..., RunSettings]
Fleet = Callable[..., list[VirtualDevice]]
SHAPE = (6, 32)


def test_head_is_the_output_layer_of_each_built_in_model() -> None:
    assert personal_keys(build_model("cnn", SHAPE, 6), "head") == {"head.weight", "head.bias"}
    assert personal_keys(build_model("mlp", SHAPE, 6), "head") == {"net.3.weight", "net.3.bias"}


def test_bn_keeps_every_normalisation_tensor_and_needs_some() -> None:
    # Prepare
    model = build_model("cnn-bn", SHAPE, 6)
    # Execute
    kept = personal_keys(model, "bn")
    # Assert: weight, bias and running statistics of both norms; no integer counter
    assert kept == {
        f"features.{i}.{k}"
        for i in (1, 4)
        for k in ("weight", "bias", "running_mean", "running_var")
    }
    with pytest.raises(ValueError, match=r"no normalisation layers.*cnn-bn"):
        personal_keys(build_model("cnn", SHAPE, 6), "bn")


def test_patterns_add_tensors_and_a_pattern_that_matches_nothing_is_refused() -> None:
    model = build_model("cnn", SHAPE, 6)
    assert personal_keys(model, "none", ["features.2.*"]) == {
        "features.2.weight",
        "features.2.bias",
    }
    assert personal_keys(model) == frozenset()
    with pytest.raises(ValueError, match=r"'adapter\.\*' matches none"):
        personal_keys(model, "head", ["adapter.*"])
    with pytest.raises(ValueError, match="nothing is shared"):
        personal_keys(model, "none", ["*"])
    with pytest.raises(ValueError, match="personalize must be one of"):
        personal_keys(model, "all")


def test_the_run_config_refuses_personal_layers_in_async_mode(fast: Fast) -> None:
    with pytest.raises(ValueError, match="sync mode only"):
        fast(mode="async", personalize="head")
    with pytest.raises(ValueError, match="personalize"):
        fast(personalize="everything")


def test_a_run_with_personal_heads_never_shares_them(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: two devices, the head personal, exports on
    settings = fast(
        num_rounds=3,
        personalize="head",
        out_dir=str(tmp_path / "out"),
        export_dir=str(tmp_path / "models"),
    )
    grid = InProcessGrid(fleet(1, 1), tmp_path / "buffers", settings)
    initial = init_model(Classification(), SHAPE, 6, settings.seed).state_dict()
    # Execute
    records = run_rounds(grid, settings)
    paths = {dev: store.path for dev, store in grid.stores.items()}
    grid.close()
    # Assert: the shared layers learned, the global head is the initial one (no update
    # carried it); each device kept a head of its own, trained, unlike the other's
    final = records[-1]
    assert final.round == 3
    heads = []
    for path in paths.values():
        with DeviceStateStore(path) as state:
            kept = state.personal({k: initial[k].numpy() for k in ("head.weight", "head.bias")})
        assert kept is not None
        heads.append(kept["head.weight"])
        assert not np.allclose(kept["head.weight"], initial["head.weight"].numpy())
    assert not np.allclose(heads[0], heads[1])
    manifest = read_manifest(next((tmp_path / "models").glob("v*")))
    assert manifest["personal-layers"] == ["head.bias", "head.weight"]


def test_the_global_model_keeps_its_initial_personal_tensors(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare
    settings = fast(num_rounds=2, personalize="head", checkpoint_dir=str(tmp_path / "ckpt"))
    grid = InProcessGrid(fleet(1, 2), tmp_path / "buffers", settings)
    initial = init_model(Classification(), SHAPE, 6, settings.seed).state_dict()
    # Execute
    run_rounds(grid, settings)
    grid.close()
    saved = torch.load(next((tmp_path / "ckpt").glob("model-*.pt")), weights_only=True)
    # Assert
    arrays = saved["arrays"] if isinstance(saved, dict) and "arrays" in saved else saved
    torch.testing.assert_close(
        torch.as_tensor(np.asarray(arrays["head.weight"])), initial["head.weight"]
    )
    assert not torch.allclose(
        torch.as_tensor(np.asarray(arrays["features.0.weight"])), initial["features.0.weight"]
    )


def test_personal_tensors_of_another_model_start_afresh() -> None:
    # Prepare: a head for 6 classes kept, in any order
    state = MemoryDeviceState()
    head = {"head.weight": np.ones((6, 32), np.float32), "head.bias": np.zeros(6, np.float32)}
    state.save_personal(head)
    # Execute
    same = state.personal({"head.bias": np.empty(6), "head.weight": np.empty((6, 32))})
    other = state.personal({"head.weight": np.empty((4, 32)), "head.bias": np.empty(4)})
    # Assert
    assert same is not None and np.array_equal(same["head.weight"], head["head.weight"])
    assert other is None


def test_a_run_with_personal_batch_norms_keeps_their_statistics_local(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: the CNN with batch normalisation, its norms personal
    settings = fast(num_rounds=2, model="cnn-bn", personalize="bn")
    grid = InProcessGrid(fleet(1, 1, feature_shift=2.0), tmp_path / "buffers", settings)
    # Execute
    records = run_rounds(grid, settings)
    paths = [store.path for store in grid.stores.values()]
    grid.close()
    # Assert: both rounds trained; each device kept running statistics of its own stream
    assert [r.round for r in records if r.devices] == [1, 2]
    means = []
    for path in paths:
        with DeviceStateStore(path) as state:
            like = {f"features.{i}.running_mean": np.zeros(32) for i in (1, 4)}
            like |= {
                f"features.{i}.{k}": np.zeros(32)
                for i in (1, 4)
                for k in ("weight", "bias", "running_var")
            }
            kept = state.personal(like)
        assert kept is not None
        means.append(kept["features.1.running_mean"])
    assert not np.allclose(means[0], means[1])


def test_the_model_a_device_keeps_for_inference_has_its_own_personal_layers(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: two devices keeping models for inference, heads personal, 3 rounds (round 3
    # receives a model both share, and each device's head as round 2 left it)
    settings = fast(num_rounds=3, personalize="head")
    devices = [VirtualDevice(f"dev-{i}", model_dir=str(tmp_path / f"models-{i}")) for i in range(2)]
    grid = InProcessGrid(devices, tmp_path / "buffers", settings)
    # Execute
    run_rounds(grid, settings)
    grid.close()
    kept = [load_version(latest_version(tmp_path / f"models-{i}")) for i in range(2)]  # type: ignore[arg-type]
    x = torch.randn(16, *SHAPE, generator=torch.Generator().manual_seed(0))
    # Assert: the same shared layers, different heads: the predictions differ
    assert all(m.version.version == 2 for m in kept)
    assert not torch.allclose(kept[0](x), kept[1](x))
