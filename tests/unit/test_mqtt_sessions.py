"""MQTT sessions and what the broker says: the protocol version a client speaks, its session
and Receive Maximum, subscriptions in packets a cloud broker takes, refusals in words, client
ids and topics within cloud brokers' limits, and the daemon's loss warning."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from edge_client.runtime.constants import MQTT_VERSION_ENV, SUBSCRIBE_MAX_FILTERS
from edge_client.runtime.ingest_status import LossLog
from edge_client.runtime.mqtt import (
    _SESSIONS,
    BrokerOptions,
    Connection,
    Subscriptions,
    describe_reason,
    make_client,
    unread_bytes,
)
from edge_client.wire.topics import check_topic, client_id


def reason(code: int, packet: int = PacketTypes.CONNACK) -> ReasonCode:
    return ReasonCode(packet, identifier=code)


def test_clients_speak_mqtt_5_unless_told_or_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare
    monkeypatch.delenv(MQTT_VERSION_ENV, raising=False)
    # Execute / Assert: the default, an option, the environment, and a bad value of each
    assert BrokerOptions.of("mqtt://h").protocol == "5"
    assert BrokerOptions.of("mqtt://h", mqtt_version="3.1.1").protocol == "3.1.1"
    monkeypatch.setenv(MQTT_VERSION_ENV, "3.1.1")
    assert BrokerOptions.of("mqtt://h").protocol == "3.1.1"
    assert BrokerOptions.of("mqtt://h", mqtt_version="5").protocol == "5"  # the option wins
    with pytest.raises(ValueError, match=r"MQTT version '4' is none of 5, 3\.1\.1"):
        BrokerOptions.of("mqtt://h", mqtt_version="4")
    monkeypatch.setenv(MQTT_VERSION_ENV, "v5")
    with pytest.raises(ValueError, match=f"{MQTT_VERSION_ENV}='v5'"):
        make_client("c", BrokerOptions.of("mqtt://h"))


def test_a_session_expires_after_its_interval_and_says_how_much_it_takes() -> None:
    # Execute
    v5 = make_client("d.ingest", BrokerOptions.of("mqtt://h", mqtt_version="5"),
                     session_expiry=3600, receive_maximum=65_535)  # fmt: skip
    clean = make_client("d.infer", BrokerOptions.of("mqtt://h", mqtt_version="5"))
    old = make_client("d.ingest", BrokerOptions.of("mqtt://h", mqtt_version="3.1.1"),
                      session_expiry=3600)  # fmt: skip
    # Assert: MQTT 5 resumes its session (no clean start) and says for how long and how many
    # messages; a clean one starts afresh; 3.1.1 has only the clean-session flag
    assert v5.protocol == mqtt.MQTTv5 and old.protocol == mqtt.MQTTv311
    clean_start, props = _SESSIONS[v5]  # the CONNECT's flag and properties
    values = vars(props)
    assert clean_start is False
    assert (values["SessionExpiryInterval"], values["ReceiveMaximum"]) == (3600, 65_535)
    assert _SESSIONS[clean][0] is True and not hasattr(_SESSIONS[clean][1], "ReceiveMaximum")
    assert old not in _SESSIONS and old._clean_session is False
    with pytest.raises(ValueError, match="session expiry"):
        make_client("c", BrokerOptions.of("mqtt://h"), session_expiry=-1)
    assert unread_bytes(v5) == 0  # not connected


def test_refusals_read_as_their_reason_code_and_what_to_do() -> None:
    # Assert: names, MQTT 5 codes, hints; a 3.1.1 broker's codes carry no MQTT 5 number
    assert describe_reason(reason(0x87), v5=True) == (
        "Not authorized (MQTT 5 reason code 0x87): the broker's ACL or policy does not allow "
        "this client, client id or topic"
    )
    assert "run with --mqtt-version 3.1.1" in describe_reason(reason(0x84), v5=True)
    assert describe_reason(reason(0x84), v5=False) == "Unsupported protocol version"
    assert "took this client id over" in describe_reason(
        reason(0x8E, PacketTypes.DISCONNECT), v5=True
    )
    assert "lower --max-payload" in describe_reason(reason(0x95, PacketTypes.DISCONNECT), True)


def test_subscriptions_go_in_packets_of_at_most_8_and_refusals_are_named() -> None:
    # Prepare: 10 topics, a client that records its SUBSCRIBE packets
    topics = [f"site/{i}/imu" for i in range(10)]
    sent: list[list[tuple[str, int]]] = []

    def subscribe(filters: list[tuple[str, int]]) -> tuple[int, int]:
        sent.append(filters)
        return 0, len(sent)  # (rc, mid)

    client: Any = SimpleNamespace(subscribe=subscribe)
    subscriptions = Subscriptions(topics)
    # Execute: the broker grants the first packet and refuses one filter of the second
    connection = Connection(v5=True)
    subscriptions.send(client)
    first = subscriptions.acknowledged(1, [reason(1, PacketTypes.SUBACK)] * 8, connection)
    second = subscriptions.acknowledged(
        2, [reason(1, PacketTypes.SUBACK), reason(0x87, PacketTypes.SUBACK)], connection
    )
    # Assert: the connection says why, as a daemon's --connect-timeout would report it
    assert [len(packet) for packet in sent] == [SUBSCRIBE_MAX_FILTERS, 2]
    assert first is None and second is False
    assert list(subscriptions.refused) == ["site/9/imu"]
    assert connection.last_error == (
        "the broker refused to subscribe: site/9/imu: Not authorized (MQTT 5 reason code "
        "0x87): the broker's ACL or policy does not allow this client, client id or topic"
    )


def test_client_ids_are_the_device_its_role_and_nothing_another_device_could_use() -> None:
    # Assert: one id per process; no device's ids start with another's id and a dot
    assert client_id("pi-1", "ingest") == "pi-1.ingest"
    assert client_id("pi-1", "publish", "a1b2") == "pi-1.publish.a1b2"
    assert not client_id("pi-1-b", "ingest").startswith("pi-1.")
    for bad, message in ((("pi.1", "ingest"), "device id"), (("pi-1", "other"), "role")):
        with pytest.raises(ValueError, match=message):
            client_id(*bad)
    with pytest.raises(ValueError, match="over 128 bytes"):
        client_id("d" * 64, "publish", "x" * 70)


def test_topics_keep_within_aws_iot_cores_seven_slashes() -> None:
    assert check_topic("fedstream/v1/pi-1/samples") == "fedstream/v1/pi-1/samples"
    assert check_topic("a/b/c/d/e/f/g/h") == "a/b/c/d/e/f/g/h"
    with pytest.raises(ValueError, match="AWS IoT Core refuses more than 7"):
        check_topic("a/b/c/d/e/f/g/h/i")
    with pytest.raises(ValueError, match="without wildcards"):
        check_topic("site/+/imu")


def test_a_loss_warning_names_the_cause_at_once_then_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Prepare
    losses = LossLog("3.1.1", interval=60.0)
    caplog.set_level(logging.WARNING)
    # Execute: nothing missing; 5 missing; 3 more within the interval; 2 more after it
    quiet = losses.record({"device-id": "d", "messages-missing": 0}, now=0.0)
    first = losses.record({"device-id": "d", "messages-missing": 5}, now=1.0)
    held = losses.record({"device-id": "d", "messages-missing": 8}, now=30.0)
    later = losses.record({"device-id": "d", "messages-missing": 10}, now=62.0)
    # Assert: the rise since the last warning, the cause and the fix
    assert (quiet, first, held, later) == (False, True, False, True)
    lines = [r.getMessage() for r in caplog.records]
    assert "d: 5 message(s) of fedstream publishers never arrived" in lines[0]
    assert "d: 5 message(s)" in lines[1]  # 10 - 5: what came since the first warning
    assert "max_inflight_messages" in lines[0] and "--mqtt-version 5" in lines[0]
    v5 = LossLog("5")
    assert v5.record({"device-id": "d", "readings-missing": 3}, now=0.0)
    assert "max_queued_messages" in caplog.records[-1].getMessage()
