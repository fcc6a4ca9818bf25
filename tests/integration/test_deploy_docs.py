"""The deployment walkthrough of ``docs/deployment.md``, run as written (2-3 minutes).

Every ``bash`` block of the walkthrough runs verbatim, in order, as a non-root user in its
home folder, with its variables pointed into a temporary folder and at free ports, the
aggregator, both devices and their sensors on this one host: ``install.sh`` into a prefix,
Mosquitto (TLS, passwords, the ACL) on Debian's stock layout, a TLS SuperLink admitting
registered SuperNodes, the handover folders, two devices' ingest daemons and SuperNodes
(their blocks without access to the aggregator's files), a run, stopped after a round and
resumed, the aggregator killed after the next checkpoint, the run resumed again, the fleet
view, the report and a device's status. ``sudo``, ``systemctl``, ``apt-get`` and ``usermod``
are the shims in ``tests/shims`` (what they do and do not do is written there); the test
itself plays the operator's stop and resume timing and systemd's restart of the killed
SuperLink. Then it checks what the guide promises: every round once, the runs' ends, logs
without colour codes, the CA key outside the broker's folder, handover folders of mode 700,
nothing written into the checkout.

Run as root (CI), the blocks run as uid 65534 with one capability, CAP_DAC_READ_SEARCH, so that
they can reach this machine's interpreter under /root; they can write only their own folder.
Where the interpreter or the test's venv lies where that user cannot go (a checkout or a venv
in a 0700 folder), each is bound into the test's folder for the blocks (tested from a 0700
checkout under /root, and by CI, whose scratch venv is in a 0700 folder).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from aggregator.round_log import read_metrics, rounds_only
from deploy.brokers import mosquitto_available
from deploy.local import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "deployment.md"
SHIMS = ROOT / "tests" / "shims"
DEVICES = ("pi-1", "pi-2")
# Stopped after one to four (the operator's stop comes late on a loaded machine: after round
# 4 beside a CPU hog), crashed after the next, finished by the second resume.
ROUNDS = 7
NOBODY = 65534
# A block that stops the run (the program may be named by its path, quoted).
STOP = re.compile(r'fedstream"? stop ')
# Where device blocks find the aggregator's files: nowhere (they read the handover folder).
AGGREGATOR_ONLY = "/nonexistent/aggregator-only"
UNITS = (
    "fedstream-ingest@.service",
    "fedstream-supernode@.service",
    "fedstream-agent@.service",
    "fedstream-superlink.service",
    "fedstream-aggregator.service",
)


@dataclass(frozen=True)
class Block:
    """One fenced ``bash`` block: its info-string words after ``bash``, its code, its line."""

    tags: frozenset[str]
    code: str
    line: int


def doc_blocks(text: str) -> list[Block]:
    """The ``bash`` blocks of a Markdown text, in order (``sh`` and others are not run)."""
    blocks = []
    for match in re.finditer(r"(?ms)^```bash([^\n]*)\n(.*?)^```", text):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(frozenset(match.group(1).split()), match.group(2), line))
    return blocks


class Walkthrough:
    """Runs blocks as the docs' user, each after the first (the variables) in a new shell."""

    def __init__(self, tmp: Path, env: dict[str, str], variables: str, as_user: list[str]) -> None:
        self.tmp, self.env, self.variables, self.as_user = tmp, env, variables, as_user
        self.background: list[subprocess.Popen[bytes]] = []

    def _argv(self, code: str) -> list[str]:
        return [*self.as_user, "bash", "-euo", "pipefail", "-c", f"{self.variables}\n{code}"]

    def run(self, block: Block, extra: Mapping[str, str] | None = None) -> str:
        """Run a block to its end; its output, or a failure with it and the units' logs."""
        proc = subprocess.run(
            self._argv(block.code), cwd=self.env["DOCS_CWD"], env={**self.env, **(extra or {})},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
            pytest.fail(
                f"docs/deployment.md's block at line {block.line} ({extra or 'once'}) exited "
                f"{proc.returncode}:\n{block.code}\n{out[-4000:]}\n{self.unit_logs()}"
            )
        return out

    def start(
        self, block: Block, extra: Mapping[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        """Start a block that runs until stopped (a sensor, ``flwr run --stream``); the
        process and its log."""
        path = self.tmp / f"block-{block.line}-{len(self.background)}.log"
        with path.open("wb") as log:
            proc = subprocess.Popen(
                self._argv(block.code), cwd=self.env["DOCS_CWD"],
                env={**self.env, **(extra or {})}, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.background.append(proc)
        return proc, path

    def unit_logs(self) -> str:
        state = Path(self.env["SHIM_STATE"])
        return "\n".join(
            f"--- {log.name}:\n{log.read_text(errors='replace')[-2500:]}"
            for log in sorted(state.glob("*.log"))
        )

    def systemctl(self, *args: str) -> None:
        """``systemctl ARGS`` as the docs' user (the shim), for what the test plays."""
        subprocess.run(
            [*self.as_user, str(Path(self.env["PATH"].split(":")[0]) / "systemctl"), *args],
            env=self.env, check=True, timeout=120,
        )  # fmt: skip

    def close(self) -> None:
        """Kill every unit the shim started (with their descendants) and background block."""
        units = [f.name.removesuffix(".pid") for f in Path(self.env["SHIM_STATE"]).glob("*.pid")]
        if units:
            self.systemctl("kill", "--signal=SIGKILL", *units)
        for proc in self.background:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _base_python() -> Path:
    """The interpreter the docs' ``PYTHON`` names: the base one where the test runs in a venv
    (``python -m venv`` from a venv makes a venv of the base interpreter anyway)."""
    return Path(getattr(sys, "_base_executable", sys.executable))


def _venv_sites() -> list[str]:
    """The test's own venv's site-packages, where it runs in one (else none): the docs' venv,
    made with ``--system-site-packages`` from the base interpreter, does not see them. Only
    those that exist: Debian's Python names ``local/lib/python3.X/dist-packages`` in every
    venv, made or not."""
    if sys.prefix == sys.base_prefix:
        return []
    return [where for where in site.getsitepackages() if os.path.isdir(where)]


def _reachable(path: Path) -> bool:
    """Whether any user may walk to ``path`` (every folder on the way searchable by others)."""
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents] if p.exists())


@dataclass
class _Nobody:
    """How root runs a command as uid 65534: the command's prefix, the interpreter path that
    user runs, and the test venv's site-packages as that user reaches them."""

    prefix: list[str]
    python: str
    sites: list[str]


def _as_nobody(tmp: Path) -> _Nobody:
    """How root runs a command as uid 65534 (:class:`_Nobody`).

    This machine's interpreter, and the test's venv, may live where that user cannot go (a
    pyenv or a checkout under /root, a home folder of mode 0700): each such folder is then
    bound to a folder in ``tmp``, in a mount namespace of the command's own, and the command
    keeps CAP_DAC_READ_SEARCH for the files the interpreter's build still names under the
    original path (access(2), which some libraries check paths with, ignores that
    capability; the bound paths need none).
    """
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: cannot run the docs as another user")
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]  # fmt: skip
    base = Path(sys.base_prefix)
    python, sites = str(_base_python()), list(_venv_sites())
    binds: list[tuple[Path, Path]] = []
    if not _reachable(base):
        binds.append((base, tmp / "python"))
        python = str(tmp / "python" / _base_python().relative_to(base))
    for i, where in enumerate(list(sites)):
        if not _reachable(Path(where)):
            binds.append((Path(where), tmp / f"site-{i}"))
            sites[i] = str(tmp / f"site-{i}")
    if not binds:
        return _Nobody(drop, python, sites)
    for _, bound in binds:
        bound.mkdir()
    script = (
        'while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 1; shift 2; done; shift; exec "$@"'
    )
    pairs = [str(p) for pair in binds for p in pair]
    prefix = ["unshare", "-m", "--propagation", "private", "--", "sh", "-c", script, "sh",
              *pairs, "--"]  # fmt: skip
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot bind the interpreter for another user here: {probe.stderr.strip()}")
    return _Nobody([*prefix, *drop], python, sites)


def _not_copied(folder: str, names: list[str]) -> set[str]:
    """What the checkout's copy leaves out: git, venvs, caches, runs and the benchmarks'
    results (``bench/`` at the top; ``deploy/bench`` is code)."""
    skip = shutil.ignore_patterns(".git", ".venv", "venv", "runs", "build", "*.egg-info",
                                  "__pycache__", ".*_cache")(folder, names)  # fmt: skip
    return skip | ({"bench"} & set(names) if Path(folder) == ROOT else set())


def _stock_mosquitto(mosquitto_etc: Path, units: Path) -> None:
    """Debian's layout: mosquitto.conf with persistence and a log, conf.d, and its unit."""
    (mosquitto_etc / "conf.d").mkdir(parents=True)
    (mosquitto_etc / "data").mkdir()
    (mosquitto_etc / "mosquitto.conf").write_text(
        "# As Debian's stock /etc/mosquitto/mosquitto.conf, its paths in the test's folder\n"
        f"persistence true\npersistence_location {mosquitto_etc}/data/\n"
        f"log_dest file {mosquitto_etc}/mosquitto.log\ninclude_dir {mosquitto_etc}/conf.d\n"
    )
    units.mkdir(parents=True)
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    (units / "mosquitto.service").write_text(
        f"[Service]\nExecStart={binary} -c {mosquitto_etc}/mosquitto.conf\n"
    )


def _wait(predicate: Callable[[], bool], timeout: float, what: str, walk: Walkthrough) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1.0)
    pytest.fail(f"{what} within {timeout:.0f} s\n{walk.unit_logs()}")


def _checkpointed_round(ckpt: Path) -> int:
    try:
        return int(json.loads((ckpt / "state.json").read_text())["server-round"])
    except (OSError, ValueError, KeyError):
        return 0


@pytest.mark.skipif(not mosquitto_available(), reason="needs Mosquitto (apt-get install mosquitto)")
@pytest.mark.timeout(900)
def test_the_deployment_walkthrough_runs_as_written() -> None:
    # Its own folder in /tmp: pytest's is under a folder only root may enter, and access(2),
    # which pip asks whether it may write, ignores the capability the blocks run with.
    tmp_path = Path(tempfile.mkdtemp(prefix="fedstream-docs-"))
    try:
        _walkthrough(tmp_path)
    finally:
        if not os.environ.get("FEDSTREAM_KEEP_TMP"):  # for a look after a failure
            shutil.rmtree(tmp_path, ignore_errors=True)


def _walkthrough(tmp_path: Path) -> None:
    # Prepare: a checkout to run from, the folders the variables point at, free ports, the
    # shims, Debian's Mosquitto layout; all of it owned by the docs' user.
    src = Path(shutil.copytree(ROOT, tmp_path / "src", ignore=_not_copied))
    bin_dir, units, extra_units = tmp_path / "bin", tmp_path / "units", tmp_path / "debian-units"
    bin_dir.mkdir()
    for shim in ("sudo", "apt-get", "usermod"):
        shutil.copy(SHIMS / shim, bin_dir / shim)
    nobody = (
        _as_nobody(tmp_path)
        if os.geteuid() == 0
        else _Nobody([], str(_base_python()), _venv_sites())
    )
    as_user, python = nobody.prefix, nobody.python
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\nexec {python} {SHIMS / "systemctl.py"} "$@"\n')
    (bin_dir / "systemctl").chmod(0o755)
    mosquitto_etc, state, prefix = tmp_path / "mosquitto", tmp_path / "state", tmp_path / "opt"
    etc, home = tmp_path / "etc", tmp_path / "home"
    _stock_mosquitto(mosquitto_etc, extra_units)
    home.mkdir()
    if os.geteuid() == 0:
        for path in [tmp_path, *tmp_path.rglob("*")]:
            os.lchown(path, NOBODY, NOBODY)
        user = "nobody"
    else:
        user = os.environ.get("USER") or subprocess.check_output(["id", "-un"], text=True).strip()
    mqtt_port, superlink_port = free_port(), free_port()
    env = {
        "PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(home), "USER": user, "LANG": "C.UTF-8", "DOCS_CWD": str(home),
        "FEDSTREAM_SRC": str(src),
        # this machine's packages (torch, flwr) reused in the venv: no download
        "PYTHON": python, "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0",
        "SHIM_STATE": str(tmp_path / "systemd"), "SHIM_UNIT_PATH": f"{units}:{extra_units}",
        "FEDSTREAM_PREFIX": str(prefix), "FEDSTREAM_ETC": str(etc),
        "FEDSTREAM_STATE": str(state), "FEDSTREAM_UNITS": str(units),
        "FEDSTREAM_USER": user, "FEDSTREAM_INSTALL": "--system-site-packages",
        "MOSQUITTO_ETC": str(mosquitto_etc), "AGGREGATOR": "localhost",
        "MQTT_PORT": str(mqtt_port), "MQTT_CERT_PORT": str(free_port()),
        "MQTT_LOCAL_PORT": str(free_port()), "SUPERLINK_PORT": str(superlink_port),
        "RUN_CONFIG": f"num-rounds={ROUNDS} min-nodes=2 local-steps=10",
    }  # fmt: skip
    if nobody.sites:  # install.sh's pip finds torch and flwr installed: no download
        env["PYTHONPATH"] = os.pathsep.join(nobody.sites)
    variables, *blocks = doc_blocks(DOC.read_text())
    assert "FEDSTREAM_PREFIX" in variables.code and not variables.tags
    walk = Walkthrough(tmp_path, env, variables.code, as_user)
    # A device block reads only what was handed over: the aggregator's files are elsewhere.
    device_env = {
        d: {"DEVICE": d, "SUPERNODE_PORT": str(free_port()), "MOSQUITTO_ETC": AGGREGATOR_ONLY}
        for d in DEVICES
    }
    ckpt, run_dir = state / "ckpt", state / "run"
    checkout = _files(src)
    resumes: list[dict[str, object]] = []
    stopped_run, stopped_status, final_status, stop_out = "", "", "", ""
    sensors: list[tuple[subprocess.Popen[bytes], Path]] = []
    outputs: list[str] = []

    try:
        # Execute: the walkthrough, block by block; where the docs have the operator stop
        # the run or the aggregator die, the test does it. The handover folders need no
        # copying: every machine is this host.
        for block in blocks:
            if STOP.search(block.code):  # once the run is under way
                _wait(lambda: _checkpointed_round(ckpt) >= 1, 300, "no checkpoint", walk)
                stopped_run = str(json.loads((ckpt / "state.json").read_text())["run-id"])
            if "crash" in block.tags:
                # The crash, once the resumed run has checkpointed a round of its own: the
                # SuperLink and what it started (the ServerApp), then systemd's restart.
                after = int(resumes[-1]["resumed-after"])  # type: ignore[call-overload]
                past = partial(_past_round, ckpt, after)
                _wait(past, 300, "no new checkpoint", walk)
                walk.systemctl("kill", "--signal=SIGKILL", "fedstream-superlink")
                walk.systemctl("start", "fedstream-superlink")
                assert wait_for_port(superlink_port, timeout=60.0), walk.unit_logs()
            if "device" in block.tags:
                for device in DEVICES:
                    if "background" in block.tags:
                        sensors.append(walk.start(block, device_env[device]))
                    else:
                        outputs.append(walk.run(block, device_env[device]))
            elif "background" in block.tags:
                walk.start(block)
            else:
                out = walk.run(block)
                outputs.append(out)
                if "deploy/install.sh" in block.code and nobody.sites:
                    # the units start with a clean environment (no PYTHONPATH): the test's
                    # venv's packages reach the installed venv as its system's would
                    for pth in (prefix / "venv").glob("lib/python3*/site-packages"):
                        (pth / "zz-fedstream-test-packages.pth").write_text(
                            "\n".join(nobody.sites) + "\n"
                        )
                if STOP.search(block.code):
                    stop_out = out
                    # the request is taken once the round is checkpointed; the run then
                    # exports and ends
                    ended = partial(_ended, walk, stopped_run)
                    _wait(ended, 120, "the stopped run did not end", walk)
                    stopped_status = _run_status(walk, stopped_run)
                if "fedstream resume" in block.code:
                    resumes.append(
                        json.loads(next(x for x in out.splitlines() if x.startswith('{"run-id"')))
                    )
                if "crash" in block.tags:  # the resumed run, to its end (flwr list, as the
                    run_id = str(resumes[-1]["run-id"])  # docs say to check)
                    finished = partial(_finished, walk, ckpt, run_id, ROUNDS)
                    _wait(finished, 420, "the resumed run did not finish", walk)
                    final_status = _run_status(walk, run_id)
        # The sensors streamed throughout (they run until stopped).
        for proc, log in sensors:
            assert proc.poll() is None, log.read_text()[-2000:]
    finally:
        walk.close()

    # Assert: installed into the prefix, units pointed there and hardened.
    assert (prefix / "venv" / "bin" / "fedstream").exists()
    assert (prefix / "app" / "pyproject.toml").exists()  # fedstream's app, no checkout needed
    for name in UNITS:
        text = (units / name).read_text()
        assert f"ExecStart={prefix}/venv/bin/" in text and "/usr/local/bin" not in text
        assert f"\nEnvironment=PATH={prefix}/venv/bin:" in text  # Flower finds its programs
        for line in ("NoNewPrivileges=true", "ProtectSystem=strict", f"ReadWritePaths={state}",
                     "Restart=", f"User={user}"):  # fmt: skip
            assert f"\n{line}" in text, (name, line)
        assert "/etc/fedstream" not in text and str(etc) in text
    if shutil.which("systemd-analyze"):
        assert any("systemd-analyze verify: ok" in out for out in outputs)
    assert not list(units.glob("*@check.service"))
    # Service logs without Flower's colour codes.
    assert list((prefix / "venv").glob("lib/python3*/site-packages/fedstream-plain-logs.pth"))
    logs = walk.unit_logs()
    assert "INFO :" in logs, logs[-2000:]  # Flower's lines, as its console handler writes them
    assert "\x1b[" not in logs, [line for line in logs.splitlines() if "\x1b[" in line][:5]
    # The run: stopped cleanly after a whole round and resumed; crashed and resumed; every
    # round once, both devices in each, finished.
    assert "the run stopped after round" in stop_out and stopped_status == "finished:completed"
    assert [int(r["num-rounds"]) for r in resumes] == [ROUNDS, ROUNDS]  # type: ignore[call-overload]
    first, second = (int(r["resumed-after"]) for r in resumes)  # type: ignore[call-overload]
    assert 1 <= first < second < ROUNDS, resumes
    assert final_status == "finished:completed"
    records = rounds_only(read_metrics(run_dir / "metrics.jsonl"))
    assert [r.round for r in records] == list(range(1, ROUNDS + 1))
    assert all(set(r.devices) == set(DEVICES) and not r.failed for r in records), [
        (r.round, sorted(r.devices), r.failed, r.wall_s) for r in records
    ]
    # Every message was trained by its device's agent, which took it from its SuperNode: no
    # ClientApp process (its CPU would be in cpu-s), the agent's CPU in agent-cpu-s.
    replies = [m for r in records for m in r.devices.values()]
    assert all(m.agent_cpu_s > 0 and m.cpu_s == 0 for m in replies), [
        (m.agent_cpu_s, m.cpu_s) for m in replies
    ]
    assert "flwr-clientapp" not in logs
    # The SuperExec secrets: the units' user's only (the shim runs the units as the caller,
    # not as User=, so their ownership is checked here).
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    for d in DEVICES:
        secret = (state / f"superexec-{d}.secret").stat()
        assert secret.st_mode & 0o777 == 0o600 and secret.st_uid == uid, d
    # The broker and the SuperLink were the secured ones: the devices came in over TLS with
    # their passwords, and the SuperNodes with their registered keys.
    broker_log = (mosquitto_etc / "mosquitto.log").read_text()
    assert all(f"u'{d}'" in broker_log for d in DEVICES), broker_log[-3000:]
    # Secrets where the docs put them: the CA key beside the broker's folder, not in it;
    # the handover folders the operator's only; nothing written into the checkout.
    assert (mosquitto_etc / "fedstream-ca" / "ca.key").exists()
    assert not list((mosquitto_etc / "fedstream").rglob("ca.key"))
    handover = home / "fedstream-handover"
    for folder in [handover, *(handover / d for d in DEVICES)]:
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    assert {p.name for p in (handover / "pi-1").iterdir()} == {
        "ca.crt",
        "pi-1.txt",
        "sensor.pi-1.txt",
        "node-pi-1.key.pub",
    }
    added = {p for p in _files(src) - checkout if not _build_output(p)}
    assert not added, sorted(added)
    # The fleet view and the report, as the walkthrough's last blocks show them.
    fleet = json.loads(
        next(line for o in outputs for line in o.splitlines() if line.startswith('[{"device"'))
    )
    assert {row["device"] for row in fleet if row["online"]} >= set(DEVICES)
    assert (run_dir / "summary.json").exists() and (run_dir / "report.png").exists()


def _files(folder: Path) -> set[str]:
    """Every file under ``folder``, relative to it."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def _build_output(path: str) -> bool:
    """What ``pip install`` of a source folder leaves in it (setuptools' build files)."""
    return any(part in ("build",) or part.endswith(".egg-info") or part == "__pycache__"
               for part in Path(path).parts)  # fmt: skip


def _past_round(ckpt: Path, after: int) -> bool:
    return _checkpointed_round(ckpt) > after


def _ended(walk: Walkthrough, run_id: str) -> bool:
    """Whether Flower lists the run as finished (in any way)."""
    return _run_status(walk, run_id).startswith("finished")


def _finished(walk: Walkthrough, ckpt: Path, run_id: str, rounds: int) -> bool:
    """Whether the run has checkpointed its last round and Flower says it finished."""
    return _checkpointed_round(ckpt) >= rounds and _run_status(walk, run_id).startswith("finished")


def _run_status(walk: Walkthrough, run_id: str) -> str:
    """The resumed run's status from ``flwr list`` (empty until it answers)."""
    proc = subprocess.run(
        [*walk.as_user, "bash", "-c",
         f'{walk.variables}\nflwr list fleet --run-id {run_id} --format json'],
        env=walk.env, cwd=walk.env["DOCS_CWD"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    try:
        runs = json.loads(proc.stdout).get("runs") or [{}]
    except ValueError:
        return ""
    return str(runs[0].get("status", ""))
