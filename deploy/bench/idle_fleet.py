"""``fedstream bench idle``: what an idle fleet costs its SuperLink, fedstream's against Flower's.

fedstream's SuperNodes (``fedstream-supernode``) pull every 0.2 s while they are in a run
(:data:`~edge_client.flower_internals.FAST_PULL_S`, for :data:`~edge_client.flower_internals.HOT_S`
after their last message) and at Flower's 3 s otherwise; their agents poll only their own
SuperNode, on the device. This measures the SuperLink's side, wall clock, on this machine:
:data:`NODES` SuperNodes join a fresh SuperLink and stay connected, no run submitted, for
:data:`WINDOW_S` seconds (after :data:`SETTLE_S` for the joins to finish), in two arms:

- ``flower``: Flower's own ``flower-supernode`` (``--isolation subprocess``), its default
  polling;
- ``fedstream``: ``fedstream-supernode`` (``--isolation process``) with a device agent each
  taking its tasks (what the demo and the deployment guide run).

The SuperLink's CPU seconds (its process and what it started: the SuperExec) over the window,
read from ``/proc``, and the devices' (SuperNodes, agents) beside them. The arms alternate
over :data:`REPETITIONS` (flower first, then fedstream first), each on its own SuperLink.
Goal: the SuperLink's CPU with fedstream's fleet at most :data:`GOAL_RATIO` times its CPU with
Flower's, in every repetition.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deploy.bench.common import PROCESS_SOURCES, Result, footnote, markdown_table, verdict
from deploy.bench.deployment import fill_buffers, standing_deployment
from deploy.local import descendants
from edge_client.flower_internals import FAST_PULL_S, FLOWER_IDLE_PULL_S
from edge_client.runtime.usage import cpu_s

__all__ = ["GOAL_RATIO", "NODES", "REPETITIONS", "SETTLE_S", "WINDOW_S", "run"]

#: SuperNodes connected (the issue's fleet), and the quick run's.
NODES, QUICK_NODES = 20, 4
#: Seconds measured, and the quick run's.
WINDOW_S, QUICK_WINDOW_S = 300.0, 20.0
#: Seconds after every node has joined before the window opens (the joins' own work done).
SETTLE_S = 20.0
#: Repetitions, each both arms (the first flower then fedstream, the next the other way).
REPETITIONS = 2
#: The SuperLink's CPU under fedstream's idle fleet, at most this times under Flower's.
GOAL_RATIO = 1.5
#: Samples per device buffer (nothing trains; the node config names a buffer).
SAMPLES = 64
ARMS = ("flower", "fedstream")


def _tree_cpu(root: int) -> dict[int, float]:
    """CPU seconds of ``root`` and each living descendant (its own, not reaped children's)."""
    pids = [root, *(pid for pid, _ in descendants(root))]
    return {pid: cpu_s(pid, reaped=False) for pid in pids}


def _spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two readings of the same processes (a process that started
    meanwhile counts whole; one that ended meanwhile is lost: none end here)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def _arm(
    arm: str, home: Path, nodes: int, window_s: float, progress: Callable[[str], None]
) -> dict[str, Any]:
    """One arm: a fresh SuperLink and ``nodes`` idle SuperNodes; the CPU each side spent
    over ``window_s``."""
    buffers = fill_buffers(home / "buffers", nodes, SAMPLES)
    began = time.monotonic()
    with standing_deployment(home / "flwr", buffers, agents=arm == "fedstream") as flower:
        joined_s = time.monotonic() - began
        time.sleep(SETTLE_S)
        procs = flower.group.procs
        superlink = procs["superlink"].pid
        devices = {name: p.pid for name, p in procs.items() if name != "superlink"}
        link0 = _tree_cpu(superlink)
        dev0 = {name: _tree_cpu(pid) for name, pid in devices.items()}
        t0 = time.monotonic()
        time.sleep(window_s)
        link1 = _tree_cpu(superlink)
        dev1 = {name: _tree_cpu(pid) for name, pid in devices.items()}
        measured_s = time.monotonic() - t0
        alive = sum(p.poll() is None for p in procs.values())
    per_role = {
        role: sum(_spent(dev0[n], dev1[n]) for n in devices if n.startswith(role))
        for role in ("supernode", "agent")
    }
    entry = {
        "arm": arm,
        "nodes": nodes,
        "window-s": round(measured_s, 1),
        "joined-s": round(joined_s, 1),
        "superlink-cpu-s": round(_spent(link0, link1), 3),
        "supernodes-cpu-s": round(per_role["supernode"], 3),
        "agents-cpu-s": round(per_role["agent"], 3),
        "processes-alive": alive,
        "processes": len(procs),
    }
    progress(
        f"  {arm}: SuperLink {entry['superlink-cpu-s']:.2f} CPU-s over {measured_s:.0f} s, "
        f"SuperNodes {entry['supernodes-cpu-s']:.2f}, agents {entry['agents-cpu-s']:.2f}"
    )
    return entry


def _table(entries: list[dict[str, Any]]) -> str:
    """The arms' table from the JSON entries alone (``dev/bench_tables.py`` renders it)."""
    rows = []
    for e in entries:
        minutes = e["window-s"] / 60
        agents = e["agents-cpu-s"] / e["nodes"] / minutes
        rows.append(
            [
                e["arm"],
                e["repetition"],
                e["nodes"],
                f"{e['window-s']:.0f}",
                f"{e['superlink-cpu-s']:.2f}",
                f"{e['superlink-cpu-s'] / minutes:.3f}",
                f"{e['supernodes-cpu-s'] / e['nodes'] / minutes:.3f}",
                f"{agents:.3f}" if e["arm"] == "fedstream" else "-",
                f"{e['ratio']:.2f}x" if "ratio" in e else "-",
            ]
        )
    return markdown_table(
        [
            "arm",
            "repetition",
            "SuperNodes",
            "window s",
            "SuperLink CPU s",
            "SuperLink CPU s/min",
            "SuperNode CPU s/min each",
            "agent CPU s/min each",
            "SuperLink vs flower",
        ],
        rows,
    )


def run(quick: bool = False, progress: Callable[[str], None] = print) -> Result:
    """Both arms, alternated over the repetitions; the table and the JSON entries."""
    nodes = QUICK_NODES if quick else NODES
    window_s = QUICK_WINDOW_S if quick else WINDOW_S
    repetitions = 1 if quick else REPETITIONS
    entries: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fedstream-bench-idle-") as name:
        for k in range(repetitions):
            progress(f" repetition {k + 1} of {repetitions}")
            for arm in ARMS if k % 2 == 0 else ARMS[::-1]:
                entry = _arm(arm, Path(name) / f"{arm}-{k}", nodes, window_s, progress)
                entries.append({**entry, "repetition": k})
    ratios = []
    for k in range(repetitions):
        pair = {e["arm"]: e for e in entries if e["repetition"] == k}
        ratio = pair["fedstream"]["superlink-cpu-s"] / max(pair["flower"]["superlink-cpu-s"], 1e-9)
        pair["fedstream"]["ratio"] = round(ratio, 3)
        ratios.append(round(ratio, 3))
    met = all(r <= GOAL_RATIO for r in ratios)
    table = _table(entries) + footnote(
        f"Wall clock on this 2-core machine: a fresh SuperLink and {nodes} SuperNodes on the "
        f"same cores, no run submitted, {window_s:.0f} s measured from {SETTLE_S:.0f} s after "
        f"the last node joined; Flower's SuperNodes poll every {FLOWER_IDLE_PULL_S:g} s, "
        f"fedstream's the same while idle ({FAST_PULL_S:g} s only within a run); CPU read "
        "from /proc (the SuperLink with its SuperExec)",
        f"the SuperLink's CPU under fedstream's fleet at most {GOAL_RATIO:g}x under Flower's "
        f"in every repetition ({', '.join(f'{r:.2f}x' for r in ratios)}): {verdict(met)}",
        virtual_clock=False,
    )
    meta = {
        "quick": quick,
        "nodes": nodes,
        "window_s": window_s,
        "settle_s": SETTLE_S,
        "repetitions": repetitions,
        "goals": {
            "superlink-cpu-vs-flower": {
                "threshold": GOAL_RATIO,
                "per_repetition": ratios,
                "median": statistics.median(ratios),
                "met": met,
            }
        },
    }
    return Result("idle", entries, table, meta, sources=PROCESS_SOURCES)
