"""The ``fedstream`` command line as a user runs it."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import Result
from typer.testing import CliRunner

from deploy.cli import app as cli_app
from deploy.local import ProcessGroup, fedstream_command, free_port, wait_for_port, wait_until
from deploy.probes import MqttProbe
from tests.helpers import run_command


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_command(fedstream_command(*args), timeout=timeout)


def invoke(*args: str) -> Result:
    """The command in this process, for refusals: a process each would cost seconds of
    imports (the real processes are run where the test is about them)."""
    return CliRunner().invoke(cli_app, list(args))


def test_demo_streams_and_shuts_everything_down(tmp_path: Path) -> None:
    # Execute: the main job, small.
    proc = run(
        "demo",
        "--stream-only",
        "--devices",
        "2",
        "--duration",
        "4",
        "--rates",
        "100,400",
        "--capacity",
        "500",
        "--out",
        str(tmp_path),
        "--no-live",
        timeout=180,
    )
    # Assert
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (summary_path,) = tmp_path.glob("stream-*/summary.json")
    summary = json.loads(summary_path.read_text())
    devices = summary["devices"]
    assert set(devices) == {"dev-0", "dev-1"}
    for dev in devices.values():
        assert dev["exactly-once"] and dev["ingest-exit-code"] == 0
        assert dev["received"] == dev["published"] > 0
    fast = devices["dev-1"]
    assert fast["fill"] == 500 and fast["dropped"] == fast["published"] - 500  # truncation
    assert "exactly once" in proc.stdout


def test_status_reports_a_missing_buffer_clearly(tmp_path: Path) -> None:
    proc = run("status", "--buffer", str(tmp_path / "nope.sqlite"), "--json")
    assert proc.returncode == 2
    assert "no buffer" in proc.stderr


def test_status_on_a_directory_and_version_answer_in_one_line(tmp_path: Path) -> None:
    on_dir = run("status", "--buffer", str(tmp_path))
    version = run("--version")
    assert on_dir.returncode == 2 and "is a directory" in on_dir.stderr
    assert len(on_dir.stderr.strip().splitlines()) == 1 and "Traceback" not in on_dir.stderr
    assert version.returncode == 0 and version.stdout.startswith("fedstream 0.")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "10", "--rate-set", "S1"], "exactly one of --rate"),
        (["--rate", "10", "--count", "5", "--duration", "1"], "at most one of count and"),
        (["--rate", "-1", "--count", "5"], "rate must be > 0"),
        (["--rate", "10", "--count", "5", "--classes", "9"], "labels must be classes"),
        (["--rate", "10", "--count", "5", "--labels", "9"], "classes per device"),
        (["--rate", "10", "--labels", "1", "--classes", "0"], "not both"),
        (["--rate", "10", "--count", "5", "--source", "missing.npz"], "no such file"),
    ],
)
def test_publish_refuses_bad_options(args: list[str], message: str) -> None:
    result = invoke("publish", "--device-id", "d", *args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_infer_gives_up_with_the_reason_after_its_connect_timeout(tmp_path: Path) -> None:
    proc = run(
        "infer", "--device-id", "dev-a", "--model", str(tmp_path), "--drift", "none",
        "--broker", "mqtt://127.0.0.1:1", "--connect-timeout", "3",
    )  # fmt: skip
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1, proc.stderr
    assert last.startswith("error: could not connect") and "refused: nothing accepts" in last


def test_infer_refuses_bad_options_in_one_line(tmp_path: Path) -> None:
    # One process (each costs seconds here); the other checks are InferConfig's unit tests.
    proc = run("infer", "--device-id", "dev-a", "--model", str(tmp_path), "--drift", "kswin")
    assert proc.returncode == 2
    assert "drift must be one of" in " ".join(proc.stderr.split())


def test_models_lists_versions_and_refuses_a_missing_directory(tmp_path: Path) -> None:
    # Prepare: one exported version.
    from edge_client.runtime.model_store import store_model
    from edge_client.task.interface import Classification, init_model
    from edge_client.wire.run_config import RunSettings

    settings, task = RunSettings(model_width=8), Classification(width=8)
    model = init_model(task, settings.shape, settings.num_classes, 0)
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    store_model(tmp_path / "m", task, settings, weights, 7, "dev-a", None)
    # Execute
    listed = run("models", str(tmp_path / "m"), "--json")
    missing = run("models", str(tmp_path / "nope"))
    # Assert
    assert listed.returncode == 0
    (entry,) = json.loads(listed.stdout)
    assert (entry["version"], entry["output"], entry["sample-shape"]) == (
        7,
        "probabilities",
        [6, 32],
    )
    assert missing.returncode == 2 and "not a directory" in " ".join(missing.stderr.split())


def test_publish_refuses_a_recording_the_device_would_refuse(tmp_path: Path) -> None:
    # Prepare: rows of 5 values where the device declares 6 x 32; labels up to 7 of 6.
    wide = tmp_path / "wide.csv"
    wide.write_text("label,a,b,c,d,e\n" + "1,0.1,0.2,0.3,0.4,0.5\n" * 3)
    labels = tmp_path / "labels.csv"
    labels.write_text("\n".join(f"{k}," + ",".join(["0.5"] * 192) for k in (0, 7)) + "\n")
    common = ["--device-id", "d", "--broker", "mqtt://127.0.0.1:1", "--rate", "10", "--count", "3"]
    # Execute
    shape = run("publish", *common, "--source", str(wide))
    label = run("publish", *common, "--source", str(labels))
    # Assert: refused before connecting, in one line each.
    assert shape.returncode == 2 and "but --shape is (6, 32)" in shape.stderr
    assert label.returncode == 2 and "labels up to 7, but --num-classes is 6" in label.stderr


def test_publish_fails_clearly_without_a_broker() -> None:
    proc = run(
        "publish",
        "--device-id",
        "d",
        "--broker",
        "mqtt://127.0.0.1:1",
        "--rate",
        "10",
        "--count",
        "5",
        "--connect-timeout",
        "2",
    )
    assert proc.returncode == 2 and "could not connect" in proc.stderr
    assert "refused: nothing accepts connections at 127.0.0.1:1" in proc.stderr


@pytest.mark.parametrize(
    ("broker", "reason"),
    [
        ("mqtt://127.0.0.1:1", "refused: nothing accepts connections at 127.0.0.1:1"),
        ("mqtt://no-such-host.invalid:1883", "DNS: cannot resolve 'no-such-host.invalid'"),
    ],
)
def test_ingest_says_why_it_cannot_connect_and_gives_up_after_its_timeout(
    tmp_path: Path, broker: str, reason: str
) -> None:
    # Execute: a broker that is not there; 3 s to connect.
    proc = run(
        "ingest", "--device-id", "d", "--buffer", str(tmp_path / "d.sqlite"),
        "--broker", broker, "--connect-timeout", "3",
    )  # fmt: skip
    # Assert: each failed attempt logged with its reason, then one line and exit 1.
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count(f"cannot connect to {broker}: {reason}") >= 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: could not connect") and reason in last


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--devices", "2", "--rates", "1,2,3"], "--rates needs 2"),
        (["--compress", "zip"], "compress must be one of"),
        (["--compress-ratio", "0"], "compress-ratio must be in (0, 1]"),
        (["--labels", "9"], "--labels must be"),
        (["--labels", "1", "--dirichlet", "0.1"], "not both"),
        (["--inject-alpha", "1.5"], "inject-alpha must be in [0, 1]"),
        (["--run-config", "num-rounds=0"], "num-rounds must be >= 1"),
        (["--run-config", "round-timout=5"], "unknown keys ['round-timout']"),
        (["--run-config", "lr=fast"], "--run-config"),
        (["--rounds", "3", "--kill-aggregator", "3"], "--kill-aggregator must be in 1..2"),
        (["--kill-broker", "1"], "--kill-broker needs the demo's Mosquitto"),
        (["--secure", "--broker", "mqtt://127.0.0.1:1883"], "drop --broker"),
    ],
)
def test_demo_refuses_bad_options(tmp_path: Path, args: list[str], message: str) -> None:
    result = invoke("demo", *args, "--out", str(tmp_path))
    assert result.exit_code == 2 and message in " ".join(result.output.split())  # rich wraps
    assert not list(tmp_path.iterdir())  # nothing was started


def test_bench_refuses_an_unknown_scenario() -> None:
    proc = run("bench", "nosuch")
    assert proc.returncode == 2 and "nosuch" in proc.stderr


def test_broker_command_serves_mqtt_quietly_and_reports_a_taken_port(
    procs: ProcessGroup, tmp_path: Path
) -> None:
    # Prepare
    port = free_port()
    log = tmp_path / "broker.log"
    procs.start("broker", fedstream_command("broker", "--port", str(port)), log_path=log)
    assert wait_for_port(port)
    url = f"mqtt://127.0.0.1:{port}"
    sub = MqttProbe(url, "sub", mqtt_version="3.1.1")  # what the broker says it speaks
    sub.subscribe("fedstream/v1/x/samples")
    pub = MqttProbe(url, "pub", mqtt_version="3.1.1")
    assert pub.wait_connected()
    time.sleep(0.3)
    # Execute
    for _ in range(20):
        pub.publish("fedstream/v1/x/samples", b"hello")
    taken = run("broker", "--port", str(port))
    # Assert: delivered; rumqttd's per-packet tracing (ERROR records by its own levels) is
    # not in the log at the default level: only the start lines are.
    assert wait_until(lambda: [m.payload for m in sub.messages] == [b"hello"] * 20, 10)
    assert taken.returncode == 2 and "cannot listen" in taken.stderr
    lines = log.read_text().splitlines()
    assert "ERROR" not in log.read_text() and len(lines) <= 3, lines[:10]
    assert "MQTT 3.1.1 only" in log.read_text() and "--mqtt-version 3.1.1" in log.read_text()
    sub.close()
    pub.close()


def test_publisher_stops_cleanly_on_sigterm(broker: Any, procs: ProcessGroup) -> None:
    # Neither --count nor --duration: it streams until stopped, as a sensor does.
    pub = procs.start(
        "pub",
        fedstream_command(
            "publish",
            "--broker",
            broker.url,
            "--device-id",
            "d",
            "--rate",
            "100",
            "--json",
        ),
        stdout_pipe=True,
    )
    time.sleep(2.0)
    pub.send_signal(signal.SIGTERM)
    out, _ = pub.communicate(timeout=30)
    report = json.loads(out.decode().splitlines()[-1])
    assert pub.returncode == 0 and 0 < report["samples"] < 6000
    assert report["acknowledged"] == report["messages"]


def test_publish_shows_its_progress_on_a_long_run(broker: Any) -> None:
    # Execute: 2 s of stream, a progress line every 0.5 s.
    proc = run(
        "publish", "--broker", broker.url, "--device-id", "d", "--rate", "300", "--count", "600",
        "--progress-interval", "0.5",
    )  # fmt: skip
    # Assert: lines with what was sent so far, rising, then the report.
    lines = [x for x in proc.stderr.splitlines() if x.startswith("sent ")]
    assert proc.returncode == 0 and len(lines) >= 2, proc.stderr
    sent = [int(x.split()[1]) for x in lines]
    assert sent == sorted(sent) and 0 < sent[0] < 600
    assert all(" of 600 samples (" in x and "messages acknowledged" in x for x in lines)
    assert "published 600 samples" in proc.stderr


def test_resume_explains_a_missing_or_old_checkpoint(tmp_path: Path) -> None:
    # Prepare: no checkpoint at all, and one written before checkpoints kept the run config.
    old = tmp_path / "old"
    old.mkdir()
    (old / "state.json").write_text(
        json.dumps({"server-round": 2, "model": "m.pt", "controller": {}})
    )
    torch.save({"w": torch.zeros(1)}, old / "m.pt")
    # Execute
    missing = run("resume", str(tmp_path / "none"))
    stale = run("resume", str(old))
    # Assert
    assert missing.returncode == 2 and "no checkpoint in" in missing.stderr
    assert stale.returncode == 2 and "does not record its run config" in " ".join(
        stale.stderr.split()
    )


def test_resume_outside_a_checkout_asks_for_the_app_and_app_writes_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a checkpoint with its run config, and a working folder without a Flower app.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "state.json").write_text(
        json.dumps({"server-round": 2, "model": "m.pt", "controller": {}, "run-config": {}})
    )
    monkeypatch.chdir(tmp_path)
    # Execute
    resumed = invoke("resume", str(ckpt), "--connection", "nowhere")
    written = invoke("app", str(tmp_path / "app"))
    # Assert: the refusal says where an app is; `fedstream app` writes fedstream's own.
    assert resumed.exit_code == 2 and "no Flower app in" in resumed.output
    assert "--app DIR" in " ".join(resumed.output.split())
    app = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    assert written.exit_code == 0
    assert app["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "aggregator.server_app:app",
        "clientapp": "edge_client.flower_app:app",
    }
    assert app["tool"]["flwr"]["app"]["config"]["num-rounds"] == 10


def test_run_config_lists_the_keys_as_pyproject_declares_them() -> None:
    # Execute
    table = run("run-config")
    block = run("run-config", "--toml")
    # Assert: the TOML block is the app's config, and the table names every key
    assert table.returncode == 0 and block.returncode == 0
    printed = tomllib.loads(block.stdout)["tool"]["flwr"]["app"]["config"]
    pyproject = tomllib.loads(Path("pyproject.toml").read_text())
    assert printed == pyproject["tool"]["flwr"]["app"]["config"]
    assert all(key in table.stdout for key in printed)
