"""What the ingest daemon tells operators: its log lines about rejects, rates and losses.

The status message itself (the buffer's counters, retained on the device's status topic)
is assembled by the daemon; these keep its log readable under a flood: one line per
reject reason per interval, one rate line per ``log_interval``, one loss warning per
interval.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from edge_client.runtime.constants import (
    LOSS_LOG_INTERVAL_S,
    MQTT_5,
    MQTT_311,
    REJECT_LOG_INTERVAL_S,
)

__all__ = ["LOSS_KEYS", "LossLog", "RateLog", "RejectLog"]

#: The status keys that count what never arrived, and what each counts.
LOSS_KEYS = {
    "messages-missing": "message(s) of fedstream publishers never arrived (gaps in their "
    "sequence numbers)",
    "readings-missing": "reading(s) never arrived (gaps in a sensor's counter, --seq-field, or "
    "inside a stream at its declared --rate)",
}
#: Why messages go missing, and what fixes it, by the daemon's MQTT version.
_CAUSES = {
    MQTT_311: "most likely the broker dropped them: under MQTT 3.1.1 it sends at most its "
    "in-flight limit before this daemon acknowledges (Mosquitto: max_inflight_messages, "
    "default 20) and queues at most its queue limit behind them (max_queued_messages, "
    "default 1000). Use --mqtt-version 5 where the broker has it, or raise both limits",
    MQTT_5: "most likely the broker dropped them while this daemon was away or behind: it "
    "queues at most its queue limit for an absent client (Mosquitto: max_queued_messages, "
    "default 1000, and max_queued_bytes), and keeps no QoS 0 message. Raise the broker's "
    "queue limits, keep the session (--session-expiry) and publish at QoS 1",
}

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


class LossLog:
    """Warns when the status shows more of a stream missing than before (what a broker
    dropped, as far as the daemon can see it), naming the likely cause and the setting that
    fixes it: the first time at once, then at most once per interval with the count since.

    Parameters
    ----------
    protocol : str
        The daemon's MQTT version (the cause differs).
    interval : float
        Seconds between warnings at most.
    """

    def __init__(self, protocol: str, interval: float = LOSS_LOG_INTERVAL_S) -> None:
        self.protocol = protocol
        self.interval = interval
        self._reported: dict[str, int] = {}  # the highest count warned about, per key
        self._last = -1e18

    def record(self, status: dict[str, Any], now: float | None = None) -> bool:
        """Look at a status just published; warn if a loss count rose (and it is time).

        Returns
        -------
        bool
            Whether it warned.
        """
        now = time.monotonic() if now is None else now
        rises = {
            key: int(status[key]) - self._reported.get(key, 0)
            for key in LOSS_KEYS
            if isinstance(status.get(key), int) and status[key] > self._reported.get(key, 0)
        }
        if not rises or now - self._last < self.interval:
            return False
        what = "; ".join(f"{n} {LOSS_KEYS[key]}" for key, n in rises.items())
        log.warning(
            "%s: %s since the last warning; %s (warned at most once per %.0f s)",
            status.get("device-id", "?"),
            what,
            _CAUSES.get(self.protocol, _CAUSES[MQTT_5]),
            self.interval,
        )
        self._reported.update({key: int(status[key]) for key in rises})
        self._last = now
        return True
