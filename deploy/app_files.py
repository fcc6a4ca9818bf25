"""The files ``flwr run`` bundles, without the rest of the folder they live in.

``flwr run DIR`` (Flower 1.42) walks every file under ``DIR`` before it applies the app's
``fab-include`` patterns: in a checkout with a virtual environment inside it (``.venv``, as
``dev/test.sh`` makes) that is some 50,000 files and about 3 CPU-seconds per submission, on
the aggregator's cores, before the run starts. :func:`app_files` hands ``flwr`` a copy of
just the folders the patterns can match (and ``pyproject.toml``, ``.gitignore``); Flower
then applies its own rules to the copy and builds the same bundle (the same FAB hash, which
``tests/unit/test_app_files.py`` checks against Flower's own build of the whole folder).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

__all__ = ["app_files", "included_roots"]

#: Root files Flower reads besides the included ones: the app's config, and the ignore
#: rules it applies to the bundle.
ROOT_FILES = ("pyproject.toml", ".gitignore")
_GLOB = frozenset("*?[]!\\")


def included_roots(app_dir: Path) -> list[str] | None:
    """The top-level entries of ``app_dir`` that its ``fab-include`` patterns can match.

    Parameters
    ----------
    app_dir : Path
        A Flower app's folder (its ``pyproject.toml``).

    Returns
    -------
    list of str or None
        The entries' names; None when the folder is best given to ``flwr`` whole: no
        ``fab-include`` (Flower then takes every file it supports), a ``fab-exclude`` (whose
        patterns Flower requires to match files of the folder), or a pattern not anchored
        at a literal folder (``*.py``, ``**/x.py``: it may match anywhere).
    """
    try:
        config = tomllib.loads((app_dir / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None  # Flower says what is wrong with it
    app = config.get("tool", {}).get("flwr", {}).get("app", {})
    patterns, excludes = app.get("fab-include"), app.get("fab-exclude")
    if not isinstance(patterns, list) or not patterns or excludes is not None:
        return None
    roots: set[str] = set()
    for pattern in patterns:
        if not isinstance(pattern, str) or pattern.startswith("!"):
            return None
        parts = pattern.lstrip("/").split("/")
        # gitignore rules: a pattern is anchored at the root only when a slash comes before
        # its end; its first part must be a plain name to name the one entry it can match.
        anchored = pattern.startswith("/") or len([p for p in parts if p]) > 1
        if not anchored or not parts[0] or _GLOB & set(parts[0]) or parts[0] in ("..", "."):
            return None
        roots.add(parts[0])
    return sorted(roots)


@contextlib.contextmanager
def app_files(app_dir: Path) -> Iterator[Path]:
    """A folder to give ``flwr run`` (or ``flwr build``) for the app in ``app_dir``: a
    temporary copy of the entries :func:`included_roots` names and the :data:`ROOT_FILES`
    (symbolic links left out, as Flower leaves them out), or ``app_dir`` itself when
    :func:`included_roots` says so. The copy is removed on exit.

    Parameters
    ----------
    app_dir : Path
        A Flower app's folder.

    Yields
    ------
    Path
        The folder to submit.
    """
    roots = included_roots(app_dir)
    if roots is None:
        yield app_dir
        return
    with tempfile.TemporaryDirectory(prefix="fedstream-app-") as tmp:
        copy = Path(tmp) / app_dir.name
        copy.mkdir()
        for name in (*ROOT_FILES, *roots):
            source = app_dir / name
            if source.is_symlink() or not source.exists():
                continue
            if source.is_dir():
                shutil.copytree(
                    source,
                    copy / name,
                    symlinks=True,  # kept as links, which Flower skips
                    ignore=shutil.ignore_patterns("__pycache__"),
                )
            else:
                shutil.copy2(source, copy / name)
        yield copy
