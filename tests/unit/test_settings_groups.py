"""The run settings by concern: each group checks its own keys, the whole is composed of
them without changing a key, and each part of the aggregator is built from its group."""

from __future__ import annotations

import ast
import dataclasses
import pickle
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.aggregation import NormalisedMean, RobustRule, make_accumulator
from aggregator.drift_reaction import DriftReaction
from aggregator.fedbuff import UpdateBuffer
from aggregator.injection import InjectionPlanner
from edge_client.wire.knob_checks import group_class
from edge_client.wire.run_config import RunSettings, knobs
from edge_client.wire.settings_groups import (
    GROUPS,
    AggregationSettings,
    AsyncSettings,
    ControllerSettings,
    DriftSettings,
    InjectionSettings,
)

ROOT = Path(__file__).resolve().parents[2]

#: One bad value per group: (group, key's field, value, what the message says).
BAD = [
    (ControllerSettings, "deadband", 1.5, "deadband"),
    (GROUPS["rounds"], "num_rounds", -1, "num-rounds"),
    (GROUPS["asynchrony"], "staleness", "linear", "staleness"),
    (GROUPS["learning"], "model", "resnet", "model"),
    (GROUPS["streams"], "wait_policy", "sleep", "wait-policy"),
    (GROUPS["exchange"], "round_timeout", 0.0, "round-timeout"),
    (GROUPS["checkpoints"], "checkpoint_dir", float("nan"), "checkpoint-dir"),
    (GROUPS["metrics_log"], "metrics_max_mb", 0.0, "metrics-max-mb"),
    (GROUPS["sinks"], "prometheus_port", 70000, "prometheus-port"),
    (GROUPS["exports"], "export_keep", 0, "export-keep"),
    (GROUPS["drift"], "drift_boost", 0.5, "drift-boost"),
    (GROUPS["evaluation"], "eval_samples", 0, "eval-samples"),
    (GROUPS["codec"], "compress", "zip", "compress"),
    (GROUPS["injection"], "inject_mix", 1.0, "inject-mix"),
    (GROUPS["aggregation_rule"], "trim_fraction", 0.6, "trim-fraction"),
    (GROUPS["privacy"], "dp_delta", 1.0, "dp-delta"),
    (GROUPS["secure"], "secagg_threshold", 0.4, "secagg-threshold"),
    (GROUPS["simulation"], "sim_rates", "fast", "sim-rates"),
]


def test_every_group_is_checked_here() -> None:
    assert {cls for cls, *_ in BAD} == {ControllerSettings, *GROUPS.values()}


@pytest.mark.parametrize(("cls", "name", "value", "key"), BAD)
def test_each_group_refuses_a_bad_value_naming_the_key(
    cls: type, name: str, value: Any, key: str
) -> None:
    with pytest.raises(ValueError, match=key):
        cls(**{name: value})
    with pytest.raises(ValueError, match=key):  # and so do the run's settings
        RunSettings(**{name: value})


def test_a_group_checks_the_rules_among_its_keys() -> None:
    with pytest.raises(ValueError, match="num-classes=10"):
        GROUPS["learning"](dataset="digits")
    with pytest.raises(ValueError, match="must not exceed b-max"):
        ControllerSettings(b_min=64, b_max=32)


def test_rules_across_groups_are_the_run_settings() -> None:
    # Each group alone is fine; together they are not.
    with pytest.raises(ValueError, match="async mode takes adaptive, fedavg or fednova"):
        RunSettings(mode="async", aggregation="krum")
    with pytest.raises(ValueError, match="sim-labels"):
        RunSettings(num_classes=3, sim_labels=4)


def test_flat_keys_and_groups_make_the_same_settings() -> None:
    flat = RunSettings(drift_boost=3.0, lr=0.1, global_batch=64, seed=2)
    grouped = RunSettings(
        drift=DriftSettings(drift_boost=3.0),
        learning=GROUPS["learning"](lr=0.1),
        global_batch=64,
        seed=2,
    )
    assert flat == grouped and hash(flat) == hash(grouped)
    assert flat.drift.drift_boost == flat.drift_boost == 3.0
    assert flat.learning.lr == flat.lr == 0.1
    # A flat key given with its group overrides the group's value.
    assert RunSettings(drift=DriftSettings(drift_rounds=5), drift_boost=4.0).drift == (
        DriftSettings(drift_boost=4.0, drift_rounds=5)
    )


def test_replace_takes_a_flat_key() -> None:
    settings = RunSettings(num_rounds=3, export_every=2)
    changed = dataclasses.replace(settings, export_dir="/tmp/models", num_rounds=4)
    assert changed.exports.export_dir == "/tmp/models" and changed.export_every == 2
    assert changed.num_rounds == 4 and settings.export_dir == ""
    with pytest.raises(ValueError, match="export-keep"):
        dataclasses.replace(settings, export_keep=0)


def test_settings_survive_pickle_and_copy() -> None:
    settings = RunSettings(mode="async", drift_reaction="boost", sim_rates="5,6")
    assert pickle.loads(pickle.dumps(settings)) == settings
    assert dataclasses.replace(settings) == settings
    bare = object.__new__(RunSettings)  # as pickle makes it: no attribute set yet
    with pytest.raises(AttributeError):
        bare.__setstate__  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(AttributeError):
        bare.lr  # noqa: B018


def test_unknown_names_are_refused() -> None:
    with pytest.raises(TypeError, match="lrate"):
        RunSettings(lrate=0.1)
    with pytest.raises(AttributeError):
        RunSettings().lrate  # type: ignore[attr-defined]  # noqa: B018


def test_keys_keep_their_order_and_each_group_holds_a_run_of_them() -> None:
    declared = list(knobs())
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert declared == list(pyproject["tool"]["flwr"]["app"]["config"])
    assert list(RunSettings().to_run_config()) == declared
    assert declared[: len(knobs(ControllerSettings))] == list(knobs(ControllerSettings))
    for cls in GROUPS.values():
        keys = list(knobs(cls))
        start = declared.index(keys[0])
        assert declared[start : start + len(keys)] == keys  # in place, in order


def test_group_names_are_no_keys_and_groups_are_as_listed() -> None:
    own = [f for f in dataclasses.fields(RunSettings) if group_class(f) is not None]
    assert {f.name: group_class(f) for f in own} == GROUPS
    assert not set(GROUPS) & {k.replace("-", "_") for k in knobs()}


def test_the_flat_keys_type_checkers_see_are_the_groups_keys() -> None:
    # RunSettings declares its grouped keys flat for type checkers (TYPE_CHECKING): the
    # same names and types as the groups, in order.
    tree = ast.parse((ROOT / "edge_client" / "wire" / "run_config.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RunSettings"]
    block = next(n for n in cls.body if isinstance(n, ast.If))  # the first: the keys
    seen = [
        (n.target.id, ast.unparse(n.annotation))
        for n in block.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id != "_"
    ]
    grouped = [(f.name, str(f.type)) for c in GROUPS.values() for f in dataclasses.fields(c)]
    assert seen == grouped


def test_parts_of_the_aggregator_are_built_from_their_group() -> None:
    settings = RunSettings(
        drift_reaction="boost", drift_boost=3.0, drift_rounds=1, aggregation="fednova",
        mode="async", staleness="constant", server_lr=0.5, inject_alpha=0.5,
        inject_budget=1000, inject_mix=0.2,
    )  # fmt: skip
    # The drift reaction from its group, as from the whole.
    for reaction in (DriftReaction(settings.drift), DriftReaction(settings)):
        assert reaction.boost_of("a", 1) == (3.0, True) and reaction.boost_of("a", 1)[0] == 1.0
    # The FedBuff buffer from the asynchrony and aggregation groups.
    shapes = {"w": (2,)}
    grouped = UpdateBuffer.from_settings(
        settings.asynchrony, shapes, 2, 0, settings.aggregation_rule
    )
    whole = UpdateBuffer.from_settings(settings, shapes, 2)
    for buffer in (grouped, whole):
        assert (buffer.rule, buffer.server_lr, buffer.weighting) == ("constant", 0.5, "fednova")
    assert UpdateBuffer.from_settings(AsyncSettings(), shapes, 2).weighting == "fedavg"
    # The accumulator from the aggregation rule.
    assert isinstance(make_accumulator(settings.aggregation_rule, shapes), NormalisedMean)
    robust = make_accumulator(AggregationSettings(aggregation="median"), shapes)
    assert isinstance(robust, RobustRule)
    # Injection: the pick and each device's share of the budget, from the injection group.
    planner = InjectionPlanner(settings.injection, settings.seed)
    picked = planner.pick(["a", "b", "c", "d"], 1)
    assert len(picked) == 2
    share = planner.for_device(picked[0], picked)
    assert (share.publish, share.budget, share.mix) == (True, 500, 0.2)
    off = InjectionPlanner(InjectionSettings(), 0).for_device("a", [])
    assert (off.publish, off.budget, off.mix) == (False, 16_384, 0.0)
    assert np.isfinite(share.beta)
