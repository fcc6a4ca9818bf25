"""Versioned model exports: self-describing directories a device can run with torch alone.

A model directory holds one sub-directory per version, ``v00000012/`` (the round, or the
asynchronous mode's model version), each with:

- ``manifest.json``: the format, version, task, what the model takes (``sample-shape``,
  ``input-shape``) and returns (``output``, ``num-classes`` or ``forecast-horizon``), the
  round's prequential metrics, how the program was saved, and the SHA-256 of every file;
- ``program.pt2``: the deployed module (:meth:`~edge_client.task.interface.Task.predictor`)
  as ``torch.export`` saves it, with a dynamic batch dimension (PyTorch's recommended
  deployment format; TorchScript is deprecated). Where the user's model cannot be exported
  with a dynamic batch it is exported for batches of one; where it cannot be exported at
  all, the whole module is pickled (``module.pt``, format ``torch-pickle``: loading it needs
  the model's class importable, which the manifest says);
- ``weights.pt``: the version's weights, loaded into the program on load. Programs are
  identical across versions of one architecture, so a writer may hard-link one program into
  every version: the aggregator and a device's ClientApp export once per architecture,
  then write weights only (``torch.export`` also keeps about 110 kB per call that it never
  gives back: exporting every version made a day-long run's memory grow).

A version appears whole or not at all: it is written into a hidden directory and renamed.
The newest version is the highest whose manifest reads; the last ``keep`` are kept.

Reading needs only torch, json and hashlib (:func:`load_version`): nothing of fedstream's
training stack.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "FORMAT",
    "PROGRAMS",
    "ArtifactError",
    "LoadedModel",
    "ModelVersion",
    "export_program",
    "latest_version",
    "list_versions",
    "load_version",
    "prune_versions",
    "write_version",
]

log = logging.getLogger(__name__)

#: Format tag in every manifest (bumped when readers must change).
FORMAT = "fedstream-model/1"
MANIFEST = "manifest.json"
PROGRAM = "program.pt2"
PICKLED = "module.pt"
WEIGHTS = "weights.pt"
#: Sub-directory of a model directory holding one program per architecture.
PROGRAMS = ".programs"
#: How a program was saved (the manifest's ``program-format``).
EXPORT_DYNAMIC = "torch.export"
EXPORT_STATIC = "torch.export-batch-1"
PICKLE = "torch-pickle"
_VERSION_DIR = re.compile(r"^v(\d{8,})$")
MAX_BATCH = 65536  # upper bound of the exported batch dimension


class ArtifactError(Exception):
    """A model directory or version that cannot be read (missing, corrupt, wrong format)."""


@dataclass(frozen=True)
class ModelVersion:
    """One exported version: its directory, number and manifest."""

    path: Path
    version: int
    manifest: dict[str, Any]


@dataclass
class LoadedModel:
    """A version loaded for inference.

    Attributes
    ----------
    version : ModelVersion
        What was loaded.
    module : torch.nn.Module
        Callable on a batch ``(n, *input-shape)`` of float32 samples.
    max_batch : int
        Largest batch the program takes in one call (1 for a batch-1 export).
    """

    version: ModelVersion
    module: Callable[[torch.Tensor], torch.Tensor]
    max_batch: int

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The outputs for a batch of any size (split to the program's batch limit)."""
        if len(x) <= self.max_batch:
            return self.module(x)
        return torch.cat(
            [self.module(x[i : i + self.max_batch]) for i in range(0, len(x), self.max_batch)]
        )


def version_dir(root: str | Path, version: int) -> Path:
    """Where version ``version`` lives under ``root``."""
    return Path(root) / f"v{version:08d}"


def export_program(module: nn.Module, example: torch.Tensor, dest: Path) -> tuple[str, str]:
    """Save ``module`` (in eval mode) for inference at ``dest``'s directory.

    Tries ``torch.export`` with a dynamic batch, then for batches of one, then pickles the
    module. Returns the file name written and its format.
    """
    module.eval()
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    attempts: list[tuple[str, dict[str, Any]]] = [
        (
            EXPORT_DYNAMIC,
            {
                "args": (example[:2].expand(2, *example.shape[1:]).contiguous(),),
                "dynamic_shapes": ({0: batch},),
            },
        ),
        (EXPORT_STATIC, {"args": (example[:1].contiguous(),)}),
    ]
    reasons = []
    for fmt, kwargs in attempts:
        try:
            program = torch.export.export(
                module, kwargs["args"], dynamic_shapes=kwargs.get("dynamic_shapes")
            )
            torch.export.save(program, dest / PROGRAM)
            return PROGRAM, fmt
        except Exception as err:
            reasons.append(f"{fmt}: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
    log.warning("model not exportable (%s): saving it pickled", "; ".join(reasons))
    torch.save(module, dest / PICKLED)
    return PICKLED, PICKLE


def write_version(
    root: str | Path,
    version: int,
    module: nn.Module,
    example: torch.Tensor,
    manifest: Mapping[str, Any],
    keep: int = 0,
    program_cache: str | Path | None = None,
) -> ModelVersion:
    """Write ``module`` as version ``version`` of the model directory ``root``.

    Parameters
    ----------
    root : path
        The model directory (created if missing).
    version : int
        The version number (>= 0); an existing version of that number is replaced.
    module : nn.Module
        The deployed module (a task's :meth:`~edge_client.task.interface.Task.predictor`).
    example : Tensor
        A batch of at least one input sample (its shape past the first axis is the input's).
    manifest : mapping
        What the manifest says of the task and round (kebab-case keys); the format, version,
        files, hashes and export format are added.
    keep : int
        Versions to keep (0: all); older ones are removed after this one is in place.
    program_cache : path, optional
        A directory of programs by architecture: the program is exported there once per
        architecture (names and shapes of the weights, the input shape, the manifest's task)
        and hard-linked into each version; only the weights are written each time.

    Returns
    -------
    ModelVersion
        The version written.
    """
    if version < 0:
        raise ValueError(f"a model version is >= 0, got {version}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = version_dir(root, version)
    tmp = root / f".{final.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    t0 = time.perf_counter()
    module = module.eval()
    state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    torch.save(state, tmp / WEIGHTS)
    program, fmt = _program(module, example, tmp, state, manifest, program_cache)
    files = {name: _sha256(tmp / name) for name in (WEIGHTS, program)}
    full = {
        **manifest,
        "format": FORMAT,
        "version": version,
        "input-shape": list(example.shape[1:]),
        "program": program,
        "program-format": fmt,
        "module-class": f"{type(module).__module__}.{type(module).__qualname__}",
        "files": files,
        "content-hash": files[WEIGHTS],
        "created": round(time.time(), 3),
        "export-s": round(time.perf_counter() - t0, 3),
    }
    (tmp / MANIFEST).write_text(json.dumps(full, indent=1, sort_keys=True))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    if keep > 0:
        prune_versions(root, keep)
    return ModelVersion(final, version, full)


def _program(
    module: nn.Module,
    example: torch.Tensor,
    dest: Path,
    state: Mapping[str, torch.Tensor],
    manifest: Mapping[str, Any],
    cache: str | Path | None,
) -> tuple[str, str]:
    """Export the program into ``dest``, through the architecture cache when there is one.

    The cache key is what the program depends on besides the weights: the weights' names,
    shapes and types, the input shape, the task, and the source code of every module class
    in the model (an edited ``forward`` with the same parameters gets a program of its own).
    """
    if cache is None:
        return export_program(module, example, dest)
    classes = sorted({type(m) for m in module.modules()}, key=lambda c: c.__qualname__)
    arch = hashlib.sha256(
        json.dumps(
            [
                sorted((k, list(v.shape), str(v.dtype)) for k, v in state.items()),
                list(example.shape[1:]),
                [f"{c.__module__}.{c.__qualname__}:{_source(c)}" for c in classes],
                {k: str(v) for k, v in manifest.items() if k in ("task", "output")},
            ]
        ).encode()
    ).hexdigest()[:16]
    cached = Path(cache) / arch
    if not (cached / "format").exists():
        cached.mkdir(parents=True, exist_ok=True)
        name, fmt = export_program(module, example, cached)
        (cached / "format").write_text(f"{name}\n{fmt}\n")
    name, fmt = (cached / "format").read_text().split()
    try:
        os.link(cached / name, dest / name)
    except OSError:  # another file system, or no hard links: copy
        shutil.copyfile(cached / name, dest / name)
    return name, fmt


def _source(cls: type) -> str:
    """A class's source, hashed (empty when Python cannot find it: a class made at run time)."""
    try:
        return hashlib.sha256(inspect.getsource(cls).encode()).hexdigest()[:16]
    except (OSError, TypeError):
        return ""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of the version directory ``path``.

    Raises
    ------
    ArtifactError
        If it is missing, not JSON, or of another format.
    """
    try:
        manifest: dict[str, Any] = json.loads((Path(path) / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        raise ArtifactError(f"{path}: no readable {MANIFEST} ({err})") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ArtifactError(f"{path}: format {found!r}, expected {FORMAT!r}")
    return manifest


def list_versions(root: str | Path) -> list[ModelVersion]:
    """Every version under ``root`` whose manifest reads, oldest first (a directory that
    is not a model directory, or does not exist, has none)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _VERSION_DIR.match(entry.name)
        if not match or not entry.is_dir():
            continue
        try:
            found.append(ModelVersion(entry, int(match.group(1)), read_manifest(entry)))
        except ArtifactError as err:
            log.warning("skipping %s", err)
    return sorted(found, key=lambda v: v.version)


def latest_version(root: str | Path) -> ModelVersion | None:
    """The newest readable version under ``root`` (None: none yet)."""
    versions = list_versions(root)
    return versions[-1] if versions else None


def prune_versions(root: str | Path, keep: int) -> list[int]:
    """Remove all but the newest ``keep`` versions (and any abandoned temporary
    directory); return the version numbers removed."""
    root = Path(root)
    removed = []
    numbered = sorted(
        (int(m.group(1)), e) for e in root.iterdir() if (m := _VERSION_DIR.match(e.name))
    )
    for number, entry in numbered[: max(0, len(numbered) - keep)]:
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(number)
    for stale in root.glob(".v*.tmp"):
        if time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)
    return removed


def load_version(version: ModelVersion, verify: bool = True) -> LoadedModel:
    """Load ``version`` for inference.

    Parameters
    ----------
    version : ModelVersion
        From :func:`list_versions` or :func:`latest_version`.
    verify : bool
        Check every file against the manifest's SHA-256 first.

    Raises
    ------
    ArtifactError
        If a file is missing or corrupt, or the weights do not fit the program.
    """
    manifest = version.manifest
    files: dict[str, str] = manifest.get("files", {})
    if verify:
        for name, expected in files.items():
            path = version.path / name
            if not path.exists() or _sha256(path) != expected:
                raise ArtifactError(
                    f"{path}: missing or corrupt (SHA-256 differs from the manifest)"
                )
    program = version.path / str(manifest.get("program", PROGRAM))
    fmt = manifest.get("program-format")
    try:
        if fmt == PICKLE:
            module: nn.Module = torch.load(program, weights_only=False)
        else:
            module = torch.export.load(program).module()
        weights = torch.load(version.path / WEIGHTS, weights_only=True)
        module.load_state_dict(weights)
    except Exception as err:
        raise ArtifactError(f"{version.path}: cannot load ({type(err).__name__}: {err})") from err
    if fmt == PICKLE:
        module.eval()
    max_batch = 1 if fmt == EXPORT_STATIC else MAX_BATCH
    return LoadedModel(version, module, max_batch)
