"""The fedstream ClientApp: one Flower message = one round of training from the buffer (or,
once before the first round, a timing probe: a ``query`` message).

Flower 1.42 starts a fresh process per message. A device whose node config names an
``agent`` (a Unix socket: ``fedstream agent``) trains there: this process imports no torch,
hands the message to the agent, which keeps torch, the task and the model loaded between
messages, and returns its reply (:mod:`~edge_client.runtime.agent_channel`). Without one,
the round runs in this process (:mod:`~edge_client.runtime.rounds`): the simulation engine,
tests, the simplest setup. Same wire format, same replies.

The node says which device it is (:class:`~edge_client.runtime.node_config.NodeConfig`); the
run config says which task and sample shape (:class:`~edge_client.wire.run_config.RunSettings`),
unless the app was built around a task (:func:`make_client_app`); the message brings the
global model and the device's :class:`~edge_client.wire.records.RoundPlan`.

In Flower's simulation engine a node has only ``partition-id``: it becomes a virtual device
fed by a replayed stream, through the hook of :mod:`edge_client.runtime.virtual_nodes` (the
stream emulation provides it when Flower loads the app as ``edge_client.flower_app:app``;
the runtime never imports the emulation, and a real device never loads it).
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from flwr.app import Context, Error, Message
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from edge_client.runtime.agent_channel import AgentError, AgentRequest, send_request
from edge_client.runtime.constants import AGENT_REPLY_TIMEOUT_S
from edge_client.runtime.node_config import NodeConfig
from edge_client.runtime.usage import cpu_s, peak_rss_bytes, process_age_s
from edge_client.runtime.virtual_nodes import (
    VirtualNodes,
    is_virtual,
    provide_virtual_nodes,
    virtual_nodes,
)
from edge_client.task.constants import IMPORT_PATH
from edge_client.wire.records import CONFIG, ReplyMetrics
from edge_client.wire.run_config import RunSettings
from edge_client.wire.secagg_records import SECAGG_ACTION, SECAGG_STAGE

if TYPE_CHECKING:
    from edge_client.task.interface import Task

__all__ = [
    "absent_reply",
    "app",
    "compose_client_app",
    "expired_reply",
    "make_client_app",
]

log = logging.getLogger(__name__)


def make_client_app(task: Task | str | None = None) -> ClientApp:
    """fedstream's ClientApp around a task: streams, batch plans, codec and faults as
    fedstream's own app has them, learning ``task``.

    Parameters
    ----------
    task : Task or str, optional
        What is learned: a task object, or its import path (``"my_app.task:HarTask"``: a
        Task class, instance, or function returning one). None: the task the run config
        names (``task``, ``model``, ...). Give the import path (or name it in the run
        config) for devices with an agent: this process then imports neither torch nor
        the task, and the agent loads it from the app Flower installed for the run.

    Returns
    -------
    ClientApp
        With a ``train`` handler (one round from the device's buffer) and a ``query``
        handler (the timing probe before round 1).

    Examples
    --------
    In a Flower app's ``client_app.py``::

        from edge_client.runtime.client_app import make_client_app

        app = make_client_app("my_app.task:HarTask")

    On real devices only: :func:`edge_client.flower_app.make_client_app` (the same
    signature) adds the simulation engine's virtual devices.
    """
    return compose_client_app(task)


def compose_client_app(
    task: Task | str | None = None, virtual: Callable[[], VirtualNodes] | None = None
) -> ClientApp:
    """:func:`make_client_app`, with the simulation engine's virtual devices made by
    ``virtual`` (:mod:`edge_client.runtime.virtual_nodes`).

    Each handler provides ``virtual`` before it runs: a reference the app carries, since
    the simulation engine loads the app once and sends it, pickled, to its workers (which
    import only what the app refers to).
    """
    if isinstance(task, str) and not IMPORT_PATH.match(task):
        raise ValueError(f"task {task!r}: expected an import path 'package.module:Name'")
    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        """Train this round's plan on the device's buffer; reply with the model delta."""
        if virtual is not None:
            provide_virtual_nodes(virtual)
        return expired_reply(msg) or absent_reply(msg, context) or _handle(msg, context, task)

    @client_app.query()
    def probe(msg: Message, context: Context) -> Message:
        """Time SGD steps at the probe's batch sizes (the controller's first timings)."""
        if virtual is not None:
            provide_virtual_nodes(virtual)
        return expired_reply(msg) or absent_reply(msg, context) or _handle(msg, context, task)

    @client_app.query(SECAGG_ACTION)
    def secure_stage(msg: Message, context: Context) -> Message:
        """Secure aggregation's stages after training: share keys, masked input, unmask
        (crypto only: in this process, never the agent)."""
        if virtual is not None:
            provide_virtual_nodes(virtual)
        from edge_client.runtime.secure_stages import serve_stage

        stage = _stage(msg)
        return expired_reply(msg) or absent_reply(msg, context, stage) or serve_stage(msg, context)

    return client_app


def _handle(msg: Message, context: Context, task: Task | str | None) -> Message:
    """The message's reply: from the device's agent when its node config names one (and
    the task can travel to it), else from this process."""
    agent = _agent(context)
    if agent and (task is None or isinstance(task, str)):
        return _via_agent(agent, msg, context, task)
    if agent:
        log.warning(
            "node config names agent %s, but this app holds its task as an object: training "
            "in this process (give make_client_app the task's import path to use the agent)",
            agent,
        )
    from edge_client.runtime import rounds  # torch: only where this process trains
    from edge_client.task.loading import task_at

    resolved = task_at(task) if isinstance(task, str) else task
    if msg.metadata.message_type.startswith("query"):
        return rounds.probe_steps(msg, context, resolved)
    return rounds.train_round(msg, context, resolved)


def _agent(context: Context) -> str:
    """The agent's socket the node config names ("" for none, and for virtual nodes)."""
    if is_virtual(context) or not NodeConfig.given_in(context.node_config):
        return ""
    return NodeConfig.from_node_config(context.node_config).agent


def _via_agent(agent: str, msg: Message, context: Context, task: str | None) -> Message:
    """Hand ``msg`` to the agent at ``agent`` and return its reply as this app's: an error
    reply naming the agent when it cannot be reached, dies mid-message or refuses."""
    start_s = process_age_s()
    meta = msg.metadata
    left = meta.created_at + meta.ttl - time.time() if meta.ttl > 0 else AGENT_REPLY_TIMEOUT_S
    kind = "query" if meta.message_type.startswith("query") else "train"
    path = task or str(context.run_config.get("task", ""))
    request = AgentRequest(
        kind=kind,
        message=msg,
        run_id=context.run_id,
        node_config=context.node_config,
        run_config=context.run_config,
        task=task,
        app_dir=_app_dir(path) if IMPORT_PATH.match(path) else None,
    )
    try:
        reply = send_request(agent, request, timeout=left)
    except AgentError as err:
        log.error("round not trained: %s", err)
        return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"agent: {err}"), reply_to=msg)
    if reply.error is not None or reply.message is None:
        why = f"agent at {agent}: {reply.error}"
        log.error("round not trained: %s", why)
        return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, why), reply_to=msg)
    if reply.message.has_error():
        return Message(reply.message.error, reply_to=msg)
    content = reply.message.content
    # This process's own costs, as a ClientApp without an agent reports them.
    ReplyMetrics.amend(
        content, start_s=start_s, cpu_s=cpu_s(reaped=False), peak_rss=peak_rss_bytes()
    )
    return Message(content, reply_to=msg)


def _app_dir(path: str) -> str | None:
    """The directory holding the top-level package of import path ``path`` (the app
    Flower installed for the run), found without importing it; None when it is not
    importable here."""
    top = path.split(":")[0].split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return str(Path(next(iter(spec.submodule_search_locations))).parent)
    return str(Path(spec.origin).parent) if spec.origin else None


def expired_reply(msg: Message) -> Message | None:
    """An error reply if ``msg`` outlived its TTL (None if it is current).

    The aggregator gives each message the round's timeout as its TTL: past it, the round has
    gone on without this device, or the run that sent it is gone (an aggregator crash leaves
    its queued messages behind). Such a message must not spend the buffer's samples.
    """
    meta = msg.metadata
    late = time.time() - (meta.created_at + meta.ttl)
    if meta.ttl <= 0 or late <= 0:
        return None
    log.warning(
        "refused %s message of run %d: it expired %.0f s ago (its round or run is over); "
        "no samples taken",
        msg.metadata.message_type,
        meta.run_id,
        late,
    )
    reason = f"expired {late:.0f} s ago: not trained, no samples taken"
    return Message(Error(ErrorCode.MESSAGE_UNAVAILABLE, reason), reply_to=msg)


def absent_reply(msg: Message, context: Context, stage: str = "") -> Message | None:
    """A simulation engine's virtual device that its population has away now (or that has
    vanished before secure aggregation's ``stage``) answers ``NODE_UNAVAILABLE`` at once
    (None: it is there, or this is a real device)."""
    if not is_virtual(context):
        return None
    settings = RunSettings.from_run_config(context.run_config)
    why = virtual_nodes().absence(context.node_config, settings, context.state, _round(msg), stage)
    return Message(Error(ErrorCode.NODE_UNAVAILABLE, why), reply_to=msg) if why else None


def _stage(msg: Message) -> str:
    """The secure-aggregation stage a ``query.secagg`` message asks for ('' if none)."""
    config = msg.content.config_records.get(CONFIG)
    value = config.get(SECAGG_STAGE, "") if config is not None else ""
    return value if isinstance(value, str) else ""


def _round(msg: Message) -> int:
    """The round a message is of (0 for one without: the timing probe)."""
    config = msg.content.config_records.get(CONFIG)
    value = config.get("server-round", 0) if config is not None else 0
    return int(value) if isinstance(value, int | float) else 0


#: fedstream's own ClientApp: the task the run config names.
app = make_client_app()
