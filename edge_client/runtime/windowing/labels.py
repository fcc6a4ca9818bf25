"""Labels joined to windows by timestamp, with a bounded wait.

A label holds from its timestamp until the next label's: ``{"ts": 12.0, "activity": "walk"}``
says the activity is walking from 12.0 s on. A window takes the label in force at its last
reading, the latest label with ``ts <=`` the window's end. That label is final once a label
at or after the window's end has arrived (labels may come late, and out of order: a later
one could still land in between). So a window waits:

- labelled as soon as the labels have reached its end;
- dropped as ``unlabelled`` if, then, no label precedes it;
- dropped as ``label-timeout`` once the readings have moved ``label_wait`` seconds past its end
  without the labels reaching it (labels that never come are counted, not waited on forever).

Labels carried by the readings themselves (``--label-field`` on a data topic) are the same
thing with no wait: a reading's label arrives with it, so a window takes its last reading's.

Which labels are kept: every one a waiting or future window could still take. Future windows
end after the newest row the aligner has made (with several topics, that can be well behind
the newest reading), so the labels from the one in force then are kept; before any row, all
are, up to :data:`~edge_client.runtime.constants.LABEL_EVENTS_MAX` (then the oldest go). A
label older than every one kept is refused as ``late``; one repeated with its timestamp is a
``duplicate``.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from typing import Any

from edge_client.runtime.constants import LABEL_EVENTS_MAX

__all__ = ["LabelJoin"]


class LabelJoin:
    """Label windows from a stream of label events.

    Parameters
    ----------
    wait : float
        Seconds of stream time a window waits for its label.
    """

    def __init__(self, wait: float) -> None:
        self.wait = wait
        self.ts: list[float] = []  # label events, by time
        self.labels: list[int] = []
        self.reached: float | None = None  # the newest label's time
        self.held: list[tuple[int, float]] = []  # (window id, end) waiting, by end
        self.horizon: float | None = None  # the newest row made: later windows end after it

    def add(self, ts: float, label: int) -> str | None:
        """Take one label event; return why it was refused, or None."""
        i = bisect.bisect_left(self.ts, ts)
        if i < len(self.ts) and self.ts[i] == ts:
            if self.labels[i] == label:
                return "duplicate"
            self.labels[i] = label  # a correction of the same moment
        elif i == 0 and self.ts and self.ts[0] <= self._needed_from():
            return "late"  # older than the label every waiting or future window takes
        else:
            self.ts.insert(i, ts)
            self.labels.insert(i, label)
            if len(self.ts) > LABEL_EVENTS_MAX:  # labels far ahead of the data: bounded
                del self.ts[0], self.labels[0]
        self.reached = ts if self.reached is None else max(self.reached, ts)
        return None

    def hold(self, window_id: int, end: float) -> None:
        """A window ending at ``end`` waits for its label (windows come in order of end)."""
        self.held.append((window_id, end))

    def resolve(
        self, now: float, horizon: float | None
    ) -> tuple[list[tuple[int, float, int]], list[int], Counter[str]]:
        """Label what can be labelled; drop what waited too long.

        Parameters
        ----------
        now : float
            The stream's time, its newest reading's: what waits are measured against.
        horizon : float, optional
            The newest row made so far: windows still to come end after it.

        Returns
        -------
        labelled : list of (window id, end, label)
        dropped : list of window ids
        reasons : Counter
            Dropped windows by reason (``unlabelled``, ``label-timeout``).
        """
        labelled: list[tuple[int, float, int]] = []
        dropped: list[int] = []
        reasons: Counter[str] = Counter()
        self.horizon = horizon
        while self.held:
            window_id, end = self.held[0]
            if self.reached is not None and self.reached >= end:
                i = bisect.bisect_right(self.ts, end) - 1
                if i < 0:
                    dropped.append(window_id)
                    reasons["unlabelled"] += 1
                else:
                    labelled.append((window_id, end, self.labels[i]))
            elif now - end > self.wait:
                dropped.append(window_id)
                reasons["label-timeout"] += 1
            else:
                break  # later windows end later: they wait too
            self.held.pop(0)
        self._prune()
        return labelled, dropped, reasons

    def _needed_from(self) -> float:
        """The earliest end a window could still be labelled at: the first waiting one's,
        or (none waiting) the newest row's; before any row, any."""
        if self.held:
            return self.held[0][1]
        return -math.inf if self.horizon is None else self.horizon

    def _prune(self) -> None:
        """Forget labels older than the one in force at the earliest end still to come."""
        i = bisect.bisect_right(self.ts, self._needed_from()) - 1
        if i > 0:
            del self.ts[:i]
            del self.labels[:i]

    def state(self) -> dict[str, Any]:
        """What a restart needs, JSON-ready."""
        return {
            "ts": self.ts,
            "labels": self.labels,
            "reached": self.reached,
            "held": self.held,
            "horizon": self.horizon,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state`."""
        self.ts = list(state["ts"])
        self.labels = list(state["labels"])
        self.reached = state["reached"]
        self.held = [(int(i), float(e)) for i, e in state["held"]]
        self.horizon = state["horizon"]
