"""The README and the docs pages: the README short and opening with the two commands, every
page it names there, every relative link resolving, and the benchmark tables and the Results
bullets of ``docs/benchmarks.md`` equal to what ``dev/bench_tables.py`` renders from their
JSON (a changed figure fails the check, a missing key fails loudly)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SCRIPT = ROOT / "dev" / "bench_tables.py"

#: The two set-up commands the README opens with (CI and newcomers run them as written).
DEMO_COMMAND = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[demo]' && fedstream demo"
)
TEST_COMMAND = "bash dev/test.sh"

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")

#: The deployment benchmark's variants compared over alternated repetitions.
COMPARED = ("plain-flower-tuned", "plain-flower-tuned-pull", "fedstream-idle", "fedstream-live")


@cache
def bench_tables() -> ModuleType:
    """``dev/bench_tables.py`` as a module (``dev`` is not a package)."""
    spec = importlib.util.spec_from_file_location("bench_tables", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _relative_links(path: Path) -> list[str]:
    """The link targets of a Markdown file that are neither URLs nor anchors on the page,
    outside fenced code."""
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text())
    return [
        target
        for target in LINK.findall(text)
        if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")
    ]


def test_readme_is_short_and_opens_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines (at most 250)"
    assert lines[0].startswith("# ")
    fence = lines.index("```bash")
    assert fence <= 3, "the commands come first"
    assert lines[fence + 1].startswith(DEMO_COMMAND + "  #")
    assert lines[fence + 2].startswith(TEST_COMMAND + " ")
    assert lines[fence + 3] == "```"


def test_at_least_five_docs_pages_all_linked_from_the_readme() -> None:
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert len(pages) >= 5, pages
    linked = {Path(t.split("#")[0]).name for t in _relative_links(README) if t.startswith("docs/")}
    assert set(pages) <= linked, f"docs pages the README does not name: {set(pages) - linked}"


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub makes of a Markdown file's headings."""
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text())
    headings = re.findall(r"(?m)^#+ (.*)$", text)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for target in _relative_links(page):
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
        text = re.sub(r"(?ms)^```.*?^```", "", page.read_text())
        for anchor in re.findall(r"\]\(#([^)\s]+)\)", text):
            if anchor not in _anchors(page):
                broken.append(f"{page.relative_to(ROOT)}: #{anchor} (no such heading)")
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


def test_the_benchmark_tables_match_their_json() -> None:
    diff = bench_tables().check()
    assert diff == "", "docs/benchmarks.md differs from bench/results/*.json:\n" + diff


def test_every_benchmark_with_results_has_its_tables_on_the_page() -> None:
    module = bench_tables()
    text = module.DOC.read_text()
    for name in module.RENDERERS:
        assert (module.RESULTS / f"{name}.json").exists(), name
        assert f"<!-- bench:{name} -->" in text and f"<!-- /bench:{name} -->" in text, name
    for name in module.FOLDER_RENDERERS:
        assert f"<!-- bench:{name} -->" in text and f"<!-- /bench:{name} -->" in text, name


def _tamper(results: Path) -> None:
    """Change one figure of the scale benchmark's JSON: the first row's round time."""
    path = results / "scale.json"
    doc: dict[str, Any] = json.loads(path.read_text())
    doc["entries"][0]["round_s"] += 1.0
    path.write_text(json.dumps(doc))


def test_a_changed_json_figure_fails_the_check(tmp_path: Path) -> None:
    module = bench_tables()
    results = shutil.copytree(module.RESULTS, tmp_path / "results")
    page = tmp_path / "benchmarks.md"
    shutil.copy(module.DOC, page)
    assert module.check(page, results) == ""
    _tamper(results)
    diff = module.check(page, results)
    assert diff and "-| none | 10 |" in diff and "+| none | 10 |" in diff

    # The script says so too: exit 1 and the diff; without --check it rewrites the table.
    argv = [sys.executable, str(SCRIPT), "--doc", str(page), "--results", str(results)]
    checked = subprocess.run([*argv, "--check"], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 1 and "+| none | 10 |" in checked.stdout
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    assert module.check(page, results) == ""
    assert page.read_text() != module.DOC.read_text()


def _results_block(text: str) -> str:
    """The body between the page's ``bench:results`` markers."""
    match = re.search(r"<!-- bench:results -->\n(.*?)<!-- /bench:results -->", text, re.S)
    assert match, "docs/benchmarks.md has no bench:results markers"
    return match.group(1)


def test_the_results_section_is_generated_from_the_json() -> None:
    module = bench_tables()
    results = module.bench_results

    block = _results_block(module.DOC.read_text())

    assert block == results.render(module.RESULTS) + "\n"
    assert block.count("\n- ") + block.startswith("- ") == len(results.BULLETS)
    assert "results" in module.FOLDER_RENDERERS and "results" not in module.RENDERERS


def _straggler_speedup(doc: dict[str, Any]) -> float:
    """Async's mean speedup over sync-dynamic with the straggler, as the Results quote it."""
    ttt = {
        (e["method"], e["seed"]): e["time-to-target-s"]
        for e in doc["entries"]
        if e["scenario"] == "straggler"
    }
    seeds = sorted({seed for _, seed in ttt})
    ratios = [float(ttt[("sync-dynamic", s)]) / float(ttt[("async", s)]) for s in seeds]
    return sum(ratios) / len(ratios)


def test_a_changed_results_figure_fails_the_check(tmp_path: Path) -> None:
    # Prepare: the page and a copy of the JSON whose straggler speedup (async) moves
    module = bench_tables()
    results = shutil.copytree(module.RESULTS, tmp_path / "results")
    page = tmp_path / "benchmarks.md"
    shutil.copy(module.DOC, page)
    path = results / "async.json"
    doc: dict[str, Any] = json.loads(path.read_text())
    before = _straggler_speedup(doc)
    for e in doc["entries"]:
        if e["scenario"] == "straggler" and e["method"] == "async":
            e["time-to-target-s"] /= 2
    path.write_text(json.dumps(doc))
    after = _straggler_speedup(doc)

    # Execute
    diff = module.check(page, results)

    # Assert: the Results bullet's figure is the one that changed, both ways in the diff
    removed = "".join(line for line in diff.splitlines() if line.startswith("-"))
    added = "".join(line for line in diff.splitlines() if line.startswith("+"))
    assert f"{before:.2f}x" in removed and f"{after:.2f}x" in added
    assert f"{after:.2f}x" in _results_block(module.rendered(page.read_text(), results))


def test_a_missing_json_key_fails_loudly(tmp_path: Path) -> None:
    # Prepare: hetero.json without the orchestration figure its Results bullet quotes
    module = bench_tables()
    results = shutil.copytree(module.RESULTS, tmp_path / "results")
    path = results / "hetero.json"
    doc: dict[str, Any] = json.loads(path.read_text())
    del doc["flower_round_s"]
    path.write_text(json.dumps(doc))

    # Execute / Assert: no bullet is made up without it
    with pytest.raises(KeyError, match="flower_round_s"):
        module.check(module.DOC, results)


def _deployment_with_repetitions(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (deployment.json) as a run with alternated repetitions writes it: each
    compared variant's ratios over both plain baselines."""
    ratios = {
        variant: {
            base: {"per_repetition": [r, r + 0.1], "mean": r + 0.05, "min": r, "max": r + 0.1}
            for base, r in (("plain-flower-tuned", 0.8), ("plain-flower-tuned-pull", 1.05))
        }
        for variant in COMPARED
    }
    return {**doc, "repetitions": 2, "ratios": ratios}


def test_the_deployment_bullet_reads_both_formats() -> None:
    # Prepare: the committed JSON, and the same as the repetitions' format writes it
    module = bench_tables()
    old: dict[str, Any] = json.loads((module.RESULTS / "deployment.json").read_text())
    old = {k: v for k, v in old.items() if k not in ("repetitions", "ratios")}
    new = _deployment_with_repetitions(old)

    # Execute
    one_run = " ".join(module.bench_results.deployment(old).split())
    repeated = " ".join(module.bench_results.deployment(new).split())
    table = module.RENDERERS["deployment"](new)

    # Assert: the older JSON is said to be one run; the newer gives mean (min-max) twice
    assert "one run per variant" in one_run and "0.2 s pull loop" in one_run
    assert "2 alternated repetitions" in repeated and "one run" not in repeated
    assert "0.85x (0.80-0.90)" in repeated and "1.10x (1.05-1.15)" in repeated
    assert "goal <= 1.2x: met, met" in repeated
    assert "vs plain-flower-tuned-pull, mean (min-max, repetitions)" in table


DEFAULTS_TABLE = re.compile(r"<!-- defaults:table -->\n(?P<body>.*?)<!-- /defaults:table -->", re.S)


def test_the_training_page_names_the_defaults_the_run_config_has() -> None:
    # Prepare: the training page's table of the controller's and aggregation's defaults.
    from edge_client.wire.run_config import knobs

    found = DEFAULTS_TABLE.search((DOCS / "training.md").read_text())
    assert found, "docs/training.md lost its <!-- defaults:table --> block"
    rows = [line.split("|")[1:3] for line in found["body"].splitlines()[2:] if line.strip()]
    # Execute: each row's key and default as the page writes them.
    named = {key.strip().strip("`"): value.strip().strip("`") for key, value in rows}
    # Assert: the keys the controller and the aggregation are chosen by, each at the default
    # the run config declares.
    declared = knobs()
    assert set(named) >= {
        "global-batch",
        "b-min",
        "b-max",
        "lr-batch",
        "aggregation",
        "controller-probe",
        "deadband",
        "controller-smoothing",
        "controller-period",
    }
    assert {k: str(declared[k]["default"]) for k in named} == named


def test_the_room_the_defaults_bullet_gives_is_the_best_split_on_its_line() -> None:
    # Prepare: a step-time line with no fixed part and no transfers, where the best split
    # is worked out by hand: each device takes T / slowdown samples, and the cut of the
    # slowest device's round is 1 - T / (its slowdown x the equal share).
    results = bench_tables().bench_results
    doc = {"step-cost": {"a": 0.0, "c": 1e-5, "sigma": 0.0}}

    # Execute
    text = " ".join(results._room(doc, transfer_s=0.0).split())

    # Assert: HL4 (8/3, 8/3, 4, 1): T = B / 2, cut 1 - (B / 2) / (4 B / 4) = 50 % at any B;
    # HL8 (16/3, 16/3, 8, 1): T = B / 1.5, cut 1 - 1 / 1.5 = 67 %; b-max 256 caps the fast
    # device at half of 512, T = 512, cut 50 %; the straggler (1, 1, 1, 10): T = 512 / 3.1,
    # cut 1 - T / 1280 = 87 %; b-min 4 and 16 bind nobody on this line.
    assert "B = 128 50 % / 67 %, B = 256 50 % / 67 %, B = 512 50 % / 67 %" in text
    assert "b-min 4 67 % at HL8 and 87 % with the straggler (b-min 8: 87 %)" in text
    assert "b-min 16 67 % at HL8, b-max 256 50 % at HL8" in text


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_a_section_is_stale_once_its_sources_change_and_only_then(tmp_path: Path) -> None:
    # Prepare: a history where a result was measured on the first commit of two files
    results = bench_tables().bench_results
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "model.py").write_text("a = 1\n")
    (repo / "other.py").write_text("b = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "one")
    measured = _git(repo, "rev-parse", "HEAD")
    section = {"commit": measured, "tree-clean": True, "sources": ["model.py"]}
    # Execute / Assert: fresh while its sources are as measured (another file may change)
    (repo / "other.py").write_text("b = 2\n")
    _git(repo, "commit", "-qam", "two")
    assert results.staleness(section, repo) is None
    # ... stale once a source changes, committed or only in the working tree
    (repo / "model.py").write_text("a = 2\n")
    assert "its sources changed since" in str(results.staleness(section, repo))
    assert results.changed_sources(section, repo) == ["model.py"]
    # ... and whatever cannot name its code
    for broken, why in (
        ({**section, "commit": None}, "names no commit"),
        ({**section, "sources": []}, "names no sources"),
        ({**section, "tree-clean": False}, "with changes beside it"),
        ({**section, "commit": "0" * 40}, "not a commit of this history"),
    ):
        assert why in str(results.staleness(broken, repo))


def test_a_re_run_section_is_checked_on_its_own() -> None:
    # Prepare: a file measured on one commit whose controller section was re-run on another
    results = bench_tables().bench_results
    doc = {"commit": "a", "sources": ["x"], "entries": [], "controllers-run": {"commit": "b"}}
    # Execute / Assert
    assert [where for where, _ in results.sections(doc)] == ["(file)", "controllers-run"]


def test_a_verdict_is_met_only_when_every_seed_meets_it() -> None:
    # Prepare: injection's fraction of IID above the goal on the mean, below it in one seed;
    # fedstream's idle round within the goal on the mean, past it in one repetition
    results = bench_tables().bench_results
    noniid = json.loads((bench_tables().RESULTS / "noniid.json").read_text())
    inj = next(
        e
        for e in noniid["entries"]
        if e["partition"] == "one-label" and e["method"] == "inject-0.25-0.25"
    )
    inj["iid_fraction_per_seed"] = [0.99, 0.99, 0.85]  # mean 0.943 >= 0.9
    one = noniid["goal"]["partitions"]["one-label"]
    one.update(inject_iid_fraction=0.943, inject_met=True, inject_seeds_met=2)
    deployment = json.loads((bench_tables().RESULTS / "deployment.json").read_text())
    idle = deployment["ratios"]["fedstream-idle"]
    for base in idle.values():
        base.update(per_repetition=[1.0, 1.0, 1.5], mean=1.17, min=1.0, max=1.5)  # goal 1.2x
    # Execute
    noniid_bullet = " ".join(results.noniid(noniid).split())
    deployment_bullet = " ".join(results.deployment(deployment).split())
    # Assert: the seed (the repetition) that misses decides, whatever the mean says
    assert "in every seed: MISSED, 2 of 3 seeds" in noniid_bullet
    assert "(goal <= 1.2x: MISSED, MISSED)" in deployment_bullet
