"""Fault injection for the reliability report: broker, disk and aggregator, real processes.

- ``broker_crash``: Mosquitto (production config: TLS, passwords, ACL, persistence saved every
  second) is SIGKILLed while 2 publishers stream into 2 ingest daemons, and is back
  ``OUTAGE_S`` later; then, with one daemon down, Mosquitto is restarted cleanly (SIGTERM)
  while it holds that daemon's queued messages. Every acknowledged sample must be accepted.
- ``disk_full``: the disk under a daemon's buffer (a small tmpfs; needs root to mount) is
  filled by a ballast file for ``DISK_FULL_S`` and then freed.
- ``aggregator_kill``: ``fedstream demo --mosquitto --kill-broker 1 --kill-aggregator 2``
  (SuperLink and ServerApp SIGKILLed after round 2, the run resumed from its checkpoint), and
  on the in-process runner the resumed run's final model against an uninterrupted run's.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from aggregator.checkpoint import load_checkpoint
from aggregator.round_log import read_metrics, rounds_only
from aggregator.server_app import run_rounds
from deploy.bench.common import SHORT_RUN
from deploy.brokers import BROKER_CONFIG_DIR, EmbeddedBroker, MosquittoBroker, mosquitto_available
from deploy.inprocess import InProcessGrid, VirtualDevice
from deploy.local import ProcessGroup, fedstream_command, wait_until
from deploy.probes import (
    DISK_FULL_S,
    SMALL_DISK_MB,
    MqttProbe,
    buffer_stats,
    fill_disk,
    publish_report,
    small_disk,
    start_ingest,
    start_publisher,
)
from deploy.secure import make_run_secrets
from edge_client.wire.run_config import RunSettings
from edge_client.wire.topics import status_topic

__all__ = ["aggregator_kill", "broker_crash", "disk_full", "resume_equivalence"]

OUTAGE_S = 3.0
RATE = 400.0  # samples per second per publisher, 4 per message
DEVICES = ("dev-0", "dev-1")


def _accepted(buffer: Path) -> int:
    return int(buffer_stats(buffer)["accepted"])


def _wait_accepted(buffer: Path, n: int, timeout: float = 60.0) -> bool:
    return wait_until(lambda: _accepted(buffer) >= n, timeout)


def _ingest(group: ProcessGroup, args: list[str], dev: str, buffer: Path) -> None:
    """``args`` as for the publisher: ``--broker URL`` first, then credentials if any."""
    start_ingest(group, args[1], buffer, dev, *args[2:], name=f"ingest-{dev}")


def _publish(
    group: ProcessGroup, args: list[str], dev: str, *extra: str
) -> subprocess.Popen[bytes]:
    """``args`` as for :func:`_ingest`."""
    return start_publisher(
        group, args[1], dev, *args[2:], "--batch", "4", *extra, name=f"pub-{dev}"
    )


def broker_crash(seconds: float) -> dict[str, Any]:
    """Broker SIGKILL mid-stream, then a clean restart holding an offline daemon's queue."""
    if not mosquitto_available():
        return {"skipped": "mosquitto not installed"}
    with tempfile.TemporaryDirectory(prefix="fedstream-broker-fault-") as name:
        tmp = Path(name)
        secrets = make_run_secrets(tmp / "secrets", list(DEVICES))
        prod = MosquittoBroker(BROKER_CONFIG_DIR / "mosquitto-prod.conf", secrets.root)
        with prod, ProcessGroup() as group:
            url = f"mqtts://127.0.0.1:{prod.port}"

            def args(dev: str) -> list[str]:
                return [
                    "--broker", url, "--username", dev, "--password", secrets.password(dev),
                    "--cafile", str(secrets.ca),
                ]  # fmt: skip

            buffers = {d: tmp / f"{d}.sqlite" for d in DEVICES}
            for d in DEVICES:
                _ingest(group, args(d), d, buffers[d])
            pubs = {
                d: _publish(group, args(d), d, "--rate", str(RATE), "--duration", str(seconds))
                for d in DEVICES
            }
            time.sleep(seconds / 3)  # sessions older than the last autosave
            prod.kill()
            time.sleep(OUTAGE_S)
            prod.restart()
            crash = {d: publish_report(p) for d, p in pubs.items()}
            for d in DEVICES:
                _wait_accepted(buffers[d], int(crash[d]["samples"]))
            after_crash = {d: _accepted(buffers[d]) for d in DEVICES}
            # Clean restart while dev-1's daemon is down and the broker queues for it.
            group.stop("ingest-dev-1")
            queued = publish_report(
                _publish(group, args("dev-1"), "dev-1", "--count", "800", "--rate", "2000")
            )
            prod.kill(graceful=True)
            prod.restart()
            _ingest(group, args("dev-1"), "dev-1", buffers["dev-1"])
            want = after_crash["dev-1"] + queued["samples"]
            _wait_accepted(buffers["dev-1"], want)
            final = _accepted(buffers["dev-1"])
    acked = sum(int(r["acknowledged"]) * 4 for r in crash.values())
    accepted = sum(after_crash.values())
    return {
        "crash": {
            "seconds": seconds,
            "outage_s": OUTAGE_S,
            "acknowledged": acked,
            "accepted": accepted,
            "lost": acked - accepted,
        },
        "clean_restart_with_queue": {
            "queued": int(queued["acknowledged"]) * 4,
            "accepted": final - after_crash["dev-1"],
            "lost": int(queued["acknowledged"]) * 4 - (final - after_crash["dev-1"]),
        },
    }


def disk_full() -> dict[str, Any]:
    """A daemon's disk fills up for ``FULL_S`` seconds mid-stream, then space returns."""
    with tempfile.TemporaryDirectory(prefix="fedstream-disk-fault-") as name:
        try:
            with small_disk(Path(name), SMALL_DISK_MB) as mount:
                return _disk_full(mount)
        except OSError as err:
            return {"skipped": str(err)}


def _disk_full(mount: Path) -> dict[str, Any]:
    buffer = mount / "dev-0.sqlite"
    with EmbeddedBroker() as broker, ProcessGroup() as group:
        args = broker.client_args
        _ingest(group, args, "dev-0", buffer)
        watcher = MqttProbe(broker.url, "watcher", mqtt_version=broker.mqtt_version)
        watcher.subscribe(status_topic("dev-0"))
        pub = _publish(group, args, "dev-0", "--rate", str(RATE), "--duration", "10")
        _wait_accepted(buffer, 400, 20)
        ballast = fill_disk(mount)
        reported = wait_until(lambda: "error" in watcher.last_json(), 15)
        error = watcher.last_json().get("error")
        time.sleep(DISK_FULL_S)
        ballast.unlink()
        report = publish_report(pub)
        recovered = _wait_accepted(buffer, int(report["samples"]))
        alive = group.procs["ingest-dev-0"].poll() is None
        watcher.close()
        accepted = _accepted(buffer)
    acked = int(report["acknowledged"]) * 4
    return {
        "full_s": DISK_FULL_S,
        "error_reported": reported,
        "error": error,
        "daemon_stayed_up": alive,
        "recovered": recovered,
        "acknowledged": acked,
        "accepted": accepted,
        "lost": acked - accepted,
    }


def aggregator_kill() -> dict[str, Any]:
    """``fedstream demo`` with the broker and then the aggregator killed mid-run."""
    with tempfile.TemporaryDirectory(prefix="fedstream-aggregator-fault-") as name:
        out = Path(name)
        broker = ["--mosquitto", "--kill-broker", "1"] if mosquitto_available() else []
        t0 = time.monotonic()
        proc = subprocess.run(
            fedstream_command(
                "demo", "--no-live", "--out", str(out), "--devices", "2", "--rounds", "4",
                "--local-steps", "10", "--slowdowns", "1,3", *broker, "--kill-aggregator", "2",
            ),
            capture_output=True,
            text=True,
            timeout=600,
        )  # fmt: skip
        wall = time.monotonic() - t0
        run_dir = next(out.glob("run-*"), None)
        summary = json.loads((run_dir / "summary.json").read_text()) if run_dir else {}
        records = rounds_only(read_metrics(run_dir / "metrics.jsonl")) if run_dir else []
    return {
        "exit_code": proc.returncode,
        "status": summary.get("status"),
        "flower_runs": len(summary.get("runs", [])),
        "rounds": [r.round for r in records],
        "planned_round_3": records[2].planned if len(records) > 2 else None,
        "accuracy": [round(r.test_accuracy, 3) for r in records],
        "broker_killed": "killed the broker" in proc.stdout + proc.stderr,
        "wall_s": round(wall, 1),
    }


def resume_equivalence() -> dict[str, Any]:
    """In-process: 4 rounds straight vs 2 rounds, a new aggregator, resume for 2 more."""

    def step_time(b: int) -> float:  # virtual step cost: the controller's input is exact
        return 0.001 + 1e-5 * b

    def fleet() -> list[VirtualDevice]:
        return [VirtualDevice(f"dev-{i}", slowdown=s) for i, s in enumerate((1, 3))]

    with tempfile.TemporaryDirectory(prefix="fedstream-resume-") as name:
        tmp = Path(name)
        grid = InProcessGrid(fleet(), tmp / "a", step_time=step_time)
        run_rounds(grid, RunSettings(**SHORT_RUN, num_rounds=4, checkpoint_dir=str(tmp / "ca")))
        grid.close()
        for rounds, resume in ((2, False), (4, True)):
            grid = InProcessGrid(fleet(), tmp / "b", step_time=step_time)
            run_rounds(
                grid,
                RunSettings(
                    **SHORT_RUN, num_rounds=rounds, checkpoint_dir=str(tmp / "cb"), resume=resume
                ),
            )
            grid.close()
        a, b = load_checkpoint(tmp / "ca"), load_checkpoint(tmp / "cb")
    assert a is not None and b is not None
    wa, wb = a.arrays.to_torch_state_dict(), b.arrays.to_torch_state_dict()
    diff = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    return {"rounds": 4, "killed_after": 2, "max_abs_weight_diff": diff, "identical": diff == 0.0}
