"""What operators watch: the fleet view, the Prometheus endpoints (scraped over HTTP and read
with prometheus_client's own parser), TensorBoard event files (read with TensorBoard's own
reader), and the Grafana dashboard's queries."""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aggregator.prometheus_sink import METRIC_NAMES as ROUND_METRICS
from aggregator.round_log import RoundRecord, rounds_only
from aggregator.server_app import run_rounds
from deploy.brokers import EmbeddedBroker, MosquittoBroker
from deploy.inprocess import InProcessGrid, VirtualDevice
from deploy.local import ProcessGroup, fedstream_command, free_port, wait_until
from deploy.probes import MetricSamples as Samples
from deploy.probes import MqttProbe, publish_report, scrape_metrics, start_ingest, start_publisher
from deploy.probes import buffer_stats as stats
from edge_client.runtime.status_metrics import METRIC_NAMES as DEVICE_METRICS
from edge_client.wire.run_config import RunSettings
from edge_client.wire.topics import status_topic

Broker = EmbeddedBroker | MosquittoBroker
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "fedstream.json"


def device_value(samples: Samples, name: str, device: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted({"device": device, **labels}.items()))))


def fleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        fedstream_command("fleet", *args), capture_output=True, text=True, timeout=60
    )


def test_ingest_serves_its_status_to_prometheus(
    broker: Broker, procs: ProcessGroup, tmp_path: Path, frames: Callable[..., bytes]
) -> None:
    # Prepare
    port = free_port()
    buf = tmp_path / "dev-a.sqlite"
    start_ingest(
        procs, broker.url, buf, "dev-a", "--metrics-port", str(port),
        "--metrics-listen", "127.0.0.1", connected=True,
    )  # fmt: skip
    # Execute: 400 good samples and one frame that is not one.
    publish_report(
        start_publisher(
            procs, broker.url, "dev-a", "--count", "400", "--batch", "8", "--rate", "2000"
        )
    )
    probe = MqttProbe(broker.url, "bad")
    assert probe.wait_connected()
    probe.publish("fedstream/v1/dev-a/samples", b"not a frame", qos=1)
    assert wait_until(lambda: stats(buf)["rejected"] == 1, 20)
    # Assert: the endpoint says what the buffer says (as of the daemon's next status).
    s = stats(buf)
    (reason,) = s["rejected-by-reason"]
    refused = "fedstream_device_samples_refused_total"
    assert wait_until(
        lambda: device_value(scrape_metrics(port), refused, "dev-a", reason=reason) == 1, 20
    )
    samples = scrape_metrics(port)
    assert device_value(samples, "fedstream_device_samples_accepted_total", "dev-a") == 400
    assert device_value(samples, "fedstream_device_online", "dev-a") == 1
    assert device_value(samples, "fedstream_device_buffer_fill", "dev-a") == s["fill"] == 400
    assert device_value(samples, "fedstream_device_buffer_capacity", "dev-a") == s["capacity"]
    assert device_value(samples, refused, "dev-a", reason=reason) == 1
    assert {name for name, _ in samples} <= set(DEVICE_METRICS)
    probe.close()


def test_fleet_shows_every_devices_retained_status_and_serves_it_to_prometheus(
    broker: Broker, procs: ProcessGroup, tmp_path: Path
) -> None:
    # Prepare: two devices stream; dev-b then goes away; a stray non-JSON status too.
    bufs = {d: tmp_path / f"{d}.sqlite" for d in ("dev-a", "dev-b")}
    for device, buf in bufs.items():
        start_ingest(procs, broker.url, buf, device, name=device, connected=True)
    for device, count in (("dev-a", "300"), ("dev-b", "100")):
        publish_report(
            start_publisher(procs, broker.url, device, "--count", count, "--rate", "1000")
        )
    assert wait_until(lambda: stats(bufs["dev-b"])["accepted"] == 100, 20)
    probe = MqttProbe(broker.url, "stray")
    assert probe.wait_connected()
    probe.publish(status_topic("dev-c"), b"\xff not json", qos=1, retain=True)
    hostile = {"ts": "yesterday", "rate": "fast", "rejected-by-reason": {"x": "many"}}
    probe.publish(status_topic("dev-d"), json.dumps(hostile).encode(), qos=1, retain=True)
    watcher = MqttProbe(broker.url, "watcher")
    watcher.subscribe(status_topic("dev-a"))
    assert wait_until(lambda: watcher.last_json().get("accepted") == 300, 20)
    assert procs.stop("dev-b") == 0
    port = free_port()
    # Execute
    table = fleet("--broker", broker.url)
    listed = fleet("--broker", broker.url, "--json")
    served = procs.start(
        "fleet",
        fedstream_command(
            "fleet", "--broker", broker.url, "--prometheus-port", str(port),
            "--metrics-listen", "127.0.0.1",
        ),
        log_path=tmp_path / "fleet.log",
    )  # fmt: skip
    watching = procs.start(
        "watch",
        fedstream_command(
            "fleet", "--broker", broker.url, "--watch", "--json", "--interval", "0.3"
        ),
        stdout_pipe=True,
    )
    assert wait_until(lambda: _scrapes(port), 30), (tmp_path / "fleet.log").read_text()
    samples = scrape_metrics(port)
    time.sleep(1.5)
    watching.send_signal(signal.SIGTERM)
    watched, _ = watching.communicate(timeout=30)
    # Assert: one row per device, the stopped one offline with its last counters.
    assert table.returncode == 0 and listed.returncode == 0, table.stderr + listed.stderr
    assert "dev-a" in table.stdout and "dev-b" in table.stdout
    # off a terminal (captured here) every header is whole, not cut to fit 80 columns
    for header in ("device", "online", "rate/s", "dropped", "refused", "missing", "drift"):
        assert f" {header} " in table.stdout.replace("\n", " "), table.stdout
    rows = {row["device"]: row for row in json.loads(listed.stdout)}
    assert set(rows) == {"dev-a", "dev-b", "dev-d"}  # dev-c's status was not JSON: ignored
    # dev-d's values are not numbers: unknown, not a crash
    assert (rows["dev-d"]["rate"], rows["dev-d"]["last-seen-s"]) == (None, None)
    assert rows["dev-d"]["refused-by-reason"] == {} and not rows["dev-d"]["online"]
    del rows["dev-d"]
    assert rows["dev-a"]["online"] and rows["dev-a"]["accepted"] == 300
    assert not rows["dev-b"]["online"] and rows["dev-b"]["accepted"] == 100
    assert rows["dev-a"]["last-seen-s"] < 30 and rows["dev-a"]["refused"] == 0
    online = {d: device_value(samples, "fedstream_device_online", d) for d in rows}
    assert online == {"dev-a": 1, "dev-b": 0}
    assert device_value(samples, "fedstream_device_samples_accepted_total", "dev-b") == 100
    assert served.poll() is None
    # --watch --json: a line per refresh, until SIGTERM (exit 0).
    views = [json.loads(line) for line in watched.decode().splitlines()]
    assert watching.returncode == 0 and len(views) >= 2
    assert all({row["device"] for row in view} == {"dev-a", "dev-b", "dev-d"} for view in views)
    probe.close()
    watcher.close()


def _scrapes(port: int) -> bool:
    try:
        return bool(scrape_metrics(port))
    except OSError:
        return False


def test_fleet_says_why_it_cannot_reach_the_broker() -> None:
    # Execute: nothing listens there.
    proc = fleet("--broker", f"mqtt://127.0.0.1:{free_port()}", "--connect-timeout", "2")
    # Assert: each attempt's reason is logged, and the exit says it in one last line.
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: could not connect") and "refused" in last
    assert "Traceback" not in proc.stderr


def _run(
    tmp: Path, settings: RunSettings, stop: Callable[[RoundRecord], bool] | None = None
) -> list[RoundRecord]:
    devices = [VirtualDevice(f"dev-{i}", slowdown=s) for i, s in enumerate((1, 2))]
    grid = InProcessGrid(devices, tmp, settings)
    try:
        return rounds_only(run_rounds(grid, settings, stop))
    finally:
        grid.close()


def test_the_aggregator_serves_each_rounds_figures_to_prometheus(
    tmp_path: Path, fast: Callable[..., RunSettings]
) -> None:
    # Prepare
    port = free_port()
    settings = fast(num_rounds=3, prometheus_port=port, prometheus_listen="127.0.0.1")
    scraped: list[Samples] = []

    def scrape_after(record: RoundRecord) -> bool:
        scraped.append(scrape_metrics(port))
        return False

    # Execute: scraped after each round but the last is committed, while the run goes on.
    records = _run(tmp_path, settings, scrape_after)
    # Assert
    assert len(scraped) == 2
    for record, samples in zip(records[:2], scraped, strict=True):
        assert samples[("fedstream_round", ())] == record.round
        assert samples[("fedstream_accuracy", ())] == pytest.approx(record.accuracy)
        assert samples[("fedstream_round_devices", ())] == 2
        for device, m in record.devices.items():
            assert device_value(samples, "fedstream_device_batch_size", device) == m.batch_size
            compute = device_value(samples, "fedstream_device_compute_seconds", device)
            assert compute == pytest.approx(m.compute_s)
    total = scraped[-1][("fedstream_bytes_up_total", ())]
    assert total == sum(r.bytes_up for r in records[:2]) > 0
    exported = {name.removesuffix("_created") for name, _ in scraped[-1]}  # counters' start
    assert exported <= set(ROUND_METRICS) | {"fedstream_bytes_up", "fedstream_rounds_skipped"}
    with pytest.raises(OSError):  # the run closed its endpoint
        scrape_metrics(port)


def test_each_round_goes_to_tensorboard(tmp_path: Path, fast: Callable[..., RunSettings]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # Prepare
    logdir = tmp_path / "tb"
    # Execute
    records = _run(tmp_path, fast(num_rounds=3, tensorboard_dir=str(logdir)))
    events = EventAccumulator(str(logdir))
    events.Reload()
    # Assert: read back with TensorBoard's own reader, one point a round.
    accuracy = events.Scalars("accuracy")
    assert [e.step for e in accuracy] == [1, 2, 3]
    assert [e.value for e in accuracy] == pytest.approx([r.accuracy for r in records])
    assert [e.value for e in events.Scalars("test-accuracy")] == pytest.approx(
        [r.test_accuracy for r in records]
    )
    batches = events.Scalars("device/dev-1/batch-size")
    assert [e.value for e in batches] == [r.devices["dev-1"].batch_size for r in records]


def test_each_round_goes_to_mlflow(tmp_path: Path, fast: Callable[..., RunSettings]) -> None:
    # MLflow is not in the dev extra (its pins clash with flwr's); where it is installed:
    mlflow_client = pytest.importorskip("mlflow.tracking", reason="MLflow is not installed")
    # Prepare: a SQLite tracking store (MLflow's file store is deprecated).
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # Execute
    records = _run(tmp_path, fast(num_rounds=2, mlflow_uri=uri, mlflow_experiment="t"))
    # Assert: one finished MLflow run, the run config as parameters, a point a round.
    client = mlflow_client.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["num-rounds"] == "2"
    history = client.get_metric_history(run.info.run_id, "accuracy")
    assert [m.value for m in history] == pytest.approx([r.accuracy for r in records])


def test_a_sink_whose_library_is_missing_is_refused_before_the_run(
    tmp_path: Path, fast: Callable[..., RunSettings]
) -> None:
    if importlib.util.find_spec("mlflow") is not None:
        pytest.skip("MLflow is installed here: nothing is missing")
    # Execute / Assert: the message says what to install; no round ran.
    with pytest.raises(ValueError, match="pip install mlflow"):
        _run(tmp_path, fast(num_rounds=1, mlflow_uri=str(tmp_path / "mlruns")))


def test_the_grafana_dashboard_queries_only_metrics_fedstream_exports() -> None:
    # Prepare
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    # Assert
    used = {name for expr in exprs for name in re.findall(r"\bfedstream_[a-z_]+", expr)}
    assert exprs and used
    assert used <= set(DEVICE_METRICS) | set(ROUND_METRICS)
    # every metric but the per-device ones the aggregator reuses is on the dashboard
    assert {"fedstream_device_online", "fedstream_round", "fedstream_accuracy"} <= used
