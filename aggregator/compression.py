"""Which codec mode a round's updates travel in: the run's, or ScaDLES' adaptive rule."""

from __future__ import annotations

from collections.abc import Sequence

from edge_client.wire.constants import ADAPTIVE

__all__ = ["choose_mode", "round_mode"]


def choose_mode(gaps: Sequence[float], delta: float) -> str:
    """ScaDLES' rule: ``topk`` when most devices' top-k gap EWMA is within ``delta``, else
    ``none`` (dense). Without any report yet the round goes dense.

    Parameters
    ----------
    gaps : sequence of float
        The gap EWMAs (``| ||g|| - ||topk(g)|| | / ||g||``) the round's devices reported.
    delta : float
        The run's ``compress-delta``.

    Returns
    -------
    str
        ``topk`` or ``none``.
    """
    within = sum(1 for g in gaps if g <= delta)
    return "topk" if gaps and within > len(gaps) / 2 else "none"


def round_mode(compress: str, gaps: Sequence[float], delta: float) -> str:
    """The codec mode of a round.

    Parameters
    ----------
    compress : str
        The run's ``compress``: a codec mode, or ``adaptive``.
    gaps, delta
        As for :func:`choose_mode` (used for ``adaptive`` only).

    Returns
    -------
    str
        ``compress`` itself, or for ``adaptive`` :func:`choose_mode`'s pick.
    """
    return choose_mode(gaps, delta) if compress == ADAPTIVE else compress
