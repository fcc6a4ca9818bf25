"""What the ingest daemon tells operators: its log lines about rejects and rates.

The status message itself (the buffer's counters, retained on the device's status topic)
is assembled by the daemon; these keep its log readable under a flood: one line per
reject reason per interval, one rate line per ``log_interval``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from edge_client.runtime.constants import REJECT_LOG_INTERVAL_S

__all__ = ["RateLog", "RejectLog"]

#: The daemon's logger: these are its lines.
log = logging.getLogger("edge_client.runtime.ingest")


class RejectLog:
    """Logs each reject reason at most once per interval, with the count since."""

    def __init__(self, interval: float = REJECT_LOG_INTERVAL_S) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        self._since: Counter[str] = Counter()

    def record(self, reasons: Counter[str], now: float) -> None:
        """Count ``reasons``; log those not logged within the interval before ``now``."""
        for reason, n in reasons.items():
            self._since[reason] += n
            if now - self._last.get(reason, -1e18) >= self.interval:
                log.warning(
                    "rejected %d message(s) as %s (logged once per %.0f s)",
                    self._since.pop(reason),
                    reason,
                    self.interval,
                )
                self._last[reason] = now


class RateLog:
    """Every ``interval`` seconds, one line of what came in since the last one."""

    def __init__(self, device_id: str, interval: float) -> None:
        self.device_id = device_id
        self.interval = interval
        self._mark: tuple[float | None, int] = (None, 0)  # (monotonic, accepted)
        self._next = 0.0

    def record(self, status: dict[str, Any], connected: bool) -> None:
        """Log the rate since the last line from the status just published, when due."""
        now = time.monotonic()
        if "accepted" not in status or now < self._next:
            return
        last_t, last_accepted = self._mark
        if last_t is not None:
            rate = (status["accepted"] - last_accepted) / max(now - last_t, 1e-9)
            log.info(
                "%s: %.1f samples/s accepted over %.0f s (%d in all), fill %d of %d, "
                "dropped %d, refused %d %s, broker %s",
                self.device_id,
                rate,
                now - last_t,
                status["accepted"],
                status["fill"],
                status["capacity"],
                status["dropped"],
                status["rejected"],
                status["rejected-by-reason"] or "",
                "connected" if connected else "NOT connected",
            )
        self._mark = (now, status["accepted"])
        self._next = now + self.interval
