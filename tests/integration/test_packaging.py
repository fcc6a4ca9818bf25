"""What an install and an app bundle carry: the distribution installs only fedstream's own
top-level packages, and the Flower app bundle (FAB) only what the apps run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from deploy.local import wait_until

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL = {"edge_client", "aggregator", "deploy"}


@pytest.fixture
def app(tmp_path: Path) -> Path:
    """A copy of the project (builds leave files behind; Flower wants the folder to be named
    like an app)."""
    ignored = shutil.ignore_patterns(
        ".git", "runs", "build", "*.egg-info", "__pycache__", ".*_cache", "*.fab"
    )

    def ignore(folder: str, names: list[str]) -> set[str]:
        # and a virtual environment inside the checkout (dev/test.sh's .venv, CI's): a GB
        venvs = {n for n in names if (Path(folder) / n / "pyvenv.cfg").is_file()}
        return set(ignored(folder, names)) | venvs

    return Path(shutil.copytree(ROOT, tmp_path / "fedstream", ignore=ignore))


def test_the_wheel_installs_no_other_top_level_names(tmp_path: Path, app: Path) -> None:
    # Execute: the wheel `pip install .` would install (built from the project, offline)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "--wheel-dir", str(tmp_path), str(app)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("fedstream-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    # Assert: site-packages gets the three packages the layout needs and the metadata
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == TOP_LEVEL
    assert any(n.startswith("deploy/bench/") for n in names)  # `fedstream bench` works installed
    assert not any(n.startswith(("tests/", "bench/")) for n in names)


def test_the_app_bundle_carries_only_what_the_apps_run(tmp_path: Path, app: Path) -> None:
    # Execute
    subprocess.run(
        ["flwr", "build", "--app", str(app)], cwd=tmp_path, check=True, capture_output=True,
        timeout=120,
    )  # fmt: skip
    (fab,) = tmp_path.glob("*.fab")
    names = [n for n in zipfile.ZipFile(fab).namelist() if not n.startswith(".info/")]
    # Assert: the ServerApp's and ClientApp's code and the app's pyproject.toml, nothing else
    assert "pyproject.toml" in names
    assert "aggregator/server_app.py" in names and "edge_client/runtime/client_app.py" in names
    assert {n.split("/")[0] for n in names} == {"aggregator", "edge_client", "pyproject.toml"}
    assert all(n.endswith(".py") or n == "pyproject.toml" for n in names)


#: A Python whose install lacks the demo extra: importing its packages fails.
WITHOUT_DEMO_EXTRA = "import sys; sys.modules.update(iotcore=None, matplotlib=None); "


def lean(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``fedstream ARGS`` in a Python without iotcore and matplotlib."""
    code = WITHOUT_DEMO_EXTRA + "from deploy.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout
    )


def test_a_device_runs_without_the_demo_extra(broker: Any, procs: Any, tmp_path: Path) -> None:
    # Prepare: the device's daemon, and what its SuperNode loads, without the demo extra.
    buf = tmp_path / "pi-1.sqlite"
    code = WITHOUT_DEMO_EXTRA + "from deploy.cli import main; main()"
    procs.start(
        "ingest",
        [sys.executable, "-c", code, "ingest", "--broker", broker.url, "--device-id", "pi-1",
         "--buffer", str(buf), "--status-interval", "0.5"],
        log_path=tmp_path / "ingest.log",
    )  # fmt: skip
    log = tmp_path / "ingest.log"
    assert wait_until(lambda: log.exists() and "connected to" in log.read_text(), 60)
    # Execute
    published = lean(
        "publish", "--broker", broker.url, "--device-id", "pi-1", "--rate", "500",
        "--count", "200", "--batch", "10",
    )  # fmt: skip
    apps = subprocess.run(
        [sys.executable, "-c", WITHOUT_DEMO_EXTRA + "import edge_client.runtime.client_app, "
         "aggregator.server_app, deploy.fleet_status, edge_client.runtime.infer"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    # Assert: samples in; the apps load; what needs the extra says how to get it.
    assert published.returncode == 0, published.stderr
    assert wait_until(lambda: buf.exists() and _accepted(buf) == 200, 30)
    assert apps.returncode == 0, apps.stderr
    for args in (["broker"], ["report", str(tmp_path)], ["demo", "--no-live"]):
        refused = lean(*args)
        assert refused.returncode == 1, (args, refused.stderr)
        assert "pip install 'fedstream[demo]'" in " ".join(refused.stderr.split()), args


def _accepted(buffer: Path) -> int:
    status = lean("status", "--buffer", str(buffer), "--json")
    return int(json.loads(status.stdout)["accepted"]) if status.returncode == 0 else -1


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root and runuser"
)
def test_install_refuses_an_interpreter_the_service_user_cannot_run(tmp_path: Path) -> None:
    # Prepare: an interpreter behind a folder only root may enter (as pyenv's under a home
    # folder of mode 700), and the units' user "nobody".
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    python = private / "python3"
    python.symlink_to(getattr(sys, "_base_executable", sys.executable))
    prefix = tmp_path / "opt"
    # Execute: install.sh as root, PYTHON written after sudo as the guide says
    proc = subprocess.run(
        ["bash", str(ROOT / "deploy" / "install.sh"), "--prefix", str(prefix),
         "--units", str(tmp_path / "units"), "--state-dir", str(tmp_path / "state"),
         "--config-dir", str(tmp_path / "etc"), "--user", "nobody", "--no-system-user"],
        env={**os.environ, "PYTHON": str(python)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    # Assert: refused before anything was installed, with the reason and the fix
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"the units' user nobody cannot run {python}" in proc.stderr
    assert "Permission denied" in proc.stderr
    assert "sudo PYTHON=/usr/bin/python3.11" in proc.stderr
    assert not prefix.exists() and not (tmp_path / "units").exists()
