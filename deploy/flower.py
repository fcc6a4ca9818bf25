"""Flower's deployment engine on one machine: a SuperLink, SuperNodes, and `flwr` runs.

What Flower 1.42 needs, found by probing: the SuperLink serves every API on one port
(``--port``); each SuperNode needs its own ``--port``; the ``flwr`` CLI finds the SuperLink
through a named connection in ``$FLWR_HOME/config.toml``; offline hosts need
``--disable-runtime-dependency-installation``; ``flwr run`` exits 0 even when the run
fails, so the outcome is read from ``flwr list --format json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deploy.local import ProcessGroup, free_port, wait_for_port

__all__ = ["FlowerDeployment", "FlowerError"]

CONNECTION = "fedstream-local"
DEFAULT_FEDERATION = "@none/default"
CLI_TIMEOUT_S = 60.0


class FlowerError(RuntimeError):
    """A Flower process or run did not do what was asked; the message says what."""


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string


def _flwr_bin(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise FlowerError(f"{name} not found: install flwr (pip install -e .)")
    return path


class FlowerDeployment:
    """A SuperLink and SuperNodes on 127.0.0.1 (insecure), started in a ProcessGroup.

    Parameters
    ----------
    group : ProcessGroup
        Owns the processes (stops them on exit).
    home : Path
        ``FLWR_HOME`` for the CLI, the SuperLink's state and the logs.
    simulated_nodes : int
        If > 0, a SuperLink in simulation mode with this many virtual SuperNodes.
    """

    def __init__(self, group: ProcessGroup, home: Path, simulated_nodes: int = 0) -> None:
        self.group = group
        self.home = home
        self.port = free_port()
        self.env = {
            "FLWR_HOME": str(home),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.nodes: list[str] = []
        home.mkdir(parents=True, exist_ok=True)
        self.simulated_nodes = simulated_nodes
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n'
            f'[superlink.{CONNECTION}]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )

    def start_superlink(self, timeout: float = 60.0) -> None:
        """Start ``flower-superlink`` and wait for its port."""
        self.group.start(
            "superlink",
            [
                _flwr_bin("flower-superlink"),
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--database",
                str(self.home / "state.db"),
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

    def start_supernode(self, name: str, node_config: Mapping[str, Any]) -> None:
        """Start a ``flower-supernode`` with ``--node-config`` built from ``node_config``."""
        config = " ".join(f"{k}={_toml_value(v)}" for k, v in node_config.items())
        self.group.start(
            f"supernode-{name}",
            [
                _flwr_bin("flower-supernode"),
                "--insecure",
                "--superlink",
                f"127.0.0.1:{self.port}",
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "--isolation",
                "subprocess",
                "--node-config",
                config,
            ],
            log_path=self.home / "logs" / f"supernode-{name}.log",
            env=self.env,
            cwd=self.home,
        )
        self.nodes.append(name)

    def kill_supernode(self, name: str) -> None:
        """SIGKILL a SuperNode and its app processes (a device that dies)."""
        self.group.kill(f"supernode-{name}")

    def wait_nodes(self, count: int, timeout: float = 120.0) -> None:
        """Block until ``count`` SuperNodes are online."""
        deadline = time.monotonic() + timeout
        online = 0
        while time.monotonic() < deadline:
            data = self._cli_json("supernode", "list", CONNECTION)
            online = sum(
                1 for n in data.get("nodes", []) if str(n.get("status", "")).lower() == "online"
            )
            if online >= count:
                return
            time.sleep(0.5)
        raise FlowerError(f"only {online} of {count} SuperNodes came online in {timeout:.0f} s")

    def submit(self, app_dir: Path, run_config: Mapping[str, Any]) -> str:
        """``flwr run`` the app; return the run id."""
        pairs = " ".join(f"{k}={_toml_value(v)}" for k, v in run_config.items())
        data = self._cli_json("run", str(app_dir), CONNECTION, "--run-config", pairs)
        if not data.get("success") or "run-id" not in data:
            raise FlowerError(f"flwr run failed: {data}")
        return str(data["run-id"])

    def status(self, run_id: str) -> dict[str, Any]:
        """The run's entry of ``flwr list --run-id ID --format json`` (empty if unknown)."""
        data = self._cli_json("list", CONNECTION, "--run-id", run_id)
        runs = data.get("runs") or []
        return dict(runs[0]) if runs else {}

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
        proc = subprocess.run(
            [_flwr_bin("flwr"), *args, "--format", "json"],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            env={**os.environ, **self.env},
        )
        try:
            data = json.loads(proc.stdout)
        except json.JSONDecodeError:
            return {"success": False, "error": (proc.stdout + proc.stderr)[-2000:]}
        return data if isinstance(data, dict) else {"success": False, "error": str(data)}
