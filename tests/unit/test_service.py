"""The aggregator as a continuous service on the in-process runner: no round limit, stopped
by SIGTERM or a STOP file after a whole round, resumed where it stopped; skipped rounds;
bounded metrics and exports."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from aggregator.checkpoint import load_checkpoint, read_state
from aggregator.round_log import (
    HOME_ENV,
    RoundRecord,
    append_record,
    read_metrics,
    read_rotated,
    rounds_only,
)
from aggregator.server_app import run_rounds
from aggregator.session import NO_OUT_DIR, with_run_dir
from aggregator.stopping import STOP_FILE, request_stop
from deploy import aggregator_service, flower
from deploy.cli import app
from deploy.inprocess import InProcessGrid, VirtualDevice
from deploy.local import wait_until
from deploy.report import in_round_order, training_time
from edge_client.task.interface import Classification, init_model
from edge_client.wire.artifact import list_versions
from edge_client.wire.run_config import RunSettings
from tests.helpers import Fast, Fleet, round_record

REPO = Path(__file__).resolve().parents[2]


def _recorded(calls: list[object], answer: str) -> Callable[..., str]:
    """A stand-in that records its calls' arguments and answers ``answer``."""

    def call(*args: object) -> str:
        calls.append(args)
        return answer

    return call


def _checkpoint_of_run_7(tmp: Path, fast: Fast, fleet: Fleet) -> Path:
    """A one-round run's checkpoint folder, written as Flower's run 7."""
    ckpt = tmp / "ckpt"
    _run(tmp / "b", fleet(1), fast(num_rounds=1, checkpoint_dir=str(ckpt)), run_id=7)
    return ckpt


def _run(
    tmp: Path, devices: list[VirtualDevice], settings: RunSettings, **kw: object
) -> list[RoundRecord]:
    grid = InProcessGrid(devices, tmp, settings)
    try:
        return rounds_only(run_rounds(grid, settings, **kw))  # type: ignore[arg-type]
    finally:
        grid.close()


def test_sigterm_ends_a_continuous_run_after_a_whole_round_and_resume_continues(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: a run with no round limit in a child process, exporting every round.
    dirs = {k: tmp_path / k for k in ("ckpt", "out", "exports")}
    script = textwrap.dedent(
        f"""
        import logging, sys
        logging.basicConfig(level=logging.INFO)
        from tests.conftest import FAST
        from aggregator.server_app import run_rounds
        from pathlib import Path
        from deploy.inprocess import InProcessGrid, VirtualDevice
        from edge_client.wire.run_config import RunSettings
        s = RunSettings(**{{**FAST, "num_rounds": 0, "checkpoint_dir": {str(dirs["ckpt"])!r},
            "out_dir": {str(dirs["out"])!r}, "export_dir": {str(dirs["exports"])!r},
            "export_every": 1, "controller_probe": 0}})
        devices = [VirtualDevice("dev-0"), VirtualDevice("dev-1")]
        run_rounds(InProcessGrid(devices, Path({str(tmp_path / "b1")!r}), s), s)
        print("returned", flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        metrics = dirs["out"] / "metrics.jsonl"
        assert wait_until(lambda: len(read_metrics(metrics)) >= 2 or proc.poll() is not None, 120)
        assert proc.poll() is None, proc.communicate()[0].decode()
        # Execute: SIGTERM, as systemd stops a service.
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Assert: exit 0, after a whole round: checkpoint, metrics and export agree.
    text = out.decode()
    assert proc.returncode == 0, text
    assert "SIGTERM: stopping after the current round" in text and "returned" in text
    last = read_state(dirs["ckpt"])["server-round"]  # type: ignore[index]
    assert [r.round for r in read_metrics(metrics)] == list(range(1, last + 1))
    assert list_versions(dirs["exports"])[-1].version == last

    # Execute: resume for two more rounds.
    settings = fast(
        num_rounds=last + 2,
        resume=True,
        checkpoint_dir=str(dirs["ckpt"]),
        out_dir=str(dirs["out"]),
        export_dir=str(dirs["exports"]),
        export_every=1,
    )
    records = _run(tmp_path / "b2", fleet(1, 1), settings)
    # Assert: the rounds and the model versions go on from where SIGTERM left them.
    assert [r.round for r in records] == [last + 1, last + 2]
    assert [r.round for r in read_metrics(metrics)] == list(range(1, last + 3))
    assert [v.version for v in list_versions(dirs["exports"])][-2:] == [last + 1, last + 2]


def test_a_stop_file_ends_an_asynchronous_run_after_the_aggregation(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: an asynchronous run with no version limit; a stale STOP file from before.
    ckpt = tmp_path / "ckpt"
    request_stop(ckpt)
    settings = fast(
        mode="async", num_rounds=0, checkpoint_dir=str(ckpt), controller_probe=0, async_buffer=1
    )

    def stop_at_4(record: RoundRecord) -> bool:
        if record.round == 4:
            request_stop(ckpt)
        return False

    # Execute
    records = _run(tmp_path / "b", fleet(1, 2), settings, stop=stop_at_4)
    # Assert: the stale file did not stop it; the new one did, after version 4, and is gone.
    assert [r.round for r in records] == [1, 2, 3, 4]
    assert read_state(ckpt)["server-round"] == 4  # type: ignore[index]
    assert not (ckpt / STOP_FILE).exists()


def test_fedstream_stop_ends_a_bounded_run_after_a_round_and_says_which(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: a 30-round run in a thread (as a ServerApp on another host: no signal reaches
    # it), its checkpoints in ckpt
    ckpt = tmp_path / "ckpt"
    settings = fast(num_rounds=30, checkpoint_dir=str(ckpt), controller_probe=0)
    records: list[RoundRecord] = []
    run = threading.Thread(target=lambda: records.extend(_run(tmp_path / "b", fleet(1), settings)))
    run.start()
    try:
        assert wait_until(lambda: (ckpt / "state.json").exists(), timeout=120.0)
        # Execute: the operator's command, waiting for the run to take it
        result = CliRunner().invoke(app, ["stop", str(ckpt), "--wait", "120"])
    finally:
        run.join(timeout=300)
    # Assert: it stopped after a whole round, checkpointed, and said which
    last = read_state(ckpt)["server-round"]  # type: ignore[index]
    assert result.exit_code == 0, result.output
    assert f"the run stopped after round {last}: `fedstream resume {ckpt} --connection" in (
        " ".join(result.output.split())
    )
    assert not run.is_alive() and [r.round for r in records][-1] == last < 30


def test_fedstream_stop_refuses_a_missing_folder_and_says_when_no_run_took_it(
    tmp_path: Path,
) -> None:
    # Execute: a mistyped folder; a folder no run watches, waited on briefly
    missing = CliRunner().invoke(app, ["stop", str(tmp_path / "ckpt-typo")])
    idle = CliRunner().invoke(app, ["stop", str(tmp_path), "--wait", "0.5"])
    # Assert: nothing written for the typo; the idle request left, and said so
    assert missing.exit_code == 2 and "no such folder" in missing.output
    assert not (tmp_path / "ckpt-typo").exists()
    assert idle.exit_code == 1 and "no run took" in idle.output
    assert (tmp_path / STOP_FILE).exists()


def test_resume_waits_for_the_run_that_wrote_the_checkpoint_to_end(
    tmp_path: Path, fast: Fast, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a checkpoint written by Flower's run 7, which Flower lists as running twice
    # more (its aggregator died; the heartbeat has not lapsed yet), then as failed
    ckpt = _checkpoint_of_run_7(tmp_path, fast, fleet)
    statuses = iter(["running", "running", "finished:failed"])
    asked: list[str] = []

    def status(run_id: str, *_: object) -> dict[str, str]:
        asked.append(run_id)
        return {"status": next(statuses)}

    monkeypatch.setattr(flower, "run_status", status)
    monkeypatch.setattr(flower, "submit_run", lambda *_: "8")
    monkeypatch.setattr(flower, "RESUME_POLL_S", 0.01)
    told: list[str] = []
    # Execute
    run_id, last, total = flower.resume_run(ckpt, REPO, "fleet", on_wait=told.append)
    # Assert: asked about run 7 until it ended, told the operator once, then submitted
    assert read_state(ckpt)["run-id"] == 7  # type: ignore[index]
    assert asked == ["7", "7", "7"] and (run_id, last, total) == ("8", 1, 1)
    assert len(told) == 1 and "run 7" in told[0] and "flwr stop 7 fleet" in told[0]


def test_resume_refuses_while_the_run_that_wrote_the_checkpoint_lives(
    tmp_path: Path, fast: Fast, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: run 7 never ends
    ckpt = _checkpoint_of_run_7(tmp_path, fast, fleet)
    monkeypatch.setattr(flower, "run_status", lambda *_: {"status": "running"})
    submitted: list[object] = []
    monkeypatch.setattr(flower, "submit_run", _recorded(submitted, "8"))
    # Execute / Assert: refused with the two ways out, nothing submitted
    with pytest.raises(flower.FlowerError, match="still running after 0 s") as err:
        flower.resume_run(ckpt, REPO, "fleet", wait_s=0.0)
    assert "fedstream stop" in str(err.value) and "flwr stop 7 fleet" in str(err.value)
    assert not submitted


def test_serve_follows_the_run_of_its_checkpoint_while_it_lives_instead_of_resuming(
    tmp_path: Path, fast: Fast, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: the service restarted while its run 7 went on (Flower lists it running once
    # more, then it ends by itself)
    ckpt = _checkpoint_of_run_7(tmp_path, fast, fleet)
    statuses = iter(["running", "running", "finished:failed"])
    monkeypatch.setattr(flower, "run_status", lambda *_: {"status": next(statuses)})
    monkeypatch.setattr(aggregator_service, "run_status", flower.run_status)
    submitted: list[object] = []
    monkeypatch.setattr(flower, "submit_run", _recorded(submitted, "8"))
    monkeypatch.setattr(aggregator_service, "submit_run", flower.submit_run)
    # Execute
    code = aggregator_service.serve(REPO, ckpt, {}, "fleet", poll_s=0.01)
    # Assert: no second run on the checkpoint; the followed run's end is the service's (1:
    # systemd starts it again, and then it resumes)
    assert code == 1 and not submitted


def test_rounds_without_enough_fresh_samples_are_skipped_and_counted(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: a round needs more fresh samples than the devices can train on.
    ckpt = tmp_path / "ckpt"
    settings = fast(num_rounds=3, min_fresh_samples=10**6, checkpoint_dir=str(ckpt))
    initial = init_model(Classification(), settings.shape, settings.num_classes, settings.seed)
    # Execute
    records = _run(tmp_path / "b", fleet(1, 1), settings)
    # Assert: every round skipped with its reason, the model as it started.
    assert [r.skipped for r in records] == ["too-few-fresh-samples"] * 3
    assert records[-1].skipped_rounds == {"too-few-fresh-samples": 3}
    saved = load_checkpoint(ckpt).arrays.to_torch_state_dict()  # type: ignore[union-attr]
    for name, tensor in initial.state_dict().items():
        assert torch.equal(saved[name], tensor)


def test_metrics_are_rotated_past_their_size_and_the_oldest_dropped(tmp_path: Path) -> None:
    # Prepare
    path = tmp_path / "metrics.jsonl"
    line = round_record()
    size = len(line.to_json()) + 1
    # Execute: 20 records, rotated past 3 lines' worth, 2 rotated files kept.
    for i in range(20):
        append_record(
            path, RoundRecord(**{**line.__dict__, "round": i + 1}), max_bytes=3 * size, keep=2
        )
    # Assert: 3 files of at most 3 lines: the newest 8 or 9 rounds, in order.
    files = [path.with_name(f"{path.name}.2"), path.with_name(f"{path.name}.1"), path]
    assert not path.with_name(f"{path.name}.3").exists()
    rounds = [json.loads(x)["round"] for f in files for x in f.read_text().splitlines()]
    assert rounds == list(range(rounds[0], 21)) and len(rounds) >= 7
    assert all(len(f.read_text().splitlines()) <= 3 for f in files)
    assert [r.round for r in read_rotated(path)] == rounds


def test_a_long_run_keeps_its_files_bounded(tmp_path: Path, fast: Fast, fleet: Fleet) -> None:
    # Prepare: many short rounds with every bound small; the run's files are counted after.
    dirs = {k: tmp_path / k for k in ("ckpt", "out", "exports")}
    bounds = {"export_every": 2, "export_keep": 2, "metrics_max_mb": 0.02, "metrics_keep": 1}
    settings = fast(
        num_rounds=40,
        checkpoint_dir=str(dirs["ckpt"]),
        out_dir=str(dirs["out"]),
        export_dir=str(dirs["exports"]),
        **bounds,
        local_steps=1,
        controller_probe=0,
        eval_data="",
    )
    # Execute
    _run(tmp_path / "b", fleet(1, 1), settings)
    # Assert: one checkpoint model, two exports, two metrics files at most.
    assert len(list(dirs["ckpt"].glob("model-*.pt"))) == 1
    assert [v.version for v in list_versions(dirs["exports"])] == [38, 40]
    assert sorted(p.name for p in dirs["out"].iterdir()) == ["metrics.jsonl", "metrics.jsonl.1"]
    assert sum(p.stat().st_size for p in dirs["out"].iterdir()) < 2 * 0.02e6 + 20_000
    assert np.isfinite(read_metrics(dirs["out"] / "metrics.jsonl")[-1].accuracy)


def test_report_draws_any_runs_metrics(tmp_path: Path, fast: Fast, fleet: Fleet) -> None:
    # Prepare: a run's out-dir, as any run with out-dir leaves it.
    out = tmp_path / "out"
    _run(tmp_path / "b", fleet(1, 1), fast(num_rounds=3, out_dir=str(out)))
    # Execute
    result = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "r")])
    missing = CliRunner().invoke(app, ["report", str(tmp_path / "nothing")])
    # Assert
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["rounds"] == 3 and len(summary["accuracy"]) == 3
    assert (tmp_path / "r" / "report.png").stat().st_size > 10_000
    assert missing.exit_code == 2


def test_report_orders_a_resumed_run_by_round_and_training_time(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: 2 rounds, then a resume for 2 more into the same out-dir, no eval-data
    out, ckpt = tmp_path / "out", str(tmp_path / "ckpt")
    settings = fast(num_rounds=2, out_dir=str(out), checkpoint_dir=ckpt, eval_data="")
    _run(tmp_path / "b1", fleet(1, 1), settings)
    _run(tmp_path / "b2", fleet(1, 1), replace(settings, num_rounds=4, resume=True))
    records = read_metrics(out / "metrics.jsonl")
    # Execute
    result = CliRunner().invoke(app, ["report", str(out)])
    ordered = in_round_order(records)
    times = training_time(ordered)
    # Assert: training time never runs backwards over the resume (the run's own clock,
    # `run-wall-s`, starts again there; whether round 3's is below round 2's depends on how
    # long the resumed run took to start, so it is not asserted), and the line says what
    # there is, no None; the report lands next to the metrics
    assert result.exit_code == 0, result.output
    assert [r.round for r in ordered] == [1, 2, 3, 4]
    assert all(r.wall_s > 0 for r in ordered)
    assert times == sorted(times) and times[-1] == pytest.approx(sum(r.wall_s for r in ordered))
    assert "None" not in result.output and "no eval-data" in result.output
    assert (out / "report.png").exists() and (out / "summary.json").exists()


def test_each_round_logs_one_progress_line(
    tmp_path: Path, fast: Fast, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare
    caplog.set_level(logging.INFO, logger="aggregator")
    # Execute
    records = _run(tmp_path / "b", fleet(1, 1), fast(num_rounds=2))
    # Assert: what `flwr log` shows of a deployed run, one line a round, from its record.
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("round ")]
    assert lines == [r.progress(2, 2) for r in records]
    assert lines[0].startswith("round 1/2: accuracy ") and "2 of 2 devices" in lines[0]
    assert f"{records[1].bytes_up / 1e6:.2f} MB up" in lines[1]


def test_a_flower_run_writes_its_metrics_to_the_documented_place_unless_told_not_to(
    fast: Fast, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    # Execute
    default, explicit, none = (
        with_run_dir(fast(out_dir=out), 42).out_dir for out in ("", "/srv/run", NO_OUT_DIR)
    )
    # Assert
    assert default == str(tmp_path / "home" / "runs" / "42")
    assert (explicit, none) == ("/srv/run", "")
