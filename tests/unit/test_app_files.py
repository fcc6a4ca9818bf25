"""What ``flwr run`` is given: the app's included folders, bundled exactly as the whole
folder would be (the same FAB, byte for byte), or the whole folder where pruning could
change the bundle."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk

from deploy.app_files import app_files, included_roots

ROOT = Path(__file__).resolve().parents[2]
# Flower's build uses pathspec's "gitwildmatch", which pathspec >= 0.12.1 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:GitWildMatchPattern:DeprecationWarning")

PYPROJECT = """[project]
name = "someapp"
version = "1.0.0"
dependencies = ["flwr>=1.42"]

[tool.flwr.app]
publisher = "someone"
{extra}

[tool.flwr.app.components]
serverapp = "src.server:app"
clientapp = "src.client:app"
"""


def write_app(where: Path, extra: str) -> Path:
    """A small app with what a checkout holds beside it: a virtual environment full of
    Python files, a ``__pycache__``, a symbolic link, data and an ignore file."""
    app = where / "someapp"
    for rel, text in {
        "pyproject.toml": PYPROJECT.format(extra=extra),
        ".gitignore": "*.log\nsrc/secret.py\n",
        "src/server.py": "app = None\n",
        "src/client.py": "app = None\n",
        "src/secret.py": "key = 1\n",
        "src/nested/util.py": "x = 1\n",
        "src/notes.md": "# notes\n",
        "src/run.log": "log\n",
        "src/__pycache__/server.cpython-311.pyc": "",
        ".venv/pyvenv.cfg": "home = /usr\n",
        ".venv/lib/site.py": "y = 2\n",
        "docs/guide.md": "# guide\n",
        "README.md": "# someapp\n",
    }.items():
        (app / rel).parent.mkdir(parents=True, exist_ok=True)
        (app / rel).write_text(text)
    os.symlink(app / "src" / "server.py", app / "src" / "link.py")
    return app


def test_the_copy_bundles_byte_for_byte_what_the_whole_folder_bundles(tmp_path: Path) -> None:
    # Prepare
    app = write_app(tmp_path, 'fab-include = ["src/**/*.py", "/src/notes.md"]')
    # Execute
    whole = build_fab_from_disk(app)
    with app_files(app) as given:
        copied = build_fab_from_disk(given)
        listed = sorted(p.relative_to(given).as_posix() for p in given.rglob("*"))
    # Assert: the same bundle (the link and the ignored files out of both), and the copy
    # held none of the rest of the checkout
    assert copied == whole
    assert given != app and not given.exists()  # a temporary copy, removed after use
    assert not [p for p in listed if p.startswith((".venv", "docs", "README"))]


def test_fedstreams_own_app_is_bundled_as_from_the_checkout() -> None:
    # Execute: Flower's build of the checkout (its .venv included, where there is one)
    whole = build_fab_from_disk(ROOT)
    with app_files(ROOT) as given:
        copied = build_fab_from_disk(given)
    # Assert
    assert included_roots(ROOT) == ["aggregator", "edge_client"]
    assert copied == whole


@pytest.mark.parametrize(
    "extra",
    [
        "",  # no fab-include: Flower takes every file it supports, anywhere
        'fab-include = ["*.py"]',  # matches at any depth
        'fab-include = ["**/server.py"]',
        'fab-include = ["src/"]',  # a trailing slash only: a folder named so at any depth
        'fab-include = ["src/**/*.py"]\nfab-exclude = ["docs/**"]',  # Flower checks it
        'fab-include = ["s*/**/*.py"]',
    ],
)
def test_the_whole_folder_is_given_where_pruning_could_change_the_bundle(
    tmp_path: Path, extra: str
) -> None:
    # Prepare
    app = write_app(tmp_path, extra)
    # Execute / Assert
    assert included_roots(app) is None
    with app_files(app) as given:
        assert given == app


def test_a_missing_or_broken_pyproject_is_left_to_flower(tmp_path: Path) -> None:
    # Prepare
    (tmp_path / "pyproject.toml").write_text("[tool.flwr.app\n")
    # Execute / Assert
    assert included_roots(tmp_path) is None
    assert included_roots(tmp_path / "nowhere") is None
