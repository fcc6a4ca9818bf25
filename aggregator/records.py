"""What the aggregator records per round: one :class:`RoundRecord` per line of
``metrics.jsonl``.

Each device's entry is its reply's metrics exactly as the device reported them (keys of
:class:`~edge_client.wire.records.ReplyMetrics`, ``bytes-up`` as received), nothing renamed
on the way. Round-level keys are the fields below in kebab case.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from edge_client.wire.mapping import MappingError, from_mapping, to_mapping
from edge_client.wire.records import ReplyMetrics

__all__ = ["RoundRecord", "append_record", "read_metrics", "virtual_round_s"]


@dataclass(frozen=True)
class RoundRecord:
    """One round as ``metrics.jsonl`` holds it.

    Attributes
    ----------
    round : int
        The server round.
    accuracy, loss : float
        The aggregator's evaluation of the new model.
    global_batch, sum_b : int
        B, and the sum of the planned batches (less than B when streams cap them).
    lr_scale : float
        The learning-rate scale of the plan.
    planned : dict of str to int
        Planned batch per device.
    devices : dict of str to ReplyMetrics
        What each device that replied reported.
    failed, rejected : dict of str to int
        Failures (error or no reply) and refusals per device, counted over the run.
    rejected_reasons : dict of str to int
        Refusals per reason, over the run.
    compress : str
        The round's codec mode.
    aggregation : str
        The aggregation rule.
    aggregated : list of str
        Devices whose update went into the model.
    bytes_up, broadcast_bytes : int
        Update frames received; one copy of the model sent down.
    inject_picked : list of str
        Devices asked to share samples.
    inject_bytes : int
        Bytes they queued for sharing.
    virtual_s : float
        The round on the virtual clock: the slowest device's compute + wait + transfer.
    wall_s, run_wall_s : float
        The round's wall time, and the run's so far.
    """

    round: int
    accuracy: float
    loss: float
    global_batch: int
    sum_b: int
    lr_scale: float
    planned: dict[str, int]
    devices: dict[str, ReplyMetrics]
    failed: dict[str, int]
    rejected: dict[str, int]
    rejected_reasons: dict[str, int]
    compress: str
    aggregation: str
    aggregated: list[str]
    bytes_up: int
    broadcast_bytes: int
    inject_picked: list[str]
    inject_bytes: int
    virtual_s: float
    wall_s: float
    run_wall_s: float = 0.0

    def to_json(self) -> str:
        """The record as one line of ``metrics.jsonl``."""
        return json.dumps(to_mapping(self))

    @classmethod
    def from_json(cls, line: str) -> RoundRecord:
        """Read one line of ``metrics.jsonl``.

        Raises
        ------
        ValueError
            If the line is not a round record.
        """
        try:
            return from_mapping(cls, json.loads(line))
        except (MappingError, json.JSONDecodeError, TypeError) as err:
            raise ValueError(f"not a round record: {err}") from err


def virtual_round_s(replies: Iterable[ReplyMetrics], uplink_mbps: float) -> float:
    """A synchronous round on the virtual clock: the slowest device's compute + wait +
    update transfer at ``uplink_mbps`` (0 without replies)."""
    return max(
        (m.compute_s + m.wait_s + m.bytes_up * 8 / (uplink_mbps * 1e6) for m in replies),
        default=0.0,
    )


def append_record(path: Path, record: RoundRecord) -> None:
    """Append a round to ``metrics.jsonl``."""
    with path.open("a") as fh:
        fh.write(record.to_json() + "\n")


def read_metrics(path: Path) -> list[RoundRecord]:
    """The rounds of a ``metrics.jsonl`` (none when the file does not exist yet).

    A last line still being written (no newline yet) is left for the next read.

    Raises
    ------
    ValueError
        If a line is not a round record (the message gives its number).
    """
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()
    records = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                records.append(RoundRecord.from_json(line))
            except ValueError as err:
                raise ValueError(f"{path}:{number}: {err}") from err
    return records
