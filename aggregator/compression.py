"""Which codec mode a round's updates travel in: the run's, or ScaDLES' adaptive rule."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ADAPTIVE", "choose_mode", "round_mode"]

ADAPTIVE = "adaptive"  # the run-config choice that lets the aggregator pick per round


def choose_mode(gaps: Sequence[float], delta: float) -> str:
    """ScaDLES' rule: ``topk`` when most devices' top-k gap EWMA is within ``delta``, else
    ``none`` (dense). Without any report yet the round goes dense."""
    within = sum(1 for g in gaps if g <= delta)
    return "topk" if gaps and within > len(gaps) / 2 else "none"


def round_mode(compress: str, gaps: Sequence[float], delta: float) -> str:
    """The mode of a round: ``compress`` itself, or for ``adaptive`` :func:`choose_mode` over
    the gap EWMAs the round's devices last reported."""
    return choose_mode(gaps, delta) if compress == ADAPTIVE else compress
