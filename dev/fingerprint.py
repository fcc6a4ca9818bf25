"""Fixed-seed in-process runs whose final weights a refactoring must not change.

    python dev/fingerprint.py                           # the runs' lines, as JSON
    python dev/fingerprint.py --compare dev/fingerprint.jsonl   # exit 1 on a difference

Three runs on the in-process runner, one torch thread, a virtual step cost (so that the
dynamic controller's input, and with it every plan, is exact):

- ``A-default``: 4 devices (slowdowns 1/1/2/4, streams 400/300/200/150 samples/s), the
  dynamic controller with the availability cap, 6 rounds of 10 steps;
- ``B-features``: slow streams that cap batches, ``wait``, half the buffers ``persistence``,
  two labels per device, adaptive top-k with error feedback, an fp16 broadcast, ScaDLES
  injection and FedProx, 5 rounds;
- ``C-krum``: 5 devices with Dirichlet(0.5) labels, multi-Krum over int8 updates, the static
  controller, 4 rounds.

Each line: the run, a SHA-256 of its final weights (names and float32 bytes, sorted by
name), its per-round plans, accuracies, codec modes and aggregated devices, every record's
virtual seconds (the timing probe's, round 0, first), and the machine it was made on (CPU,
torch, Python). The hash is bit-exact on one machine and torch build only: ``--compare``
holds it where the machine matches the line's, and everywhere the plans, modes and
aggregated devices exactly, the accuracies within :data:`ACCURACY_TOLERANCE` and the
virtual seconds within :data:`VIRTUAL_TOLERANCE_S` (on another machine, whose weights
compress to a few bytes more or fewer, within :data:`VIRTUAL_ELSEWHERE_RELATIVE` of each).
The suite runs the comparison (``tests/unit/test_fingerprint.py``): a change of behaviour
fails it until the lines are made again, in the same commit, and the commit says why.

``dev/fingerprint.jsonl``: made again in the commit that put the comparison in the suite
(issue 56), on the 2-core x86_64 development machine, torch 2.13.0+cpu. The lines of
97a28c1 (the defaults of issue 52) stopped matching at 62735f5, which packs the broadcast
model into one array: its bytes, and with them every round's virtual download, are 512
bytes' worth (0.5 ms) shorter; in ``B-features``, whose slow streams fill the buffers by
that clock, the weights changed with it. Plans, modes, aggregated devices and accuracies
are as before. Earlier lines (the charged-clock change, issue 34; the defaults, issue 52)
are in git history.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from aggregator.checkpoint import load_checkpoint
from aggregator.round_log import rounds_only
from aggregator.server_app import run_rounds
from deploy.bench.common import SHORT_RUN
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.emulation.sources import pick_classes
from edge_client.wire.run_config import RunSettings

BASE: dict[str, Any] = {"num_rounds": 4, **SHORT_RUN, "seed": 0}
#: Accuracies may differ this much on another CPU or torch build (float summation order).
ACCURACY_TOLERANCE = 0.02
#: Virtual seconds are sums of a fixed cost line and byte counts: on the recorded machine
#: equal but for rounding.
VIRTUAL_TOLERANCE_S = 1e-6
#: On another CPU the trained weights differ in their last bits, and so do their compressed
#: sizes, which the clock charges (10 Mbit/s: 0.8 us a byte): a relative tolerance there
#: (measured: 1.1e-4 of a round, 11 bytes, between an Intel Xeon and an AMD EPYC line).
VIRTUAL_ELSEWHERE_RELATIVE = 1e-3
#: What must be equal exactly, on any machine.
EXACT = ("planned", "modes", "aggregated")


def machine() -> dict[str, str]:
    """Where a line is made: the CPU's model, torch's and Python's versions."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpu": cpu, "torch": torch.__version__, "python": platform.python_version()}


def step_time(batch: int) -> float:
    """The virtual cost of one step at ``batch``."""
    return 1e-3 + 2e-5 * batch


def fingerprint(name: str, devices: list[VirtualDevice], overrides: dict[str, Any]) -> str:
    """One run's line: the hash of its final weights and what each round did."""
    with tempfile.TemporaryDirectory(prefix="fedstream-fingerprint-") as tmp:
        settings = RunSettings(**{**BASE, **overrides, "checkpoint_dir": f"{tmp}/ckpt"})
        grid = InProcessGrid(devices, Path(tmp) / "buffers", settings, step_time=step_time)
        records = run_rounds(grid, settings)
        grid.close()
        checkpoint = load_checkpoint(settings.checkpoint_dir)
    assert checkpoint is not None
    weights = checkpoint.arrays.to_torch_state_dict()
    digest = hashlib.sha256()
    for key in sorted(weights):
        digest.update(key.encode())
        digest.update(weights[key].numpy().tobytes())
    rounds = rounds_only(records)
    return json.dumps(
        {
            "run": name,
            "sha256": digest.hexdigest(),
            "planned": [r.planned for r in rounds],
            "accuracy": [r.test_accuracy for r in rounds],
            "modes": [r.compress for r in rounds],
            "aggregated": [r.aggregated for r in rounds],
            "virtual_s": [r.virtual_s for r in records],  # the probe's (round 0) first
            "machine": machine(),
        }
    )


def lines() -> list[str]:
    """The three runs' lines."""
    torch.set_num_threads(1)
    out: list[str] = []
    speeds = list(zip((1, 1, 2, 4), (400, 300, 200, 150), strict=True))
    out.append(
        fingerprint(
            "A-default",
            [VirtualDevice(f"dev-{i}", slowdown=s, rate=r) for i, (s, r) in enumerate(speeds)],
            {"num_rounds": 6, "local_steps": 10},
        )
    )
    slow = list(zip((1, 1, 2, 4), (60, 40, 30, 20), strict=True))
    out.append(
        fingerprint(
            "B-features",
            [
                VirtualDevice(
                    f"dev-{i}", slowdown=s, rate=r, initial=150, inject=True, capacity=3000,
                    labels=pick_classes(2, 6, index=i),
                    policy="persistence" if i % 2 else "truncation",
                )
                for i, (s, r) in enumerate(slow)
            ],
            {
                "num_rounds": 5, "compress": "adaptive", "compress_ratio": 0.05,
                "compress_broadcast": "fp16", "inject_alpha": 0.5, "proximal_mu": 0.1,
                "wait_policy": "wait",
            },
        )
    )  # fmt: skip
    skewed = [
        VirtualDevice(f"dev-{i}", slowdown=1 + i % 3, rate=300, dirichlet=0.5) for i in range(5)
    ]
    settings = {
        "aggregation": "multi-krum",
        "krum_malicious": 1,
        "compress": "int8",
        "controller": "static",
    }
    out.append(fingerprint("C-krum", skewed, settings))
    return out


def main() -> None:
    """Print the lines, or compare them with a file of lines made before (exit 1 on a
    difference, naming what differs)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", metavar="FILE", help="lines made before, to hold these to")
    args = parser.parse_args()
    now = [json.loads(line) for line in lines()]
    if args.compare is None:
        print("\n".join(json.dumps(run) for run in now))
        return
    before = [json.loads(line) for line in Path(args.compare).read_text().splitlines() if line]
    differ = compare(before, now)
    print("\n".join(differ) or f"the same as {args.compare}: {len(now)} runs")
    sys.exit(1 if differ else 0)


def compare(before: list[dict[str, Any]], now: list[dict[str, Any]]) -> list[str]:
    """What differs between lines made before and now (empty: the same behaviour): the
    hash where both were made on one machine, the rest everywhere (see the module notes)."""
    if [b["run"] for b in before] != [n["run"] for n in now]:
        return [f"runs {[b['run'] for b in before]} != {[n['run'] for n in now]}"]
    differ = []
    for b, n in zip(before, now, strict=True):
        name = b["run"]
        same_machine = b.get("machine") == n["machine"]
        if same_machine and b["sha256"] != n["sha256"]:
            differ.append(f"{name}: sha256 differs (same machine)")
        differ += [f"{name}: {key} differs" for key in EXACT if b[key] != n[key]]
        relative = 0.0 if same_machine else VIRTUAL_ELSEWHERE_RELATIVE
        pairs = (
            ("accuracy", ACCURACY_TOLERANCE, 0.0),
            ("virtual_s", VIRTUAL_TOLERANCE_S, relative),
        )
        for key, tolerance, rel in pairs:
            if len(b[key]) != len(n[key]) or any(
                (x is None) != (y is None)
                or (x is not None and abs(x - y) > max(tolerance, rel * abs(x)))
                for x, y in zip(b[key], n[key], strict=False)
            ):
                bound = f"{tolerance}" + (f" or {rel:g} of it" if rel else "")
                differ.append(f"{name}: {key} differs beyond {bound}")
    return differ


if __name__ == "__main__":
    main()
