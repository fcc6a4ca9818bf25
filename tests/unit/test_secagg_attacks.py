"""Secure aggregation against an aggregator that lies: the devices hold its plan to the
protocol's floors, and the device's owner to its own (issue 54)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message

from aggregator.server_app import run_rounds
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.client_app import app as client_app
from edge_client.runtime.device_state import DeviceStateStore
from edge_client.runtime.node_config import NodeConfig
from edge_client.runtime.secure_stages import prepare_input
from edge_client.wire import masking
from edge_client.wire.records import CONFIG, RoundPlan
from edge_client.wire.secagg_records import SHARE_KEYS, UNMASK, StageReply
from tests.secagg_round import Devices, Fast, one_round
from tests.secagg_round import config_of as _config


def _one_survivor(stage: str, msg: Message) -> Message:
    """Issue 54's lying aggregator: each helper is told that one neighbour survived and
    every other dropped, so that it hands over one seed share and the others' mask-key
    shares; a few such lies, each to other devices, rebuild one device's every mask."""
    if stage == UNMASK:
        record = _config(msg)
        everyone = [*record["survivors"], *record["dropped"]]
        record["survivors"], record["dropped"] = everyone[:1], everyone[1:]
    return msg


def _leave_one_out(stage: str, msg: Message) -> Message:
    """An unmask ask that names some of the neighbours only (a story per helper)."""
    if stage == UNMASK:
        record = _config(msg)
        record["survivors"] = list(record["survivors"])[:-1]
    return msg


def _low_threshold(stage: str, msg: Message) -> Message:
    if stage == SHARE_KEYS:
        _config(msg)["threshold"] = 1  # every share would be the secret itself
    return msg


def _repeat_a_key(stage: str, msg: Message) -> Message:
    if stage == SHARE_KEYS:
        record = _config(msg)
        keys = list(record["mask-keys"])
        keys[1] = keys[0]  # two neighbours under one key: one of them the aggregator's
        record["mask-keys"] = keys
    return msg


def _stage_replies(app: Devices, stage: str) -> list[Any]:
    """The headers of the replies to ``stage`` (training replies are no stage's)."""
    staged = [r for r in app.replies if r.has_content() and CONFIG in r.content.config_records]
    heads = [StageReply.read(r.content) for r in staged if "secagg-stage" in _config(r)]
    return [h for h in heads if h.stage == stage]


def test_a_lying_aggregator_told_one_survivor_gets_no_share_at_all(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: every device told at unmasking that one neighbour survived, the rest dropped
    lie: Callable[[str, Message], Message] = _one_survivor
    app = Devices(tamper_ask={f"dev-{i}": lie for i in range(6)})
    # Execute
    _session, step, report = one_round(tmp_path, fast, app)
    # Assert: every device refused, so no share left any device; the round is skipped
    unmask = _stage_replies(app, UNMASK)
    assert len(unmask) == 6 and all(h.refused == "too-few-survivors" for h in unmask)
    keys = [set(r.content.config_records.get(CONFIG, {})) for r in app.replies if r.has_content()]
    assert not [k for k in keys if {"seed-shares", "key-shares"} & k]
    assert report.refused == {f"dev-{i}": "secagg-too-few-survivors" for i in range(6)}
    assert step is None


@pytest.mark.parametrize(
    ("ask", "stage", "reason"),
    [
        (_leave_one_out, UNMASK, "not-the-neighbourhood"),
        (_low_threshold, SHARE_KEYS, "low-threshold"),
        (_repeat_a_key, SHARE_KEYS, "duplicate-keys"),
    ],
)
def test_a_plan_below_the_protocols_floors_is_refused_by_the_device(
    tmp_path: Path, fast: Fast, ask: Callable[[str, Message], Message], stage: str, reason: str
) -> None:
    # Prepare: dev-3 gets the bad ask
    app = Devices(tamper_ask={"dev-3": ask})
    # Execute
    _session, _step, report = one_round(tmp_path, fast, app)
    # Assert: refused with its reason, counted by the aggregator
    refused = {h.refused for h in _stage_replies(app, stage)} - {""}
    assert refused == {reason}
    assert report.refused.get("dev-3") == f"secagg-{reason}"


def test_a_device_takes_part_only_with_as_many_neighbours_as_its_own_minimum(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: 4 devices (3 neighbours each), one of them asking for at least 4
    app = Devices(node={"dev-2": {"secagg-min-peers": 4}})
    # Execute
    _session, _step, report = one_round(tmp_path, fast, app, devices=4)
    # Assert: dev-2 refused its neighbourhood; the others went on without it
    assert report.refused.get("dev-2") == "secagg-too-few-neighbours"
    assert "dev-2" not in report.aggregated and len(report.aggregated) == 3


def test_the_rounds_secrets_are_erased_from_the_device_state_once_unmasking_was_asked(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare / Execute: a whole round
    app = Devices()
    _session, step, _report = one_round(tmp_path, fast, app)
    # Assert: no device keeps its seed, keys or the shares it held
    assert step is not None
    for path in sorted((tmp_path / "buffers").glob("*.sqlite")):
        with DeviceStateStore(path) as state:
            doc = state.secure_round()
        assert doc.get("stage") == "done", path
        assert not {"seed", "mask-seed", "share-private", "held", "neighbours"} & set(doc)


# -- the device's owner sets a floor under the aggregator's plan ---------------------------


def _with_node_keys(keys: dict[str, Any]) -> Callable[[Message, Context], Message]:
    """fedstream's ClientApp on devices whose owner set ``keys`` in dev-1's node config."""

    def app(msg: Message, context: Context) -> Message:
        if NodeConfig.from_node_config(context.node_config).device_id == "dev-1":
            context.node_config.update(keys)
        return client_app(msg, context)

    return app


@pytest.mark.parametrize(
    ("owner", "run", "refused"),
    [
        ({"secure-required": True}, {}, True),
        ({"dp-min-noise": 1.0}, {"dp": "local", "dp_noise": 0.5}, True),
        ({"dp-min-noise": 1.0}, {"dp": "central", "dp_noise": 2.0}, True),  # no local noise
        ({"dp-max-clip": 0.5}, {}, True),  # no clip at all
        ({"dp-max-clip": 0.5}, {"dp": "local", "dp_clip": 1.0}, True),
        ({"dp-min-noise": 0.5, "dp-max-clip": 1.0}, {"dp": "local", "dp_noise": 1.0}, False),
    ],
)
def test_a_plan_below_the_owners_privacy_floor_is_refused_before_a_sample_is_taken(
    tmp_path: Path, fast: Fast, owner: dict[str, Any], run: dict[str, Any], refused: bool
) -> None:
    # Prepare: three devices, dev-1's owner sets a floor; the records name the devices
    # (dp-device-records) so that the test sees which trained
    settings = fast(
        num_rounds=1, controller="fixed", controller_probe=0, dp_device_records=True, **run
    )
    devices = [VirtualDevice(f"dev-{i}", rate=20_000) for i in range(3)]
    app = _with_node_keys(owner)
    grid = InProcessGrid(devices, tmp_path / "b", settings, client_app=app)  # type: ignore[arg-type]
    # Execute
    (record,) = run_rounds(grid, settings)
    # Assert: refused (counted, with its reason) and its buffer untouched; or trained
    with BufferStore(tmp_path / "b" / "dev-1.sqlite") as store:
        taken = store.stats()["consumed"]
    if refused:
        assert "dev-1" not in record.devices and record.rejected_reasons == {"plan-refused": 1}
        assert taken == 0
    else:
        assert "dev-1" in record.devices and not record.rejected_reasons and taken > 0


@pytest.mark.parametrize(
    ("key", "value"),
    [("secagg_min_peers", 0), ("dp_min_noise", -1.0), ("dp_max_clip", float("nan"))],
)
def test_a_bad_floor_in_the_node_config_is_refused_saying_which(key: str, value: Any) -> None:
    with pytest.raises(ValueError, match=key.replace("_", "-")):
        NodeConfig("pi-1", "pi-1.sqlite", **{key: value})


@pytest.mark.parametrize("bits", [8, 16])
def test_a_quantised_update_under_dp_stays_within_the_clip(tmp_path: Path, bits: int) -> None:
    # Prepare: an update whose every coordinate is far past a clip of 1, at the edge of the
    # grid (stochastic rounding can only add to its norm), DP's equal weights
    clip = 1.0
    delta = {"w": np.full((40, 50), 3.0), "b": np.full(50, -3.0)}
    plan = RoundPlan(
        32, 5, 0.05, server_round=1, dp_clip=clip, secagg_weighting="equal",
        secagg_range=clip, secagg_bits=bits,
    )  # fmt: skip
    path = tmp_path / "d.sqlite"
    BufferStore(path, shape=(2,)).close()
    # Execute: what the device keeps to mask, over many draws of the rounding
    norms = []
    for seed in range(20):
        with DeviceStateStore(path) as state:
            prepare_input(state, 1, plan, delta, 1.0, np.random.default_rng(seed))
            levels = np.frombuffer(state.secure_input(), "<u8").astype(np.uint64)
        norms.append(float(np.linalg.norm(masking.dequantise_sum(levels, 1, clip, bits))))
    # Assert: never past the clip (the sum of such updates cannot be clipped again)
    room = masking.rounding_norm(clip, bits, 2050)  # what the rounding may add, at most
    assert max(norms) <= clip and min(norms) > clip - 2 * room
