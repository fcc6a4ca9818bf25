"""A run's task from its run config: a built-in one by name, or a user's by import path.

``task = "classification"`` is the built-in :class:`~edge_client.task.interface.Classification`
with ``model``, ``model-width`` and ``preprocess``; ``task = "forecast"`` the built-in
:class:`~edge_client.task.forecasting.Forecast` with ``forecast-horizon``; ``model`` may
itself name a user's model (``model = "my_pkg.task:Net"``). Any other ``task`` is an import
path ``module:attribute`` to a :class:`~edge_client.task.interface.Task` subclass (built
without arguments), an instance, or a function that returns one. The module must be
importable where the ServerApp and the ClientApps run: in the Flower app (FAB) that is run,
or installed on those hosts.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from edge_client.task.constants import BUILTIN_TASKS, IMPORT_PATH, MODELS
from edge_client.task.forecasting import Forecast
from edge_client.task.interface import Classification, ModelFactory, Task

__all__ = ["TaskSettings", "import_object", "load_task", "task_at"]


class TaskSettings(Protocol):
    """What :func:`load_task` reads of a run's settings
    (:class:`~edge_client.wire.run_config.RunSettings` has it)."""

    @property
    def task(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def model_width(self) -> int: ...
    @property
    def preprocess(self) -> str: ...
    @property
    def forecast_horizon(self) -> int: ...


def load_task(settings: TaskSettings) -> Task:
    """The task ``settings`` name.

    Raises
    ------
    ValueError
        If the task or model is neither built in nor an importable path to the right kind
        of object; the message says which key and why.
    """
    if settings.task == "forecast":
        return Forecast(settings.forecast_horizon, settings.model_width)
    if settings.task in BUILTIN_TASKS:
        model: str | ModelFactory = settings.model
        if settings.model not in MODELS:
            model = _model_factory(settings.model)
        return Classification(model, settings.model_width, settings.preprocess)
    return task_at(settings.task)


def task_at(path: str) -> Task:
    """The task at import path ``path``: a Task instance, a Task class or a function
    returning one (called without arguments).

    Raises
    ------
    ValueError
        If the path does not import or names something else; the message says why.
    """
    obj = import_object(path, "task")
    if not isinstance(obj, Task) and callable(obj):  # a Task class, or a function making one
        obj = obj()
    if not isinstance(obj, Task):
        raise ValueError(
            f"task = {path!r} is a {type(obj).__name__}, not a fedstream Task "
            "(a subclass of edge_client.task.Task, an instance, or a function returning one)"
        )
    return obj


def _model_factory(path: str) -> ModelFactory:
    obj = import_object(path, "model")
    if not callable(obj):
        raise ValueError(f"model = {path!r} is a {type(obj).__name__}: need an nn.Module class")
    return obj  # type: ignore[no-any-return]


def import_object(path: str, key: str) -> Any:
    """The object at import path ``module:attribute``, for run-config key ``key``.

    Raises
    ------
    ValueError
        If the path is malformed, the module does not import, or it lacks the attribute.
    """
    if not IMPORT_PATH.match(path):
        raise ValueError(f"{key} = {path!r}: expected 'package.module:Name'")
    module_name, attribute = path.split(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as err:  # whatever the user's module raises on import
        raise ValueError(
            f"{key} = {path!r}: cannot import {module_name!r} ({type(err).__name__}: {err}); "
            "it must be importable where the ServerApp and ClientApps run"
        ) from err
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{key} = {path!r}: {module_name!r} has no {attribute!r}")
        obj = getattr(obj, part)
    return obj
