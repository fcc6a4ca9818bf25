"""Which messages of a publisher were stored already: exact QoS 1 de-duplication.

A publisher numbers its messages 0, 1, 2, ... A high-water mark ("drop anything not newer
than the last stored") is not enough: after a broker restart paho sends the message being
published right now before it resends the ones it queued during the outage, and a broker
restored from its persistence file may hand out a queue out of order, so a high-water mark
drops resent messages as duplicates (found by the broker-crash fault test: 700 of 1,200).

:class:`SeqWindow` keeps a floor (every number up to it counts as seen) and a bitmap of the
numbers seen above it. An in-order stream keeps the bitmap empty. The bitmap never spans
more than ``DEDUP_WINDOW`` numbers: a gap further behind the newest message than any client
can have messages in flight (MQTT message ids are 16 bit) is forgotten, and a hostile
sequence number cannot make the state grow.

The same state tells what never arrived: the numbers from the lowest stored to the highest
stored that were not stored are missing (a broker dropped them, most likely), and a late
arrival takes its number off again. Numbers the window forgets unseen stay counted
(:attr:`SeqWindow.lost`; at most ``DEDUP_WINDOW`` per jump, so that a hostile number cannot
inflate the count without bound).
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_client.runtime.constants import DEDUP_WINDOW

__all__ = ["SeqWindow"]


@dataclass
class SeqWindow:
    """The sequence numbers of one publisher's stored messages.

    Attributes
    ----------
    floor : int
        Every number <= floor counts as seen.
    bits : int
        Bit i set: number ``floor + 1 + i`` was seen (0 for an in-order stream).
    low, high : int or None
        The lowest and highest numbers stored (None: none yet).
    lost : int
        Numbers between ``low`` and ``high`` that the window forgot without seeing them.
    """

    floor: int
    bits: int = 0
    low: int | None = None
    high: int | None = None
    lost: int = 0

    @classmethod
    def starting_at(cls, seq: int) -> SeqWindow:
        """The window of a publisher first met at message ``seq``.

        Up to ``DEDUP_WINDOW`` earlier numbers may still come (a queue delivered out of
        order); anything older counts as seen.
        """
        return cls(max(-1, seq - 1 - DEDUP_WINDOW))  # numbers start at 0; add() sets the span

    def seen(self, seq: int) -> bool:
        """True when ``seq`` was stored already (a redelivery) or is too old to be new."""
        return seq <= self.floor or bool(self.bits >> (seq - self.floor - 1) & 1)

    def add(self, seq: int) -> None:
        """Record ``seq`` as stored; raise the floor over every gap that closed."""
        if self.seen(seq):
            return
        self.low = seq if self.low is None else min(self.low, seq)
        self.high = seq if self.high is None else max(self.high, seq)
        if seq - self.floor > DEDUP_WINDOW:  # slide: forget gaps that far behind
            floor = seq - DEDUP_WINDOW
            self.lost += min(self._unseen(floor), DEDUP_WINDOW)
            self._raise_floor(floor)
        self.bits |= 1 << (seq - self.floor - 1)
        ones = (~self.bits & (self.bits + 1)).bit_length() - 1  # trailing set bits
        self._raise_floor(self.floor + ones)

    @property
    def missing(self) -> int:
        """Numbers from the lowest stored to the highest stored that were never stored."""
        if self.high is None:
            return self.lost
        return self.lost + self._unseen(self.high)

    def _unseen(self, upto: int) -> int:
        """Numbers above the floor (and not below ``low``) up to ``upto`` not seen."""
        start = self.floor if self.low is None else max(self.floor, self.low - 1)
        if upto <= start:
            return 0
        span = upto - self.floor  # bits 0 .. span-1 are the numbers up to ``upto``
        seen = self.bits if span >= self.bits.bit_length() else self.bits & ((1 << span) - 1)
        return (upto - start) - seen.bit_count()

    def _raise_floor(self, floor: int) -> None:
        shift = floor - self.floor
        if shift > 0:
            self.bits >>= shift
            self.floor = floor

    def to_bytes(self) -> bytes:
        """The bitmap for storage (empty for an in-order stream)."""
        return self.bits.to_bytes((self.bits.bit_length() + 7) // 8, "little")

    @classmethod
    def from_stored(
        cls,
        floor: int,
        bits: bytes | None,
        low: int | None = None,
        high: int | None = None,
        lost: int = 0,
    ) -> SeqWindow:
        """The window as :meth:`to_bytes`, its floor and its span stored it (a buffer file of
        a layout before loss counting has no span: counting starts above the floor)."""
        ahead = int.from_bytes(bits or b"", "little")
        if low is None or high is None:
            low, high = floor + 1, floor + ahead.bit_length()
        return cls(floor, ahead, low, high, lost)
