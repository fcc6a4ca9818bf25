"""A recording split across devices, as Flower Datasets' partitioners split it.

Real federations are not shuffled: each device is one person's watch or one machine's
sensor, and its stream comes in the order things happen. Schemes (``--partition`` of
``fedstream demo`` and ``fedstream simulate``, run config ``sim-partition``):

- ``natural``: one device per group of the recording's key (``--partition-by user``),
  Flower Datasets' ``NaturalIdPartitioner``;
- ``iid``: the recording shuffled (by the seed) and cut in equal parts, ``IidPartitioner``
  (what the demo did by hand before);
- ``dirichlet(ALPHA)``: each device's label mix drawn from Dirichlet(alpha),
  ``DirichletPartitioner``;
- ``pathological(K)``: K classes a device, ``PathologicalPartitioner``.

Every device streams its part in recorded order (``iid``: the shuffled order). A group too
small to make one sample (``min_size``) is left out and named (:attr:`Partitions.left_out`).
Partitioning needs ``flwr-datasets`` (the ``simulation`` and ``demo`` extras); it is imported
only here, when a recording is split.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_client.task.recordings import load_groups, load_recording, recording_keys
from edge_client.wire.constants import DEVICE_ID_PATTERN
from edge_client.wire.partitioning import Scheme

__all__ = ["Partitions", "SplitRecording", "device_name", "partition", "split_recording"]

_NOT_IN_ID = re.compile(r"[^A-Za-z0-9_-]+")


def device_name(key: str, group: str) -> str:
    """The device id of a natural partition: the key and the group, e.g. ``user-14``
    (characters a device id cannot hold become ``_``)."""
    name = _NOT_IN_ID.sub("_", f"{key}-{group}")[:64]
    if not re.fullmatch(DEVICE_ID_PATTERN, name):  # pragma: no cover - the sub makes it so
        raise ValueError(f"cannot make a device id of group {group!r}")
    return name


@dataclass(frozen=True)
class Partitions:
    """A recording's samples by device.

    Attributes
    ----------
    names : list of str
        Each device's name: the group (natural) or the part's index.
    indices : list of ndarray
        Each device's samples, as indices into the recording, in the order it streams them.
    left_out : dict of str to int
        Groups too small to make a sample, and their sizes.
    """

    names: list[str]
    indices: list[npt.NDArray[np.int64]]
    left_out: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.names)


def partition(
    labels: npt.ArrayLike,
    scheme: Scheme,
    *,
    groups: Sequence[str] | npt.NDArray[np.str_] | None = None,
    num_partitions: int | None = None,
    seed: int = 0,
    min_size: int = 1,
) -> Partitions:
    """Split a recording's samples across devices with Flower Datasets' partitioners.

    Parameters
    ----------
    labels : array_like
        Each sample's label (Dirichlet and pathological split by it).
    scheme : Scheme
        How (:func:`parse_scheme`).
    groups : sequence of str, optional
        Each sample's group: needed by ``natural``.
    num_partitions : int, optional
        Devices for ``iid``, ``dirichlet`` and ``pathological`` (``natural``: the groups).
    seed : int
        Seeds the shuffle and the draws.
    min_size : int
        Samples a device needs (a group with fewer is left out and named).

    Returns
    -------
    Partitions

    Raises
    ------
    ValueError
        If a natural partition has no groups or a single one, a count is missing or below 1,
        or no device would keep ``min_size`` samples.
    ImportError
        Without ``flwr-datasets`` (saying which extra brings it).
    """
    y = np.asarray(labels).reshape(-1)
    columns: dict[str, npt.ArrayLike] = {"idx": np.arange(len(y)), "label": y}
    if scheme.kind == "natural":
        if groups is None:
            raise ValueError("a natural partition needs each sample's group (--partition-by)")
        names = np.asarray(groups).astype(str)
        distinct = np.unique(names)
        if len(distinct) < 2:
            raise ValueError(
                f"the partition key holds {len(distinct)} group(s) ({', '.join(distinct)}): "
                "a natural partition needs at least 2"
            )
        columns["group"] = names
    elif num_partitions is None or num_partitions < 1:
        raise ValueError(f"partition {scheme} needs a number of devices >= 1")
    partitioner = _partitioner(scheme, num_partitions, seed)
    dataset = _dataset(columns)
    if scheme.kind == "iid":
        dataset = dataset.shuffle(seed=seed)
    partitioner.dataset = dataset
    with contextlib.redirect_stderr(io.StringIO()):  # the partitioners' progress bars
        loaded = [partitioner.load_partition(pid) for pid in range(partitioner.num_partitions)]
    found: list[tuple[str, npt.NDArray[np.int64]]] = []
    for pid, rows in enumerate(loaded):
        part = np.asarray(rows["idx"], dtype=np.int64)
        if scheme.kind in ("dirichlet", "pathological"):
            part = np.sort(part)  # its own samples, in recorded order
        name = (
            str(partitioner.partition_id_to_natural_id[pid])
            if scheme.kind == "natural"
            else str(pid)
        )
        found.append((name, part))
    kept = [(n, i) for n, i in found if len(i) >= min_size]
    if not kept:
        raise ValueError(f"no device has {min_size} sample(s) with partition {scheme}")
    return Partitions(
        [n for n, _ in kept],
        [i for _, i in kept],
        {n: len(i) for n, i in found if len(i) < min_size},
    )


def _partitioner(scheme: Scheme, num_partitions: int | None, seed: int) -> Any:
    try:
        from flwr_datasets import partitioner as fds
    except ImportError as err:
        raise ImportError(
            "partitioning a recording needs Flower Datasets: pip install 'fedstream[simulation]' "
            "(or the demo extra)"
        ) from err
    n = int(num_partitions or 0)
    if scheme.kind == "natural":
        return fds.NaturalIdPartitioner(partition_by="group")
    if scheme.kind == "iid":
        return fds.IidPartitioner(num_partitions=n)
    if scheme.kind == "dirichlet":
        return fds.DirichletPartitioner(
            num_partitions=n, partition_by="label", alpha=float(scheme.value or 0),
            min_partition_size=0, self_balancing=False, shuffle=True, seed=seed,
        )  # fmt: skip
    return fds.PathologicalPartitioner(
        num_partitions=n, partition_by="label", num_classes_per_partition=int(scheme.value or 0),
        class_assignment_mode="first-deterministic", shuffle=True, seed=seed,
    )  # fmt: skip


def _dataset(columns: dict[str, npt.ArrayLike]) -> Any:
    """A Hugging Face dataset of the recording's indices, labels and groups (the features stay
    in numpy: partitioners need only these)."""
    from datasets import Dataset, disable_progress_bars

    disable_progress_bars()
    return Dataset.from_dict({k: np.asarray(v).tolist() for k, v in columns.items()})


@dataclass(frozen=True)
class SplitRecording:
    """A recording and its partitions: what a device of a partitioned recording streams.

    Attributes
    ----------
    x, y : ndarray
        The recording's samples and labels, in recorded order.
    partitions : Partitions
        Which samples are whose.
    key : str
        The key of a natural partition ("" for the others).
    """

    x: npt.NDArray[np.float32]
    y: npt.NDArray[np.int64]
    partitions: Partitions
    key: str = ""

    def device(self, index: int) -> str:
        """The device id of partition ``index``: its group's (``user-14``) with a natural
        partition, else ``part-<index>``."""
        name = self.partitions.names[index]
        return device_name(self.key, name) if self.key else f"part-{name}"

    def part(self, index: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Partition ``index``'s samples and labels, in the order the device streams them.

        Raises
        ------
        IndexError
            If there is no such partition (saying how many there are).
        """
        if not 0 <= index < len(self.partitions):
            raise IndexError(
                f"partition {index} does not exist: the recording splits into "
                f"{len(self.partitions)}"
            )
        at = self.partitions.indices[index]
        return self.x[at], self.y[at]


def split_recording(
    path: str,
    scheme: Scheme,
    *,
    key: str = "",
    num_partitions: int | None = None,
    seed: int = 0,
    shape: Sequence[int] | None = None,
) -> SplitRecording:
    """Load a recording and split it across devices (cached per process for a file that has
    not changed: every virtual device of a process reads it once).

    Raises
    ------
    ValueError
        If the recording cannot be read, the key is missing, or the split is impossible
        (:func:`partition`).
    ImportError
        Without ``flwr-datasets``.
    """
    stamp = Path(path).stat().st_mtime_ns if Path(path).is_file() else 0
    return _split(path, stamp, scheme, key, num_partitions, seed, tuple(shape or ()))


@functools.lru_cache(maxsize=4)
def _split(
    path: str,
    _stamp: int,
    scheme: Scheme,
    key: str,
    num_partitions: int | None,
    seed: int,
    shape: tuple[int, ...],
) -> SplitRecording:
    x, y = load_recording(path, shape or None, group_key=key or None)
    groups = load_groups(path, key) if key else None
    if groups is not None and scheme.kind == "natural" and len(set(groups.tolist())) < 2:
        raise ValueError(
            f"{path}: {key!r} holds one group ({groups[0] if len(groups) else 'none'}), one "
            f"device: partition by a key with several; it has: {', '.join(recording_keys(path))}"
        )
    parts = partition(y, scheme, groups=groups, num_partitions=num_partitions, seed=seed)
    return SplitRecording(x, y, parts, key)
