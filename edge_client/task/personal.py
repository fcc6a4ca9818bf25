"""Personal layers: the part of a model each device keeps to itself.

People differ, and so do the ways a sensor is worn; the cheap answers on edge devices keep
part of the model on each device. ``personalize = "head"`` keeps the output layer
(FedPer, Arivazhagan et al. 2019; FedRep, Collins et al. 2021): the devices share the
features and each learns its own mapping to classes. ``personalize = "bn"`` keeps the
normalisation layers, their statistics and affine parameters (FedBN, Li et al. 2021): each
device's feature shift (gain, bias, mounting) is absorbed locally. ``personal-layers`` names
a user's model's parameters by pattern (:func:`fnmatch.fnmatchcase` on state-dict keys,
``"head.*,adapter.*"``), alone or on top of either.

A personal tensor is never sent: the device trains it, keeps it in its device state, and
overlays it on every model it receives; the aggregator leaves it out of the update and of
the exported model (whose manifest names it).
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

from torch import nn

from edge_client.wire.constants import PERSONALIZE
from edge_client.wire.settings_groups import LearningSettings

__all__ = ["personal_keys", "run_personal_keys", "split_patterns", "unshared_keys"]

#: Normalisation layers, whose statistics and affine parameters ``bn`` keeps local.
_NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)


def split_patterns(text: str) -> tuple[str, ...]:
    """``personal-layers`` as its patterns (comma-separated, blanks ignored)."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


def personal_keys(
    model: nn.Module, personalize: str = "none", patterns: Sequence[str] = ()
) -> frozenset[str]:
    """The state-dict keys of ``model`` that stay on each device.

    Parameters
    ----------
    model : nn.Module
        The run's model.
    personalize : {"none", "head", "bn"}
        ``head``: the output layer, i.e. the last module that holds parameters of its own;
        ``bn``: every normalisation layer (batch, layer, group, instance norm).
    patterns : sequence of str
        Further keys by pattern (``personal-layers``).

    Returns
    -------
    frozenset of str
        Empty with ``none`` and no patterns.

    Raises
    ------
    ValueError
        If ``personalize`` is not one of :data:`PERSONALIZE`, if it or a pattern selects
        nothing (a model without normalisation layers under ``bn``), or if everything would
        stay local (nothing left to share).
    """
    if personalize not in PERSONALIZE:
        raise ValueError(f"personalize must be one of {PERSONALIZE}, got {personalize!r}")
    keys = [k for k, v in model.state_dict().items() if v.is_floating_point()]
    chosen: set[str] = set()
    if personalize == "head":
        owners = [name for name, m in model.named_modules() if _own_keys(name, m)]
        if not owners:
            raise ValueError("personalize = 'head': the model has no layer with parameters")
        chosen |= _own_keys(owners[-1], dict(model.named_modules())[owners[-1]])
    elif personalize == "bn":
        for name, module in model.named_modules():
            if isinstance(module, _NORMS):
                chosen |= _own_keys(name, module)
        if not chosen:
            raise ValueError(
                "personalize = 'bn': the model has no normalisation layers to keep local "
                "(model = 'cnn-bn' is the built-in CNN with batch normalisation)"
            )
    for pattern in patterns:
        matched = {k for k in keys if fnmatchcase(k, pattern)}
        if not matched:
            raise ValueError(
                f"personal-layers: {pattern!r} matches none of the model's tensors "
                f"({', '.join(keys)})"
            )
        chosen |= matched
    if chosen and chosen >= set(keys):
        raise ValueError("personalisation would keep every tensor local: nothing is shared")
    return frozenset(chosen)


def unshared_keys(model: nn.Module, personal: frozenset[str]) -> frozenset[str]:
    """What no update carries: the personal tensors, and every tensor that is not floating
    point (a batch norm's step counter: bookkeeping, not something to average)."""
    counters = {k for k, v in model.state_dict().items() if not v.is_floating_point()}
    return personal | counters


def _own_keys(name: str, module: nn.Module) -> set[str]:
    """The state-dict keys of ``module``'s own floating-point parameters and buffers (not its
    children's; a step counter is left to :func:`unshared_keys`)."""
    prefix = f"{name}." if name else ""
    own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
    return {prefix + k for k, v in own if v is not None and v.is_floating_point()}


def run_personal_keys(model: nn.Module, learning: LearningSettings) -> frozenset[str]:
    """:func:`personal_keys` as a run's ``personalize`` and ``personal-layers`` say."""
    return personal_keys(model, learning.personalize, split_patterns(learning.personal_layers))
