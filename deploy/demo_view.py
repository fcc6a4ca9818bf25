"""What the demo shows and writes: its progress table, its lines on where time went and why
a run diverged, and the command that serves the final model."""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from aggregator.round_log import RoundRecord, divergence_hint
from deploy.constants import (
    DEFAULT_MQTT_PORT,
)
from deploy.demo_config import DemoConfig, device_ids
from deploy.demo_streams import ingest_args
from deploy.device_scores import fleet_scores, round_scores
from edge_client.runtime.constants import MQTT_311
from edge_client.wire.run_config import RunSettings

__all__ = [
    "breakdown_line",
    "divergence_line",
    "final_export",
    "infer_command",
    "progress_table",
    "run_diverged",
    "source_passes",
    "what_streams",
]


def progress_table(
    records: list[RoundRecord], rounds: int, state: str, max_rows: int | None = None
) -> Table:
    """The round's table: one row per device that replied (with ``max_rows``, only that many:
    the devices that scored worst)."""
    last = records[-1] if records else None
    asynchronous = last is not None and last.mode == "async"
    title = f"{'version' if asynchronous else 'round'} {len(records)}/{rounds}"
    if last is not None:
        title += f", {last.metric} {last.accuracy:.3f} (prequential)"
        if not math.isnan(last.test_accuracy):
            title += f", {last.test_accuracy:.3f} (test set)"
        fleet = fleet_scores(round_scores(last), last.higher_is_better)
        if fleet is not None:
            title += (
                f"; devices {fleet.mean:.3f} mean, {fleet.median:.3f} median, "
                f"{fleet.worst10:.3f} worst 10 %"
            )
        title += f", sum b {last.sum_b}"
        if last.dp_epsilon_spent is not None:
            title += f", epsilon {last.dp_epsilon_spent:.2f} spent"
        if last.secagg_survivors is not None:
            title += f", {last.secagg_survivors} in the secure sum ({last.secagg_dropped} lost)"
        if asynchronous:
            title += f", {len(last.updates)} updates, {last.in_flight} in flight"
        if last.devices_hidden:
            title += (
                f"; {last.replied_count} of {last.planned_count} devices replied, "
                f"{last.aggregated_count} in the model (devices hidden under DP: "
                "dp-device-records)"
            )
    # a light box and short headers: ten columns fit an 80-column terminal unabridged
    table = Table(title=f"{title} ({state})", box=box.SIMPLE_HEAD, collapse_padding=True)
    columns = ["device", "plan b", "batch", "train s", "wait s", "rate/s", "fill", "score"]
    if asynchronous:
        columns += ["updates", "stale"]
    for col in columns:
        table.add_column(col, justify="right")
    if last is not None:
        shown = sorted(last.devices)
        if max_rows is not None and len(shown) > max_rows:
            scores = round_scores(last)
            worst = sorted(scores, key=scores.__getitem__, reverse=not last.higher_is_better)[
                :max_rows
            ]
            shown = sorted(worst or shown[:max_rows])
            table.caption = f"the {len(shown)} of {len(last.devices)} devices that scored worst"
        for dev in shown:
            m = last.devices[dev]
            row = [
                dev,
                str(last.planned.get(dev, "-")),
                str(m.batch_size),
                f"{m.compute_s:.2f}",
                f"{m.wait_s:.2f}",
                f"{m.stream_rate:.0f}",
                str(m.buffer_fill),
                "-" if m.eval_count == 0 or math.isnan(m.eval_metric) else f"{m.eval_metric:.3f}",
            ]
            if asynchronous:  # this version's updates from the device, and how old each was
                stale = [str(u.staleness) for u in last.updates if u.device == dev]
                row += [str(len(stale)), ",".join(stale) or "-"]
            table.add_row(*row)
    return table


def breakdown_line(breakdown: dict[str, Any]) -> str:
    """Where the rounds' wall time went, in one line (the largest parts first)."""
    if not breakdown:
        return "no round recorded where its wall time went"
    shares = sorted(breakdown["shares"].items(), key=lambda kv: -kv[1])
    parts = ", ".join(f"{p} {100 * v:.0f} %" for p, v in shares if v >= 0.01)
    return (
        f"the devices trained for {100 * breakdown['training_share']:.0f} % of the rounds' wall "
        f"time (median round {breakdown['round_wall_s']:.1f} s; along the slowest device: "
        f"{parts})"
    )


def run_diverged(records: list[RoundRecord], settings: RunSettings) -> bool:
    """Whether the run ended because training diverged: its last round made
    ``max-diverged-rounds`` in a row."""
    limit = settings.max_diverged_rounds
    return bool(records) and limit > 0 and records[-1].diverged_rounds >= limit


def divergence_line(records: list[RoundRecord], settings: RunSettings) -> str:
    """Why a diverged run ended, and what to change, in one line."""
    last = records[-1]
    return (
        f"{last.divergence()} in round {last.round}, {last.diverged_rounds} rounds in a row "
        f"(max-diverged-rounds = {settings.max_diverged_rounds}): "
        f"{divergence_hint(settings.lr)} (--run-config lr=...)"
    )


def final_export(settings: RunSettings) -> dict[str, Any] | None:
    """The newest model version in ``export-dir`` (its folder and number), or None."""
    from edge_client.wire.artifact import latest_version  # torch: only once a run ended

    version = latest_version(settings.export_dir) if settings.export_dir else None
    if version is None:
        return None
    return {"dir": settings.export_dir, "version": version.version, "path": str(version.path)}


def infer_command(config: DemoConfig, settings: RunSettings) -> str:
    """The ``fedstream infer`` command that serves the exported model on ``dev-0``'s stream,
    as the demo's devices publish it: sample frames, or a series' readings (in ``--style``)
    cut into the run's windows (the demo's own broker is gone by now: the command names the one the
    demo was given, else ``fedstream broker``'s default address, which speaks MQTT 3.1.1)."""
    dev = device_ids(config.devices)[0]
    if config.broker is not None:
        args = ["--broker", config.broker]
    else:
        args = ["--broker", f"mqtt://127.0.0.1:{DEFAULT_MQTT_PORT}", "--mqtt-version", MQTT_311]
    args += ["--device-id", dev, "--model", settings.export_dir]
    if config.series is not None:  # what its ingest daemon reads, but the commit interval
        reading = ingest_args(config, dev, 0)
        at = reading.index("--commit-interval")
        args += reading[:at] + reading[at + 2 :]
    if settings.preprocess == "standardize":  # the device's statistics are in its buffer
        args += ["--buffer", str(Path(settings.out_dir) / "buffers" / f"{dev}.sqlite")]
    return shlex.join(["fedstream", "infer", *args])


def source_passes(records: list[RoundRecord], shards: dict[str, int]) -> dict[str, float]:
    """How many times over each device trained on its part of a ``--source`` recording
    (its own samples taken / the part's size; nothing with the synthetic task)."""
    taken = {
        dev: sum(
            r.devices[dev].num_examples - r.devices[dev].inject_used
            for r in records
            if dev in r.devices
        )
        for dev in shards
    }
    return {dev: round(taken[dev] / n, 2) for dev, n in shards.items()}


#: How the demo says a ``--style`` publishes a series.
STYLE_NAMES = {
    "json": "per-reading JSON",
    "esphome": "ESPHome's bare values",
    "zigbee2mqtt": "Zigbee2MQTT's JSON (no timestamps)",
    "tasmota": "Tasmota's JSON (local times)",
    "sparkplug": "Sparkplug B",
}


def what_streams(config: DemoConfig) -> str:
    settings = config.settings
    if config.series is not None:
        return (
            f"{config.source} as {STYLE_NAMES[config.style]} ({', '.join(config.channels)}), "
            f"windows of {config.window} readings, label-free"
        )
    what = str(config.source) if config.source else "the synthetic sensor task"
    what += f" ({settings.sample_shape.replace(',', 'x')}, {settings.num_classes} classes)"
    if config.groups:  # partitioned: whose part each device streams, in recorded order
        by = f"by {config.partition_by}" if config.partition_by else config.partition
        named = zip(device_ids(config.devices), config.groups, strict=True)
        parts = ", ".join(f"{d} {g}" for d, g in named)
        what += f", split {by}, each part in recorded order: {parts}"
    return what
