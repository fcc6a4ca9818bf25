"""A user's own Flower app (``examples/activity-app``: its own task and model, built on
fedstream's app factories) run through ``flwr run`` on a real SuperLink and SuperNodes, each
device's agent taking its SuperNode's tasks (as fedstream's own app; no process per
message), its updates securely aggregated."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from aggregator.round_log import HOME_ENV, METRICS_FILE, read_metrics, rounds_only
from deploy.agents import agent_sockets, start_devices
from deploy.flower import FlowerDeployment
from deploy.local import ProcessGroup, fedstream_command, free_port, wait_until
from deploy.probes import scrape_metrics
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.node_config import NodeConfig
from edge_client.task.synthetic import SensorTask
from edge_client.wire.frames import SampleBatch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "activity-app"


def _scrape_round(port: int, into: dict[str, float]) -> float:
    """The ServerApp's ``fedstream_round`` (-1 while nothing answers); unlabelled samples
    go into ``into``."""
    try:
        samples = scrape_metrics(port, timeout=5)
    except OSError:
        return -1
    into.update({name: value for (name, labels), value in samples.items() if not labels})
    return into.get("fedstream_round", -1)


def fill_buffer(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """A device's buffer as its ingest daemon leaves it after the stream ran a while."""
    with BufferStore(path, shape=tuple(x.shape[1:])) as store:
        store.append([SampleBatch(x, y, np.full(len(y), time.time()))], rate=100.0)


@pytest.mark.timeout(300)  # a secure run of a user app to its end: 1-2 minutes
def test_a_user_app_trains_its_own_model_securely_aggregated_through_flwr_run(
    tmp_path: Path,
) -> None:
    # Prepare: the example's recording (two watches and a test file), as its README says.
    data = tmp_path / "data"
    subprocess.run(
        [sys.executable, "-m", "activity_app.record", str(data), "--windows", "2500"],
        cwd=EXAMPLE,
        check=True,
        capture_output=True,
    )
    buffers = {f"watch-{i}": tmp_path / f"watch-{i}.sqlite" for i in range(2)}
    for i, path in enumerate(buffers.values()):
        with np.load(data / f"watch-{i}.npz") as rec:
            fill_buffer(path, rec["x"], rec["y"])
    # ... and a third device whose sensors send 6 x 32 windows: not this app's 3 x 50.
    buffers["phone-0"] = tmp_path / "phone-0.sqlite"
    x, y = SensorTask((6, 32), 4).sample(2000, np.random.default_rng(0))
    fill_buffer(buffers["phone-0"], x, y)
    with agent_sockets() as sockets, ProcessGroup() as group:
        flower = FlowerDeployment(group, tmp_path / "flwr")
        flower.start_superlink()
        taking = start_devices(
            flower,
            buffers,
            # two watches: one neighbour each, which their owners allow (the README's way)
            lambda device, _: NodeConfig(
                device, str(buffers[device]), secagg_min_peers=1
            ).to_node_config(),
            sockets,
            tmp_path / "logs",
        )
        flower.wait_nodes(3)
        # Execute: the app's own out-dir ("": the default place), its Prometheus endpoint on,
        # its updates securely aggregated (SecAgg+: each stage a ClientApp process per device)
        port = free_port()
        run_id = flower.submit(
            EXAMPLE,
            {
                "num-rounds": 3,
                "min-nodes": 3,
                "secure-aggregation": True,
                "secagg-min-survivors": 2,
                "eval-data": str(data / "test.npz"),
                "prometheus-port": port,
                "prometheus-listen": "127.0.0.1",
            },
        )
        scraped: dict[str, float] = {}
        assert wait_until(lambda: _scrape_round(port, scraped) >= 1, 240)
        status = flower.wait_finished(run_id, timeout=300)
        logs = flower.logs(run_id)
    # Assert: the watches trained the app's model; the phone was left out, with its reason.
    assert status.get("status") == "finished:completed", logs[-3000:]
    # The deployed ServerApp served a committed round's figures while it ran (the phone
    # was refused: two devices trained).
    assert scraped["fedstream_round"] >= 1 and 0 <= scraped["fedstream_accuracy"] <= 1
    assert scraped["fedstream_round_devices"] == 2 and scraped["fedstream_bytes_up_total"] > 0
    assert scraped["fedstream_secagg_survivors"] == 2
    # Each round's progress reached `flwr log`, and the records their documented place.
    for n in (1, 2, 3):
        assert f"round {n}/3: accuracy" in logs, logs[-3000:]
    assert "MB up" in logs
    out = Path(flower.env[HOME_ENV]) / "runs" / run_id
    assert f"writes {out / METRICS_FILE}" in logs
    records = rounds_only(read_metrics(out / METRICS_FILE))
    assert [r.round for r in records] == [1, 2, 3]
    for record in records:
        assert record.aggregated == ["watch-0", "watch-1"]
        assert (record.secagg_survivors, record.secagg_dropped) == (2, 0)
        assert record.secagg_bytes_up > 0 and record.timing.secagg_s > 0
    assert records[-1].rejected == {"phone-0": 3}
    # Every message was trained in its device's agent, which took it from its SuperNode and
    # loaded the user's app from the run's bundle: no ClientApp process.
    assert taking
    replies = [m for r in records for m in r.devices.values()]
    assert replies and all(m.agent_cpu_s > 0 and m.cpu_s == 0 for m in replies)
    assert records[-1].rejected_reasons == {"shape-mismatch": 3}
    assert records[-1].test_accuracy > 0.6  # 4 activities: chance is 0.25
    assert records[-1].accuracy > 0.5  # prequential, on the watches' own windows
    assert records[-1].eval_count == sum(m.num_examples for m in records[-1].devices.values())
    # ... and `fedstream report` draws the deployed run from its default place.
    report = subprocess.run(
        fedstream_command("report", str(out)), capture_output=True, text=True, timeout=120
    )
    assert report.returncode == 0, report.stderr
    assert json.loads((out / "summary.json").read_text())["rounds"] == 3
    assert (out / "report.png").stat().st_size > 10_000
