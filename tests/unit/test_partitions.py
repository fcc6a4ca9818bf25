"""A recording split across devices (Flower Datasets' partitioners), and the simulation
engine's virtual devices streaming their parts in recorded order on a virtual clock."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import RecordDict

from edge_client.emulation.lazy_buffer import RecordingSamples
from edge_client.emulation.partitions import device_name, partition, split_recording
from edge_client.emulation.simulation import lazy_device, virtual_stream
from edge_client.task.recordings import load_groups, load_recording
from edge_client.wire.partitioning import parse_scheme, scheme_of
from edge_client.wire.run_config import RunSettings


def people(path: Path, users: int = 4, each: int = 30) -> Path:
    """A recording of ``users`` people, ``each`` samples of shape (2, 3) a person, one person
    after another then interleaved; sample ``i`` holds ``i`` (to check order and identity)."""
    who = np.repeat(np.arange(users), each)
    order = np.r_[np.arange(0, len(who), 2), np.arange(1, len(who), 2)]  # people interleave
    who = who[order]
    x = np.arange(len(who), dtype=np.float32)[:, None, None] * np.ones((1, 2, 3), np.float32)
    y = np.arange(len(who)) % 3
    np.savez(path, x=x, y=y, user=np.array([f"u{w}" for w in who]))
    return path


def test_a_natural_partition_gives_each_group_its_samples_in_recorded_order(
    tmp_path: Path,
) -> None:
    # Prepare
    rec = people(tmp_path / "rec.npz")
    _x, y = load_recording(rec)
    groups = load_groups(rec, "user")
    # Execute
    parts = partition(y, parse_scheme("natural"), groups=groups)
    # Assert: one device per person, every sample once, each part increasing (recorded order)
    assert sorted(parts.names) == ["u0", "u1", "u2", "u3"] and not parts.left_out
    assert sorted(np.concatenate(parts.indices).tolist()) == list(range(len(y)))
    for name, at in zip(parts.names, parts.indices, strict=True):
        assert np.all(np.diff(at) > 0) and set(groups[at]) == {name}


@pytest.mark.parametrize("scheme", ["iid", "dirichlet(0.3)", "pathological(1)"])
def test_the_other_partitions_come_from_flower_datasets_partitioners(scheme: str) -> None:
    # Prepare: 600 samples of 3 classes in order
    y = np.arange(600) % 3
    # Execute
    parts = partition(y, parse_scheme(scheme), num_partitions=5, seed=1)
    again = partition(y, parse_scheme(scheme), num_partitions=5, seed=1)
    # Assert: 5 devices at most, no sample twice, the same split for the same seed
    every = np.concatenate(parts.indices)
    assert 0 < len(parts) <= 5 and len(every) == len(set(every.tolist()))
    assert [a.tolist() for a in parts.indices] == [a.tolist() for a in again.indices]
    if scheme == "iid":
        assert sorted(map(len, parts.indices)) == [120] * 5 and len(every) == 600
    if scheme.startswith("pathological"):  # one class a device, each in recorded order
        for at in parts.indices:
            assert len(set(y[at].tolist())) == 1 and np.all(np.diff(at) > 0)


def test_a_csv_partition_key_is_a_named_column_not_a_feature(tmp_path: Path) -> None:
    # Prepare: label, two features, and the person
    rec = tmp_path / "rec.csv"
    rec.write_text("label,a,b,user\n0,1.0,2.0,ann\n1,3.0,4.0,bob\n0,5.0,6.0,ann\n")
    # Execute
    x, y = load_recording(rec, group_key="user")
    groups = load_groups(rec, "user")
    # Assert
    assert x.tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]] and y.tolist() == [0, 1, 0]
    assert groups.tolist() == ["ann", "bob", "ann"]


def test_a_bad_partition_says_what_the_file_has(tmp_path: Path) -> None:
    # Prepare
    rec = people(tmp_path / "rec.npz")
    csv = tmp_path / "rec.csv"
    csv.write_text("label,a,subject\n0,1,s1\n")
    alone = tmp_path / "alone.npz"
    np.savez(alone, x=np.zeros((4, 2)), y=np.zeros(4), user=np.array(["u"] * 4))
    # Execute / Assert: a missing key names the keys there are; one group is not a federation
    with pytest.raises(ValueError, match=r"has no array 'person'.*it has: x, y, user"):
        load_groups(rec, "person")
    with pytest.raises(ValueError, match=r"no column 'user'.*its columns: label, a, subject"):
        load_groups(csv, "user")
    with pytest.raises(ValueError, match=r"'user' holds one group \(u\).*it has: x, y, user"):
        split_recording(str(alone), parse_scheme("natural"), key="user")
    for bad, message in (("natural", "needs the key"), ("pathological(0)", "whole number")):
        with pytest.raises(ValueError, match=message):
            scheme_of(bad, "")
    with pytest.raises(ValueError, match="goes with a natural partition"):
        scheme_of("iid", "user")
    with pytest.raises(ValueError, match="split a sim-source"):
        RunSettings(sim_partition_by="user")


def test_a_part_streams_in_order_and_starts_over_when_it_ends() -> None:
    # Prepare: a part of 5 samples
    x = np.arange(5, dtype=np.float32)[:, None]
    part = RecordingSamples(x, np.arange(5))
    # Execute
    first, _ = part.range(0, 5)
    wrapped, labels = part.range(3, 12)
    # Assert
    assert first[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert wrapped[:, 0].tolist() == [3, 4, 0, 1, 2, 3, 4, 0, 1] and labels.tolist()[2] == 0
    assert part.passes(12) == 12 / 5


def test_virtual_devices_stream_their_group_on_the_virtual_clock(tmp_path: Path) -> None:
    # Prepare: 4 people; 3 samples/s a device, 10 s a round, 20 samples at the start
    rec = people(tmp_path / "rec.npz")
    settings = RunSettings(
        sim_source=str(rec), sim_partition_by="user", sample_shape="2,3", num_classes=3,
        sim_rates="3", sim_round_s=10.0, sim_initial=20,
    )  # fmt: skip
    node = {"partition-id": 2, "num-partitions": 4}
    state = RecordDict()
    # Execute: rounds 1 and 3 (a device missed round 2), each taking everything held
    device_id, _ = virtual_stream(node, settings)
    taken = []
    for server_round in (1, 3):
        with lazy_device(node, settings, state, server_round) as (buffer, _):
            taken.append(buffer.take(1000).x[:, 0, 0].astype(int).tolist())
    # Assert: its own person's samples, in recorded order, as many as the virtual clock says
    # (20 at first, then 3/s x 20 s); starting over after its 30
    own = [int(i) for i in np.load(rec)["x"][:, 0, 0]]
    mine = [i for i, who in zip(own, np.load(rec)["user"], strict=True) if who == "u2"]
    assert device_id == device_name("user", "u2") == "user-u2"
    assert taken[0] == mine[:20] and taken[1] == (mine * 3)[20:80]
