"""The benchmark tables of ``docs/benchmarks.md``, rendered from ``bench/results/*.json``.

    python dev/bench_tables.py            # rewrite the tables between the markers
    python dev/bench_tables.py --check    # exit 1, with a diff, where a table and its JSON differ

Each benchmark's tables sit in the page between ``<!-- bench:NAME -->`` and
``<!-- /bench:NAME -->``, NAME the JSON file's stem (``hetero`` for ``hetero.json``). Nothing
else in the page is touched, so no figure in a table is typed by hand: rerun a benchmark
(``fedstream bench NAME``), then this script.

Where a scenario module of :mod:`deploy.bench` renders its table from its JSON entries alone
(``_table``), that renderer is used, so that ``bench/results/NAME.md`` and the page agree by
construction; the other scenarios build their tables inside their run, and their renderers
are here (the same columns and formats as their ``NAME.md``).

A marker named in :data:`FOLDER_RENDERERS` is drawn from several JSON files: ``results``, the
page's ``## Results`` bullets (one per benchmark, ``dev/bench_results.py``).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # dev/ is not a package: its sibling module by its folder
    sys.path.insert(0, str(HERE))

import bench_results  # noqa: E402

ROOT = HERE.parent
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "benchmarks.md"

__all__ = [
    "DOC",
    "FOLDER_RENDERERS",
    "RENDERERS",
    "RESULTS",
    "check",
    "render",
    "rendered",
    "update",
]

MARKER = re.compile(
    r"(<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.S
)

Doc = dict[str, Any]


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    from deploy.bench.common import markdown_table

    return markdown_table(headers, rows)


def _spread(values: Sequence[float | None], fmt: str = "{:.2f}") -> str:
    from deploy.bench.common import spread

    return spread(values, fmt)


def _hetero(doc: Doc) -> str:
    from deploy.bench import hetero

    return hetero._table(doc["entries"])


def _defaults(doc: Doc) -> str:
    from deploy.bench import defaults

    return defaults._table(doc["entries"])


def _streams(doc: Doc) -> str:
    from deploy.bench import streams

    return streams._table(doc["entries"])


def _async(doc: Doc) -> str:
    from deploy.bench import asynchronous

    return asynchronous._table(doc["entries"], doc["deadline-chosen"])


def _compression(doc: Doc) -> str:
    from deploy.bench import compression

    return (
        compression._table(doc["entries"]) + "\n\n" + compression._speed_table(doc["codec_speed"])
    )


def _deployment(doc: Doc) -> str:
    from deploy.bench.deployment_table import deployment_table

    controllers = doc.get("controllers") or {}
    targets = sorted({t for c in controllers.values() for t in c["time_to_s"]}, key=float)
    rows = [
        [
            name.removeprefix("controller-"),
            ", ".join(map(str, c["seeds"])),
            c["round_wall_median_s"],
            *(c["time_to_s"].get(t, "-") for t in targets),
        ]
        for name, c in controllers.items()
    ]
    table = deployment_table(doc["entries"], doc.get("ratios"))
    if rows:
        headers = ["controller", "seeds", "round wall s, median (range)"]
        headers += [f"wall s to test accuracy {t}" for t in targets]
        table += "\n\n" + _table(headers, rows)
    if doc.get("agent"):
        from deploy.bench.agent import agent_table

        table += "\n\n" + agent_table(doc["agent"], doc.get("soak"))
    if doc.get("goals"):
        from deploy.bench.deployment_table import goals_table

        table += "\n\n" + goals_table(doc["goals"])
    return table


def _noniid(doc: Doc) -> str:
    from deploy.bench import noniid

    main, sweep = noniid.split_entries(doc["entries"])
    table = noniid.main_table(main, doc["rounds"])
    if len(sweep) > 1:
        table += "\n\n" + noniid.sweep_table(sweep, doc["rounds"])
    return table


def _scale(doc: Doc) -> str:
    from deploy.bench import scale

    return scale.results_table(doc["entries"])


def _forecast(doc: Doc) -> str:
    from deploy.bench import forecast

    fed = next(e for e in doc["entries"] if "mae_per_seed" in e)
    vs = (fed["lower_than_naive_per_seed"], fed["vs_ridge_per_seed"])
    return forecast.results_table(
        doc["naive_mae"],
        doc["ridge_mae"],
        doc["ridge_penalty"],
        fed["mae_per_seed"],
        vs,
        doc["rounds"],
    )


def _reliability(doc: Doc) -> str:
    from deploy.bench.reliability import _fault_summary

    rows = [
        [
            e["device"],
            f"{e['published']:,}",
            f"{e['acknowledged']:,}",
            f"{e['accepted']:,}",
            e["duplicates"],
            e["lost"],
            f"{e['achieved_rate']:.0f}",
            f"{(e['rss_kib_first'] or 0) / 1024:.1f} -> {(e['rss_kib_last'] or 0) / 1024:.1f} MiB",
        ]
        for e in doc["entries"]
    ]
    headers = ["device", "published", "acked by broker", "accepted", "duplicates", "lost"]
    table = _table([*headers, "msg/s", "ingest RSS"], rows)
    lost = sum(e["lost"] for e in doc["entries"])
    _, _, fault_rows = _fault_summary(lost, doc["faults"])
    table += "\n\n" + _table(["fault", "survived", "figures"], fault_rows)
    checks = doc["security"]["checks"]
    table += "\n\n" + _table(
        ["security check", "passed", "outcome"],
        [[c["check"], "yes" if c["passed"] else "NO", c["detail"]] for c in checks],
    )
    return table


def _simulation(doc: Doc) -> str:
    from deploy.bench.simulation import _row

    header = (
        "| devices | sim-buffers | sim-slowdowns | status | round 1 (s) | slowest later "
        "round (s) | fewest replied | memory peak (MiB) | memory, round 2 to last | "
        "disk peak (MiB) |"
    )
    rows = [_row(e) for e in doc["entries"]]
    return "\n".join([header, "|---|---|---|---|---|---|---|---|---|---|", *rows])


def _inference(doc: Doc) -> str:
    from deploy.bench.inference import BATCHES, FASTEST_RATE, PER_MESSAGE

    models = [e for e in doc["entries"] if "model" in e]
    table = _table(
        ["model (exported, torch alone)", *(f"samples/s, batch {b}" for b in BATCHES)],
        [[m["model"], *(f"{m['samples_per_s'][str(b)]:,.0f}" for b in BATCHES)] for m in models],
    )
    daemon, paced = (e for e in doc["entries"] if "daemon" in e)
    how = {
        id(daemon): "as fast as sent",
        id(paced): f"paced at {FASTEST_RATE:.0f} samples/s",
    }
    rows = [
        [
            f"{d['samples']} samples in frames of {PER_MESSAGE}, {how[id(d)]}",
            f"{d['samples_per_s']:,.0f}",
            f"{1000 * (d['latency_median_s'] or 0):.1f} ms",
            f"{1000 * (d['latency_p99_s'] or 0):.1f} ms",
        ]
        for d in (daemon, paced)
    ]
    headers = ["fedstream infer end to end", "samples/s", "latency median", "latency p99"]
    return table + "\n\n" + _table(headers, rows)


def _drift(doc: Doc) -> str:
    from deploy.bench import drift_recovery

    return drift_recovery.results_tables(doc["entries"])


def _service(doc: Doc) -> str:
    from deploy.bench import continuous_run

    return continuous_run.samples_table(doc["entries"][0]["samples"])


def _ingest(doc: Doc) -> str:
    rows = []
    for c in doc["cases"]:
        n, per, size = c["messages"], c["samples-per-message"], c["sample-bytes"]
        if c["kind"].startswith("per-reading"):
            what = f"{n:,} x 1 reading (per-reading JSON, {c['shape'][0]} channels)"
            what += f", windows of {c['shape'][-1]}"
            samples = f"{c['ingest-samples-s']:,.0f} readings"
        else:
            what = f"{n:,} x {per} sample(s) of {size} B"
            samples = f"{c['ingest-samples-s']:,.0f} ({c['ingest-mb-s']:.0f} MB/s)"
        runs = ", ".join(f"{r:.2f}" for r in c["ratios"])
        rows.append(
            [
                f"{what}, MQTT {c.get('mqtt-version', '3.1.1')}",  # runs before MQTT 5: 3.1.1
                f"{c['raw-msg-s']:,.0f}",
                f"{c['ingest-msg-s']:,.0f}",
                samples,
                f"**{c['ratio']:.2f}x** ({runs})",
            ]
        )
    m = doc["memory"]
    table = _table(
        ["messages", "raw paho msg/s", "ingest msg/s", "ingest samples/s", "ingest/raw (runs)"],
        rows,
    )
    mem_rows = [
        [
            f"{m['seconds']:.0f} s",
            f"{m['accepted']:,}",
            f"{m['dropped']:,}",
            f"{m['rss-kib-after-warmup'] / 1024:.1f} MiB",
            f"{m['rss-kib-end'] / 1024:.1f} MiB",
            f"{m['rss-kib-max'] / 1024:.1f} MiB",
        ]
    ]
    headers = ["fed for", "accepted", "evicted", "RSS after warm-up", "RSS at the end", "RSS max"]
    return table + "\n\n" + _table(headers, mem_rows)


#: Each benchmark's renderer: its JSON document -> its tables (markdown).
def _bursts(doc: Doc) -> str:
    from deploy.bench import bursts

    return bursts._table(doc["entries"])


def _idle(doc: Doc) -> str:
    from deploy.bench import idle_fleet

    return idle_fleet._table(doc["entries"])


def _people(doc: Doc) -> str:
    from deploy.bench import people

    return people._table(doc["entries"], doc["rounds"], doc["quick"])


def _privacy(doc: Doc) -> str:
    from deploy.bench import privacy

    return privacy._table(
        doc["entries"], doc["devices"], doc["rounds"], doc["quick"], doc.get("secret_draws", False)
    )


def _secagg(doc: Doc) -> str:
    from deploy.bench import secagg

    return secagg._table(doc["entries"], doc["quick"])


RENDERERS: dict[str, Callable[[Doc], str]] = {
    "ingest": _ingest,
    "bursts": _bursts,
    "compression": _compression,
    "noniid": _noniid,
    "hetero": _hetero,
    "defaults": _defaults,
    "streams": _streams,
    "async": _async,
    "scale": _scale,
    "deployment": _deployment,
    "idle": _idle,
    "forecast": _forecast,
    "reliability": _reliability,
    "simulation": _simulation,
    "people": _people,
    "privacy": _privacy,
    "secagg": _secagg,
    "inference": _inference,
    "drift": _drift,
    "service": _service,
}


#: Blocks drawn from several JSON files: the results folder -> markdown.
FOLDER_RENDERERS: dict[str, Callable[[Path], str]] = {
    "results": bench_results.render,
}


def render(name: str, results: Path = RESULTS) -> str:
    """The block of marker ``name``: a benchmark's tables from ``results/NAME.json``, or
    (a name of :data:`FOLDER_RENDERERS`) what its renderer draws from the folder.

    Parameters
    ----------
    name : str
        The marker's name (``hetero`` for ``<!-- bench:hetero -->``).
    results : Path
        The folder of ``NAME.json`` files.

    Returns
    -------
    str
        The block's markdown.
    """
    if name in FOLDER_RENDERERS:
        return FOLDER_RENDERERS[name](results)
    doc = json.loads((results / f"{name}.json").read_text())
    return RENDERERS[name](doc)


def update(text: str, tables: dict[str, str]) -> str:
    """``text`` with the body between each pair of markers replaced by its table.

    Parameters
    ----------
    text : str
        The page.
    tables : dict of str to str
        Each marker's block, by the marker's name.

    Returns
    -------
    str
        The page with every marked block replaced (``SystemExit`` for a marker without one).
    """

    def body(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in tables:
            raise SystemExit(f"no renderer for the marker bench:{name}")
        return f"{match.group(1)}{tables[name]}\n{match.group(4)}"

    return MARKER.sub(body, text)


def rendered(text: str, results: Path = RESULTS) -> str:
    """The page ``text`` with every marked block rendered afresh from ``results``.

    Parameters
    ----------
    text : str
        The page.
    results : Path
        The folder of ``NAME.json`` files.

    Returns
    -------
    str
        The page, every block between markers rendered (``SystemExit`` where a renderer has
        no marker on the page).
    """
    names = [m.group("name") for m in MARKER.finditer(text)]
    known = set(RENDERERS) | set(FOLDER_RENDERERS)
    missing = sorted(known - set(names))
    if missing:
        raise SystemExit(f"no markers for: {', '.join(missing)}")
    return update(text, {name: render(name, results) for name in names if name in known})


def check(doc: Path = DOC, results: Path = RESULTS) -> str:
    """A unified diff of the page against its blocks rendered from JSON.

    Parameters
    ----------
    doc : Path
        The page (``docs/benchmarks.md``).
    results : Path
        The folder of ``NAME.json`` files.

    Returns
    -------
    str
        The diff; ``''`` when every block agrees with its JSON.
    """
    text = doc.read_text()
    fresh = rendered(text, results)
    diff = difflib.unified_diff(
        text.splitlines(keepends=True),
        fresh.splitlines(keepends=True),
        f"{doc} (as written)",
        f"{doc} (from {results}/*.json)",
    )
    return "".join(diff)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where a table differs")
    parser.add_argument("--doc", type=Path, default=DOC, help="the page (docs/benchmarks.md)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the JSON files' folder")
    args = parser.parse_args(argv)
    if args.check:
        diff = check(args.doc, args.results)
        if diff:
            sys.stdout.write(diff)
            print(f"{args.doc}: tables differ from {args.results}/*.json", file=sys.stderr)
            return 1
        print(f"{args.doc}: every table matches its JSON")
        return 0
    text = args.doc.read_text()
    fresh = rendered(text, args.results)
    if fresh != text:
        args.doc.write_text(fresh)
        print(f"{args.doc}: tables rewritten from {args.results}/*.json")
    else:
        print(f"{args.doc}: already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
