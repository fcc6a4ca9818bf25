"""``deploy/install.sh`` into a temporary prefix: a venv with fedstream, and the systemd units
pointed into it, hardened, and verified by systemd where it is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = (
    "fedstream-ingest@.service",
    "fedstream-supernode@.service",
    "fedstream-superlink.service",
    "fedstream-aggregator.service",
)


@pytest.mark.timeout(600)
def test_the_install_script_makes_a_venv_and_hardened_units(tmp_path: Path) -> None:
    # Prepare: a copy of the checkout (pip builds from it).
    source = Path(
        shutil.copytree(
            ROOT, tmp_path / "src",
            ignore=shutil.ignore_patterns(".git", "runs", "build", "*.egg-info", "__pycache__",
                                          ".*_cache", "bench"),
        )
    )  # fmt: skip
    prefix, units, state = tmp_path / "opt", tmp_path / "units", tmp_path / "state"
    subprocess.run(  # the wheel, built offline (a release would come from the index)
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
         "--wheel-dir", str(tmp_path / "dist"), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("fedstream-*.whl")
    # Execute: this machine's packages reused (no download), no system user made.
    proc = subprocess.run(
        ["bash", str(source / "deploy" / "install.sh"), "--prefix", str(prefix),
         "--source", str(wheel), "--units", str(units), "--state-dir", str(state),
         "--system-site-packages", "--no-system-user"],
        capture_output=True, text=True, timeout=540,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/bin",
             "PYTHON": sys.executable, "PIP_NO_INDEX": "1", "HOME": str(tmp_path)},
    )  # fmt: skip
    # Assert: fedstream runs from the venv; each unit runs it from there, as its own user,
    # hardened, writing only its state directory.
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    version = subprocess.run(
        [str(prefix / "venv" / "bin" / "fedstream"), "--version"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert version.returncode == 0 and version.stdout.strip()
    for program in ("flower-superlink", "flower-supernode", "flower-superexec", "flwr"):
        ran = subprocess.run(
            [str(prefix / "venv" / "bin" / program), "--help"],
            capture_output=True, timeout=120,
        )  # fmt: skip
        assert ran.returncode == 0, (program, ran.stderr[-500:])
    for name in UNITS:
        text = (units / name).read_text()
        assert f"ExecStart={prefix}/venv/bin/" in text and "/usr/local/bin" not in text
        # Flower starts flower-superexec and the apps by name: the venv's bin is on PATH
        assert f"\nEnvironment=PATH={prefix}/venv/bin:" in text
        for line in ("User=fedstream", "NoNewPrivileges=true", "ProtectSystem=strict",
                     f"ReadWritePaths={state}", "Restart="):  # fmt: skip
            assert f"\n{line}" in text, (name, line)
    supernode = (units / "fedstream-supernode@.service").read_text()
    assert "--port ${FEDSTREAM_SUPERNODE_PORT}" in supernode  # one runtime port per node
    if shutil.which("systemd-analyze"):
        assert "systemd-analyze verify: ok" in proc.stdout, proc.stdout + proc.stderr
    assert not list(units.glob("*@check.service"))  # its verification copies are gone
