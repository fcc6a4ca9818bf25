"""Non-IID streams and their mitigation: skewed generators, ScaDLES data injection, FedProx."""

from __future__ import annotations

import contextlib
import copy
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from aggregator.controller import BatchController
from aggregator.server_app import run_rounds
from aggregator.settings import RunSettings
from aggregator.strategy import StreamStrategy
from bench.probes import MqttProbe, start_ingest
from bench.probes import buffer_stats as stats
from deploy.inprocess import InProcessGrid, VirtualDevice
from deploy.local import ProcessGroup, wait_until
from edge_client.buffer import BufferStore, inject_pool_path
from edge_client.client_app import _share
from edge_client.constants import INJECT_MAX_PAYLOAD_BYTES, INJECT_TOPIC
from edge_client.frames import FrameError, SampleBatch, decode_payload, encode_json
from edge_client.inject import open_pool, receive
from edge_client.models import build_model
from edge_client.replay import replay_into
from edge_client.schedule import device_rng
from edge_client.sources import SyntheticSource, label_distribution, pick_classes
from edge_client.synthetic import SensorTask
from edge_client.trainer import LocalPlan, train_local

FAST: dict[str, Any] = {
    "local_steps": 5,
    "global_batch": 64,
    "b_min": 4,
    "b_max": 64,
    "eval_samples": 300,
    "controller": "fixed",
}


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


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

    replay_into(path, "sim-3", 100.0, initial=500, capacity=10_000, labels=[3], now=0.0)
    replay_into(path, "sim-3", 100.0, initial=500, capacity=10_000, labels=[3], now=5.0)

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


def strategy(**kw: Any) -> StreamStrategy:
    settings = RunSettings(**FAST, **kw)
    return StreamStrategy(
        settings=settings, controller=BatchController(settings.controller_config())
    )


def test_injectors_are_a_fraction_alpha_of_the_opted_in_devices() -> None:
    s = strategy(inject_alpha=0.25, seed=3)
    devices = [f"dev-{i}" for i in range(10)]
    s.last_metrics = {d: {"inject-opt-in": float(i < 8)} for i, d in enumerate(devices)}

    picks = [s._pick_injectors(r, devices) for r in range(1, 201)]

    assert all(len(p) == 2 for p in picks)  # round(0.25 * 8)
    assert not {"dev-8", "dev-9"} & set().union(*map(set, picks))  # never the opted-out
    counts = Counter(d for p in picks for d in p)
    assert min(counts.values()) > 25  # every opted-in device gets picked (50 on average)
    assert strategy(inject_alpha=0.0)._pick_injectors(1, devices) == []


def test_a_picked_device_shares_beta_of_its_samples_within_the_budget(tmp_path: Path) -> None:
    task = SensorTask()
    x, y = task.sample(400, np.random.default_rng(0))
    taken = SampleBatch(x=x, y=y, ts=np.zeros(400))
    rng = np.random.default_rng(0)

    def share(beta: float, budget: int) -> dict[str, int]:
        plan = LocalPlan(8, 1, 0.1, inject_publish=True, inject_beta=beta, inject_budget=budget)
        with BufferStore(tmp_path / f"b{beta}-{budget}.sqlite", shape=task.shape) as store:
            out = _share(store, "dev-1", taken, plan, rng)
            queued = store.outbox()
            assert sum(len(p) for _, p in queued) == out.get("inject-bytes", 0)
        return out

    roomy = share(0.1, 10**6)
    tight = share(0.5, 8_000)

    assert roomy["inject-samples"] == 40  # beta * 400
    assert tight["inject-bytes"] <= 8_000 and tight["inject-samples"] == 10  # 776 B a sample
    assert share(0.5, 100) == {}  # not even one sample fits


def test_injection_over_many_rounds_respects_opt_in_alpha_budget_and_mix(tmp_path: Path) -> None:
    # Prepare: 5 devices, one label each; dev-4 did not opt in.
    devices = [VirtualDevice(f"dev-{i}", rate=20_000, labels=[i], inject=i < 4) for i in range(5)]
    grid = InProcessGrid(devices, tmp_path / "buffers")
    settings = RunSettings(
        **FAST,
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
    assert records[0]["inject-picked"] == []
    for r in records[1:]:
        assert len(r["inject-picked"]) == 2 and "dev-4" not in r["inject-picked"]
        assert 0 < r["inject-bytes"] <= 6_000
        assert r["devices"]["dev-4"]["inject-bytes"] == 0
    # the opted-out device has no pool, never mixes, and its samples reach no pool
    assert "dev-4" not in pools and all(r["devices"]["dev-4"]["inject-used"] == 0 for r in records)
    assert all(4 not in labels for labels in pooled.values())
    # pools hold others' samples only (tagged by origin: a device's own label never shows up)
    for dev, labels in pooled.items():
        assert int(dev[-1]) not in labels and labels
    # counted: every delivered message accepted, none rejected
    assert sum(p["accepted"] for p in pools.values()) == sum(
        3 * r["devices"][d]["inject-samples"] for r in records for d in r["inject-picked"]
    )
    assert all(p["rejected"] == 0 for p in pools.values())
    # planned proportion: round(0.25 * b) of every batch, once the pool has samples
    last = records[-1]["devices"]["dev-0"]
    assert last["inject-used"] == round(0.25 * last["batch"]) * last["steps"]


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


def test_ingest_inject_keeps_others_samples_apart_and_publishes_the_outbox(
    tmp_path: Path, broker: Any, procs: ProcessGroup, frames: Any
) -> None:
    # Prepare: dev-a opted in, dev-c did not; a watcher on the injection topic.
    a, c = tmp_path / "dev-a.sqlite", tmp_path / "dev-c.sqlite"
    with BufferStore(a, shape=(6, 32)) as store:
        store.queue_outbox([frames(n=5, publisher="dev-a", seq=1)])
    with BufferStore(c, shape=(6, 32)) as store:
        store.queue_outbox([frames(n=5, publisher="dev-c", seq=1)])  # must never leave
    watcher = MqttProbe(broker.url, "watcher")
    watcher.subscribe(INJECT_TOPIC)
    start_ingest(procs, broker.url, a, "dev-a", "--inject", name="ingest-a")
    start_ingest(procs, broker.url, c, "dev-c", name="ingest-c")
    sender = MqttProbe(broker.url, "dev-b")
    assert sender.wait_connected()
    # Execute: dev-a's outbox goes out; dev-b shares samples and sends garbage.
    assert wait_until(lambda: len(watcher.messages) >= 1, 20)
    time.sleep(1.0)
    sender.publish(INJECT_TOPIC, frames(n=7, publisher="dev-b", seq=1))
    sender.publish(INJECT_TOPIC, b"\x00garbage")
    pool = inject_pool_path(a)
    assert wait_until(lambda: pool.exists() and stats(pool)["received"] >= 7, 20)
    assert wait_until(lambda: stats(pool)["rejected"] >= 1, 20)
    # Assert
    publishers = []
    for m in watcher.messages:
        with contextlib.suppress(FrameError):
            publishers.append(decode_payload(m.payload, (6, 32), 6, now=0.0).publisher)
    assert "dev-a" in publishers and "dev-c" not in publishers
    assert stats(pool)["accepted"] == 7  # dev-b's; dev-a's own came back and was skipped
    assert stats(a)["accepted"] == 0  # nothing injected reached the device's own buffer
    assert not inject_pool_path(c).exists()
    with BufferStore(c) as store:
        assert len(store.outbox()) == 1  # never published
    with BufferStore(a) as store:
        assert store.outbox() == []
    watcher.close()
    sender.close()


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
            train_local(model, store, LocalPlan(20, 30, 0.1, proximal_mu=mu))
        drift[mu] = sum(
            float(((p - q) ** 2).sum().detach())
            for p, q in zip(model.parameters(), start.parameters(), strict=True)
        )
    # Assert
    assert drift[1.0] < 0.7 * drift[0.0]


def test_fedprox_mu_reaches_the_devices_plan(tmp_path: Path) -> None:
    s = strategy(proximal_mu=0.01)
    grid = InProcessGrid([VirtualDevice("dev-0")], tmp_path)
    from flwr.app import ArrayRecord, ConfigRecord

    arrays = ArrayRecord(build_model("cnn", (6, 32), 6).state_dict())
    (msg,) = list(s.configure_train(1, arrays, ConfigRecord(), grid))
    grid.close()

    assert msg.content.config_records["config"]["proximal-mu"] == 0.01
