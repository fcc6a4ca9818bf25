"""What a secure round did and cost (:mod:`aggregator.secure_round` fills it in; a round's
report carries it): a module of its own, so that the strategy can name it without importing
the secure round, which imports the strategy."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SecureRoundFigures"]


@dataclass
class SecureRoundFigures:
    """What a secure round did and cost.

    Attributes
    ----------
    survivors : int
        Devices whose update is in the sum.
    dropped : int
        Devices that trained and advertised keys but were lost (no answer, an error) or
        refused at a later stage: before their masked input (their update is not in the
        sum) or after it (it is: their seed rebuilt from their neighbours' shares).
    bytes_up, bytes_down : int
        Payload bytes of the adverts and stages 2-4, devices to aggregator and back.
    device_cpu_s : float
        CPU seconds a device spent on stages 2-4 (mean over those that answered).
    unmask_s : float
        The aggregator's CPU seconds rebuilding secrets and taking masks off.
    stages_s : float
        Wall seconds from the first stage's messages to the sum (stages 2-4).
    skipped : str
        Why the round was skipped ('' when it was not).
    """

    survivors: int = 0
    dropped: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    device_cpu_s: float = 0.0
    unmask_s: float = 0.0
    stages_s: float = 0.0
    skipped: str = ""
    cpu: dict[int, float] = field(default_factory=dict, repr=False)  # device -> stages' CPU
    lost: set[int] = field(default_factory=set, repr=False)  # devices dropped or refused
