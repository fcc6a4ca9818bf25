"""The fingerprint guards refactorings: three fixed-seed in-process runs must behave as
``dev/fingerprint.jsonl`` recorded (about 6 s)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LINES = ROOT / "dev" / "fingerprint.jsonl"


def fingerprint_module() -> ModuleType:
    """``dev/fingerprint.py`` as a module (``dev`` is not a package)."""
    spec = importlib.util.spec_from_file_location("fingerprint", ROOT / "dev" / "fingerprint.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recorded() -> list[dict[str, Any]]:
    return [json.loads(line) for line in LINES.read_text().splitlines() if line]


def scaled(lines: list[dict[str, Any]], by: float) -> list[dict[str, Any]]:
    """``lines`` with every virtual second multiplied by ``by``."""
    return [{**e, "virtual_s": [v * by for v in e["virtual_s"]]} for e in lines]


def test_the_runs_behave_as_the_fingerprint_recorded() -> None:
    # Execute: the three runs now (on one torch thread, as recorded; the suite's count after)
    import torch

    fp = fingerprint_module()
    threads = torch.get_num_threads()
    try:
        now = [json.loads(line) for line in fp.lines()]
    finally:
        torch.set_num_threads(threads)
    # Assert: plans, modes and aggregated devices exact; accuracies and virtual seconds
    # within the stated tolerances; the weights' hash where the machine is the recorded one.
    # A change of behaviour fails here until `python dev/fingerprint.py > dev/fingerprint.jsonl`
    # is run in the same commit (and the commit says why).
    assert fp.compare(recorded(), now) == []


def test_the_comparison_catches_a_change_and_spares_another_machines_hash() -> None:
    # Prepare: the recorded lines, and copies changed as a refactoring might change them
    fp = fingerprint_module()
    before = recorded()
    elsewhere = [{**b, "sha256": "0" * 64, "machine": {"cpu": "other"}} for b in before]
    same_machine = [{**b, "sha256": "0" * 64} for b in before]
    slower = [{**b, "virtual_s": [v + 1e-3 for v in b["virtual_s"]]} for b in before]
    replanned = [{**b, "planned": list(reversed(b["planned"]))} for b in before]
    # Execute / Assert
    assert fp.compare(before, elsewhere) == []  # another CPU's float summation
    # another CPU's weights compress to a few bytes more (10 bytes at 10 Mbit/s: 8 us); a
    # per-cent of a round is a change of behaviour there too
    assert fp.compare(before, scaled(elsewhere, 1 + fp.VIRTUAL_ELSEWHERE_RELATIVE / 2)) == []
    assert all("virtual_s" in d for d in fp.compare(before, scaled(elsewhere, 1.01)))
    assert len(fp.compare(before, same_machine)) == len(before)
    assert all("virtual_s" in d for d in fp.compare(before, slower))
    assert any("planned" in d for d in fp.compare(before, replanned))
