"""Flower's log lines without colour codes in services: the ``.pth`` line ``install.sh``
writes into the venv, with and without ``NO_COLOR``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.plain_logs import PTH_FILE, PTH_LINE

ESC = "\x1b["
# A fresh interpreter that reads a site folder holding only the .pth (as the venv's
# site-packages does at start), then logs through Flower as its programs do.
CHILD = """
import site, sys
site.addsitedir(sys.argv[1])
loaded = "deploy.plain_logs" in sys.modules
from logging import INFO
from flwr.common.logger import log
log(INFO, "a line of the journal")
print("loaded" if loaded else "not loaded")
"""


@pytest.mark.parametrize("no_color", [True, False])
def test_the_pth_line_turns_flowers_colours_off_only_under_no_color(
    tmp_path: Path, no_color: bool
) -> None:
    # Prepare: the site folder with install.sh's file
    (tmp_path / PTH_FILE).write_text(PTH_LINE + "\n")
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    if no_color:
        env["NO_COLOR"] = "1"
    # Execute
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    # Assert: the line is there; coloured only without NO_COLOR, which imports nothing
    assert "a line of the journal" in proc.stderr
    assert (ESC in proc.stderr) is not no_color, proc.stderr
    assert proc.stdout.strip() == ("loaded" if no_color else "not loaded")
