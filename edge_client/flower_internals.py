"""Every use fedstream makes of Flower's internals, in one module (the device runtime's
SuperNode launcher and task client, and the ServerApp's reply pulls; a layer of its own, so
that the aggregator may import it without reaching the device runtime).

Flower 1.42 delivers a message to a device slowly: its SuperNode sleeps 3 s whenever a pull
from the SuperLink finds nothing and waits for a ClientApp's reply in 0.5 s steps
(``flwr/supernode/start_client_internal.py``, hard-coded), and in its default isolation it
starts one ``flwr-clientapp`` process per message. fedstream changes both, without forking
or editing Flower, and only in the processes it launches itself:

- :func:`supernode_main` (``fedstream-supernode``, every ``flower-supernode`` option as is)
  runs Flower's own SuperNode with a :class:`Pacer` in place of the ``time`` module *inside*
  ``start_client_internal``: an empty pull waits :data:`FAST_PULL_S` while the node has been
  busy within :data:`HOT_S` (a run is going on), Flower's 3 s otherwise (an idle fleet loads
  the SuperLink as plain Flower's does); a reply is looked for every :data:`REPLY_POLL_S`;
  with a SuperExec secret file, each message stored with its objects wakes the device's
  agent (:mod:`~edge_client.task_wake`), which then need not poll for tasks.
- :func:`quicken_reply_pulls` (in fedstream's ServerApp process on the deployment engine)
  asks again for a reply's objects after :data:`OBJECT_RETRY_S`: the SuperLink hands the
  ServerApp a reply as soon as its message is stored, often before the SuperNode has pushed
  the reply's objects, and Flower's first retry comes a whole second later.
- :class:`TaskClient` takes a task from a SuperNode started with ``--isolation process``
  through the SuperNode's runtime API (``AcquireTask``, signed with the SuperExec secret as
  Flower's SuperExec signs it), pulls its inputs and pushes its reply and output with the
  functions Flower's own ``flwr-clientapp`` uses (``flwr/supernode/runtime/
  run_clientapp.py``): the device agent (:mod:`~edge_client.runtime.task_taker`) runs the
  ClientApp in its own long-lived process.

What would let this module go: a SuperNode option for its idle pull interval, a runtime
API that notifies (or long-polls) its task takers, and a SuperExec executor that hands tasks
to a long-lived worker (Flower 1.42's warm executor pools
serve ``flwr-agentapp``, ``model`` and ``connector`` tasks only).

The Flower sources relied on are pinned by hash (:data:`PINNED`, :func:`changed_internals`):
a Flower release that changes them fails ``tests/unit/test_flower_internals.py``, and the
project allows only the Flower minor version they were read from (``flwr>=1.42,<1.43``).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib
import inspect
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from edge_client.task_wake import send_wake, wake_path

if TYPE_CHECKING:
    from flwr.app import Context, Message
    from flwr.clientapp import ClientApp

_log = logging.getLogger(__name__)

__all__ = [
    "FAST_PULL_S",
    "FLOWER_IDLE_PULL_S",
    "HOT_S",
    "OBJECT_PULL_MAX_S",
    "PINNED",
    "REPLY_POLL_S",
    "AcquiredTask",
    "Pacer",
    "TaskClient",
    "changed_internals",
    "install_pacer",
    "quicken_reply_pulls",
    "superexec_secret",
    "supernode_main",
]

#: An empty pull's wait while the node is in a run (busy within :data:`HOT_S`).
FAST_PULL_S = 0.2
#: How long after its last message a SuperNode keeps pulling every :data:`FAST_PULL_S`:
#: longer than a round's wait for the fleet's slowest device, so a run's next round is
#: found at once; past it the node idles at Flower's own interval.
HOT_S = 60.0
#: Flower's idle pull interval (``time.sleep(3)`` in ``start_client_internal``).
FLOWER_IDLE_PULL_S = 3.0
#: How often the SuperNode looks for a ClientApp's reply (Flower's: 0.5 s).
REPLY_POLL_S = 0.02
#: The first wait, and the longest, before a message's object is asked for again when it is
#: not there yet (Flower's: 1 s, doubling to 10 s). A SuperNode makes a task of a message
#: before it has pulled the message's objects from the SuperLink, so the agent that takes
#: the task at once meets them missing; Flower's own ClientApp, 1-2 s in starting, rarely
#: does. The SuperNode's own pull from the SuperLink (the ServerApp pushes the message before
#: its objects) and the ServerApp's pull of a reply (the SuperNode pushes the reply before
#: its objects) wait as briefly: on a busy 2-core host the objects come 0.1-1 s after their
#: message, and a wait that doubled past 0.1 s overshot their arrival by up to half a second.
OBJECT_RETRY_S = (0.02, 0.1)
#: How long a task's message's objects are waited for (Flower's ClientApp: 2 hours). They
#: come from the SuperNode on this host, which pulled them from the SuperLink; one whose
#: pull failed (its run ended meanwhile) never has them.
OBJECT_PULL_MAX_S = 60.0

#: The Flower functions this module depends on, and the sha256 of their source as read
#: from flwr 1.42.0. A release that changes one must be read again before it is allowed.
PINNED: dict[str, str] = {
    # the pull loop's sleeps and its reply push (the Pacer)
    "flwr.supernode.start_client_internal:start_client_internal": (
        "9e89a6eb68fbec6821e817cd2c09f7894fc7b0f5725c2365b19a7122307f11f3"
    ),
    "flwr.supernode.start_client_internal:_pull_and_store_message": (
        "eaf5d0e36dc34e4cf46a490511d077ac55cc8edbbcdbe938c1f6dbcb758628be"
    ),
    "flwr.supernode.start_client_internal:_push_messages": (
        "00bb86faffdec114db87e7f716af2acd901d12284e44f51f5c2a84704db05f64"
    ),
    "flwr.supernode.cli.flower_supernode:flower_supernode": (
        "e263e10452076b0062e28433cca5d75a552a8a32635ac38a0101d7678231ddaf"
    ),
    # a task's life as flwr-clientapp lives it (TaskClient.run follows it)
    "flwr.supernode.runtime.run_clientapp:run_clientapp": (
        "6ce09559f3a2f5dcafb7d08f4b443585d76b9b53b9cb29ba1ec06a6982163443"
    ),
    "flwr.supernode.runtime.run_clientapp:pull_task_input": (
        "5607a23e1673ee876930c1b35685b8dfdfd8b3776a436560b0467042e15fc695"
    ),
    "flwr.supernode.runtime.run_clientapp:push_message": (
        "07cb512c93e065a93a4cba3facc7d37dd99758c56835065a63fdfbfc604dcd8a"
    ),
    "flwr.supernode.runtime.run_clientapp:push_task_output": (
        "9206407456e79e17338d367de7c21e2d840d939de378c03ac61da6cc2b57a3c6"
    ),
    # the secret's file as the SuperNode reads it (its exact bytes, a newline included)
    "flwr.supercore.auth.superexec_secret:load_superexec_auth_secret": (
        "6765c403a16b0cb3ac753c272160ebf5f31d8406238364ed0248dbf98903ddab"
    ),
    # the ServerApp's pull of replies and their objects (quicken_reply_pulls)
    "flwr.superlink.grid.http_grid:HttpGrid.pull_messages": (
        "67a5266a5a2ed51557437a15ef4c8844f46576bc5bb6b0753d2a2f6230a3aa83"
    ),
    "flwr.supercore.inflatable.inflatable_utils:pull_objects": (
        "31bb2de46b450e6acfadb7a8bb15e3f2074bb112199826a40a5eaa648bad5b2b"
    ),
    "flwr.supercore.inflatable.inflatable_utils:pull_and_inflate_object_from_tree": (
        "139811483a15e4a6c1f8523614c12f28dd3049194e5713816be0931387adb1cf"
    ),
    "flwr.clientapp.utils:get_load_client_app_fn": (
        "f7790dd641bafaff5089017c31f804fc7aa93c0d0eec49be72a3b8585cec4d05"
    ),
    # acquiring a task as Flower's SuperExec does, signed as it signs
    "flwr.supercore.superexec.run_superexec:run_superexec": (
        "91e7a33c5b898f33249c29d2058c57637ca7668a14c27296d2506dc98ac84f9b"
    ),
    "flwr.supercore.interceptors.http.superexec_auth:SuperExecAuthHttpInterceptor": (
        "c11135b67c2049864d2129fa4b2706298196a0da36929d959b9316df46d169b9"
    ),
}


class Pacer:
    """Stands in for the ``time`` module inside Flower's ``start_client_internal``: every
    attribute is the real module's but ``sleep``, which shortens the SuperNode's waits.

    Parameters
    ----------
    clock : callable, optional
        Monotonic seconds (tests pass a fake).
    sleep : callable, optional
        The real wait (tests pass a recorder).
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        # Idle until its first message: a fleet of nodes that join and wait loads the
        # SuperLink as Flower's own do (a run's first message may wait one 3 s pull).
        self._busy_at = -math.inf
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def busy(self) -> None:
        """Note that the node handled a message now."""
        with self._lock:
            self._busy_at = self._clock()

    def wait_for(self, seconds: float) -> float:
        """What Flower's ``time.sleep(seconds)`` becomes."""
        if seconds >= FLOWER_IDLE_PULL_S:  # the pull loop found no message
            with self._lock:
                idle_for = self._clock() - self._busy_at
            return FAST_PULL_S if idle_for < HOT_S else seconds
        self.busy()  # waiting for a reply or its content: a message is being handled
        return min(seconds, REPLY_POLL_S)

    def sleep(self, seconds: float) -> None:
        """Wait :meth:`wait_for` ``seconds``."""
        self._sleep(self.wait_for(seconds))


def install_pacer(pacer: Pacer | None = None, wake: Path | None = None) -> Pacer:
    """Put ``pacer`` in place of ``time`` in this process's ``start_client_internal`` (and
    note each reply push as activity); with ``wake``, tell the agent listening there each
    time a message is stored with its objects (:mod:`~edge_client.task_wake`);
    before each pull, push any reply still waiting (:class:`_Strays`); return the pacer.
    Only this process is affected.
    """
    module = _supernode_module()
    pacer = pacer or Pacer()
    module.time = pacer  # type: ignore[attr-defined]
    pull_and_store = module._pull_and_store_message
    push = module._push_messages
    strays = _Strays(push)

    def pull_store_and_wake(*args: Any, **kwargs: Any) -> int | None:
        strays.push_waiting()
        run_id: int | None = pull_and_store(*args, **kwargs)
        if run_id is not None and wake is not None:  # its task is ready: the agent asks now
            send_wake(wake)
        return run_id

    module._pull_and_store_message = pull_store_and_wake  # type: ignore[attr-defined]

    def push_and_note(*args: Any, **kwargs: Any) -> None:
        pacer.busy()
        strays.note(*args, **kwargs)
        push(*args, **kwargs)
        pacer.busy()

    module._push_messages = push_and_note  # type: ignore[attr-defined]
    module.pull_objects = _quick(module.pull_objects)  # type: ignore[attr-defined]
    return pacer


def _quick(pull: Callable[..., dict[str, bytes]]) -> Callable[..., dict[str, bytes]]:
    """Flower's ``pull_objects`` asking again after :data:`OBJECT_RETRY_S`; with no cap on
    tries (Flower's 500 last over an hour at its 10 s cap, under a minute at ours): its
    ``max_time`` (2 h) still bounds objects that never come."""
    first, cap = OBJECT_RETRY_S
    return functools.partial(
        pull, initial_backoff=first, backoff_cap=cap, max_tries_per_object=None
    )


def quicken_reply_pulls() -> None:
    """In this process (a ServerApp's), ask again for a reply's objects after
    :data:`OBJECT_RETRY_S` instead of Flower's 1 s doubling to 10 s.

    Flower's deployment grid (``HttpGrid.pull_messages``) gets each reply from the SuperLink
    as soon as the SuperNode has pushed its message, and then pulls its objects, which the
    SuperNode pushes next; when they are not all there yet, Flower's first retry comes a
    second later, a second added to the round. Calling it again changes nothing; other
    grids (simulation, the in-process runner) do not use the patched function.
    """
    module = importlib.import_module("flwr.superlink.grid.http_grid")
    pull = module.pull_objects
    if isinstance(pull, functools.partial):
        return
    module.pull_objects = _quick(pull)  # type: ignore[attr-defined]


class _Strays:
    """Pushes replies that Flower's pull loop would leave waiting.

    The loop pairs each stored message with one ``_push_messages``, which pushes whatever
    replies are there once there is one. A reply to a message that no pull paired (a message
    stored without its objects because its run stopped mid-pull: Flower creates its task
    and stores it, then ``RunNotRunningException`` skips the push; the agent answers it with
    an error) shifts the pairing by one: the next message's push sends that stale reply and
    returns, and the real reply waits until a later message arrives, a round's timeout
    after. This pushes, before each pull, every reply already waiting, with the ``send``
    and ``push_object`` the loop last gave ``_push_messages``.
    """

    def __init__(self, push: Callable[..., None]) -> None:
        self._push = push
        self._signature = inspect.signature(push)
        self._arguments: dict[str, Any] | None = None

    def note(self, *args: Any, **kwargs: Any) -> None:
        """Keep the loop's ``_push_messages`` arguments (one connection per process)."""
        self._arguments = dict(self._signature.bind(*args, **kwargs).arguments)

    def push_waiting(self) -> None:
        """Push every reply waiting in the node's state now; never wait for one."""
        if self._arguments is None:
            return  # nothing pushed yet: the loop's own first push sends what waits
        state = self._arguments["state"]
        # Taking them marks them retrieved: Flower's push is handed exactly these.
        if replies := state.get_messages_legacy(is_reply=True):
            _log.info("pushing %d reply(ies) left waiting by the pull loop", len(replies))
            self._push(**{**self._arguments, "state": _Handing(state, replies)})


class _Handing:
    """A node state whose replies are the ones given (already taken from ``state``)."""

    def __init__(self, state: Any, replies: Any) -> None:
        self._state = state
        self._replies = replies

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)

    def get_messages_legacy(self, **_: Any) -> Any:
        return self._replies


def _supernode_module() -> ModuleType:
    import flwr.supernode.start_client_internal as module

    return module


def supernode_main() -> None:
    """``fedstream-supernode``: Flower's ``flower-supernode`` (the same options) with the
    :class:`Pacer`'s waits."""
    from flwr.supernode.cli.flower_supernode import flower_supernode

    secret = _option_value(sys.argv[1:], "--superexec-auth-secret-file")
    install_pacer(wake=None if secret is None else wake_path(secret))
    sys.argv[0] = "flower-supernode"  # Flower's messages name its program
    flower_supernode()


def _option_value(argv: list[str], option: str) -> str | None:
    """The value of ``option`` in ``argv`` (``--opt value`` or ``--opt=value``; the last)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(option + "="):
            value = arg[len(option) + 1 :]
    return value


# -- taking tasks through the runtime API ----------------------------------------------------


@dataclass(frozen=True)
class AcquiredTask:
    """A task a SuperNode handed out: its token (the task's authority) and ids."""

    token: str
    task_id: int
    run_id: int


def superexec_secret(path: str) -> bytes:
    """The SuperExec secret in ``path``, read as the SuperNode's ``--superexec-auth-secret-file``
    is: its exact bytes (a secret written with ``echo`` or ``openssl rand -hex 32 > FILE``
    ends in a newline, and the SuperNode keeps it).

    Raises
    ------
    ValueError
        If the file cannot be read or is empty.
    """
    from flwr.supercore.auth.superexec_secret import load_superexec_auth_secret

    secret = load_superexec_auth_secret(path)
    assert secret is not None  # a path was given
    return secret


class TaskClient:
    """The SuperNode runtime API as a long-lived worker uses it: acquire a task (signed with
    the SuperExec secret), then pull its message and push its reply as ``flwr-clientapp``
    does.

    Parameters
    ----------
    address : str
        The SuperNode's runtime API (``--host``:``--port``).
    secret : bytes
        The SuperNode's ``--superexec-auth-secret-file`` contents.
    """

    def __init__(self, address: str, secret: bytes) -> None:
        from flwr.supercore.interceptors import (
            RuntimeVersionHttpInterceptor,
            SuperExecAuthHttpInterceptor,
        )
        from flwr.supercore.runtime import RuntimeHttpClient

        self.address = address
        self._client = RuntimeHttpClient.from_server_address(
            server_address=address,
            insecure=True,
            root_certificates=None,
            interceptors=[
                RuntimeVersionHttpInterceptor(component_name="SuperExec"),
                SuperExecAuthHttpInterceptor(
                    master_secret=secret, protected_methods={"/flwr.proto.Runtime/AcquireTask"}
                ),
            ],
            retry_invoker=_invoker(tries=1),  # a down SuperNode is the caller's to wait out
        )

    def acquire(self) -> AcquiredTask | None:
        """A ClientApp task waiting on the SuperNode, taken for this process; None if none."""
        from flwr.proto.runtime_pb2 import AcquireTaskRequest
        from flwr.supercore.constant import TaskType

        res = self._client.AcquireTask(
            AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP.value])
        )
        if not res.HasField("task") or not res.token:
            return None
        return AcquiredTask(res.token, int(res.task.task_id), int(res.task.run_id))

    def run(
        self,
        task: AcquiredTask,
        handle: Callable[[ClientApp, Message, Context], Message],
        pulled: Callable[[str], None] | None = None,
    ) -> str:
        """Serve ``task``: pull its message, context and app, reply with ``handle(app,
        message, context)`` (an error reply if it raises), push the task's output; return
        ``""`` or why it failed. ``pulled`` is given the task's :meth:`answer_failed` note
        once its message is in (before the handler runs)."""
        from flwr.app import Error, Message
        from flwr.common.constant import ErrorCode, SubStatus
        from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
        from flwr.supernode.runtime import run_clientapp as flower

        client = self._task_client(task.token)
        heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
        heartbeat.start()
        message = context = reply = None
        status, details = SubStatus.FAILED, "the task was not served"
        try:
            t0 = time.perf_counter()
            message, context, run, fab = _pull_task_input(client)
            if pulled is not None:
                pulled(_task_note(task.token, message, context))
            t1 = time.perf_counter()
            app = load_app(run.fab_id, run.fab_version, fab.hash_str, fab.content)
            t2 = time.perf_counter()
            reply = handle(app, message, context)
            _log.debug(
                "task %d: input %.2f s, app %.2f s, handler %.2f s",
                task.task_id,
                t1 - t0,
                t2 - t1,
                time.perf_counter() - t2,
            )
            status, details = SubStatus.COMPLETED, ""
        except Exception as err:  # as flwr-clientapp: an error reply names the cause
            details = f"{type(err).__name__}: {err}"
            if message is not None:
                reply = Message(
                    Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, details), reply_to=message
                )
        finally:
            try:
                if reply is not None and context is not None:
                    flower.push_message(client, reply, context)
            finally:
                flower.push_task_output(client, context, status, details)
                heartbeat.stop()
                client.close()
        return details

    def answer_failed(self, note: str, why: str) -> None:
        """Answer, with an error reply saying ``why``, the task a note of :meth:`run`'s
        ``pulled`` names (its process died mid-task: the SuperNode would otherwise wait out
        the task token's expiry, pulling no message meanwhile).

        Raises
        ------
        httpx.HTTPError
            If the SuperNode refuses (the token has expired: it has answered already).
        """
        from flwr.app import Error, Message
        from flwr.common.constant import ErrorCode, SubStatus
        from flwr.common.serde import message_from_proto
        from flwr.proto.message_pb2 import Message as ProtoMessage
        from flwr.supernode.runtime import run_clientapp as flower

        data = json.loads(note)
        proto = ProtoMessage()
        proto.ParseFromString(base64.b64decode(data["message"]))
        message = message_from_proto(proto)
        reply = Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, why), reply_to=message)
        context = _Ids(node_id=int(data["node-id"]), run_id=int(data["run-id"]))
        client = self._task_client(str(data["token"]))
        try:
            flower.push_message(client, reply, context)  # type: ignore[arg-type]
            flower.push_task_output(client, None, SubStatus.FAILED, why)
        finally:
            client.close()

    def _task_client(self, token: str) -> Any:
        from flwr.supercore.interceptors import (
            RuntimeTokenHttpInterceptor,
            RuntimeVersionHttpInterceptor,
        )
        from flwr.supercore.runtime import RuntimeHttpClient

        return RuntimeHttpClient.from_server_address(
            server_address=self.address,
            insecure=True,
            root_certificates=None,
            interceptors=[
                RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                RuntimeTokenHttpInterceptor(token),
            ],
            retry_invoker=_invoker(tries=5),
        )

    def close(self) -> None:
        """Close the connection to the runtime API."""
        self._client.close()


def _pull_task_input(client: Any) -> tuple[Message, Context, Any, Any]:
    """Flower's ``run_clientapp.pull_task_input`` (pinned), retrying a missing object after
    :data:`OBJECT_RETRY_S` instead of Flower's 1 s."""
    from flwr.app import Message
    from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
    from flwr.proto.node_pb2 import Node
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullTaskInputRequest
    from flwr.supercore.inflatable.inflatable_protobuf_utils import (
        make_confirm_message_received_fn_protobuf,
        make_pull_object_fn_protobuf,
    )
    from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
    from flwr.supercore.task_identity import TaskIdentity

    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id = res.task_id
    TaskIdentity.run_id = res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    context = context_from_proto(res.context)
    run = run_from_proto(res.run)
    fab = fab_from_proto(res.fab)
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("no message received from the runtime API")
    node = Node(node_id=context.node_id)
    tree = pulled.message_object_trees[0]
    first, cap = OBJECT_RETRY_S
    message = pull_and_inflate_object_from_tree(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(
            client.ConfirmMessageReceived, node, context.run_id
        ),
        return_type=Message,
        max_time=OBJECT_PULL_MAX_S,
        initial_backoff=first,
        backoff_cap=cap,
    )
    message.metadata.__dict__["_message_id"] = tree.object_id  # as Flower sets it
    return message, context, run, fab


@dataclass(frozen=True)
class _Ids:
    """What ``push_message`` reads of a Context."""

    node_id: int
    run_id: int


def _task_note(token: str, message: Message, context: Context) -> str:
    """What :meth:`TaskClient.answer_failed` needs to answer a task: its token, its message
    without content, and its node and run."""
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto

    bare = message_to_proto(remove_content_from_message(message)).SerializeToString()
    return json.dumps(
        {
            "token": token,
            "message": base64.b64encode(bare).decode(),
            "node-id": context.node_id,
            "run-id": context.run_id,
        }
    )


def _invoker(tries: int) -> Any:
    """A retry policy for the runtime API: ``tries`` attempts on a transport error, none on
    an HTTP error. (Flower's own SIGINTs its process on a 401, which for a ClientApp process
    ends a task whose token expired; here it would stop the whole agent.)"""
    import httpx
    from flwr.supercore.retry import RetryInvoker, exponential

    return RetryInvoker(
        wait_gen_factory=lambda: exponential(base_delay=0.05, multiplier=2, max_delay=1),
        recoverable_exceptions=(httpx.TransportError,),
        max_tries=tries,
        max_time=None,
    )


#: fab hash -> its loaded ClientApp (a run's app is installed and imported once).
_APPS: dict[str, ClientApp] = {}
_APPS_LOCK = threading.Lock()  # tasks are served in threads of their own


def load_app(fab_id: str, fab_version: str, fab_hash: str, content: bytes) -> ClientApp:
    """The ClientApp of a run's app bundle, installed (Flower's way) and loaded on first use.

    Raises
    ------
    flwr.clientapp.client_app.LoadClientAppError
        If the bundle's ClientApp does not load.
    """
    with _APPS_LOCK:
        return _load_app(fab_id, fab_version, fab_hash, content)


def _load_app(fab_id: str, fab_version: str, fab_hash: str, content: bytes) -> ClientApp:
    if fab_hash in _APPS:
        return _APPS[fab_hash]
    from flwr.cli.install import install_from_fab
    from flwr.clientapp.utils import get_load_client_app_fn
    from flwr.common.config import get_project_dir

    if not get_project_dir(fab_id, fab_version, fab_hash).exists():
        install_from_fab(content, skip_prompt=True)
    loader = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
    _APPS.clear()  # one run's app at a time: a new bundle replaces the last one's modules
    _APPS[fab_hash] = loader(fab_id, fab_version, fab_hash)
    return _APPS[fab_hash]


# -- pinning -----------------------------------------------------------------------------------


def _source_hash(ref: str) -> str:
    module_name, _, name = ref.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in name.split("."):  # a class's method: "Class.method"
        target = getattr(target, part)
    return hashlib.sha256(inspect.getsource(target).encode()).hexdigest()


def changed_internals() -> dict[str, str]:
    """The pinned Flower functions whose source differs from what this module was written
    against (name -> its source's sha256 now); empty when all are as pinned."""
    return {ref: now for ref in PINNED if (now := _source_hash(ref)) != PINNED[ref]}
