"""Bursts through a stock broker: what a burst of per-reading messages loses on its way to the
ingest daemon over MQTT 5 and over 3.1.1, on a Mosquitto nobody tuned for fedstream.

Wall clock, real processes on this machine: Mosquitto with nothing but a listener (20 messages
in flight to a 3.1.1 client, 1,000 queued behind them), ``fedstream ingest`` (per-reading
JSON, windows of 100, the sensor's counter ``--seq-field n``) and ``mosquitto_pub -l -q 1``
sending the burst as fast as it goes: recordings of 100 readings, 10 s of stream time apart.
Once the daemon has had no message for two seconds, the sensor's next recording follows (what
a sensor that goes on sends), so that a loss at the burst's end shows as a gap in the counter.

Each case reports the readings sent and stored, those lost (sent - stored), those the daemon
counted missing, the windows made, and the seconds from the burst's end until the daemon had
all it would get; every run also times ``fedstream ingest`` from its start to the log line
that says it is connected and subscribed. Cases alternate, repeated; figures are the runs'.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from deploy.bench.common import PROCESS_SOURCES, Result, footnote, markdown_table, verdict
from deploy.brokers import MosquittoBroker, mosquitto_available
from deploy.local import ProcessGroup, fedstream_command, wait_until
from deploy.probes import buffer_stats
from edge_client.runtime.constants import MQTT_5, MQTT_311

__all__ = ["BURSTS", "LOSSLESS_UP_TO", "SUBSCRIBE_GOAL_S", "run"]

BURSTS = (2_000, 10_000, 50_000)  # readings in one burst
QUICK_BURSTS = (2_000, 10_000)
VERSIONS = (MQTT_5, MQTT_311)
REPETITIONS, QUICK_REPETITIONS = 3, 1
RECORDING = 100  # readings per recording, and the window
SUBSCRIBE_GOAL_S = 2.0  # `fedstream ingest` connected and subscribed this soon after its start
LOSSLESS_UP_TO = 10_000  # readings in a burst MQTT 5 must take whole (the goal)
QUIET_S = 2.0  # no message for this long: the broker has sent what it will
TOPIC = "site/w1/imu"


def _lines(first: int, count: int) -> list[str]:
    """Recordings ``first .. first + count - 1`` as per-reading JSON lines, numbered on."""
    return [
        json.dumps({"n": r * RECORDING + i, "ts": round(1.7e9 + 10.0 * r + i / 100, 6),
                    "ax": i, "ay": r, "az": 1.0})
        for r in range(first, first + count)
        for i in range(RECORDING)
    ]  # fmt: skip


def _send(broker: MosquittoBroker, lines: list[str]) -> None:
    subprocess.run(
        ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-q", "1", "-t", TOPIC,
         "-l"],
        input="\n".join(lines) + "\n", text=True, check=True, timeout=300,
    )  # fmt: skip


def _settle(buf: Path) -> float:
    """Wait until the daemon has handled no new message for :data:`QUIET_S`; return when it
    handled its last one (monotonic seconds)."""
    seen, since = -1, time.monotonic()
    deadline = since + 300
    while time.monotonic() < deadline:
        now = buffer_stats(buf)["messages"]
        if now != seen:
            seen, since = now, time.monotonic()
        elif time.monotonic() - since >= QUIET_S:
            break
        time.sleep(0.05)
    return since


def burst_once(burst: int, version: str, tmp: Path) -> dict[str, Any]:
    """One burst of ``burst`` readings to a fresh daemon on a fresh stock broker."""
    recordings = burst // RECORDING
    buf, log = tmp / f"b{burst}-{version}.sqlite", tmp / f"b{burst}-{version}.log"
    with MosquittoBroker.stock() as broker, ProcessGroup() as group:
        started = time.monotonic()
        group.start(
            "ingest",
            fedstream_command(
                "ingest", "--broker", broker.url, "--mqtt-version", version, "--device-id",
                "w1", "--buffer", str(buf), "--topic", TOPIC, "--fields", "ax,ay,az",
                "--window", str(RECORDING), "--seq-field", "n", "--status-interval", "1",
            ),
            log_path=log,
        )  # fmt: skip
        if not wait_until(lambda: "connected to" in log.read_text(), 60, interval=0.01):
            raise RuntimeError(f"fedstream ingest did not connect:\n{log.read_text()}")
        subscribed = time.monotonic() - started
        _send(broker, _lines(0, recordings))
        sent_at = time.monotonic()
        last = _settle(buf)
        _send(broker, _lines(recordings, 1))  # the sensor's next recording
        _settle(buf)
        s = buffer_stats(buf)
    sent = burst + RECORDING
    return {
        "sent": sent,
        "stored": s["readings"],
        "lost": sent - s["readings"],
        "counted-missing": s["readings-missing"],
        "windows": s["accepted"],
        "expected-windows": recordings + 1,
        "duplicates": s["duplicates"],
        "drain-s": max(0.0, last - sent_at),
        "subscribed-s": subscribed,
    }


def _spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}-{fmt.format(hi)}"


def _table(entries: list[dict[str, Any]]) -> str:
    """The cases' table from the JSON entries alone (``dev/bench_tables.py`` renders it)."""
    rows = []
    for e in entries:
        runs = e["runs"]
        rows.append(
            [
                f"{e['burst']:,} readings + {RECORDING}",
                e["mqtt-version"],
                _spread([r["stored"] for r in runs]),
                _spread([r["lost"] for r in runs]),
                _spread([r["counted-missing"] for r in runs]),
                f"{_spread([r['windows'] for r in runs])} of {runs[0]['expected-windows']}",
                _spread([r["drain-s"] for r in runs], "{:.1f}"),
                len(runs),
            ]
        )
    return markdown_table(
        ["burst", "MQTT", "stored", "lost", "counted missing", "windows", "drain s", "runs"],
        rows,
    )


def run(quick: bool = False) -> Result:
    """Every burst size over MQTT 5 and 3.1.1, alternated, repeated.

    Raises
    ------
    RuntimeError
        Without Mosquitto and its clients (``apt-get install -y mosquitto mosquitto-clients``).
    """
    if shutil.which("mosquitto_pub") is None or not mosquitto_available():
        raise RuntimeError("bench bursts needs mosquitto and mosquitto_pub (apt-get install -y "
                           "mosquitto mosquitto-clients)")  # fmt: skip
    bursts = QUICK_BURSTS if quick else BURSTS
    repetitions = QUICK_REPETITIONS if quick else REPETITIONS
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="fedstream-bench-bursts-") as name:
        for rep in range(repetitions):
            for burst in bursts:
                for version in VERSIONS:
                    tmp = Path(name) / f"r{rep}"
                    tmp.mkdir(exist_ok=True)
                    outcome = burst_once(burst, version, tmp)
                    runs.setdefault((burst, version), []).append(outcome)
                    print(f"burst {burst:,}, MQTT {version}, run {rep + 1}: "
                          f"stored {outcome['stored']:,} of {outcome['sent']:,}, counted "
                          f"missing {outcome['counted-missing']:,}", flush=True)  # fmt: skip
    entries = [
        {"burst": burst, "mqtt-version": version, "runs": rs}
        for (burst, version), rs in runs.items()
    ]
    subscribed = [r["subscribed-s"] for rs in runs.values() for r in rs]
    v5_lossless = all(
        r["lost"] == 0
        for (burst, v), rs in runs.items()
        if v == MQTT_5 and burst <= LOSSLESS_UP_TO
        for r in rs
    )
    counted = all(r["counted-missing"] == r["lost"] for rs in runs.values() for r in rs)
    met = v5_lossless and counted and max(subscribed) <= SUBSCRIBE_GOAL_S
    table = _table(entries)
    table += footnote(
        "Wall clock on this 2-core machine: a stock Mosquitto 2, `fedstream ingest` and "
        "`mosquitto_pub -l -q 1` on the same cores; `fedstream ingest` started, connected and "
        f"subscribed in {statistics.median(subscribed):.2f} s (median, max "
        f"{max(subscribed):.2f} s over {len(subscribed)} starts)",
        f"MQTT 5 loses nothing of a burst of up to {LOSSLESS_UP_TO:,} readings, every loss is "
        f"counted, the daemon subscribes within {SUBSCRIBE_GOAL_S:g} s: {verdict(met)}",
        virtual_clock=False,
    )
    meta = {
        "quick": quick,
        "repetitions": repetitions,
        "subscribed-s": subscribed,
        "subscribe-goal-s": SUBSCRIBE_GOAL_S,
        "lossless-up-to": LOSSLESS_UP_TO,
        "met": {"v5-lossless": v5_lossless, "counted": counted, "subscribed": max(subscribed)
                <= SUBSCRIBE_GOAL_S},
    }  # fmt: skip
    return Result("bursts", entries, table, meta=meta, sources=PROCESS_SOURCES)
