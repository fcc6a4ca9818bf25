"""The tables of ``fedstream bench deployment``, from its JSON entries alone: one row per
run, and the ratios of each compared variant over the baselines (``bench/results/
deployment.md`` and the page's table are both drawn by :func:`deployment_table`)."""

from __future__ import annotations

from typing import Any

from deploy.bench.common import markdown_table

__all__ = ["deployment_table", "goals_table", "ratio_table"]


def _times(entry: dict[str, Any]) -> str:
    """Seconds to each target accuracy (``-``: not reached), for the controller runs."""
    if "time_to_s" not in entry:
        return "-"
    return ", ".join(
        f"{t}: {'-' if v is None else f'{v:.0f} s'}" for t, v in entry["time_to_s"].items()
    )


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def deployment_table(entries: list[dict[str, Any]], ratios: dict[str, Any] | None = None) -> str:
    """One row per run; with ``ratios`` (the JSON's), their summary over the repetitions."""
    rows = []
    for e in entries:
        b = e.get("breakdown") or {}
        rows.append(
            [
                e["variant"],
                str(e.get("repetition", "-")),
                f"{e['round_wall_median_s']:.2f} ({e['round_wall_min_s']:.2f}-"
                f"{e['round_wall_max_s']:.2f})",
                f"{e['vs_plain_tuned']:.2f}x",
                f"{e['vs_plain_tuned_pull']:.2f}x" if "vs_plain_tuned_pull" in e else "-",
                _num(e["clientapp_cpu_s_per_round"]),
                _num(e["clientapp_start_s"]),
                _num(e["clientapp_train_s"]),
                f"{100 * b['training_share']:.0f} %" if b else "-",
                str(e.get("seed", "-")),
                _times(e),
            ]
        )
    table = markdown_table(
        [
            "variant",
            "repetition",
            "round wall s, median (range)",
            "vs plain tuned",
            "vs plain tuned, 0.2 s pulls",
            "ClientApp CPU s",
            "process start s",
            "train s",
            "training share",
            "seed",
            "wall s to test accuracy",
        ],
        rows,
    )
    if ratios:
        table += "\n\n" + ratio_table(ratios)
    return table


def ratio_table(ratios: dict[str, Any]) -> str:
    """The median round of each compared variant over each baseline's, within each
    repetition: mean (min-max) over them."""
    rows = [
        [
            variant,
            *(
                f"{r['mean']:.2f}x ({r['min']:.2f}-{r['max']:.2f}, {len(r['per_repetition'])})"
                for r in by_base.values()
            ),
        ]
        for variant, by_base in ratios.items()
    ]
    bases: dict[str, Any] = next(iter(ratios.values()), {})
    headers = ["variant"] + [f"vs {base}, mean (min-max, repetitions)" for base in bases]
    return markdown_table(headers, rows)


def goals_table(goals: dict[str, Any]) -> str:
    """Each goal's value in every repetition (or seed) and its verdict (the JSON's
    ``goals``)."""
    rows = [
        [name, ", ".join("-" if v is None else f"{v:g}" for v in g["values"]), g["verdict"]]
        for name, g in goals.items()
    ]
    return markdown_table(["goal", "value per repetition or seed", "verdict"], rows)
