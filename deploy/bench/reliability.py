"""Reliability report: a soak with a fault injected, every sample accounted for, memory over
time, hostile input refused, then broker, disk and aggregator faults
(:mod:`deploy.bench.faults`) and security checks (:mod:`deploy.bench.security`), with the
probes of :mod:`deploy.probes`.

8 publishers stream 1-sample QoS 1 messages (625 msg/s each, 5k msg/s together) into 8
``fedstream ingest`` daemons (truncation) through Mosquitto (the embedded broker when it is
not installed); a third of the way in, one daemon is SIGKILLed and restarted 2 s later.
Afterwards every device's broker-acknowledged samples are compared with its buffer's
counters: lost = acknowledged - accepted must be 0. Hostile input: mutations of valid frames
and random bytes through the decoder; a crash is any exception other than FrameError.
Wall clock of real processes on this machine (not the virtual clock).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from deploy.bench.common import PROCESS_SOURCES, Result, footnote, markdown_table
from deploy.bench.faults import aggregator_kill, broker_crash, disk_full, resume_equivalence
from deploy.bench.security import security_checks
from deploy.brokers import EmbeddedBroker, MosquittoBroker, mosquitto_available
from deploy.local import ProcessGroup, fedstream_command
from deploy.probes import buffer_stats, start_ingest
from edge_client.task.synthetic import SensorTask
from edge_client.wire.frames import FrameError, decode_payload, encode_frame

__all__ = ["run"]

DEVICES = 8
RATE = 625.0  # messages (= samples) per second per publisher
CAPACITY = 20_000
VICTIM = "dev-3"


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def _ingest(
    group: ProcessGroup, broker: EmbeddedBroker | MosquittoBroker, dev: str, tmp: Path
) -> int:
    proc = start_ingest(
        group, broker.url, tmp / f"{dev}.sqlite", dev, "--policy", "truncation",
        "--capacity", str(CAPACITY), "--mqtt-version", broker.mqtt_version,
        name=f"ingest-{dev}", status_interval=5.0,
    )  # fmt: skip
    return proc.pid


def soak(seconds: float) -> dict[str, Any]:
    """The soak with one ingest daemon killed and restarted; per-device accounting."""
    with tempfile.TemporaryDirectory(prefix="fedstream-soak-") as name:
        tmp = Path(name)
        broker: EmbeddedBroker | MosquittoBroker = (
            MosquittoBroker() if mosquitto_available() else EmbeddedBroker()
        )
        with broker, ProcessGroup(grace=30.0) as group:
            devs = [f"dev-{i}" for i in range(DEVICES)]
            pids = {d: _ingest(group, broker, d, tmp) for d in devs}  # each made its buffer
            time.sleep(1.0)
            pubs = {
                d: group.start(
                    f"pub-{d}",
                    fedstream_command(
                        "publish",
                        *broker.client_args,
                        "--device-id",
                        d,
                        "--rate",
                        str(RATE),
                        "--duration",
                        str(seconds),
                        "--seed",
                        str(i),
                        "--json",
                    ),
                    stdout_pipe=True,
                )
                for i, d in enumerate(devs)
            }
            rss: dict[str, list[tuple[float, int]]] = {d: [] for d in devs}
            t0 = time.monotonic()
            killed = False
            while time.monotonic() - t0 < seconds:
                now = time.monotonic() - t0
                if not killed and now >= seconds / 3:  # the fault: kill -9, back 2 s later
                    group.kill(f"ingest-{VICTIM}")
                    time.sleep(2.0)
                    pids[VICTIM] = _ingest(group, broker, VICTIM, tmp)
                    killed = True
                for d in devs:
                    rss[d].append((now, _rss_kib(pids[d])))
                time.sleep(2.0)
            reports = {}
            for d, p in pubs.items():
                out, _ = p.communicate(timeout=120)
                reports[d] = json.loads(out.decode().strip().splitlines()[-1])
            acked = {d: int(r["acknowledged"]) for d, r in reports.items()}  # 1 sample each
            settle = time.monotonic() + 60
            while time.monotonic() < settle:
                if all(_stats(tmp, d)["accepted"] >= acked[d] for d in devs):
                    break
                time.sleep(0.5)
            counters = {d: _stats(tmp, d) for d in devs}
    devices = {}
    for d in devs:
        s = counters[d]
        warm = [r for t, r in rss[d] if t >= seconds / 3 + 4 or (d != VICTIM and t >= 10)]
        devices[d] = {
            "published": int(reports[d]["samples"]),
            "acknowledged": acked[d],
            "accepted": s["accepted"],
            "duplicates": s["duplicates"],
            "dropped": s["dropped"],
            "lost": acked[d] - s["accepted"],
            "achieved_rate": float(reports[d]["achieved-rate"]),
            "rss_kib_first": warm[0] if warm else None,
            "rss_kib_last": warm[-1] if warm else None,
            "rss_kib_max": max(warm) if warm else None,
        }
    return {"seconds": seconds, "devices": devices, "killed": VICTIM}


def _stats(tmp: Path, dev: str) -> dict[str, Any]:
    return buffer_stats(tmp / f"{dev}.sqlite")


def hostile(n: int, seed: int = 0) -> dict[str, int]:
    """Mutated and random payloads through the frame decoder."""
    rng = np.random.default_rng(seed)
    task = SensorTask()
    tried = refused = accepted = crashed = 0
    for i in range(n):
        x, y = task.sample(2, rng)
        good = bytearray(encode_frame(x, y, np.full(2, 1.7e9), publisher="p", seq=i + 1))
        if i % 4 == 0:
            payload = rng.integers(0, 256, size=int(rng.integers(0, 200)), dtype=np.uint8).tobytes()
        else:
            for pos in rng.integers(0, len(good) * 8, size=int(rng.integers(1, 4))):
                good[pos // 8] ^= 1 << (pos % 8)
            payload = bytes(good[: int(rng.integers(1, len(good) + 1))] if i % 3 else good)
        tried += 1
        try:
            decode_payload(payload, task.shape, task.num_classes, now=1.7e9)
            accepted += 1  # a flip inside the values can leave a valid frame
        except FrameError:
            refused += 1
        except Exception:
            crashed += 1
    return {
        "tried": tried,
        "refused": refused,
        "valid-after-mutation": accepted,
        "crashed": crashed,
    }


def run(quick: bool = False, seed: int = 0) -> Result:
    """Soak with a fault, hostile input, broker/disk/aggregator faults, security checks.

    ``quick`` shortens the soak and the broker fault and leaves out the real-process
    aggregator kill (``fedstream demo --kill-aggregator``, about 1.5 minutes).
    """
    seconds = 20.0 if quick else 120.0
    s = soak(seconds)
    h = hostile(2_000 if quick else 20_000, seed)
    faults = _faults(quick)
    security = security_checks()
    devs = s["devices"]
    rows = [
        [
            d,
            f"{v['published']:,}",
            f"{v['acknowledged']:,}",
            f"{v['accepted']:,}",
            v["duplicates"],
            v["lost"],
            f"{v['achieved_rate']:.0f}",
            f"{(v['rss_kib_first'] or 0) / 1024:.1f} -> {(v['rss_kib_last'] or 0) / 1024:.1f} MiB",
        ]
        for d, v in devs.items()
    ]
    table = markdown_table(
        [
            "device",
            "published",
            "acked by broker",
            "accepted",
            "duplicates",
            "lost",
            "msg/s",
            "ingest RSS",
        ],
        rows,
    )
    lost = sum(v["lost"] for v in devs.values())
    injected, survived, fault_rows = _fault_summary(lost, faults)
    table += "\n\n" + markdown_table(["fault", "survived", "figures"], fault_rows)
    table += "\n\n" + markdown_table(
        ["security check", "passed", "outcome"],
        [[c["check"], "yes" if c["passed"] else "NO", c["detail"]] for c in security["checks"]],
    )
    table += footnote(
        f"Soak: {DEVICES} publishers x {RATE:.0f} msg/s (1 sample each) for {seconds:.0f} s "
        f"into {DEVICES} ingest daemons (truncation, capacity {CAPACITY:,}); {s['killed']}'s "
        f"daemon SIGKILLed at {seconds / 3:.0f} s and restarted 2 s later. Lost accepted "
        f"samples in total: {lost} (goal 0). Hostile input: {h['tried']:,} payloads, "
        f"{h['refused']:,} refused with a reason, {h['valid-after-mutation']:,} still valid "
        f"after mutation, {h['crashed']} crashes (goal 0). Faults survived: {survived} of "
        f"{injected}. Security checks passed: {security['passed']} of {security['tried']}. "
        "Wall clock, real processes (the resume comparison: in-process runner)",
        virtual_clock=False,
    )
    return Result(
        "reliability",
        [{"device": d, **v} for d, v in devs.items()],
        table,
        meta={
            "quick": quick,
            "faults": {"injected": injected, "survived": survived, **faults},
            "samples": _samples(devs, faults),
            "hostile": h,
            "security": security,
        },
        sources=PROCESS_SOURCES,
    )


def _faults(quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "broker": broker_crash(10.0 if quick else 30.0),
        "disk_full": disk_full(),
        "resume_equivalence": resume_equivalence(),
    }
    out["aggregator"] = {"skipped": "--quick"} if quick else aggregator_kill()
    return out


def _samples(devs: dict[str, dict[str, Any]], faults: dict[str, Any]) -> dict[str, int]:
    """Acknowledged, accepted and lost samples over the soak and the broker and disk faults."""
    parts = [{k: v[k] for k in ("acknowledged", "accepted", "lost")} for v in devs.values()]
    broker = faults["broker"]
    if "crash" in broker:
        parts.append(broker["crash"])
        q = broker["clean_restart_with_queue"]
        parts.append({"acknowledged": q["queued"], "accepted": q["accepted"], "lost": q["lost"]})
    if "lost" in faults["disk_full"]:
        parts.append(faults["disk_full"])
    return {k: sum(int(p[k]) for p in parts) for k in ("acknowledged", "accepted", "lost")}


#: A fault's line in the summary: (fault, survived: None when skipped, its figures).
Outcome = tuple[str, bool | None, str]


def _fault_summary(soak_lost: int, faults: dict[str, Any]) -> tuple[int, int, list[list[str]]]:
    """(injected, survived, table rows) over every fault that ran (skipped ones say why)."""
    outcomes: list[Outcome] = [
        ("ingest daemon kill -9 (soak)", soak_lost == 0, f"lost {soak_lost}")
    ]
    outcomes += _ran_or_skipped(faults["broker"], "crash", "broker faults", _broker_outcomes)
    outcomes += _ran_or_skipped(faults["disk_full"], "lost", "disk full", _disk_outcomes)
    outcomes += _ran_or_skipped(
        faults["aggregator"], "status", "aggregator kill", _aggregator_outcomes
    )
    eq = faults["resume_equivalence"]
    outcomes.append(
        ("resumed vs uninterrupted model (in-process)", eq["identical"],
         f"max |weight difference| {eq['max_abs_weight_diff']}")
    )  # fmt: skip
    ran = [ok for _, ok, _ in outcomes if ok is not None]
    verdict = {True: "yes", False: "NO", None: "skipped"}
    rows = [[name, verdict[ok], figures] for name, ok, figures in outcomes]
    return len(ran), sum(ran), rows


def _ran_or_skipped(
    fault: dict[str, Any], ran_key: str, name: str, read: Callable[[dict[str, Any]], list[Outcome]]
) -> list[Outcome]:
    """A fault's outcomes when it ran (its figures have ``ran_key``), else one line that
    names it skipped and says why."""
    return read(fault) if ran_key in fault else [(name, None, fault["skipped"])]


def _broker_outcomes(broker: dict[str, Any]) -> list[Outcome]:
    c, q = broker["crash"], broker["clean_restart_with_queue"]
    return [
        (f"broker SIGKILL, {c['outage_s']:.0f} s down", c["lost"] == 0,
         f"acked {c['acknowledged']:,}, accepted {c['accepted']:,}, lost {c['lost']}"),
        ("broker clean restart, daemon down", q["lost"] == 0,
         f"queued {q['queued']}, accepted {q['accepted']}, lost {q['lost']}"),
    ]  # fmt: skip


def _disk_outcomes(disk: dict[str, Any]) -> list[Outcome]:
    survived = disk["lost"] == 0 and disk["daemon_stayed_up"] and disk["error_reported"]
    figures = (
        f"status error {disk['error']!r}; acked {disk['acknowledged']:,}, "
        f"accepted {disk['accepted']:,}, lost {disk['lost']}"
    )
    return [(f"disk full for {disk['full_s']:.0f} s", survived, figures)]


def _aggregator_outcomes(agg: dict[str, Any]) -> list[Outcome]:
    survived = agg["status"] == "finished:completed" and agg["rounds"] == [1, 2, 3, 4]
    figures = (
        f"rounds {agg['rounds']} in {agg['flower_runs']} Flower runs, accuracy "
        f"{agg['accuracy']}, round-3 plan {agg['planned_round_3']}"
    )
    return [("aggregator SIGKILL after round 2, resumed", survived, figures)]
