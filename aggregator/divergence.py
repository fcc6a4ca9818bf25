"""The divergence watch: rounds in a row in which training diverged on some device, logged
in one line each, and the end of the run once ``max-diverged-rounds`` came in a row."""

from __future__ import annotations

import logging

from aggregator.round_log import RoundRecord, divergence_hint

__all__ = ["DivergenceWatch", "RunDivergedError"]

log = logging.getLogger(__name__)


class RunDivergedError(RuntimeError):
    """The run ended because training diverged on its devices in ``max-diverged-rounds``
    rounds in a row (raised from the ServerApp: Flower marks the run failed)."""


class DivergenceWatch:
    """Counts the rounds (asynchronous mode: versions) in a row that diverged.

    Parameters
    ----------
    limit : int
        ``max-diverged-rounds``: the run ends after this many in a row (0: never).
    lr : float
        The run's learning rate, named in the hint logged.
    rounds : int
        Rounds in a row that diverged so far (a resumed run's count).
    """

    def __init__(self, limit: int, lr: float, rounds: int = 0) -> None:
        self.limit = limit
        self.lr = lr
        self.rounds = rounds

    def count(self, diverged: bool) -> int:
        """Count a committed round (that ``diverged`` or not); return the rounds in a row."""
        self.rounds = self.rounds + 1 if diverged else 0
        return self.rounds

    def check(self, record: RoundRecord) -> None:
        """Log a round in which training diverged on some device, in one line; end the run
        once ``max-diverged-rounds`` such rounds came in a row.

        Raises
        ------
        RunDivergedError
            When the limit is reached (never with ``max-diverged-rounds = 0``).
        """
        if not record.diverged:
            return
        what = "version" if record.mode == "async" else "round"
        hint = divergence_hint(self.lr)
        log.warning("%s %d: %s: %s", what, record.round, record.divergence(), hint)
        if self.limit and self.rounds >= self.limit:
            raise RunDivergedError(
                f"training diverged in {self.rounds} {what}s in a row "
                f"(max-diverged-rounds = {self.limit}); in {what} {record.round}, "
                f"{record.divergence()}: {hint}"
            )
