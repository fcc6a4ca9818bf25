"""Stopping: what a command starts ends with it, and a daemon exits soon after SIGTERM.

``fedstream demo`` (and every command that starts processes) stops all of them on SIGTERM,
SIGINT or SIGHUP within 10 s, and a second signal kills them at once; the device daemons exit
within 5 s of SIGTERM whether or not their broker is still there; the ServerApp ends the run
once its SuperLink has not answered for ``superlink-timeout`` seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from flwr.superlink.grid.http_grid import HttpGrid

from aggregator.exchange import SuperLinkUnreachableError, superlink_outage_bound
from deploy.brokers import EmbeddedBroker
from deploy.local import (
    SIGNAL_ECHO_S,
    ProcessGroup,
    ProcStat,
    descendants,
    fedstream_command,
    free_port,
    pids,
    proc_stat,
    wait_until,
)
from deploy.probes import start_ingest
from edge_client.runtime.constants import MQTT_VERSION_ENV
from edge_client.runtime.model_store import store_model
from edge_client.task.interface import Classification, init_model
from edge_client.wire.run_config import RunSettings
from tests.helpers import stop_command

#: The bounds the issue sets: a command that started processes, a device daemon.
COMMAND_STOP_S = 10.0
DAEMON_STOP_S = 5.0
#: A marker in the environment of everything a test starts: what still carries it runs on.
MARK = "FEDSTREAM_TEST_MARK"


def _marked(mark: str) -> list[int]:
    """Processes whose environment carries ``MARK=mark``, the zombies aside."""
    found = []
    for pid in pids():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours
            continue
        stat = proc_stat(pid)
        if f"{MARK}={mark}".encode() in environ and stat is not None and stat.state != "Z":
            found.append(pid)
    return found


def _python(code: str, mark: str, ignore_sigint: bool = False) -> subprocess.Popen[str]:
    """``python -c code`` in a session of its own, ``MARK=mark`` in its environment; with
    ``ignore_sigint`` it inherits SIGINT ignored, as a command a script started with ``&``."""

    def ignore() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, MARK: mark},
        start_new_session=True,
        preexec_fn=ignore if ignore_sigint else None,
    )


#: A command that starts a child which starts a grandchild in a session of its own (as
#: Flower's SuperLink runs its ServerApp), with the signals handled as fedstream's commands do.
SUPERVISOR = """
    import subprocess, sys, time
    from deploy.local import ProcessGroup, Stopped, stop_on_signals

    child = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', {grandchild!r}], start_new_session=True); "
        "{child_body}"
    )
    try:
        with stop_on_signals(lambda line: print(line, flush=True)), ProcessGroup({grace}) as group:
            group.start("child", [sys.executable, "-c", child])
            print("started", flush=True)
            while True:
                time.sleep(0.1)
    except Stopped as stop:
        print("stopped", stop.exit_code, flush=True)
        sys.exit(stop.exit_code)
"""


def _supervisor(
    mark: str, *, stubborn: bool, ignore_sigint: bool = False, grace: float = ProcessGroup.GRACE_S
) -> Any:
    grandchild = "import time; time.sleep(600)"
    # A stubborn child ignores SIGTERM: only SIGKILL (after the grace, or a second signal)
    body = (
        "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
        if stubborn
        else "time.sleep(600)"
    )
    code = SUPERVISOR.format(grandchild=grandchild, child_body=body, grace=grace)
    proc = _python(code, mark, ignore_sigint)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    assert wait_until(lambda: len(_marked(mark)) == 3, 20)  # it, its child, the grandchild
    return proc


def test_a_stop_signal_stops_every_process_started_even_those_in_their_own_session() -> None:
    # Prepare: a supervisor that inherited SIGINT ignored (started with `&` by a script)
    proc = _supervisor("sigint", stubborn=False, ignore_sigint=True)
    try:
        # Execute: Ctrl-C
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=COMMAND_STOP_S + 5)
        took = time.monotonic() - t0
    finally:
        stop_command(proc)
    # Assert: stopped, said so, the shell's code for SIGINT, nothing left
    assert proc.returncode == 130, out
    assert "SIGINT: stopping the 2 processes started here" in out and "stopped 130" in out
    assert took < COMMAND_STOP_S, took
    assert _marked("sigint") == []


def test_a_second_signal_kills_a_child_that_ignores_sigterm_at_once() -> None:
    # Prepare: its child ignores SIGTERM, so the first SIGTERM waits out the grace period;
    # a long one, so that a loaded host's slow first stop (CI once took over 5 s to end the
    # grandchild) still leaves the second signal well within it.
    grace = 60.0
    proc = _supervisor("again", stubborn=True, grace=grace)
    try:
        proc.send_signal(signal.SIGTERM)
        assert wait_until(lambda: len(_marked("again")) == 2, 30)  # the grandchild ended
        time.sleep(SIGNAL_ECHO_S + 0.5)  # a second stop, not the first one sent twice
        # Execute: SIGTERM again, well within the grace period
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=COMMAND_STOP_S)
        took = time.monotonic() - t0
    finally:
        stop_command(proc)
    # Assert: killed at once (not after the grace), and said so
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "SIGTERM again: killing" in out
    assert took < COMMAND_STOP_S < grace / 2, took
    assert wait_until(lambda: _marked("again") == [], 5)


def test_process_group_close_stops_grandchildren_in_their_own_session() -> None:
    # Prepare
    group = ProcessGroup(grace=5.0)
    child = group.start(
        "child",
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(600)'], start_new_session=True); time.sleep(600)",
        ],
    )
    assert wait_until(lambda: len(descendants(child.pid)) == 1, 20)
    (grandchild, _) = descendants(child.pid)[0]
    # Execute
    group.close()
    # Assert
    assert child.returncode is not None
    assert wait_until(lambda: getattr(proc_stat(grandchild), "state", "Z") == "Z", 5)


@pytest.mark.parametrize("reused", [False, True])
def test_a_reaped_childs_group_is_signalled_only_while_its_pid_is_not_anothers(
    reused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a child that ended and was reaped (its pid free for the next process); with
    # `reused`, /proc shows that pid held by a process started later.
    import deploy.local as local

    group = ProcessGroup(grace=1.0)
    child = group.start("child", [sys.executable, "-c", "pass"])
    child.wait()
    read = local.proc_stat
    later = ProcStat("S", 1, 10**12)
    monkeypatch.setattr(
        local, "proc_stat", lambda pid: later if reused and int(pid) == child.pid else read(pid)
    )
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    # Execute
    group.close()
    # Assert: the stragglers' SIGKILL goes to the child's group, never to a stranger's.
    assert (child.pid in {pgid for pgid, _ in sent}) is not reused


def _model_dir(path: Path) -> Path:
    settings = RunSettings(model_width=8)
    task = Classification(width=8)
    model = init_model(task, settings.shape, settings.num_classes, 0)
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    assert store_model(path, task, settings, weights, 1, "dev-a", None) is not None
    return path


@pytest.mark.parametrize("daemon", ["ingest", "publish", "infer", "fleet"])
def test_a_daemon_exits_soon_after_sigterm_once_its_broker_is_gone(
    daemon: str, procs: ProcessGroup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: the daemon connected to a broker (MQTT 3.1.1: the embedded one's), then the
    # broker gone
    monkeypatch.setenv(MQTT_VERSION_ENV, EmbeddedBroker.mqtt_version)
    with EmbeddedBroker(free_port()) as broker:  # stop() is safe twice
        proc, log = _start_daemon(daemon, broker.url, procs, tmp_path)
        time.sleep(1.0)
        broker.stop()
        time.sleep(1.5)  # it has noticed: reconnecting, or messages piling up
        # Execute
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(DAEMON_STOP_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{daemon} runs {DAEMON_STOP_S} s after SIGTERM:\n{log.read_text()}")
        took = time.monotonic() - t0
    # Assert: a clean exit within the bound; a publisher says what it could not deliver
    assert code == 0, log.read_text()[-3000:]
    assert took < DAEMON_STOP_S
    if daemon == "publish":
        assert "not delivered" in log.read_text(), log.read_text()[-3000:]


def _start_daemon(
    daemon: str, url: str, procs: ProcessGroup, tmp_path: Path
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start ``fedstream DAEMON`` on ``url`` and wait until it runs; the process, its log."""
    if daemon == "ingest":
        proc = start_ingest(procs, url, tmp_path / "dev-a.sqlite", connected=True)
        return proc, (tmp_path / "dev-a.sqlite").with_suffix(".log")
    args = {
        "publish": ["publish", "--broker", url, "--device-id", "dev-a", "--rate", "200"],
        "infer": [
            "infer", "--broker", url, "--device-id", "dev-a", "--model",
            str(_model_dir(tmp_path / "models")), "--drift", "none",
        ],
        "fleet": ["fleet", "--broker", url, "--watch", "--interval", "0.3", "--json"],
    }[daemon]  # fmt: skip
    log = tmp_path / f"{daemon}.log"
    proc = procs.start(daemon, fedstream_command(*args), log_path=log)
    started = {"publish": "publishing to", "infer": "connected to", "fleet": "["}[daemon]
    assert wait_until(lambda: started in log.read_text(), 60), log.read_text()
    return proc, log


def test_the_serverapp_gives_up_on_a_superlink_that_does_not_answer() -> None:
    # Prepare: Flower's deployment grid, as flwr-serverapp makes it, pointed at a port where
    # no SuperLink answers any more (Flower itself retries for ever)
    grid = HttpGrid(f"127.0.0.1:{free_port()}", insecure=True, token="run-token")
    # Execute
    t0 = time.monotonic()
    with pytest.raises(SuperLinkUnreachableError) as raised, superlink_outage_bound(grid, 2.0):
        list(grid.get_node_ids())
    took = time.monotonic() - t0
    # Assert: it gave up after the bound, and says why and what is kept
    assert 2.0 <= took < 30.0
    assert "has not answered for 2 s" in str(raised.value)
    assert "fedstream resume" in str(raised.value)


@pytest.mark.timeout(300)
def test_ctrl_c_stops_the_demo_and_everything_it_started(tmp_path: Path) -> None:
    # Prepare: the demo running rounds (its broker, publishers, ingest daemons, SuperLink,
    # SuperNodes and the ServerApp), started as a script's `&` would start it: SIGINT ignored
    code = f"""
        import sys
        from deploy.cli import main
        sys.argv = ["fedstream", "demo", "--no-live", "--devices", "2", "--rounds", "50",
                    "--out", {str(tmp_path)!r}]
        main()
    """
    proc = _python(code, "demo", ignore_sigint=True)
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:  # until a round has been recorded
            lines.append(line)
            if " round 1/50" in line:
                break
        assert _marked("demo"), "".join(lines)
        # Execute: Ctrl-C, as a terminal sends it to the foreground process group
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=COMMAND_STOP_S + 10)
        took = time.monotonic() - t0
    finally:
        stop_command(proc)
    # Assert: every process it started ended within the bound, and it said so
    assert took < COMMAND_STOP_S, (took, out)
    assert proc.returncode == 130, out
    assert "SIGINT: stopping the" in out and "nothing it started is running" in out, out
    assert _marked("demo") == []
