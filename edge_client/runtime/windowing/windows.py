"""Rows into windows: ``window`` consecutive rows every ``stride``, never across a break.

``N`` rows without a break make ``(N - window) // stride + 1`` windows (none when
``N < window``): the first starts at the first row, each next one ``stride`` rows later. A
break starts the count afresh, so the rows before it that did not fill a window are given up
(the aligner breaks at gaps in time: a window of readings minutes apart is not a sample);
the rows given up that were in no window are counted (``readings-at-gaps``: readings, or
ticks of the grid when the aligner resamples).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from edge_client.runtime.windowing.align import Row

__all__ = ["Window", "Windower"]

#: A window: the time of its last row, and its values ``(channels, window)``.
Window = tuple[float, npt.NDArray[np.float32]]


class Windower:
    """Cut windows from a stream of rows and breaks.

    Parameters
    ----------
    window, stride : int
        Rows per window, and between the starts of consecutive windows.
    """

    def __init__(self, window: int, stride: int) -> None:
        self.window = window
        self.stride = stride
        self.rows: list[Row] = []  # rows of the window being filled
        self.skip = 0  # rows to pass over before the next window starts (stride > window)
        self.unused = 0  # rows held that are in no window yet (the newest ones)
        self.given_up = 0  # rows dropped at breaks that made no window (a counter)

    def feed(self, rows: list[Row | None]) -> list[Window]:
        """Take rows (None: a break) in order; return the windows they complete."""
        out: list[Window] = []
        for row in rows:
            if row is None:
                self.given_up += self.unused
                self.rows.clear()
                self.skip = self.unused = 0
                continue
            if self.skip:
                self.skip -= 1
                continue
            self.rows.append(row)
            self.unused += 1
            if len(self.rows) == self.window:
                values = np.array([v for _, v in self.rows], dtype=np.float32).T
                out.append((self.rows[-1][0], np.ascontiguousarray(values)))
                del self.rows[: self.stride]
                self.skip = max(0, self.stride - self.window)
                self.unused = 0  # the rows kept for the next window were in this one
        return out

    @property
    def waiting(self) -> int:
        """Rows held for the window being filled."""
        return len(self.rows)

    def state(self) -> dict[str, Any]:
        """What a restart needs, JSON-ready."""
        return {
            "rows": [[ts, list(v)] for ts, v in self.rows],
            "skip": self.skip,
            "unused": self.unused,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state`."""
        self.rows = [(ts, tuple(v)) for ts, v in state["rows"]]
        self.skip = int(state["skip"])
        self.unused = int(state["unused"])
