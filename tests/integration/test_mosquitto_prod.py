"""The production Mosquitto config: TLS, a password per device, a per-device ACL."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.brokers import BROKER_CONFIG_DIR, MosquittoBroker
from deploy.local import ProcessGroup, fedstream_command, free_port, wait_for_port, wait_until
from deploy.probes import MqttProbe, start_ingest
from deploy.probes import buffer_stats as stats
from edge_client.wire.constants import INJECT_TOPIC
from edge_client.wire.topics import predictions_topic, samples_topic, status_topic

pytestmark = pytest.mark.mosquitto


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MosquittoBroker, Path]]:
    files = tmp_path_factory.mktemp("mosquitto-files")
    subprocess.run(  # dev-a opted in to data injection, dev-b did not
        ["bash", str(BROKER_CONFIG_DIR / "make-dev-certs.sh"), str(files), "dev-a", "dev-b"],
        check=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "FEDSTREAM_INJECT": "dev-a"},
    )
    with MosquittoBroker(BROKER_CONFIG_DIR / "mosquitto-prod.conf", files_dir=files) as broker:
        yield broker, files


def tls_url(broker: MosquittoBroker) -> str:
    return f"mqtts://127.0.0.1:{broker.ports[0]}"


def creds(files: Path, user: str) -> dict[str, str]:
    return {
        "username": user,
        "password": (files / "credentials" / f"{user}.txt").read_text().strip(),
        "cafile": str(files / "certs" / "ca.crt"),
    }


def test_unauthenticated_and_wrong_password_are_refused(secured) -> None:
    broker, _ = secured
    plain = f"mqtt://127.0.0.1:{broker.ports[1]}"
    anonymous = MqttProbe(plain, "anon")
    wrong = MqttProbe(plain, "wrong", username="dev-a", password="nope")

    refused = wait_until(lambda: anonymous.refused is not None and wrong.refused is not None, 10)

    anonymous.close()
    wrong.close()
    assert refused and not anonymous.connected and not wrong.connected
    assert "authorized" in str(anonymous.refused).lower()


def test_device_cannot_write_or_read_another_devices_topic(secured) -> None:
    # Prepare: dev-a listens on its own topic; a spy (dev-b) tries to read dev-a's topic.
    broker, files = secured
    url = tls_url(broker)
    a = MqttProbe(url, "a", **creds(files, "dev-a"))
    b = MqttProbe(url, "b", **creds(files, "dev-b"))
    a.subscribe(samples_topic("dev-a"))
    b.subscribe(samples_topic("dev-a"))
    time.sleep(0.5)
    # Execute
    b.publish(samples_topic("dev-a"), b"from-b")  # denied: dropped by the broker
    a.publish(samples_topic("dev-a"), b"from-a")  # allowed
    # Assert
    assert wait_until(lambda: len(a.messages) >= 1, 10)
    time.sleep(0.5)
    assert [m.payload for m in a.messages] == [b"from-a"]
    assert b.messages == []  # dev-b may not read dev-a's samples
    a.close()
    b.close()


def test_a_device_publishes_only_its_own_predictions(secured) -> None:
    # Prepare: dev-a reads its predictions topic; dev-b tries to write and read it.
    broker, files = secured
    url = tls_url(broker)
    a = MqttProbe(url, "a-pred", **creds(files, "dev-a"))
    b = MqttProbe(url, "b-pred", **creds(files, "dev-b"))
    a.subscribe(predictions_topic("dev-a"))
    b.subscribe(predictions_topic("dev-a"))
    time.sleep(0.5)
    # Execute
    b.publish(predictions_topic("dev-a"), b"forged")  # denied: dropped by the broker
    a.publish(predictions_topic("dev-a"), b"{}")  # its own: allowed
    # Assert
    assert wait_until(lambda: len(a.messages) >= 1, 10)
    time.sleep(0.5)
    assert [m.payload for m in a.messages] == [b"{}"]
    assert b.messages == []
    a.close()
    b.close()


def cert_url(broker: MosquittoBroker) -> str:
    """The listener that authenticates clients by certificate."""
    return f"mqtts://127.0.0.1:{broker.ports[2]}"


def cert(files: Path, user: str) -> dict[str, str]:
    clients = files / "certs" / "clients"
    return {
        "certfile": str(clients / f"{user}.crt"),
        "keyfile": str(clients / f"{user}.key"),
        "cafile": str(files / "certs" / "ca.crt"),
    }


def test_only_devices_that_opted_in_use_the_injection_topic(secured) -> None:
    # Prepare: dev-a opted in (FEDSTREAM_INJECT), dev-b did not; both listen on the topic.
    broker, files = secured
    url = tls_url(broker)
    a = MqttProbe(url, "a-inj", **creds(files, "dev-a"))
    b = MqttProbe(url, "b-inj", **creds(files, "dev-b"))
    agg = MqttProbe(url, "agg-inj", **creds(files, "aggregator"))
    a.subscribe(INJECT_TOPIC)
    b.subscribe(INJECT_TOPIC)
    time.sleep(0.5)
    # Execute
    b.publish(INJECT_TOPIC, b"from-b")  # denied: dropped by the broker
    agg.publish(INJECT_TOPIC, b"from-aggregator")
    # Assert: dev-a gets what is shared; dev-b may neither share nor read.
    assert wait_until(lambda: len(a.messages) >= 1, 10)
    time.sleep(0.5)
    assert [m.payload for m in a.messages] == [b"from-aggregator"]
    assert b.messages == []
    for probe in (a, b, agg):
        probe.close()


def test_a_sensor_credential_publishes_its_devices_samples_and_nothing_else(secured) -> None:
    # Prepare: dev-a and dev-b listen on their samples; dev-a on its status too.
    broker, files = secured
    url = tls_url(broker)
    a = MqttProbe(url, "a-s", **creds(files, "dev-a"))
    b = MqttProbe(url, "b-s", **creds(files, "dev-b"))
    sensor = MqttProbe(url, "sensor-a", **creds(files, "sensor.dev-a"))
    a.subscribe(samples_topic("dev-a"))
    a.subscribe(status_topic("dev-a"))
    b.subscribe(samples_topic("dev-b"))
    sensor.subscribe(samples_topic("dev-a"))  # not allowed to read: gets nothing
    time.sleep(0.5)
    # Execute
    sensor.publish(samples_topic("dev-b"), b"wrong device")
    sensor.publish(status_topic("dev-a"), b"forged status")
    sensor.publish(samples_topic("dev-a"), b"reading")
    # Assert
    assert wait_until(lambda: len(a.messages) >= 1, 10)
    time.sleep(0.5)
    assert [m.payload for m in a.messages] == [b"reading"]
    assert b.messages == [] and sensor.messages == []
    for probe in (a, b, sensor):
        probe.close()


def test_a_device_logs_in_with_its_client_certificate(secured, tmp_path: Path) -> None:
    # Prepare: the listener that requires a client certificate (its CN is the username).
    broker, files = secured
    url = cert_url(broker)
    buf = tmp_path / "dev-a.sqlite"
    with ProcessGroup() as procs:
        # Execute: ingest and a publisher with certificates, no password.
        start_ingest(procs, url, buf, "dev-a", *_flags(cert(files, "dev-a")), connected=True)
        published = subprocess.run(
            fedstream_command(
                "publish", "--broker", url, "--device-id", "dev-a", "--count", "100",
                "--rate", "1000", "--batch", "10", *_flags(cert(files, "sensor.dev-a")),
            ),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        # ... and one without a certificate, with dev-b's valid password.
        anonymous = _ingest_once(url, tmp_path, *_flags(creds(files, "dev-b")))
        # Assert: the certified ones are in, as their CNs (the ACL held: the sensor wrote).
        assert published.returncode == 0, published.stderr
        assert wait_until(lambda: stats(buf)["accepted"] == 100, 20)
    assert anonymous.returncode == 1
    assert "error: could not connect" in anonymous.stderr.strip().splitlines()[-1]


def _flags(options: dict[str, str]) -> list[str]:
    return [arg for key, value in options.items() for arg in (f"--{key}", value)]


def test_the_ca_key_stays_away_from_the_broker_and_adding_a_device_keeps_the_others(
    tmp_path: Path,
) -> None:
    # Prepare: the broker's folder, as the guide makes it (devices dial an IP address)
    files = tmp_path / "fedstream"
    script = ["bash", str(BROKER_CONFIG_DIR / "make-dev-certs.sh"), str(files)]
    env = {**os.environ, "FEDSTREAM_BROKER_HOST": "192.0.2.10"}
    subprocess.run([*script, "dev-a"], check=True, capture_output=True, timeout=120, env=env)
    password = (files / "credentials" / "dev-a.txt").read_text()
    # Execute: run again with one device more; then with the CA asked inside the folder
    subprocess.run(
        [*script, "dev-a", "dev-b"], check=True, capture_output=True, timeout=120, env=env
    )
    inside = subprocess.run(
        [*script, "dev-a"], capture_output=True, text=True, timeout=120,
        env={**env, "FEDSTREAM_CA_DIR": str(files / "ca")},
    )  # fmt: skip
    # Assert: no CA key among the broker's files; it is in the folder beside, the caller's
    # only; the first device kept its password; both devices' certificates are the CA's;
    # the server certificate names the address
    assert not [p for p in files.rglob("ca.*") if p.name != "ca.crt"]
    ca_dir = tmp_path / "fedstream-ca"
    assert (ca_dir / "ca.key").exists() and (ca_dir.stat().st_mode & 0o777) == 0o700
    assert (files / "credentials" / "dev-a.txt").read_text() == password
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(files / "certs" / "ca.crt"),
         *(str(files / "certs" / "clients" / f"{d}.crt") for d in ("dev-a", "dev-b"))],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    san = subprocess.run(
        ["openssl", "x509", "-in", str(files / "certs" / "server.crt"), "-noout", "-ext",
         "subjectAltName"], capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    assert "IP Address:192.0.2.10" in san
    assert inside.returncode == 1 and "the broker's user would own the CA key" in inside.stderr
    assert not (files / "ca").exists()


def test_the_bound_on_queued_bytes_drops_what_exceeds_it(tmp_path: Path) -> None:
    # Prepare: the production config as written, its per-client bound on queued bytes
    # shrunk from 64 MiB to 64 KiB (one directive changed; the rest as deployed).
    files = tmp_path / "files"
    subprocess.run(
        ["bash", str(BROKER_CONFIG_DIR / "make-dev-certs.sh"), str(files), "dev-a"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    text = (BROKER_CONFIG_DIR / "mosquitto-prod.conf").read_text()
    assert "\nmax_queued_bytes 67108864\n" in text
    config = tmp_path / "small-queue.conf"
    config.write_text(text.replace("max_queued_bytes 67108864", "max_queued_bytes 65536"))
    with MosquittoBroker(config, files_dir=files) as broker:
        url = tls_url(broker)
        away = MqttProbe(url, "away", session_expiry=3600, **creds(files, "dev-a"))
        away.subscribe(samples_topic("dev-a"))
        time.sleep(0.5)
        away.close()  # its session (and the subscription) stays, queueing
        sender = MqttProbe(url, "sender", **creds(files, "sensor.dev-a"))
        assert sender.wait_connected()
        # Execute: 40 messages of 4 KiB (160 KiB) while it is away, then it comes back.
        for i in range(40):
            sender.publish(samples_topic("dev-a"), bytes([i]) * 4096)
        back = MqttProbe(url, "away", session_expiry=3600, **creds(files, "dev-a"))
        time.sleep(2.0)
        # Assert: what fit in the bound was queued, the rest dropped.
        received = len(back.messages)
        assert 8 <= received <= 17, received
        sender.close()
        back.close()


def test_ingest_and_publisher_over_tls_with_credentials(secured, tmp_path: Path) -> None:
    broker, files = secured
    url = tls_url(broker)
    c = creds(files, "dev-a")
    auth = ["--username", "dev-a", "--password", c["password"], "--cafile", c["cafile"]]
    buf = tmp_path / "dev-a.sqlite"
    with ProcessGroup() as procs:
        start_ingest(procs, url, buf, "dev-a", *auth)
        out = subprocess.run(
            fedstream_command(
                "publish",
                "--broker",
                url,
                "--device-id",
                "dev-a",
                "--count",
                "500",
                "--rate",
                "1000",
                "--batch",
                "5",
                "--json",
                *auth,
            ),
            capture_output=True,
            check=True,
            timeout=120,
        ).stdout
        assert json.loads(out.decode().splitlines()[-1])["acknowledged"] == 100
        assert wait_until(lambda: stats(buf)["accepted"] >= 500, 20)
        assert procs.stop("ingest") == 0
    assert stats(buf)["accepted"] == 500


def _ingest_once(url: str, tmp_path: Path, *auth: str) -> subprocess.CompletedProcess[str]:
    """``fedstream ingest`` with 3 s to make its first connection."""
    return subprocess.run(
        fedstream_command(
            "ingest", "--device-id", "dev-a", "--buffer", str(tmp_path / "a.sqlite"),
            "--broker", url, "--connect-timeout", "3", *auth,
        ),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _exits_with_reason(proc: subprocess.CompletedProcess[str], reason: str) -> None:
    """Exit 1; the reason logged at each attempt and in the one line it exits with."""
    assert proc.returncode == 1, proc.stderr
    assert "WARNING" in proc.stderr or "ERROR" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: could not connect") and reason in last, proc.stderr


@pytest.mark.parametrize(
    ("password", "cafile", "reason"),
    [
        (None, "/etc/ssl/certs/ca-certificates.crt", "certificate failed verification"),
        ("wrong", None, "the broker refused the connection: Not authorized"),
    ],
)
def test_ingest_says_why_a_tls_broker_will_not_have_it(
    secured, tmp_path: Path, password: str | None, cafile: str | None, reason: str
) -> None:
    # Prepare: the production broker; one thing wrong at a time (another CA, a bad password).
    broker, files = secured
    c = creds(files, "dev-a")
    auth = ["--username", "dev-a", "--password", password or c["password"]]
    # Execute
    proc = _ingest_once(tls_url(broker), tmp_path, *auth, "--cafile", cafile or c["cafile"])
    # Assert
    _exits_with_reason(proc, reason)


def test_ingest_names_the_host_a_tls_certificate_does_not_cover(tmp_path: Path) -> None:
    # Prepare: a TLS listener on 127.0.0.1 whose certificate, from its own CA, names only
    # broker.example (what a device dialling the broker by IP meets).
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=t CA",
            "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=broker.example",
            "-keyout", "s.key", "-out", "s.csr")  # fmt: skip
    (tmp_path / "san.ext").write_text("subjectAltName=DNS:broker.example\n")
    openssl("x509", "-req", "-in", "s.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "s.crt")  # fmt: skip
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tmp_path / "s.crt", tmp_path / "s.key")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with contextlib.suppress(OSError), server.wrap_socket(conn, server_side=True):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        # Execute
        proc = _ingest_once(
            f"mqtts://127.0.0.1:{port}", tmp_path, "--cafile", str(tmp_path / "ca.crt")
        )
    finally:
        stop.set()
        thread.join(5)
        listener.close()
    # Assert
    _exits_with_reason(proc, "certificate is not valid for '127.0.0.1'")


DEBIAN_MAIN_CONFIG = Path("/etc/mosquitto/mosquitto.conf")


@pytest.mark.skipif(not DEBIAN_MAIN_CONFIG.exists(), reason="not Debian's Mosquitto package")
def test_the_snippet_starts_on_debians_stock_config_and_logs_what_an_operator_reads(
    tmp_path: Path,
) -> None:
    # Prepare: Debian's own mosquitto.conf, with its host paths moved into tmp_path, and our
    # snippet in its conf.d, as the deployment docs install it.
    files = tmp_path / "files"
    subprocess.run(
        ["bash", str(BROKER_CONFIG_DIR / "make-dev-certs.sh"), str(files), "dev-a"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    confd, data, log = tmp_path / "conf.d", tmp_path / "data", tmp_path / "mosquitto.log"
    confd.mkdir()
    data.mkdir()
    main = DEBIAN_MAIN_CONFIG.read_text()
    assert "include_dir /etc/mosquitto/conf.d" in main and "persistence_location" in main
    main = re.sub(r"(?m)^pid_file .*$", "", main)
    main = re.sub(r"(?m)^persistence_location .*$", f"persistence_location {data}/", main)
    main = re.sub(r"(?m)^log_dest .*$", f"log_dest file {log}", main)
    main = main.replace("/etc/mosquitto/conf.d", str(confd))
    ports: list[int] = []

    def port(_match: re.Match[str]) -> str:
        ports.append(free_port())
        return f"listener {ports[-1]} 127.0.0.1"

    snippet = (BROKER_CONFIG_DIR / "mosquitto-prod.conf").read_text()
    snippet = snippet.replace("/etc/mosquitto/fedstream", str(files))
    snippet = re.sub(r"(?m)^listener[ \t]+\d+([ \t]+\S+)?", port, snippet)
    if os.geteuid() == 0:  # as root it would drop to user mosquitto, who cannot read tmp_path
        snippet = "user root\n" + snippet
    (confd / "fedstream.conf").write_text(snippet)
    (tmp_path / "mosquitto.conf").write_text(main)
    with ProcessGroup() as procs:
        # Execute: it starts, a device connects over TLS and leaves; autosaves go by.
        procs.start("mosquitto", ["mosquitto", "-c", str(tmp_path / "mosquitto.conf")])
        assert all(wait_for_port(p) for p in ports), log.read_text() if log.exists() else ""
        device = MqttProbe(f"mqtts://127.0.0.1:{ports[0]}", "dev-a-probe", **creds(files, "dev-a"))
        assert device.wait_connected()
        device.close()
        time.sleep(3.0)  # autosave_interval 1: a save every second or two
        procs.stop("mosquitto")
    # Assert: the device's comings and goings are logged, the autosaves are not.
    text = log.read_text()
    assert "New client connected" in text and "dev-a" in text and "disconnected" in text
    assert "Saving in-memory database" not in text
    assert (data / "mosquitto.db").exists()  # persistence where Debian's config puts it
