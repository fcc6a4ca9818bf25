"""The production Mosquitto config: TLS, a password per device, a per-device ACL."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.brokers import BROKER_CONFIG_DIR, MosquittoBroker
from deploy.local import ProcessGroup, fedstream_command, wait_until
from deploy.probes import MqttProbe, start_ingest
from deploy.probes import buffer_stats as stats
from edge_client.wire.topics import predictions_topic, samples_topic

pytestmark = pytest.mark.mosquitto


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MosquittoBroker, Path]]:
    files = tmp_path_factory.mktemp("mosquitto-files")
    subprocess.run(
        ["bash", str(BROKER_CONFIG_DIR / "make-dev-certs.sh"), str(files), "dev-a", "dev-b"],
        check=True,
        capture_output=True,
        timeout=120,
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
