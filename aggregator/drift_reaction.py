"""The aggregator's reaction to drift that devices report.

A device's drift watcher (:mod:`edge_client.runtime.drift_watch`) counts rises of its
prequential error; each reply carries the count (``drift-changes``). When a device's count
goes up, its stream has changed and the global model is behind on it. Every detection is
logged and recorded per round (``drift`` in ``metrics.jsonl``), and the run reacts as
``drift-reaction`` says, for ``drift-rounds`` rounds (asynchronous mode: aggregations):

- ``none`` (default): only log and record;
- ``learning-rate``: every device trains with its learning rate times ``drift-boost``, so the whole
  model moves faster while it catches up, then returns to the run's rate;
- ``boost``: the drifting device's updates weigh ``drift-boost`` times what the
  aggregation rule gives them (fedavg: its samples; fednova: one device).

Why ``none`` by default, measured in ``fedstream bench drift`` (4 devices, sensors
flipped, 3 seeds): neither reaction recovered sooner. When the whole fleet changes, every
setting recovers in 3 rounds, ``learning-rate`` with 1 point more accuracy over the rounds
after; when half of it changes, ``learning-rate`` and ``boost`` lose 2-3 points: each pulls
the model towards the group that just reported drift, which makes the other group report
drift in turn (4-5x the detections).

The robust rules (trimmed mean, median, Krum) never boost weights: a device's own claim
must not buy it influence there.
"""

from __future__ import annotations

import logging

from edge_client.wire.run_config import RunSettings
from edge_client.wire.settings_groups import DriftSettings

__all__ = ["DriftReaction"]

log = logging.getLogger(__name__)


class DriftReaction:
    """Per device: the drift count last seen; the rounds of reaction left.

    Parameters
    ----------
    settings : DriftSettings
        ``drift-reaction``, ``drift-boost`` and ``drift-rounds`` (the run's settings serve
        too: their keys read flat).
    """

    def __init__(self, settings: DriftSettings | RunSettings) -> None:
        self.reaction = settings.drift_reaction
        self.boost = settings.drift_boost
        self.rounds = settings.drift_rounds
        self.seen: dict[str, int] = {}
        self.left: dict[str, int] = {}  # boost: per device
        self.lr_left = 0  # lr: for the fleet

    def boost_of(self, device: str, changes: int) -> tuple[float, bool]:
        """The weight multiplier of ``device``'s update, given the drift count its reply
        carries; and whether the count rose with this reply."""
        rose = changes > self.seen.get(device, 0)
        self.seen[device] = max(changes, self.seen.get(device, 0))
        if rose:
            log.warning(
                "drift on %s (change %d): %s for %d rounds",
                device,
                changes,
                {
                    "learning-rate": f"learning rate x{self.boost:g}",
                    "boost": f"its updates weigh x{self.boost:g}",
                    "none": "no reaction",
                }[self.reaction],
                self.rounds,
            )
            if self.reaction == "boost":
                self.left[device] = self.rounds
            elif self.reaction == "learning-rate":
                self.lr_left = self.rounds
        if self.reaction == "boost" and self.left.get(device, 0) > 0:
            self.left[device] -= 1
            return self.boost, rose
        return 1.0, rose

    def next_lr_factor(self) -> float:
        """The learning-rate multiplier of the round (asynchronous mode: the version) being
        planned; each call is one round of the reaction spent."""
        if self.reaction != "learning-rate" or self.lr_left <= 0:
            return 1.0
        self.lr_left -= 1
        return self.boost

    def state_dict(self) -> dict[str, object]:
        """What a checkpoint keeps."""
        return {"seen": dict(self.seen), "left": dict(self.left), "lr-left": self.lr_left}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`."""
        seen = state.get("seen", {})
        left = state.get("left", {})
        self.seen = {str(k): int(v) for k, v in seen.items()} if isinstance(seen, dict) else {}
        self.left = {str(k): int(v) for k, v in left.items()} if isinstance(left, dict) else {}
        self.lr_left = int(state.get("lr-left", 0))  # type: ignore[call-overload]
