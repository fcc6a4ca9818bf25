"""Sparkplug B read with Tahu's schema: births, aliases, each metric's timestamp, the edge
node's sequence number, deaths, held data and hostile payloads; against hand cases."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from edge_client.emulation.reading_styles import (
    SparkplugEdge,
    default_topic,
    encode_style,
    ingest_options,
)
from edge_client.runtime.windowing import WindowAssembler, WindowSpec
from edge_client.wire.constants import (
    MAX_SPARKPLUG_METRICS,
    SPARKPLUG_HELD_BYTES,
    SPARKPLUG_HELD_MAX,
)
from edge_client.wire.frames import REJECT_REASONS, FrameError
from edge_client.wire.sparkplug import (
    SparkplugReader,
    SparkplugTopic,
    decode_payload,
    encode_metrics,
    metric_number,
)
from edge_client.wire.sparkplug_b_pb2 import DataType, Payload

DDATA = "spBv1.0/plant/DDATA/edge-1/pump-3"
NAMES = ("temperature", "pressure")


def reader(names: tuple[str, ...] = NAMES) -> SparkplugReader:
    return SparkplugReader(SparkplugTopic.data(DDATA), names)


def read_all(
    r: SparkplugReader, messages: list[tuple[str, bytes]], arrival: float = 0.0
) -> list[tuple[int, float, float]]:
    out = []
    for topic, payload in messages:
        readings, _ = r.take(topic, payload, arrival)
        out += [(i, x.ts, x.values[0]) for i, x in readings]
    return out


# -- topics and values ---------------------------------------------------------------------


def test_topics_are_parsed_and_a_data_topic_names_its_edge_nodes_subscriptions() -> None:
    # Execute
    device = SparkplugTopic.parse("spBv1.0/plant/DBIRTH/edge-1/pump-3")
    node = SparkplugTopic.parse("spBv1.0/plant/NDEATH/edge-1")
    # Assert
    assert (device.group, device.kind, device.node, device.device) == (
        "plant",
        "DBIRTH",
        "edge-1",
        "pump-3",
    )
    assert node.device is None and node.kind == "NDEATH"
    assert SparkplugTopic.data(DDATA).subscriptions == (
        "spBv1.0/plant/+/edge-1",
        "spBv1.0/plant/+/edge-1/+",
    )
    for bad in ("spBv1.0/plant/DDATA/edge-1", "spBv1.0/plant/NBIRTH/edge-1/x", "spAv1.0/g/NDATA/e"):
        with pytest.raises(FrameError, match="Sparkplug") as err:
            SparkplugTopic.parse(bad)
        assert err.value.reason == "bad-topic"
    for user_topic in ("spBv1.0/plant/DDATA/+/pump-3", "spBv1.0/plant/DBIRTH/edge-1/pump-3"):
        with pytest.raises(ValueError, match="one data topic"):
            SparkplugTopic.data(user_topic)


@pytest.mark.parametrize(
    ("datatype", "value"),
    [
        (DataType.Int8, -5),
        (DataType.Int16, -300),
        (DataType.Int32, -70000),
        (DataType.Int64, -1),
        (DataType.UInt8, 255),
        (DataType.UInt32, 4_000_000_000),
        (DataType.UInt64, 2**40),
        (DataType.Float, 1.5),
        (DataType.Double, -2.25),
        (DataType.Boolean, 1),
    ],
)
def test_numeric_scalars_come_back_as_written_signed_ones_from_twos_complement(
    datatype: int, value: float
) -> None:
    # Prepare: as Tahu's clients write them (a negative Int8 as value + 2**8 in int_value)
    payload = decode_payload(encode_metrics([("m", None, datatype, value, 0)], 0, 0))
    # Execute / Assert
    assert metric_number(payload.metrics[0], datatype) == value


def test_a_null_metric_is_missing_and_a_string_one_no_number() -> None:
    # Prepare
    message = Payload()
    null = message.metrics.add(name="t", datatype=DataType.Double, is_null=True)
    text = message.metrics.add(name="s", datatype=DataType.String, string_value="hot")
    # Execute / Assert
    from edge_client.wire.readings import MissingValueError

    with pytest.raises(MissingValueError):
        metric_number(null, DataType.Double)
    with pytest.raises(FrameError, match="numeric") as err:
        metric_number(text, DataType.String)
    assert err.value.reason == "not-a-number"


# -- the edge node's session ---------------------------------------------------------------


def test_a_replay_comes_back_by_name_in_the_fields_order_with_each_metrics_timestamp() -> None:
    # Prepare: three readings at 10 Hz; the birth carries the first, the data the rest by
    # alias only; the fields ask for the metrics in the other order.
    stamps = [1_700_000_000.0, 1_700_000_000.1, 1_700_000_000.2]
    rows = [[20.0, 1.0], [21.0, 1.1], [22.0, 1.2]]
    messages = SparkplugEdge(DDATA, NAMES).messages(stamps, rows)
    r = reader(("pressure", "temperature"))
    # Execute
    got = read_all(r, messages)
    # Assert: NBIRTH, DBIRTH, two DDATA; every value on its channel, at its own time
    assert [t.split("/")[2] for t, _ in messages] == ["NBIRTH", "DBIRTH", "DDATA", "DDATA"]
    want = [(1 - j, ts, row[j]) for ts, row in zip(stamps, rows, strict=True) for j in range(2)]
    assert sorted(got) == sorted(want)
    assert r.types == {"temperature": DataType.Double, "pressure": DataType.Double}
    assert r.online is True and r.node_online is True


def test_exactly_the_dropped_messages_of_ten_thousand_are_counted_lost() -> None:
    # Prepare: 10,000 DDATA (the sequence wraps 39 times); 100 dropped on purpose, none
    # next to another
    rng = random.Random(7)
    edge = SparkplugEdge(DDATA, NAMES)
    stamps = [1_700_000_000 + i / 100 for i in range(10_001)]
    messages = edge.messages(stamps, [[float(i), 0.0] for i in range(10_001)])
    data = list(range(2, len(messages)))  # after the births
    dropped = set(rng.sample(data[::2], 100))
    r = reader()
    lost = 0
    # Execute
    for k, (topic, payload) in enumerate(messages):
        if k not in dropped:
            lost += r.take(topic, payload, 0.0)[1]["sparkplug-lost"]
    # Assert
    assert len(messages) - 2 == 10_000 and lost == 100


def test_a_redelivered_message_is_out_of_order_not_a_loss_and_a_new_birth_restarts() -> None:
    # Prepare
    edge = SparkplugEdge(DDATA, NAMES)
    messages = edge.messages([1.0, 2.0, 3.0], [[1.0, 1.0]] * 3)
    r = reader()
    read_all(r, messages)
    # Execute: the last DDATA again (QoS 1 redelivery), then the node reconnects
    _, again = r.take(*messages[-1], 0.0)
    rebirth = SparkplugEdge(DDATA, NAMES).messages([4.0], [[2.0, 2.0]])
    counts = [r.take(t, p, 0.0)[1] for t, p in rebirth]
    # Assert
    assert again["sparkplug-out-of-order"] == 1 and again["sparkplug-lost"] == 0
    assert sum(c["sparkplug-lost"] for c in counts) == 0
    assert sum(c["sparkplug-births"] for c in counts) == 1  # the device's (ours); NBIRTH resets


def test_data_before_its_birth_is_held_then_read_when_the_birth_names_it() -> None:
    # Prepare: a daemon that started after the births: it sees two DDATA by alias first
    edge = SparkplugEdge(DDATA, NAMES)
    births = edge.messages([1.0], [[10.0, 0.5]])
    data = edge.messages([2.0, 3.0], [[11.0, 0.6], [12.0, 0.7]])
    r = reader()
    # Execute
    early = [r.take(t, p, 0.0) for t, p in data]
    due = r.rebirth_due(100.0)
    late = read_all(r, births)
    # Assert: held and counted, a rebirth would be asked once (not again within 30 s),
    # then every reading read in order once named
    assert all(not readings and c["sparkplug-held"] == 1 for readings, c in early)
    assert due and not r.rebirth_due(101.0) and not r.held
    assert sorted((ts, v) for i, ts, v in late if i == 0) == [(1.0, 10.0), (2.0, 11.0), (3.0, 12.0)]


def test_held_data_is_bounded_and_deaths_are_followed() -> None:
    # Prepare
    edge = SparkplugEdge(DDATA, NAMES)
    edge.messages([0.0], [[0.0, 0.0]])  # births the reader never sees
    data = edge.messages([float(i) for i in range(SPARKPLUG_HELD_MAX + 3)], [[1.0, 1.0]] * 259)
    r = reader()
    # Execute
    counts = [r.take(t, p, 0.0)[1] for t, p in data]
    ddeath = encode_metrics([], edge._next(), 0)
    _, device_death = r.take("spBv1.0/plant/DDEATH/edge-1/pump-3", ddeath, 0.0)
    device_online = r.online
    ndeath = encode_metrics([("bdSeq", None, DataType.Int64, 0.0, 0)], None, 0)
    _, node_death = r.take("spBv1.0/plant/NDEATH/edge-1", ndeath, 0.0)
    # Assert
    assert len(r.held) == SPARKPLUG_HELD_MAX
    assert sum(c["sparkplug-held-dropped"] for c in counts) == 3
    assert device_death["sparkplug-deaths"] == 1 and device_online is False
    assert node_death["sparkplug-deaths"] == 1 and r.node_online is False
    assert r.status["node-online"] is False and r.status["held"] == SPARKPLUG_HELD_MAX


def test_held_data_is_bounded_in_bytes_too() -> None:
    # Prepare: DDATA of unknown aliases, each of 3,000 metrics (about 40 kB)
    edge = SparkplugEdge(DDATA, [f"m{i}" for i in range(3000)])
    edge.messages([0.0], [[0.0] * 3000])  # births the reader never sees
    data = edge.messages([float(i) for i in range(1, 61)], [[1.0] * 3000] * 60)
    r = reader()
    # Execute
    counts = [r.take(t, p, 0.0)[1] for t, p in data]
    # Assert: what is held stays within the bound, the oldest dropped first, each counted
    held = sum(len(p) for _, p, _ in r.held)
    assert held <= SPARKPLUG_HELD_BYTES < sum(len(p) for _, p in data)
    assert sum(c["sparkplug-held-dropped"] for c in counts) == len(data) - len(r.held)
    assert r.held[-1][1] == data[-1][1]


def test_the_session_survives_a_restart_of_the_reader() -> None:
    # Prepare
    edge = SparkplugEdge(DDATA, NAMES)
    first = edge.messages([1.0, 2.0], [[1.0, 1.0], [2.0, 2.0]])
    then = edge.messages([3.0, 4.0], [[3.0, 3.0], [4.0, 4.0]])
    r = reader()
    read_all(r, first)
    # Execute: the state as the buffer file keeps it, in a new reader; one message is lost
    # while it was away
    again = reader()
    again.restore(json.loads(json.dumps(r.state())))
    (readings, counts) = again.take(*then[1], 0.0)
    # Assert: aliases known without a new birth; the loss across the restart counted
    assert [(i, x.ts, x.values[0]) for i, x in readings] == [(0, 4.0, 4.0), (1, 4.0, 4.0)]
    assert counts["sparkplug-lost"] == 1 and again.types == r.types


# -- hostile input -------------------------------------------------------------------------


def test_hostile_payloads_and_topics_are_refused_by_reason_and_lose_nothing() -> None:
    # Prepare: a session that has read its births
    edge = SparkplugEdge(DDATA, NAMES)
    r = reader()
    read_all(r, edge.messages([1.0], [[1.0, 1.0]]))
    huge = Payload(seq=5)
    for i in range(100_000):
        huge.metrics.add(name=f"m{i}", alias=i, datatype=DataType.Double, double_value=1.0)
    hostile = [
        (DDATA, b'{"temperature": 21.5}', "bad-protobuf"),
        (DDATA, b"\xff\xff\xff\xff", "bad-protobuf"),
        (DDATA, b"", "empty"),
        ("spBv1.0/plant/DBIRTH/edge-1/pump-3", huge.SerializeToString(), "too-many-metrics"),
        ("spBv1.0/plant/DDATA/edge-1/" + "x" * 65_536, b"\x18\x01", "bad-topic"),
        ("spBv1.0/plant/DDATA/edge-2/pump-3", b"\x18\x01", "bad-topic"),
    ]
    # Execute / Assert: each refused by its reason, the session as it was
    for topic, payload, reason in hostile:
        with pytest.raises(FrameError) as err:
            r.take(topic, payload, 0.0)
        assert err.value.reason == reason and reason in REJECT_REASONS
    assert len(huge.metrics) > MAX_SPARKPLUG_METRICS
    got = read_all(r, edge.messages([2.0], [[2.0, 3.0]]))
    assert sorted(got) == [(0, 2.0, 2.0), (1, 2.0, 3.0)]


# -- windows -------------------------------------------------------------------------------


def test_a_sparkplug_replay_makes_the_windows_of_the_same_readings_as_json() -> None:
    # Prepare: 40 readings at 10 Hz of two channels, as Sparkplug B and as per-reading JSON
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(40, 2)).round(3).tolist()
    stamps = [1_700_000_000 + i / 10 for i in range(40)]
    topic = default_topic("sparkplug", "dev-0")
    assert topic is not None
    sparkplug = WindowSpec.from_options(
        topics=[topic], fields=",".join(NAMES), window=8, rate=10.0, payload="sparkplug"
    )
    plain_json = WindowSpec.from_options(topics=["t"], fields=",".join(NAMES), window=8, rate=10.0)
    styled = encode_style("sparkplug", topic, stamps, rows, NAMES)
    as_json = encode_style("json", "t", stamps, rows, NAMES)
    # Execute
    got = WindowAssembler(sparkplug).feed([(t, p, stamps[-1]) for t, p in styled])
    want = WindowAssembler(plain_json).feed([(t, p, stamps[-1]) for t, p in as_json])
    # Assert: the same windows, channels in --fields' order
    assert got.x.shape == want.x.shape and len(got.x) >= 3
    np.testing.assert_allclose(got.x, want.x, atol=1e-6)
    assert sparkplug.subscriptions == SparkplugTopic.data(topic).subscriptions
    state = json.loads(got.state)
    assert state["sparkplug-status"]["metrics-known"] == sorted(NAMES)
    assert ingest_options("sparkplug", topic, NAMES)[:2] == ["--payload", "sparkplug"]


def test_sparkplug_options_that_cannot_work_are_refused() -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="label-free"):
        WindowSpec.from_options(
            topics=[DDATA], fields="t", window=4, payload="sparkplug", label_field="y",
            num_classes=2,
        )  # fmt: skip
    with pytest.raises(ValueError, match="one data topic"):
        WindowSpec.from_options(topics=["spBv1.0/plant/DDATA/+/x"], fields="t", window=4,
                                payload="sparkplug")  # fmt: skip
    with pytest.raises(ValueError, match="distinct"):
        WindowSpec.from_options(topics=[DDATA], fields="t,t", window=4, payload="sparkplug")
    with pytest.raises(ValueError, match="--sparkplug-rebirth"):
        WindowSpec.from_options(topics=["t"], fields="a", window=4, rebirth=True)
