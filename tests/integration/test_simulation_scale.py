"""Fleet-scale simulation through Flower's simulation engine (Ray): hundreds of virtual
devices on this machine, and a run that joins a Ray cluster started beforehand (about 2
minutes together)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from deploy.bench.simulation import simulate as simulate_fleet
from deploy.local import descendants, free_port


@pytest.mark.timeout(600)
def test_two_hundred_virtual_devices_reply_in_every_round(tmp_path: Path) -> None:
    # Prepare / Execute: 200 virtual devices through `flwr run` on the simulation engine, as
    # `fedstream bench simulation` runs them (less its timing probe's exchange), their speeds
    # and rates drawn from OmniLearn's HL2 and ScaDLES' S2; the lazy replay (the default).
    population = {
        "sim-population": "slowdown=omnilearn(HL2) rate=scadles(S2)",
        "controller-probe": 0,
    }
    run = simulate_fleet(200, 2, tmp_path, extra=population, progress=lambda _: None)
    # Assert: every device in every round; no device stored its stream or state on disk
    assert run["status"] == "finished:completed", run
    assert [r["round"] for r in run["rounds"]] == [1, 2]
    assert all(r["replied"] == 1.0 for r in run["rounds"]), run["rounds"]
    assert not list(tmp_path.glob("sim/**/*.sqlite"))  # buffers and state: in node states
    assert run["disk_peak_bytes"] < 50e6  # the SuperLink's database and logs


@pytest.mark.timeout(300)
def test_a_simulation_joins_a_ray_cluster_started_beforehand(tmp_path: Path) -> None:
    # Prepare: a one-machine Ray cluster, as the head of a multi-machine one is started (a
    # short temporary folder: Ray's sockets live in it, and socket paths are short).
    ray = shutil.which("ray")
    assert ray is not None, "flwr[simulation] brings Ray's command line"
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    address = f"127.0.0.1:{free_port()}"
    before = {pid for pid, _ in descendants(os.getpid())}
    subprocess.run(
        [ray, "start", "--head", f"--port={address.split(':')[1]}", "--num-cpus=2",
         "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats"],
        check=True, capture_output=True, timeout=180,
    )  # fmt: skip
    try:
        # Execute: the simulation runtime with RAY_ADDRESS, as the docs say
        run = simulate_fleet(3, 1, tmp_path, ray_address=address, progress=lambda _: None)
        logs = {
            p.name: p.read_text(errors="replace")
            for p in temp.glob("session_*/logs/*")
            if p.is_file()
        }
    finally:
        _stop_ray(temp, before)
    # Assert: the run finished, and its driver and ClientApp actors ran in that cluster
    assert run["status"] == "finished:completed", run
    assert any(name.startswith("python-core-driver-") for name in logs), sorted(logs)
    assert any(
        ":actor_name:ClientAppActor" in text for name, text in logs.items() if name.endswith(".out")
    ), sorted(logs)


def _stop_ray(temp: Path, before: set[int]) -> None:
    """Kill this test's Ray cluster only (``ray stop`` would stop every one on the host): the
    processes that name its folder, and those it started that do not (its client server and
    dashboard agent; the suite adopts them, so they are this process's descendants that
    were not there ``before``)."""
    for pid, _ in descendants(os.getpid()):
        if pid not in before:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(temp).encode() in cmd:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
    shutil.rmtree(temp, ignore_errors=True)
