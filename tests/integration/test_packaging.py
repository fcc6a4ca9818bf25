"""What an install and an app bundle carry: the distribution installs only fedstream's own
top-level packages, and the Flower app bundle (FAB) only what the apps run."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL = {"edge_client", "aggregator", "deploy"}


@pytest.fixture
def app(tmp_path: Path) -> Path:
    """A copy of the project (builds leave files behind; Flower wants the folder to be named
    like an app)."""
    ignore = shutil.ignore_patterns(
        ".git", "runs", "build", "*.egg-info", "__pycache__", ".*_cache", "*.fab"
    )
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
