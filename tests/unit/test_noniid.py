"""Non-IID streams and their mitigation: skewed generators, ScaDLES data injection, FedProx."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.common.constant import PARTITION_ID_KEY

from aggregator.injection import pick_injectors
from aggregator.server_app import run_rounds
from aggregator.strategy import StreamStrategy
from deploy.inprocess import InProcessGrid, StaticGrid, VirtualDevice
from edge_client.emulation.lazy_buffer import StreamSamples
from edge_client.emulation.replay import replay_into
from edge_client.emulation.simulation import SimulationNodes, simulated_node
from edge_client.emulation.sources import SyntheticSource, label_distribution, pick_classes
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.device_state import MemoryDeviceState
from edge_client.runtime.injection import open_pool, receive, share, share_when_picked
from edge_client.runtime.outbox import Outbox
from edge_client.runtime.seeding import device_rng
from edge_client.runtime.trainer import train_local
from edge_client.task.constants import DEFAULT_NUM_CLASSES, DEFAULT_SHAPE
from edge_client.task.models import build_model
from edge_client.task.synthetic import SensorTask
from edge_client.wire.constants import DEFAULT_MAX_PAYLOAD_BYTES, INJECT_MAX_PAYLOAD_BYTES
from edge_client.wire.frames import SampleBatch, encode_json
from edge_client.wire.records import CONFIG, RoundPlan
from edge_client.wire.run_config import RunSettings

Fast = Callable[..., RunSettings]

#: Injection runs: a fixed controller, so that only the data differs between devices.
NONIID = {"controller": "fixed", "eval_samples": 300}


def histogram(y: np.ndarray, classes: int = 6) -> np.ndarray:
    return np.bincount(y, minlength=classes) / len(y)


# -- skewed stream generators ---------------------------------------------------------------


def test_pathological_skew_gives_each_device_its_k_classes_and_covers_the_fleet() -> None:
    picks = [pick_classes(1, 6, index=i) for i in range(8)]
    pairs = [pick_classes(2, 6, index=i) for i in range(3)]
    drawn = pick_classes(2, 6, rng=device_rng(0, "pi-1", 3))

    assert picks == [[0], [1], [2], [3], [4], [5], [0], [1]]
    assert pairs == [[0, 1], [2, 3], [4, 5]]
    assert drawn == pick_classes(2, 6, rng=device_rng(0, "pi-1", 3)) and len(set(drawn)) == 2
    with pytest.raises(ValueError, match="classes per device"):
        pick_classes(7, 6, index=0)


def test_label_histograms_follow_the_skew_and_are_reproducible() -> None:
    task = SensorTask()

    def draw(seed: int, **skew: Any) -> np.ndarray:
        rng = device_rng(seed, "dev-0")
        probs = label_distribution(6, rng, **skew)
        return SyntheticSource(task, rng, probs).next(3000)[1]

    one = draw(0, labels=[4])
    dirichlet = draw(0, dirichlet=0.1)
    iid = draw(0)

    assert set(one.tolist()) == {4}
    assert histogram(dirichlet).max() > 0.6  # alpha 0.1: one class dominates
    assert np.abs(histogram(iid) - 1 / 6).max() < 0.03
    assert np.array_equal(dirichlet, draw(0, dirichlet=0.1))  # same seed, same stream
    assert not np.array_equal(dirichlet, draw(1, dirichlet=0.1))


def test_feature_shift_moves_each_devices_sensor_statistics() -> None:
    task = SensorTask()
    plain = SyntheticSource(task, device_rng(0, "a"), None, 0.0).next(2000)[0]
    shifted = SyntheticSource(task, device_rng(0, "a"), None, 2.0).next(2000)[0]

    gap = np.abs(plain.mean(axis=(0, 2)) - shifted.mean(axis=(0, 2)))

    assert gap.max() > 0.5


def test_replayed_streams_carry_the_skew_across_top_ups(tmp_path: Path) -> None:
    path = tmp_path / "sim-3.sqlite"

    stream = StreamSamples("sim-3", 0, DEFAULT_SHAPE, DEFAULT_NUM_CLASSES, labels=[3])
    replay_into(path, stream, 100.0, initial=500, capacity=10_000, now=0.0)
    replay_into(path, stream, 100.0, initial=500, capacity=10_000, now=5.0)

    with BufferStore(path) as store:
        y = store.take(10_000).y
    assert len(y) == 1000 and set(y.tolist()) == {3}


def test_in_process_fleets_are_skewed_per_device(tmp_path: Path) -> None:
    devices = [VirtualDevice(f"d{i}", labels=pick_classes(1, 6, index=i)) for i in range(3)]
    devices.append(VirtualDevice("dir", dirichlet=0.1))

    grid = InProcessGrid(devices, tmp_path)
    labels = {d.device_id: grid.stores[n].take(2000).y for n, d in grid.devices.items()}
    grid.close()

    assert [set(labels[f"d{i}"].tolist()) for i in range(3)] == [{0}, {1}, {2}]
    assert histogram(labels["dir"]).max() > 0.6


# -- data injection -------------------------------------------------------------------------


def test_injectors_are_a_fraction_alpha_of_the_opted_in_devices() -> None:
    # Prepare: 8 of 10 devices opted in.
    opted = [f"dev-{i}" for i in range(8)]
    # Execute
    picks = [pick_injectors(opted, 0.25, 3, r) for r in range(1, 201)]
    # Assert
    assert all(len(p) == 2 for p in picks)  # round(0.25 * 8)
    assert set().union(*map(set, picks)) <= set(opted)  # never an opted-out device
    counts = Counter(d for p in picks for d in p)
    assert min(counts.values()) > 25  # every opted-in device gets picked (50 on average)
    assert pick_injectors(opted, 0.0, 3, 1) == [] and pick_injectors([], 0.5, 3, 1) == []


def test_a_picked_device_shares_beta_of_its_samples_within_the_budget(tmp_path: Path) -> None:
    # Prepare: 400 samples just trained on.
    task = SensorTask()
    x, y = task.sample(400, np.random.default_rng(0))
    taken = SampleBatch(x=x, y=y, ts=np.zeros(400))
    rng = np.random.default_rng(0)

    def shared(beta: float, budget: int) -> tuple[int, int]:
        plan = RoundPlan(8, 1, 0.1, inject_publish=True, inject_beta=beta, inject_budget=budget)
        path = tmp_path / f"b{beta}-{budget}.sqlite"
        BufferStore(path, shape=task.shape).close()
        out = share(path, "dev-1", taken, plan, rng)
        with Outbox(path) as outbox:
            assert sum(len(p) for _, p in outbox.pending()) == out[0]
        return out

    # Execute
    roomy, tight, none = shared(0.1, 10**6), shared(0.5, 8_000), shared(0.5, 100)
    everything = shared(1.0, 10**6)
    # Assert
    assert roomy[1] == 40  # beta * 400
    assert everything[0] <= DEFAULT_MAX_PAYLOAD_BYTES < 400 * 784  # one message any broker takes
    assert tight[0] <= 8_000 and tight[1] == 10  # 776 B a sample
    assert none == (0, 0)  # not even one sample fits


def test_injection_over_many_rounds_respects_opt_in_alpha_budget_and_mix(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: 5 devices, one label each; dev-4 did not opt in.
    devices = [VirtualDevice(f"dev-{i}", rate=20_000, labels=[i], inject=i < 4) for i in range(5)]
    grid = InProcessGrid(devices, tmp_path / "buffers")
    settings = fast(
        **NONIID,
        num_rounds=8,
        inject_alpha=0.5,
        inject_beta=0.5,
        inject_budget=6_000,
        inject_mix=0.25,
    )
    # Execute
    records = run_rounds(grid, settings)
    pools = {grid.devices[n].device_id: p.stats() for n, p in grid.pools.items()}
    pooled = {
        grid.devices[n].device_id: set(p.sample(500, np.random.default_rng(0)).y.tolist())
        for n, p in grid.pools.items()
    }
    grid.close()
    # Assert: round 1 knows nobody's opt-in yet; then 2 of the 4 opted-in devices each round.
    assert records[0].inject_picked == []
    for r in records[1:]:
        assert len(r.inject_picked) == 2 and "dev-4" not in r.inject_picked
        assert 0 < r.inject_bytes <= 6_000
        assert r.devices["dev-4"].inject_bytes == 0
    # the opted-out device has no pool, never mixes, and its samples reach no pool
    assert "dev-4" not in pools and all(r.devices["dev-4"].inject_used == 0 for r in records)
    assert all(4 not in labels for labels in pooled.values())
    # pools hold others' samples only (tagged by origin: a device's own label never shows up)
    for dev, labels in pooled.items():
        assert int(dev[-1]) not in labels and labels
    # counted: every delivered message accepted, none rejected
    assert sum(p["accepted"] for p in pools.values()) == sum(
        3 * r.devices[d].inject_samples for r in records for d in r.inject_picked
    )
    assert all(p["rejected"] == 0 for p in pools.values())
    # planned proportion: round(0.25 * b) of every batch, once the pool has samples
    last = records[-1].devices["dev-0"]
    assert last.inject_used == round(0.25 * last.batch_size) * last.local_steps


def test_bad_injection_messages_are_refused_and_counted(tmp_path: Path, frames: Any) -> None:
    pool = open_pool(tmp_path / "dev-a.sqlite", (6, 32))
    x = np.zeros((6, 32))
    big = frames(n=400, publisher="dev-b", seq=9)
    assert len(big) > INJECT_MAX_PAYLOAD_BYTES

    refused = receive(
        pool,
        [
            b"garbage",
            big,
            encode_json(x, 1),  # JSON has no publisher: untagged
            frames(n=2, publisher="dev-a", seq=1),  # our own: skipped, not counted
            frames(n=3, publisher="dev-b", seq=1),
            frames(n=3, publisher="dev-b", seq=1),  # redelivery: de-duplicated
        ],
        "dev-a",
        6,
        0.0,
    )

    s = pool.stats()
    pool.close()
    assert refused == {"bad-magic": 1, "too-large": 1, "untagged": 1}
    assert s["accepted"] == 3 and s["duplicates"] == 1 and s["rejected"] == 3
    assert s["rejected-by-reason"] == {"bad-magic": 1, "too-large": 1, "untagged": 1}


def test_virtual_devices_receive_what_others_shared_in_earlier_rounds_once(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: three virtual devices of an injecting run; sim-1 and sim-2 share in round 2,
    # sim-2 again in round 3 (a partial file of round 2 is never read)
    settings = fast(inject_alpha=0.5, sim_dir=str(tmp_path))
    nodes = SimulationNodes()
    node = {i: simulated_node({PARTITION_ID_KEY: i}, 1, settings, 0) for i in (1, 2, 3)}
    task = SensorTask()
    x, y = task.sample(40, np.random.default_rng(0))
    taken = SampleBatch(x=x, y=y, ts=np.zeros(40))
    plan = RoundPlan(8, 2, 0.1, inject_publish=True, inject_beta=0.5, inject_budget=10**6)
    states = {i: MemoryDeviceState() for i in node}
    rng = np.random.default_rng(0)
    for i, server_round in ((1, 2), (2, 2), (2, 3)):
        post = nodes.post_shared(node[i], server_round)
        assert share_when_picked(node[i], plan, taken, rng, states[i], post)[1] == 20
    (tmp_path / "run-1" / "inject" / "00000002" / ".sim-3.frame.1").write_bytes(b"partial")

    def pooled(i: int) -> dict[str, Any]:
        with open_pool(node[i].buffer, settings.shape) as pool:
            return pool.stats()

    # Execute: sim-3 starts round 3, then round 3 again (a retry), then round 4
    nodes.receive_shared(node[3], settings, states[3], 3)
    after_3 = pooled(3)
    nodes.receive_shared(node[3], settings, states[3], 3)
    nodes.receive_shared(node[3], settings, states[3], 4)
    after_4 = pooled(3)
    nodes.receive_shared(node[1], settings, states[1], 3)
    # Assert: round 2's two frames (40 samples) by round 3, round 3's by round 4, each once;
    # a device never receives its own; none that did not opt in
    assert node[3].inject and after_3["fill"] == 40 and after_4["fill"] == 60
    assert after_4["rejected-by-reason"] == {} and states[3].inject_received() == 3
    assert pooled(1)["fill"] == 20  # sim-2's frame, not its own
    assert not simulated_node({PARTITION_ID_KEY: 1}, 1, fast(), 0).inject


# -- FedProx --------------------------------------------------------------------------------


def test_fedprox_keeps_the_local_model_closer_to_the_global_one(tmp_path: Path) -> None:
    # Prepare: the same samples in two buffers; the same starting model.
    task = SensorTask()
    x, y = task.sample(600, np.random.default_rng(1), np.eye(6)[2])
    start = build_model("cnn", task.shape, 6, seed=0)
    drift = {}
    for mu in (0.0, 1.0):
        with BufferStore(tmp_path / f"mu{mu}.sqlite", shape=task.shape) as store:
            store.append([SampleBatch(x=x, y=y, ts=np.zeros(600))])
            model = copy.deepcopy(start)
            torch.manual_seed(0)
            # Execute
            train_local(model, store, RoundPlan(20, 30, 0.1, proximal_mu=mu))
        drift[mu] = sum(
            float(((p - q) ** 2).sum().detach())
            for p, q in zip(model.parameters(), start.parameters(), strict=True)
        )
    # Assert
    assert drift[1.0] < 0.7 * drift[0.0]


def test_fedprox_mu_reaches_the_devices_plan(fast: Fast) -> None:
    # Prepare
    strategy = StreamStrategy(fast(proximal_mu=0.01))
    arrays = ArrayRecord(build_model("cnn", (6, 32), 6).state_dict())
    # Execute
    (msg,) = list(strategy.configure_train(1, arrays, ConfigRecord(), StaticGrid([1])))
    # Assert
    assert RoundPlan.from_record(msg.content.config_records[CONFIG]).proximal_mu == 0.01
