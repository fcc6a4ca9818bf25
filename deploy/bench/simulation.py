"""Fleet-scale simulation: thousands of virtual devices through ``flwr run`` on Flower's
simulation engine (Ray), on this machine.

Each run is fedstream's own app submitted to a ``--simulation`` SuperLink with N virtual
SuperNodes: the default model, 5 local steps, a global batch of 8 per device, the default
stream rates (``sim-rates``) and round timeout, every other key at its default (the timing
probe included). Measured per round, from the run's ``metrics.jsonl`` and ``/proc``: wall
time, the share of devices that replied having trained on at least one sample, the memory
of every process the run started (PSS, summed: the SuperLink, the ServerApp, Ray and its
workers) and the disk its folders hold.

Runs: the lazy replay (``sim-buffers = "lazy"``, the default) at 100 and 1,000 devices
(``--quick``) and 5,000 (the full run); side by side at 100 devices, the eager replay into a
buffer file per device (``sim-buffers = "files"``), the way every virtual device was fed
before. The default ``sim-slowdowns`` (1,1,2,4) are real: a slow device's steps sleep, and
hold their Ray actor; the full run adds 1,000 devices at one speed to show what that costs.
Wall clock on this machine, not a virtual clock.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from aggregator.round_log import read_metrics, rounds_only
from deploy.bench.common import PROCESS_SOURCES, Result
from deploy.demo import APP_DIR
from deploy.flower import FlowerDeployment
from deploy.local import ProcessGroup
from edge_client.runtime.usage import children, pss_bytes
from edge_client.wire.mapping import kebab

__all__ = ["run", "simulate"]

LOCAL_STEPS = 5
BATCH_PER_DEVICE = 8
GOALS = {"round_s": 30.0, "disk_bytes": 1e9, "memory_growth": 0.10}
SAMPLE_S = 1.0


def _du(path: Path) -> int:
    """Bytes the files under ``path`` take."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


@contextmanager
def _memory(samples: list[int]) -> Iterator[None]:
    """Append the summed PSS of this process's descendants every second while it runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(SAMPLE_S):
            samples.append(sum(pss_bytes(pid) for pid in children(os.getpid())))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def simulate(
    devices: int,
    rounds: int,
    where: Path,
    sim_buffers: str = "lazy",
    extra: dict[str, Any] | None = None,
    timeout: float = 3600.0,
    progress: Callable[[str], None] = print,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """One ``flwr run`` of ``devices`` virtual devices for ``rounds`` rounds; its figures.

    ``ray_address``: a running Ray cluster (``ray start``) the simulation runtime joins
    (``RAY_ADDRESS``) instead of starting Ray of its own.

    Returns
    -------
    dict
        ``status``, ``rounds`` (per round: ``round``, ``wall_s``, ``replied``,
        ``memory_bytes`` (the summed PSS when the round was logged), ``disk_bytes``),
        ``memory_peak_bytes``, ``disk_peak_bytes``, ``wall_s``.
    """
    memory: list[int] = []
    per_round: list[dict[str, Any]] = []
    out, sim = where / "out", where / "sim"
    began = time.monotonic()
    with ProcessGroup() as group, _memory(memory):
        flower = FlowerDeployment(group, where / "flwr", simulated_nodes=devices)
        if ray_address:
            flower.env["RAY_ADDRESS"] = ray_address
        flower.start_superlink()
        run_id = flower.submit(
            APP_DIR,
            {
                "num-rounds": rounds,
                kebab("local_steps"): LOCAL_STEPS,  # a metric's name too: through the mapping
                "global-batch": BATCH_PER_DEVICE * devices,
                "out-dir": str(out),
                "sim-dir": str(sim),
                "sim-buffers": sim_buffers,
                **(extra or {}),
            },
        )
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        next_status = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            records = rounds_only(read_metrics(out / "metrics.jsonl"))
            for record in records[len(per_round) :]:
                trained = sum(m.num_examples > 0 for m in record.devices.values())
                entry = {
                    "round": record.round,
                    "wall_s": record.wall_s,
                    "replied": trained / devices,  # replies that trained on a sample or more
                    "memory_bytes": memory[-1] if memory else 0,
                    "disk_bytes": _du(sim) + _du(where / "flwr"),
                }
                per_round.append(entry)
                progress(
                    f"    {devices} devices, round {record.round}: {record.wall_s:.1f} s, "
                    f"{entry['replied']:.0%} replied, {entry['memory_bytes'] / 2**20:.0f} MiB, "
                    f"{entry['disk_bytes'] / 2**20:.1f} MiB on disk"
                )
            if len(per_round) >= rounds or time.monotonic() >= next_status:
                # `flwr list` costs about a CPU-second: asked rarely, and at the end
                status = flower.status(run_id)
                next_status = time.monotonic() + 30.0
                if str(status.get("status", "")).startswith("finished"):
                    break
            time.sleep(1.0)
    disk = max([e["disk_bytes"] for e in per_round], default=0)
    return {
        "devices": devices,
        "sim_buffers": sim_buffers,
        "status": status.get("status", "timed out"),
        "rounds": per_round,
        "memory_peak_bytes": max(memory, default=0),
        "disk_peak_bytes": disk,
        "wall_s": round(time.monotonic() - began, 1),
    }


#: ``sim-slowdowns``' default: two devices at full speed, one 2x and one 4x slower, cycled.
DEFAULT_SLOWDOWNS = "1,1,2,4"


def _row(run: dict[str, Any]) -> str:
    later = [r["wall_s"] for r in run["rounds"][1:]] or [float("nan")]
    mem = [r["memory_bytes"] for r in run["rounds"]]
    growth = (mem[-1] - mem[1]) / mem[1] if len(mem) > 2 and mem[1] else float("nan")
    replied = min((r["replied"] for r in run["rounds"]), default=0.0)
    first = run["rounds"][0]["wall_s"] if run["rounds"] else float("nan")
    return (
        f"| {run['devices']} | {run['sim_buffers']} | {run['sim_slowdowns']} | {run['status']} | "
        f"{first:.1f} | "
        f"{max(later):.1f} | {replied:.0%} | {run['memory_peak_bytes'] / 2**20:.0f} | "
        f"{growth:+.1%} | {run['disk_peak_bytes'] / 2**20:.1f} |"
    )


def run(quick: bool = False, progress: Callable[[str], None] = print) -> Result:
    """The lazy replay at 100 and 1,000 devices (and 5,000 unless ``quick``), the eager one
    at 100 beside it."""
    sizes = [100, 1000] if quick else [100, 1000, 5000]
    rounds = 3 if quick else 4
    plan: list[tuple[int, str, str]] = [(100, "files", DEFAULT_SLOWDOWNS)]
    plan += [(n, "lazy", DEFAULT_SLOWDOWNS) for n in sizes]
    if not quick:  # what the emulated slowdowns (real sleeps in Ray's actors) cost
        plan.append((1000, "lazy", "1"))
    runs: list[dict[str, Any]] = []
    for devices, buffers, slowdowns in plan:
        where = Path(tempfile.mkdtemp(prefix=f"fedstream-bench-sim-{devices}-"))
        try:
            progress(f"  {devices} virtual devices, sim-buffers={buffers}, slowdowns {slowdowns}")
            extra = {"sim-slowdowns": slowdowns}
            run_ = simulate(devices, rounds, where, buffers, extra=extra, progress=progress)
            runs.append({**run_, "sim_slowdowns": slowdowns})
        finally:
            shutil.rmtree(where, ignore_errors=True)
    table = "\n".join(
        [
            "| devices | sim-buffers | sim-slowdowns | status | round 1 (s) | slowest later "
            "round (s) | fewest replied | memory peak (MiB) | memory, round 2 to last | "
            "disk peak (MiB) |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *(_row(r) for r in runs),
        ]
    )
    return Result(
        "simulation",
        runs,
        table,
        meta={
            "what": "flwr run on a --simulation SuperLink (Ray), wall clock on this machine",
            "local_steps": LOCAL_STEPS,
            "global_batch_per_device": BATCH_PER_DEVICE,
            "rounds": rounds,
            "goals": GOALS,
            "cpus": os.cpu_count(),
        },
        sources=PROCESS_SOURCES,
    )
