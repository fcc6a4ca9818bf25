"""A recorded series replayed as a sensor sends it: per-reading JSON, one reading at a time
(or in the way ESPHome, Zigbee2MQTT or Tasmota devices publish it:
:mod:`~edge_client.emulation.reading_styles`).

``fedstream publish --source series.csv --readings`` publishes each row of the series as
``{"ts": ..., "<channel>": value, ...}`` (the CSV's column names; ``x0``, ``x1``, ... for an
``.npz``), for ``fedstream ingest --fields <channels> --window W`` to cut into samples.

Timestamps are the publisher's clock at the first reading plus ``i / rate``: evenly spaced,
as a sampling sensor stamps them, whatever the network does to the messages. When the series
ends it starts again, :data:`~edge_client.emulation.constants.REPLAY_GAP_S` seconds of stream
time later, so that no window is cut across the seam (the ingest daemon's ``--max-gap``).
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from edge_client.emulation.constants import REPLAY_GAP_S
from edge_client.emulation.reading_styles import STYLES, SparkplugEdge, encode_style
from edge_client.task.recordings import TIME_COLUMNS, load_series
from edge_client.wire.readings import encode_readings
from edge_client.wire.readings import time_zone as zone_of
from edge_client.wire.sparkplug import SparkplugTopic

__all__ = ["SeriesReadings", "series_channels"]


def series_channels(path: str | Path) -> list[str]:
    """The channel names of a series file: a CSV's columns but its time columns, or
    ``x0, x1, ...`` for an ``.npz``.

    Raises
    ------
    ValueError
        If the file cannot be read as a series (:func:`~edge_client.task.load_series`).
    """
    path = Path(path)
    values = load_series(path)
    if path.suffix == ".csv":
        with path.open(newline="") as fh:
            header = next(csv.reader(fh))
        return [c for c in header if c.lower() not in TIME_COLUMNS]
    return [f"x{c}" for c in range(values.shape[1])]


class SeriesReadings:
    """The readings of a series as per-reading JSON payloads, in order, looping.

    Parameters
    ----------
    values : ndarray
        ``(T, C)`` readings.
    names : list of str
        The ``C`` channels' field names.
    rate : float
        Readings per second: the spacing of the timestamps.
    start : float, optional
        The first reading's timestamp (default: now).
    style : str
        How the readings are published (:data:`~edge_client.emulation.reading_styles.STYLES`).
    time_zone : str, optional
        ``tasmota``: the zone of its local times.
    topic : str, optional
        Where the style publishes (``esphome``: a template with a ``+`` for the channel's
        level); default: the publisher's topic.
    """

    def __init__(
        self,
        values: npt.NDArray[np.float32],
        names: list[str],
        rate: float,
        start: float | None = None,
        style: str = "json",
        time_zone: str | None = None,
        topic: str | None = None,
    ) -> None:
        if values.ndim != 2 or values.shape[1] != len(names) or not len(values):
            raise ValueError(f"{len(names)} channel names for readings of shape {values.shape}")
        if style not in STYLES:
            raise ValueError(f"--style {style!r}: one of {', '.join(STYLES)}")
        if time_zone is not None:
            zone_of(time_zone)  # an unknown zone is refused before anything is sent
        self.values = values
        self.names = names
        self.rate = rate
        self.start = time.time() if start is None else start
        self.style = style
        self.time_zone = time_zone
        self.topic = topic
        self.sent = 0  # readings given so far, over all passes
        self._edge: SparkplugEdge | None = None  # --style sparkplug's edge node

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        rate: float,
        style: str = "json",
        time_zone: str | None = None,
        topic: str | None = None,
    ) -> SeriesReadings:
        """The series in ``path`` (see :func:`series_channels`), stamped at ``rate``, sent
        in ``style`` (on ``topic``)."""
        values, names = load_series(path), series_channels(path)
        return cls(values, names, rate, style=style, time_zone=time_zone, topic=topic)

    def messages(self, n: int, max_payload: int, topic: str) -> list[tuple[str, bytes]]:
        """The next ``n`` readings as (topic, payload) messages in :attr:`style` (``json``:
        :meth:`payloads`), on :attr:`topic` or else ``topic``."""
        where = self.topic or topic
        if self.style == "json":
            return [(where, payload) for payload in self.payloads(n, max_payload)]
        stamps, rows = self._next(n)
        if self.style == "sparkplug":  # stateful: births once, the sequence runs on
            if self._edge is None or self._edge.topic != SparkplugTopic.data(where):
                self._edge = SparkplugEdge(where, self.names)
            return self._edge.messages(stamps, rows)
        return encode_style(self.style, where, stamps, rows, self.names, self.time_zone)

    def payload(self, n: int) -> bytes:
        """The next ``n`` readings: one JSON object, or a list of ``n`` of them."""
        return encode_readings(*self._next(n), self.names)

    def payloads(self, n: int, max_payload: int) -> list[bytes]:
        """The next ``n`` readings as few messages of at most ``max_payload`` bytes each
        (one JSON list, or single objects, as :meth:`payload`), in order.

        Raises
        ------
        ValueError
            If one reading alone is bigger than ``max_payload``.
        """
        stamps, rows = self._next(n)
        out: list[bytes] = []
        parts = [(0, n)]
        while parts:  # halve what does not fit, keeping the order
            lo, hi = parts.pop(0)
            payload = encode_readings(stamps[lo:hi], rows[lo:hi], self.names)
            if len(payload) <= max_payload:
                out.append(payload)
            elif hi - lo == 1:
                raise ValueError(
                    f"one reading makes a {len(payload)}-byte message, more than the largest "
                    f"message, {max_payload} bytes (--max-payload)"
                )
            else:
                mid = (lo + hi) // 2
                parts[:0] = [(lo, mid), (mid, hi)]
        return out

    def _next(self, n: int) -> tuple[list[float], list[list[float]]]:
        """The next ``n`` readings' timestamps and values."""
        stamps: list[float] = []
        rows: list[list[float]] = []
        for _ in range(n):
            passes, i = divmod(self.sent, len(self.values))
            stamps.append(round(self.start + self.sent / self.rate + passes * REPLAY_GAP_S, 6))
            rows.append(self.values[i].tolist())
            self.sent += 1
        return stamps, rows
