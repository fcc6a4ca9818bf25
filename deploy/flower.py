"""Flower's deployment engine on one machine: a SuperLink, SuperNodes, and `flwr` runs.

What Flower 1.42 needs, found by probing: the SuperLink serves every API on one port
(``--port``); each SuperNode needs its own ``--port``; the ``flwr`` CLI finds the SuperLink
through a named connection in ``$FLWR_HOME/config.toml``; offline hosts need
``--disable-runtime-dependency-installation``; ``flwr run`` exits 0 even when the run
fails, so the outcome is read from ``flwr list --format json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from aggregator.checkpoint import RUN_CONFIG, RUN_ID, SERVER_ROUND, read_state
from aggregator.round_log import HOME_ENV
from deploy.app_files import app_files
from deploy.constants import RESUME_POLL_S, RESUME_WAIT_S
from deploy.control import ControlClient
from deploy.local import ProcessGroup, free_port, wait_for_port
from deploy.secure import RunSecrets
from edge_client.wire.mapping import kebab
from edge_client.wire.run_config import RunSettings, upgrade_saved

__all__ = [
    "STATE_DATABASE",
    "FlowerDeployment",
    "FlowerError",
    "app_run_config",
    "checkpoint_run",
    "config_toml",
    "find_app",
    "resume_run",
    "run_status",
    "submit_run",
]

CONNECTION = "fedstream-local"
DEFAULT_FEDERATION = "@none/default"
CLI_TIMEOUT_S = 60.0
#: A durable SuperLink's database file, in the deployment's home.
STATE_DATABASE = "state.db"


#: The components of fedstream's own Flower app (in the installed package).
SERVERAPP = "aggregator.server_app:app"
CLIENTAPP = "edge_client.flower_app:app"


class FlowerError(RuntimeError):
    """A Flower process or run did not do what was asked; the message says what."""


def config_toml() -> str:
    """The ``[tool.flwr.app.config]`` block: every run-config key at its default, with its help."""
    from edge_client.wire.run_config import knobs

    lines = ["[tool.flwr.app.config]"]
    for key, knob in knobs().items():
        value = json.dumps(knob["default"])  # TOML and JSON agree on these scalars
        lines.append(f"{key} = {value}  # {knob['help']}")
    return "\n".join(lines) + "\n"


def write_app(directory: Path) -> Path:
    """Write fedstream's own Flower app to ``directory``: ``flwr run DIR`` without a checkout.

    The app is one ``pyproject.toml`` naming fedstream's ServerApp and ClientApp; their code
    comes from the fedstream installed where they run (the bundle carries no code), so the
    SuperLink's and every SuperNode's fedstream must be the same version.

    Returns
    -------
    Path
        The ``pyproject.toml`` written.
    """
    from importlib.metadata import version

    installed = version("fedstream")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pyproject.toml"
    path.write_text(
        "# fedstream's own Flower app (`fedstream app`): flwr run THIS_FOLDER <connection>\n"
        "# Its ServerApp and ClientApp are those of the fedstream installed where they run.\n"
        "[project]\n"
        'name = "fedstream-app"\n'
        f'version = "{installed}"\n'
        'description = "fedstream: federated learning on live MQTT sensor streams"\n'
        'license = "Apache-2.0"\n'
        f'dependencies = ["fedstream=={installed}"]\n\n'
        "[tool.flwr.app]\n"
        'publisher = "fedstream"\n'
        'fab-include = ["pyproject.toml"]  # no code: the installed package\'s\n\n'
        "[tool.flwr.app.components]\n"
        f'serverapp = "{SERVERAPP}"\n'
        f'clientapp = "{CLIENTAPP}"\n\n' + config_toml()
    )
    return path


def find_app(app_dir: Path | None) -> Path:
    """The Flower app to submit: ``app_dir``, or the current directory when it holds one.

    Raises
    ------
    FlowerError
        If there is no ``pyproject.toml`` with a ``[tool.flwr.app]`` table there.
    """
    where = Path(".") if app_dir is None else app_dir
    pyproject = where / "pyproject.toml"
    try:
        declared = "app" in tomllib.loads(pyproject.read_text()).get("tool", {}).get("flwr", {})
    except (OSError, tomllib.TOMLDecodeError):
        declared = False
    if not declared:
        hint = "" if app_dir is not None else "the current directory holds none: "
        raise FlowerError(
            f"no Flower app in {where.resolve()} ({hint}pass --app DIR; deploy/install.sh "
            "writes fedstream's to /opt/fedstream/app, `fedstream app DIR` writes it anywhere)"
        )
    return where


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string


#: Where this interpreter's programs are: Flower's are there when it is in the same venv,
#: whether or not the venv is activated (its bin on PATH).
SCRIPTS_DIR = str(Path(sys.executable).parent)


def _flwr_bin(name: str) -> str:
    path = shutil.which(name, path=f"{SCRIPTS_DIR}{os.pathsep}{os.environ.get('PATH', '')}")
    if path is None:
        raise FlowerError(f"{name} not found: install flwr (pip install -e .)")
    return path


def _cli_json(*args: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run ``flwr ARGS --format json``; its JSON object (``success`` false on garbage)."""
    proc = subprocess.run(
        [_flwr_bin("flwr"), *args, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env={**os.environ, **(env or {})},
    )
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"success": False, "error": (proc.stdout + proc.stderr)[-2000:]}
    return data if isinstance(data, dict) else {"success": False, "error": str(data)}


def flower_says(data: Mapping[str, Any]) -> str:
    """A failed ``flwr ... --format json`` reply as a sentence (Flower's own message, and the
    fix where it is a missing connection), never the raw dict."""
    said = str(data.get("error-message") or data.get("error") or "no reason given").strip()
    if "No SuperLink connection set" in said:
        said += (
            ": name the SuperLink connection (a [superlink.NAME] entry of "
            "$FLWR_HOME/config.toml), e.g. fedstream resume DIR --connection NAME, or set "
            "its default"
        )
    return said


def submit_run(
    app_dir: Path,
    connection: str | None,
    run_config: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
) -> str:
    """``flwr run APP [CONNECTION] --run-config ...``; the new run's id.

    Parameters
    ----------
    app_dir : Path
        The Flower app (the folder with ``pyproject.toml``).
    connection : str or None
        A SuperLink connection in ``$FLWR_HOME/config.toml``; None: its default.
    run_config : Mapping
        Run-config overrides (kebab-case keys).
    env : Mapping, optional
        Extra environment (``FLWR_HOME``).

    Raises
    ------
    FlowerError
        If ``flwr run`` does not report a run id (the message carries its output).
    """
    pairs = " ".join(f"{k}={_toml_value(v)}" for k, v in run_config.items())
    with app_files(app_dir) as app:  # not the whole checkout: flwr walks every file given
        where = [str(app), *([connection] if connection else [])]
        data = _cli_json("run", *where, "--run-config", pairs, env=env)
    if not data.get("success") or "run-id" not in data:
        raise FlowerError(f"flwr run failed: {flower_says(data)}")
    return str(data["run-id"])


def resume_run(
    checkpoint_dir: Path,
    app_dir: Path | None,
    connection: str | None = None,
    env: Mapping[str, str] | None = None,
    wait_s: float = RESUME_WAIT_S,
    on_wait: Callable[[str], None] | None = None,
    status: Callable[[str], Mapping[str, Any]] | None = None,
) -> tuple[str, int, int]:
    """Submit the checkpointed run again with ``resume=true``: what ``fedstream resume`` does.

    The checkpoint holds the run config it was made with, so the resumed run has the same
    rounds, model and settings; it continues after the checkpoint's round with its model,
    controller state and device map, and appends to the same ``metrics.jsonl``. ``app_dir``
    None: the current directory's Flower app (:func:`find_app`).

    The run that wrote the checkpoint must have ended first: two runs on one checkpoint
    would both train the devices and overwrite each other's checkpoints. One whose
    aggregator died shows as running until Flower misses its heartbeats (about a minute):
    the resume waits up to ``wait_s`` for it, telling ``on_wait`` once. ``status``: how a
    run's status is asked (None: ``flwr list`` on ``connection``).

    Returns
    -------
    tuple
        (new run id, last completed round, total rounds).

    Raises
    ------
    FlowerError
        If there is no checkpoint, it cannot be read, it has no run config, the run that
        wrote it is still running after ``wait_s``, or ``flwr run`` fails.
    """
    try:
        state = read_state(checkpoint_dir)  # the model stays on disk: the ServerApp loads it
    except PermissionError as err:
        raise FlowerError(
            f"cannot read the checkpoint in {checkpoint_dir} ({err.strerror}): run this as a "
            "user who may read the run's state folder (its owner, or a member of its group: "
            "sudo usermod -aG <the units' user> $USER, then log in again)"
        ) from err
    if state is None:
        raise FlowerError(f"no checkpoint in {checkpoint_dir} (no state.json)")
    saved = state.get(RUN_CONFIG)
    if not isinstance(saved, dict):
        raise FlowerError(
            f"the checkpoint in {checkpoint_dir} does not record its run config: resume with "
            f"flwr run . <connection> --run-config \"resume=true checkpoint-dir='...' ...\""
        )
    try:
        settings = RunSettings.from_run_config(upgrade_saved(saved))
    except ValueError as err:
        raise FlowerError(
            f"the checkpoint in {checkpoint_dir} has a bad run config: {err}"
        ) from err
    settings = replace(settings, resume=True, checkpoint_dir=str(Path(checkpoint_dir).resolve()))
    app = find_app(app_dir)
    _wait_ended(state, connection, wait_s, on_wait, status or _cli_status(connection, env))
    run_id = submit_run(app, connection, app_run_config(settings.to_run_config(), app), env)
    return run_id, int(state[SERVER_ROUND]), settings.num_rounds


def checkpoint_run(
    state: Mapping[str, Any],
    connection: str | None = None,
    env: Mapping[str, str] | None = None,
    status: Callable[[str], Mapping[str, Any]] | None = None,
) -> tuple[str, str] | None:
    """The Flower run that wrote a checkpoint (its ``state.json``, :func:`read_state`) and
    its status while Flower lists it as not finished (pending, starting, running); None once
    it has ended, when Flower does not know it, or for a checkpoint without a run id.
    ``status``: how a run's status is asked (None: ``flwr list`` on ``connection``)."""
    if state.get(RUN_ID) is None:
        return None
    run_id = str(state[RUN_ID])
    said = str((status or _cli_status(connection, env))(run_id).get("status", ""))
    return None if not said or said.startswith("finished") else (run_id, said)


def _cli_status(
    connection: str | None, env: Mapping[str, str] | None
) -> Callable[[str], Mapping[str, Any]]:
    """A run's status through the ``flwr`` CLI (a user's connection, whatever it needs)."""
    return lambda run_id: run_status(run_id, connection, env)


def _wait_ended(
    state: Mapping[str, Any],
    connection: str | None,
    wait_s: float,
    on_wait: Callable[[str], None] | None,
    ask: Callable[[str], Mapping[str, Any]],
) -> None:
    """Return once the run that wrote the checkpoint has ended (:func:`checkpoint_run`);
    raise :class:`FlowerError` after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    where = connection or "<connection>"
    told = False
    while (live := checkpoint_run(state, status=ask)) is not None:
        run_id, status = live
        if time.monotonic() >= deadline:
            raise FlowerError(
                f"run {run_id}, which wrote this checkpoint, is still {status} after "
                f"{wait_s:.0f} s. If it is alive, stop it first (fedstream stop CHECKPOINT-DIR: "
                f"after its current round; or flwr stop {run_id} {where}); if its aggregator "
                f"died, flwr stop {run_id} {where} marks it stopped. Then resume."
            )
        if not told and on_wait is not None:
            on_wait(
                f"run {run_id}, which wrote this checkpoint, is still {status}: waiting up to "
                f"{wait_s:.0f} s for it to end (one whose aggregator died is marked failed "
                f"within about a minute; flwr stop {run_id} {where} marks it at once)"
            )
            told = True
        time.sleep(RESUME_POLL_S)


def run_status(
    run_id: str, connection: str | None = None, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The run's entry of ``flwr list --run-id ID --format json`` (empty if unknown, or the
    SuperLink does not answer)."""
    data = _cli_json("list", *([connection] if connection else []), "--run-id", run_id, env=env)
    runs = data.get("runs") or []
    return dict(runs[0]) if runs else {}


def app_run_config(run_config: Mapping[str, Any], app_dir: Path) -> dict[str, Any]:
    """The keys of ``run_config`` that the app at ``app_dir`` declares (``flwr run`` refuses
    others). A user's app declares only the keys it sets; a key it does not declare could not
    have been overridden in the run that made the checkpoint, so it had its default there and
    has it again.

    Raises
    ------
    FlowerError
        If the app has no run config, or one without ``resume`` and ``checkpoint-dir``.
    """
    try:
        with (app_dir / "pyproject.toml").open("rb") as fh:
            declared = tomllib.load(fh)["tool"]["flwr"]["app"]["config"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as err:
        raise FlowerError(
            f"{app_dir}: no Flower app config ([tool.flwr.app.config]): {err}"
        ) from err
    missing = [kebab(k) for k in ("resume", "checkpoint_dir") if kebab(k) not in declared]
    if missing:
        raise FlowerError(f"{app_dir} cannot be resumed: its run config lacks {missing}")
    return {k: v for k, v in run_config.items() if k in declared}


class FlowerDeployment:
    """A SuperLink and SuperNodes on 127.0.0.1, started in a ProcessGroup.

    Insecure by default. With ``secrets`` the SuperLink serves TLS with the run's server
    certificate and admits only SuperNodes whose public key was registered
    (``--enable-supernode-auth``); SuperNodes verify it with the run's CA and sign with their
    own key; the ``flwr`` CLI connection verifies it too.

    Parameters
    ----------
    group : ProcessGroup
        Owns the processes (stops them on exit).
    home : Path
        ``FLWR_HOME`` for the CLI, the SuperLink's state and the logs; ``home/fedstream``
        is ``FEDSTREAM_HOME`` (runs' default ``out-dir``: ``home/fedstream/runs/<id>``).
    simulated_nodes : int
        If > 0, a SuperLink in simulation mode with this many virtual SuperNodes.
    secrets : RunSecrets, optional
        TLS and SuperNode authentication (see :mod:`deploy.secure`).
    durable : bool
        Keep the SuperLink's state in a database file (``home/state.db``), as the deployment
        guide's service does, so that a SuperLink started again (:meth:`start_superlink`
        after :meth:`kill_superlink`) still knows the SuperNodes, their keys and the runs.
        Otherwise the SuperLink keeps it in memory, Flower's default: its SQL state runs
        several statements for every request a SuperNode or the ServerApp makes (the
        run's abort check, the node's authentication, expired tokens), CPU that a host
        shared with the devices takes from their training (``fedstream demo``: median round
        2.1-2.5 s in memory, 2.6-4.2 s with the file, on this 2-core machine).
    """

    def __init__(
        self,
        group: ProcessGroup,
        home: Path,
        simulated_nodes: int = 0,
        secrets: RunSecrets | None = None,
        durable: bool = False,
    ) -> None:
        self.group = group
        self.home = home
        self.secrets = secrets
        self.durable = durable
        self.port = free_port()
        self.env = {
            "FLWR_HOME": str(home),
            HOME_ENV: str(home / "fedstream"),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "PYTHONUNBUFFERED": "1",
            # Flower starts flower-superexec and the app processes by name, from PATH
            "PATH": f"{SCRIPTS_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self.nodes: list[str] = []
        self.runtime_ports: dict[str, int] = {}  # name -> its SuperNode's runtime API port
        self._task_secrets: dict[str, Path] = {}  # name -> the secret its agent signs with
        home.mkdir(parents=True, exist_ok=True)
        self.simulated_nodes = simulated_nodes
        transport = (
            f"root-certificates = {_toml_value(secrets.ca)}\n" if secrets else "insecure = true\n"
        )
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n'
            f'[superlink.{CONNECTION}]\naddress = "127.0.0.1:{self.port}"\n{transport}'
        )
        # What the CLI's connection above names, asked in-process (a run's status, the nodes):
        # the demo and the benchmarks ask every few seconds, a process each was a CPU-second.
        self.control = ControlClient(
            f"127.0.0.1:{self.port}", secrets.ca if secrets else None, CLI_TIMEOUT_S
        )

    def start_superlink(self, timeout: float = 60.0) -> None:
        """Start ``flower-superlink`` and wait for its port."""
        self.group.start(
            "superlink",
            [
                _flwr_bin("flower-superlink"),
                *self._superlink_transport(),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                *(["--database", str(self.home / STATE_DATABASE)] if self.durable else []),
                "--isolation",
                "subprocess",
                "--disable-runtime-dependency-installation",
                *(["--simulation"] if self.simulated_nodes else []),
            ],
            log_path=self.home / "logs" / "superlink.log",
            env=self.env,
            cwd=self.home,
        )
        if not wait_for_port(self.port, timeout=timeout):
            raise FlowerError(f"the SuperLink did not start; see {self.home}/logs/superlink.log")
        if self.simulated_nodes:  # the federation runs on Flower's simulation engine (Ray)
            deadline = time.monotonic() + timeout
            data: dict[str, Any] = {}
            while time.monotonic() < deadline:  # the default federation appears a bit later
                data = self._cli_json(
                    "federation",
                    "simulation-config",
                    DEFAULT_FEDERATION,
                    CONNECTION,
                    "--num-supernodes",
                    str(self.simulated_nodes),
                    "--client-resources-num-cpus",
                    "1",
                )
                if data.get("success"):
                    return
                time.sleep(1.0)
            raise FlowerError(f"could not configure the simulation: {data}")

    def _superlink_transport(self) -> list[str]:
        if self.secrets is None:
            return ["--insecure"]
        return [
            "--ssl-ca-certfile",
            str(self.secrets.ca),
            "--ssl-certfile",
            str(self.secrets.server_cert),
            "--ssl-keyfile",
            str(self.secrets.server_key),
            "--enable-supernode-auth",
        ]

    def register_supernode(self, public_key: Path) -> int:
        """``flwr supernode register``: admit the SuperNode holding this key; its node id.

        Raises
        ------
        FlowerError
            If the SuperLink refuses the key.
        """
        data = self._cli_json("supernode", "register", str(public_key), CONNECTION)
        if not data.get("success") or "node-id" not in data:
            raise FlowerError(f"flwr supernode register {public_key} failed: {flower_says(data)}")
        return int(data["node-id"])

    def start_supernode(
        self,
        name: str,
        node_config: Mapping[str, Any],
        key: Path | None = None,
        tasks_secret: Path | None = None,
        runtime_port: int | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a ``flower-supernode`` with ``--node-config`` built from ``node_config``.

        Parameters
        ----------
        name : str
            Process name (``supernode-<name>``) and log file name.
        node_config : Mapping
            The SuperNode's ``--node-config`` (``device-id``, ``buffer``, ...).
        key : Path, optional
            Private key it signs with; secured deployments default to the device's key in
            the run's secrets (``node_config["device-id"]``).
        tasks_secret : Path, optional
            A SuperExec secret file: the node runs as ``fedstream-supernode`` (Flower's
            SuperNode, its idle waits shortened: :mod:`edge_client.flower_internals`)
            in ``--isolation process``, its tasks left for the device's agent, which signs
            with this secret; its runtime API's port is in :attr:`runtime_ports`. None:
            Flower's own ``flower-supernode``, one ``flwr-clientapp`` per message.
        runtime_port : int, optional
            The runtime API's port; None: a free one. A node started again under the same
            name keeps its port and secret (its agent's).
        """
        config = " ".join(f"{k}={_toml_value(v)}" for k, v in node_config.items())
        if self.secrets is None:
            transport = ["--insecure"]
        else:
            key = key or self.secrets.node_key(str(node_config["device-id"]))
            transport = [
                "--root-certificates",
                str(self.secrets.ca),
                "--auth-supernode-private-key",
                str(key),
            ]
        tasks_secret = tasks_secret or self._task_secrets.get(name)
        port = runtime_port or self.runtime_ports.get(name) or free_port()
        self.runtime_ports[name] = port
        if tasks_secret is not None:
            self._task_secrets[name] = tasks_secret
        if tasks_secret is None:
            program, isolation = [_flwr_bin("flower-supernode"), "--isolation", "subprocess"], []
        else:
            program = [_flwr_bin("fedstream-supernode"), "--isolation", "process"]
            isolation = ["--superexec-auth-secret-file", str(tasks_secret)]
        proc = self.group.start(
            f"supernode-{name}",
            [
                *program,
                *isolation,
                *transport,
                "--superlink",
                f"127.0.0.1:{self.port}",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--node-config",
                config,
            ],
            log_path=self.home / "logs" / f"supernode-{name}.log",
            env=self.env,
            cwd=self.home,
        )
        self.nodes.append(name)
        return proc

    def kill_superlink(self) -> None:
        """SIGKILL the SuperLink and the ServerApp it runs (the aggregator host dies).

        The SuperExec and the ServerApp it starts may leave the SuperLink's process group;
        they are found by the SuperLink address they serve. A ServerApp left alive would
        reconnect to the restarted SuperLink and finish the round a resumed run repeats.
        """
        self.group.kill("superlink")
        address = f"127.0.0.1:{self.port}"
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                args = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:  # gone meanwhile, or not ours to read
                continue
            served = [a.decode(errors="replace") for a in args]
            if "--runtime-api-address" in served and address in served:
                with contextlib.suppress(OSError):
                    os.kill(int(proc.name), signal.SIGKILL)

    def kill_supernode(self, name: str) -> None:
        """SIGKILL a SuperNode and its app processes (a device that dies)."""
        self.group.kill(f"supernode-{name}")

    def list_nodes(self) -> list[dict[str, Any]]:
        """``flwr supernode list``'s nodes: the federation's SuperNodes (id, status, times)."""
        return self.control.nodes()

    def wait_nodes(self, count: int, timeout: float = 120.0) -> None:
        """Block until ``count`` SuperNodes are online."""
        deadline = time.monotonic() + timeout
        online = 0
        while time.monotonic() < deadline:
            online = sum(1 for n in self.list_nodes() if str(n.get("status")).lower() == "online")
            if online >= count:
                return
            time.sleep(0.5)
        raise FlowerError(f"only {online} of {count} SuperNodes came online in {timeout:.0f} s")

    def submit(self, app_dir: Path, run_config: Mapping[str, Any]) -> str:
        """``flwr run`` the app; return the run id."""
        return submit_run(app_dir, CONNECTION, run_config, self.env)

    def resume(self, checkpoint_dir: Path, app_dir: Path) -> tuple[str, int, int]:
        """:func:`resume_run` on this deployment's SuperLink."""
        return resume_run(checkpoint_dir, app_dir, CONNECTION, self.env, status=self.status)

    def status(self, run_id: str) -> dict[str, Any]:
        """The run's entry of ``flwr list --run-id ID --format json`` (empty if unknown)."""
        return self.control.run(run_id)

    def stop_run(self, run_id: str) -> None:
        """``flwr stop ID``: Flower marks the run stopped (at once, also one whose ServerApp
        is gone) and stops sending its messages. A run that has ended already is left so.

        Raises
        ------
        FlowerError
            If ``flwr stop`` fails and the run has not ended.
        """
        data = self._cli_json("stop", run_id, CONNECTION)
        if data.get("success", False):
            return
        if not str(self.status(run_id).get("status", "")).startswith("finished"):
            raise FlowerError(f"flwr stop {run_id} failed: {flower_says(data)}")

    def wait_finished(
        self, run_id: str, timeout: float = 300.0, interval: float = 2.0
    ) -> dict[str, Any]:
        """Poll the run's status every ``interval`` seconds until it is ``finished:*`` or
        ``timeout`` passes; the last status seen (``flwr run`` exits 0 whatever the run
        does: this is how to know)."""
        status: dict[str, Any] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status(run_id)
            if str(status.get("status", "")).startswith("finished"):
                break
            time.sleep(interval)
        return status

    def logs(self, run_id: str) -> str:
        """The ServerApp's log (``flwr log ID --show``)."""
        proc = subprocess.run(
            [_flwr_bin("flwr"), "log", run_id, CONNECTION, "--show"],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            env={**os.environ, **self.env},
        )
        return proc.stdout + proc.stderr

    def _cli_json(self, *args: str) -> dict[str, Any]:
        return _cli_json(*args, env=self.env)
