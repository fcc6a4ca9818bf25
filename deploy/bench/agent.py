"""The device agent's part of ``fedstream bench deployment``: what agents change, within
each repetition
(the ClientApp's CPU seconds over Flower's do-nothing ClientApp's, the device's CPU seconds
per round, the live round's wall time, the device's peak memory)."""

from __future__ import annotations

from typing import Any

from deploy.bench.common import markdown_table, spread

__all__ = ["agent_summary", "agent_table"]


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
            f"after {rss[1][0]}, {rss[-1][1] / mib:.0f} MiB after {rss[-1][0]}"
        )
        if "round_s_median" in soak:  # taken from a real SuperNode, a round each
            growth = 100 * soak["rss_growth_after_warmup"]
            table += (
                f" ({growth:+.1f} % after message {rss[1][0]}); taken by the agent from a real "
                f"SuperNode, median round {soak['round_s_median']:.2f} s."
            )
        else:  # results before the soak went through a SuperNode: handed over in process
            table += f" (median message {soak['message_s_median'] * 1000:.0f} ms)."
    return table
