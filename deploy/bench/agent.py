"""The device agent's part of ``fedstream bench deployment``: a soak (one agent serving
hundreds of messages: is its memory flat?) and what agents change, within each repetition
(the ClientApp's CPU seconds over Flower's do-nothing ClientApp's, the device's CPU seconds
per round, the live round's wall time, the device's peak memory)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, Context, Message, RecordDict

from deploy.agents import agent_sockets, start_agents
from deploy.bench.common import markdown_table, spread
from deploy.inprocess import as_superlink
from deploy.local import ProcessGroup
from edge_client.runtime import usage
from edge_client.runtime.client_app import make_client_app
from edge_client.runtime.node_config import NodeConfig
from edge_client.task.loading import load_task
from edge_client.wire.records import ARRAYS, CONFIG, RoundPlan
from edge_client.wire.run_config import RunSettings

__all__ = ["SOAK_EVERY", "agent_summary", "agent_table", "run_soak"]

#: How often (in messages) the soak reads the agent's resident memory.
SOAK_EVERY = 50


def run_soak(
    buffer: Path,
    settings: RunSettings,
    batch: int,
    logs: Path,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """A device agent serving ``settings.num_rounds`` rounds back to back on ``buffer``
    (``batch`` samples a step, ``settings.local_steps`` steps), each handed over by the
    ClientApp (in this process) as a SuperNode's would: its resident memory every
    :data:`SOAK_EVERY` messages (flat when nothing leaks), and each message's time."""
    messages, steps = settings.num_rounds, settings.local_steps
    as_superlink()  # the messages are made here, as the SuperLink makes them
    buffers = {"dev-0": buffer}
    model = load_task(settings).build_model(settings.shape, settings.num_classes)
    arrays = ArrayRecord(model.state_dict())
    app = make_client_app()
    rss: list[list[int]] = []
    seconds: list[float] = []
    with agent_sockets() as sockets, ProcessGroup() as group:
        assert sockets is not None
        socket = start_agents(group, buffers, sockets, logs)["dev-0"]
        pid = group.procs["agent-dev-0"].pid
        node = NodeConfig("dev-0", str(buffers["dev-0"]), threads=1, agent=str(socket))
        context = Context(1, 1, node.to_node_config(), RecordDict(), settings.to_run_config())
        for k in range(1, messages + 1):
            plan = RoundPlan(batch, steps, settings.lr, server_round=k).to_record()
            msg = Message(RecordDict({ARRAYS: arrays, CONFIG: plan}), 1, "train", ttl=120.0)
            began = time.perf_counter()
            reply = app(msg, context)
            seconds.append(time.perf_counter() - began)
            if reply.has_error():
                raise RuntimeError(f"the soak's message {k} failed: {reply.error.reason}")
            if k == 1 or k % SOAK_EVERY == 0:
                rss.append([k, usage.rss_bytes(pid)])
                progress(f"  agent soak: {k} messages, resident {rss[-1][1] / 2**20:.0f} MiB")
    first, last = rss[0][1], rss[-1][1]
    after_warmup = rss[1][1] if len(rss) > 1 else first
    return {
        "messages": messages,
        "rss_bytes": rss,
        "rss_growth_after_first_bytes": last - first,
        "rss_growth_after_warmup_bytes": last - after_warmup,
        "message_s_median": round(statistics.median(seconds), 4),
        "steps_per_message": steps,
        "batch": batch,
    }


def agent_summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """What the agent changes, within each repetition: the ClientApp's CPU seconds per
    message over Flower's do-nothing ClientApp's, the device's CPU seconds per round and the
    live round's wall time with agents over without, and the device's peak memory."""

    def of(variant: str, k: int) -> dict[str, Any]:
        return next(e for e in entries if e["variant"] == variant and e.get("repetition") == k)

    reps = sorted({e["repetition"] for e in entries if "repetition" in e})
    rows = []
    for k in reps:
        noop, live, agent = (
            of("flower-do-nothing", k),
            of("fedstream-live", k),
            of("fedstream-live-agent", k),
        )
        idle, idle_agent = of("fedstream-idle", k), of("fedstream-idle-agent", k)
        rows.append(
            {
                "repetition": k,
                "do_nothing_clientapp_cpu_s": noop["clientapp_cpu_s_per_round"],
                "agent_clientapp_cpu_s": agent["clientapp_cpu_s_per_round"],
                "agent_clientapp_cpu_over_do_nothing_s": round(
                    agent["clientapp_cpu_s_per_round"] - noop["clientapp_cpu_s_per_round"], 3
                ),
                "no_agent_clientapp_cpu_s": live["clientapp_cpu_s_per_round"],
                "device_cpu_s_per_round": {
                    "no-agent": live["footprint"]["device_cpu_s_per_round"],
                    "agent": agent["footprint"]["device_cpu_s_per_round"],
                },
                "device_cpu_ratio": round(
                    agent["footprint"]["device_cpu_s_per_round"]
                    / live["footprint"]["device_cpu_s_per_round"],
                    3,
                ),
                "live_round_wall_ratio": round(
                    agent["round_wall_median_s"] / live["round_wall_median_s"], 3
                ),
                "idle_round_wall_ratio": round(
                    idle_agent["round_wall_median_s"] / idle["round_wall_median_s"], 3
                ),
                "pss_peak_bytes": {
                    "no-agent": live["footprint"]["pss_peak_bytes"],
                    "agent": agent["footprint"]["pss_peak_bytes"],
                },
                "torch_processes": {
                    "no-agent": live["footprint"]["torch_processes"],
                    "agent": agent["footprint"]["torch_processes"],
                },
            }
        )
    keys = ("agent_clientapp_cpu_over_do_nothing_s", "device_cpu_ratio", "live_round_wall_ratio")
    return {
        "per_repetition": rows,
        **{key: spread([r[key] for r in rows]) for key in keys},
    }


def agent_table(summary: dict[str, Any], soak: dict[str, Any] | None) -> str:
    """The agent's rows (one per repetition) and its soak, as the benchmarks page shows
    them."""
    mib = 2**20
    rows = []
    for r in summary["per_repetition"]:
        cpu, pss, torch = r["device_cpu_s_per_round"], r["pss_peak_bytes"], r["torch_processes"]
        over = r["agent_clientapp_cpu_over_do_nothing_s"]
        rows.append(
            [
                str(r["repetition"]),
                f"{r['do_nothing_clientapp_cpu_s']:.2f}",
                f"{r['agent_clientapp_cpu_s']:.2f} ({over:+.2f})",
                f"{r['no_agent_clientapp_cpu_s']:.2f}",
                f"{cpu['no-agent']:.2f} -> {cpu['agent']:.2f} ({r['device_cpu_ratio']:.2f}x)",
                f"{r['live_round_wall_ratio']:.2f}x",
                f"{r['idle_round_wall_ratio']:.2f}x",
                f"{pss['no-agent'] / mib:.0f} -> {pss['agent'] / mib:.0f}",
                f"{torch['no-agent'].get('clientapp', 0)} -> {torch['agent'].get('clientapp', 0)}"
                f" (agents {torch['agent'].get('agent', 0)})",
            ]
        )
    table = markdown_table(
        [
            "repetition",
            "do-nothing ClientApp CPU s",
            "ClientApp CPU s, agent (over do-nothing)",
            "ClientApp CPU s, no agent",
            "device CPU s per round, no agent -> agent",
            "live round, agent / no agent",
            "idle round, agent / no agent",
            "device peak PSS MiB, no agent -> agent",
            "ClientApps with torch, no agent -> agent",
        ],
        rows,
    )
    if soak:
        rss = soak["rss_bytes"]
        table += (
            f"\n\nAgent soak: {soak['messages']} messages back to back, resident "
            f"{rss[0][1] / mib:.0f} MiB after message {rss[0][0]}, {rss[1][1] / mib:.0f} MiB "
            f"after {rss[1][0]}, {rss[-1][1] / mib:.0f} MiB after {rss[-1][0]} "
            f"(median message {soak['message_s_median'] * 1000:.0f} ms)."
        )
    return table
