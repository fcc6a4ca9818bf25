"""The task interface: what a run learns, whatever the user's sensors send.

A :class:`Task` says how to build the model for a sample shape and an output count, the loss
it is trained on, the metric it is scored by, how a batch of buffered samples becomes the
model's inputs and targets, and an optional preprocessing step the device keeps state for
(:mod:`edge_client.task.preprocess`). Nothing in it assumes classification: a task whose
targets are cut from the samples themselves (forecasting) overrides :meth:`Task.targets`.

Built in: :class:`Classification` (the sensor 1D-CNN or the MLP, or a user's own
``nn.Module`` class). A user's task derives from :class:`Task` and is named by import path in
the run config (``task = "my_pkg.task:HarTask"``) or handed to the app factories
(:func:`edge_client.flower_app.make_client_app`,
:func:`aggregator.server_app.make_server_app`).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from edge_client.task.constants import PREPROCESSING
from edge_client.task.models import build_model
from edge_client.task.preprocess import ChannelStandardizer, Preprocessor

__all__ = [
    "Classification",
    "ModelFactory",
    "Probabilities",
    "Scores",
    "Task",
    "evaluate",
    "init_model",
]

#: A user's model: a class or function called with the keyword arguments it declares of
#: ``shape`` (the sample shape), ``num_outputs`` and ``num_classes`` (both the output count).
ModelFactory = Callable[..., nn.Module]

# Samples per forward pass when scoring: bounds the memory it takes. 256 scored a CNN's
# samples fastest on one thread here (4,096 samples of 6x32: 256 channels 0.86-0.99 s at
# 256 against 1.32-1.39 s at 1,024, 0.87-1.09 s at 128; the default width 0.027-0.029 s
# against 0.048-0.061 s): a larger chunk's activations fall out of the cache.
EVAL_CHUNK = 256


class Task(ABC):
    """What is learned and how it is scored.

    Subclasses implement :meth:`build_model`, :meth:`loss` and :meth:`score`; they may
    override :meth:`targets` (where the targets come from) and :meth:`preprocessor`.

    Attributes
    ----------
    metric : str
        Name of the headline metric that :meth:`score` measures, as records and tables show
        it (``accuracy``).
    higher_is_better : bool
        Whether a larger metric is a better model (False for an error, such as ``mae``).
    """

    metric: ClassVar[str] = "accuracy"
    higher_is_better: ClassVar[bool] = True
    #: What the deployed model (:meth:`predictor`) outputs: ``probabilities`` (a
    #: classifier's), ``forecast`` (the next readings), or ``outputs`` (the model's own).
    output: ClassVar[str] = "outputs"

    @abstractmethod
    def build_model(self, shape: tuple[int, ...], num_outputs: int) -> nn.Module:
        """A freshly initialised model for samples of ``shape`` with ``num_outputs`` outputs
        (seed torch before calling it for a reproducible start: :func:`init_model`)."""

    @abstractmethod
    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The training loss of a batch (a scalar: the mean over its samples)."""

    @abstractmethod
    def score(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The metric of each sample of a batch (shape ``(n,)``): its mean is the metric."""

    def targets(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's inputs and targets from a batch of samples ``x`` and their labels
        ``y`` (labels as they are, by default)."""
        return x, y

    def preprocessor(self) -> Preprocessor | None:
        """A fresh preprocessing step whose state the device keeps across rounds, or None."""
        return None

    def predictor(self, model: nn.Module) -> nn.Module:
        """The module deployed for inference (:mod:`edge_client.runtime.infer`): a batch of
        samples, as the stream sends them (after the device's preprocessing), to what
        :attr:`output` names. The model itself, by default."""
        return model

    def input_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of one input of :meth:`predictor` for buffered samples of ``shape``
        (the same, by default)."""
        return tuple(shape)

    def describe(self) -> dict[str, object]:
        """What a model export's manifest says of the task, beyond its shape and outputs
        (e.g. a forecast's horizon); kebab-case keys."""
        return {}


class Classification(Task):
    """Classification of sensor samples by a 1D-CNN, an MLP, or a model of the user's.

    Parameters
    ----------
    model : str or callable
        ``cnn`` (needs ``(channels, steps)`` samples) or ``mlp`` (any shape), or a model
        factory (:data:`ModelFactory`).
    width : int
        Channels of the CNN or hidden units of the MLP (0: their defaults).
    preprocess : {"none", "standardize"}
        ``standardize``: each device standardises every channel (the sample's first axis)
        by running statistics of its own stream (:class:`ChannelStandardizer`).
    """

    output: ClassVar[str] = "probabilities"

    def __init__(
        self, model: str | ModelFactory = "cnn", width: int = 0, preprocess: str = "none"
    ) -> None:
        if preprocess not in PREPROCESSING:
            raise ValueError(f"preprocess must be one of {PREPROCESSING}, got {preprocess!r}")
        self.model = model
        self.width = width
        self.preprocess = preprocess

    def build_model(self, shape: tuple[int, ...], num_outputs: int) -> nn.Module:
        """The configured model for ``shape`` and ``num_outputs`` classes."""
        if isinstance(self.model, str):
            return build_model(self.model, shape, num_outputs, seed=None, width=self.width)
        return call_model_factory(self.model, shape, num_outputs)

    def targets(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples and their labels.

        Raises
        ------
        ValueError
            If a sample has no label (:data:`~edge_client.wire.constants.NO_LABEL`: cut from
            a label-free stream, which a forecasting task learns from instead).
        """
        if len(y) and int(y.min()) < 0:
            raise ValueError(
                "classification needs labels, and these samples have none: ingest with "
                '--label-field (and --classes), or learn the stream with task = "forecast"'
            )
        return x, y

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the logits."""
        return nn.functional.cross_entropy(outputs, targets)

    def score(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """1 where the most likely class is the label, else 0."""
        return (outputs.argmax(1) == targets).float()

    def preprocessor(self) -> Preprocessor | None:
        """A :class:`ChannelStandardizer` with ``standardize``, else None."""
        return ChannelStandardizer() if self.preprocess == "standardize" else None

    def predictor(self, model: nn.Module) -> nn.Module:
        """The model followed by a softmax: each sample's class probabilities."""
        return Probabilities(model)

    def describe(self) -> dict[str, object]:
        """The preprocessing the inputs need (``standardize``: the device's own statistics)."""
        return {"preprocess": self.preprocess}

    def __repr__(self) -> str:
        model = self.model if isinstance(self.model, str) else _name(self.model)
        return (
            f"Classification(model={model!r}, width={self.width}, preprocess={self.preprocess!r})"
        )


class Probabilities(nn.Module):
    """A classifier's deployed form: its logits through a softmax."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class probabilities ``(n, classes)`` of a batch."""
        return torch.softmax(self.model(x), dim=1)


def call_model_factory(factory: ModelFactory, shape: tuple[int, ...], outputs: int) -> nn.Module:
    """Build a user's model: ``factory`` is called with those of ``shape``, ``num_outputs``
    and ``num_classes`` that it declares (none: called without arguments).

    Raises
    ------
    ValueError
        If it does not return an ``nn.Module``, or fails to build.
    """
    offered = {"shape": tuple(shape), "num_outputs": outputs, "num_classes": outputs}
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable: offer nothing
        params = {}  # type: ignore[assignment]
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in offered.items() if takes_all or k in params}
    try:
        model = factory(**kwargs)
    except Exception as err:
        raise ValueError(
            f"model {_name(factory)} failed to build for shape {tuple(shape)} and {outputs} "
            f"outputs: {type(err).__name__}: {err}"
        ) from err
    if not isinstance(model, nn.Module):
        raise ValueError(f"model {_name(factory)} returned {type(model).__name__}, not a Module")
    return model


def init_model(task: Task, shape: tuple[int, ...], num_outputs: int, seed: int) -> nn.Module:
    """The run's initial global model: ``task``'s model, initialised from ``seed``."""
    torch.manual_seed(seed)
    return task.build_model(tuple(shape), num_outputs)


@dataclass(frozen=True)
class Scores:
    """A model's scores on some samples: the task's metric and loss (means), and how many
    samples they are over (NaN means over none); ``values``: each sample's metric, in order
    (what a drift watcher takes)."""

    metric: float
    loss: float
    count: int
    values: np.ndarray | None = field(default=None, compare=False, repr=False)


@torch.no_grad()
def evaluate(
    task: Task,
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    device: torch.device | None = None,
) -> Scores:
    """Score ``model`` on samples ``x`` with labels ``y`` by ``task``'s metric and loss.

    Runs in chunks of :data:`EVAL_CHUNK` samples, with the model in eval mode (it is left
    in eval mode: a trainer puts it back in train mode).
    """
    device = device or torch.device("cpu")
    model.to(device).eval()
    n = len(x)
    if n == 0:
        return Scores(float("nan"), float("nan"), 0)
    loss_sum = 0.0
    values = []
    for first in range(0, n, EVAL_CHUNK):
        xb = torch.from_numpy(np.ascontiguousarray(x[first : first + EVAL_CHUNK])).to(device)
        yb = torch.from_numpy(np.ascontiguousarray(y[first : first + EVAL_CHUNK])).to(device)
        inputs, targets = task.targets(xb, yb)
        outputs = model(inputs)
        values.append(task.score(outputs, targets).detach().cpu().numpy().astype(np.float64))
        loss_sum += float(task.loss(outputs, targets).item()) * len(xb)
    per_sample = np.concatenate(values)
    return Scores(float(per_sample.sum()) / n, loss_sum / n, n, per_sample)


def _name(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"
