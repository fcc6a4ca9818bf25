"""The run config: every key declared once, checked in one place, pyproject.toml held to it."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest

from aggregator.controller import BatchController
from deploy.flower import FlowerError, app_run_config
from edge_client.wire.run_config import ControllerSettings, RunSettings, knobs

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def app_config() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    return config


def test_pyproject_declares_exactly_the_run_config_keys_with_their_defaults() -> None:
    # Prepare
    config = app_config()
    # Execute
    settings = RunSettings.from_run_config(config)
    # Assert: the same keys, in both directions, and the same defaults.
    assert list(config) == list(knobs())
    assert settings == RunSettings()


def test_every_key_says_what_it_does_and_what_it_takes() -> None:
    declared = knobs()
    assert all(k["help"] for k in declared.values())
    assert declared["controller"]["allowed"] == "fixed | static | dynamic"
    assert declared["deadband"]["allowed"] == "in [0, 1)"
    assert declared["lr"]["allowed"] == "> 0"


def test_the_controller_is_configured_by_the_run_settings() -> None:
    # The controller's knobs are part of the run settings, not a second declaration.
    settings = RunSettings(global_batch=96, b_min=4, controller="fixed")
    controller = BatchController(settings)
    assert controller.plan(["a", "b", "c"], 1).batches == {"a": 32, "b": 32, "c": 32}
    controller_keys = {f.name for f in dataclasses.fields(ControllerSettings)}
    assert controller_keys < {f.name for f in dataclasses.fields(RunSettings)}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"b-min": 64, "b-max": 32}, "must not exceed b-max"),
        ({"global-batch": 4, "b-min": 8}, "global-batch"),
        ({"b-min": 0}, "b-min must be >= 1"),
        ({"deadband": 1.5}, r"deadband must be in \[0, 1\)"),
        ({"controller-period": 0}, "controller-period"),
        ({"controller": "pid"}, "controller must be one of"),
        ({"lr": -1}, "lr must be > 0"),
        ({"wait-policy": "sleep"}, "wait-policy"),
        ({"model": "resnet"}, "model must be one of"),
        ({"num-rounds": "many"}, "num-rounds"),
        ({"round-timout": 5}, "unknown keys"),
        ({"compress": "zip"}, "compress must be"),
        ({"compress-ratio": 0.0}, "compress-ratio"),
        ({"compress-delta": 2.0}, "compress-delta"),
        ({"compress-broadcast": "int8"}, "compress-broadcast"),
        ({"aggregation": "average"}, "aggregation must be one of"),
        ({"trim-fraction": 0.6}, "trim-fraction"),
        ({"krum-malicious": -2}, "krum-malicious"),
        ({"dataset": "digits"}, "num-classes=10"),
        ({"sim-rates": "fast"}, "sim-rates"),
        ({"lr": float("nan")}, "lr must be finite"),
        ({"seed": 10**12}, "out of range"),
    ],
)
def test_bad_run_config_fails_fast_naming_the_key(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunSettings.from_run_config(config)


def test_run_config_is_read_with_types() -> None:
    s = RunSettings.from_run_config({"num-rounds": 3, "lr": "0.1", "resume": "true"})
    assert (s.num_rounds, s.lr, s.resume) == (3, 0.1, True)


def test_settings_round_trip_through_a_run_config() -> None:
    settings = RunSettings(num_rounds=7, compress="topk", sim_rates="5,6")
    assert RunSettings.from_run_config(settings.to_run_config()) == settings


def test_a_resume_submits_only_the_keys_the_app_declares(tmp_path: Path) -> None:
    # Prepare: a checkpoint's whole run config, and a user's app that declares a few keys.
    example = Path(__file__).resolve().parents[2] / "examples" / "activity-app"
    saved = RunSettings(sample_shape="3,50", num_classes=4, resume=True).to_run_config()
    (tmp_path / "pyproject.toml").write_text("[tool.flwr.app.config]\nnum-rounds = 3\n")
    # Execute
    sent = app_run_config(saved, example)
    # Assert: flwr run refuses undeclared keys; an app that cannot resume says so.
    assert set(sent) < set(saved) and sent["sample-shape"] == "3,50" and sent["resume"]
    with pytest.raises(FlowerError, match="cannot be resumed"):
        app_run_config(saved, tmp_path)
