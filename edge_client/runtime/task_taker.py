"""The device agent taking its SuperNode's tasks itself: no process per message.

A SuperNode started with ``--isolation process`` starts no ClientApp: it holds each message
as a task until a process acquires it through its runtime API. The agent does, with torch,
the task and the run's app already loaded, and runs the run's ClientApp (Flower's own app
bundle, installed and loaded once per run: fedstream's app or a user's built on
:func:`~edge_client.runtime.client_app.make_client_app`) in its own process. The runtime
API's calls are Flower's (:mod:`~edge_client.flower_internals`).

- **Only this device's agent.** Acquiring a task is signed with the SuperNode's SuperExec
  secret (``--superexec-auth-secret-file``: a file only the device's service user reads); a
  process without it is refused by the SuperNode.
- **Pace.** The agent asks when its SuperNode (``fedstream-supernode``) wakes it, a
  datagram on the socket beside the secret file each time a message is stored with its
  objects (:mod:`~edge_client.task_wake`), and otherwise every
  :data:`IDLE_POLL_S` (Flower's SuperExec's own interval): a task is taken at once, and a
  device between messages costs less than Flower's SuperExec. Until a first wake has come
  (plain ``flower-supernode`` sends none), it asks every :data:`HOT_POLL_S` within
  :data:`~edge_client.flower_internals.HOT_S` of its last task.
- **One task at a time trains; none blocks the others.** Each task is served in a thread of
  its own, as Flower gives each its own process, and the handlers run one at a time (a
  device trains one round at a time): a task whose message never fully arrives (its run
  ended while the SuperNode pulled it) waits for its objects without holding up the next.
- **Faults.** A SuperNode that goes away is waited for (asked every :data:`IDLE_POLL_S`,
  said once); a task whose app cannot be loaded or whose handler raises gets an error reply
  saying why; a task whose message's objects do not arrive within
  :data:`~edge_client.flower_internals.OBJECT_PULL_MAX_S` fails. An agent killed
  mid-task leaves a note of it; the agent started again answers it as failed at once (the
  SuperNode would otherwise wait out the task's token), and the samples its round took are
  put back by the next round (:meth:`~edge_client.runtime.buffer.BufferStore.take` with
  ``hold``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from edge_client.flower_internals import (
    HOT_S,
    AcquiredTask,
    TaskClient,
    superexec_secret,
)
from edge_client.runtime.usage import peak_rss_bytes
from edge_client.task_wake import WakeSocket
from edge_client.wire.records import ReplyMetrics

if TYPE_CHECKING:
    from flwr.app import Context, Message
    from flwr.clientapp import ClientApp

__all__ = ["HOT_POLL_S", "IDLE_POLL_S", "TaskTaker", "read_secret", "write_private"]

log = logging.getLogger(__name__)

#: How often an agent in a run asks its SuperNode for a task (a local HTTP call).
HOT_POLL_S = 0.1
#: ... and outside one (Flower's SuperExec: 1 s).
IDLE_POLL_S = 1.0


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, a file born readable by its owner only (0600: no window in
    which others may read it, as a write then chmod would leave)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def read_secret(path: Path) -> bytes:
    """The SuperExec secret in ``path``.

    Raises
    ------
    ValueError
        If the file is empty or others may read it (mode 0600 or stricter expected).
    """
    if Path(path).stat().st_mode & 0o077:
        raise ValueError(
            f"{path}: the SuperExec secret must be readable by its owner only (chmod 600 {path})"
        )
    if Path(path).stat().st_size == 0:
        raise ValueError(f"{path} is empty: write a random secret into it")
    return superexec_secret(str(path))  # byte for byte as the SuperNode reads it


class TaskTaker:
    """Take the SuperNode's ClientApp tasks and serve them in this process, in a thread.

    Parameters
    ----------
    address : str
        The SuperNode's runtime API (``host:port``).
    secret : bytes
        Its SuperExec secret.
    device_id : str, optional
        For the log.
    inflight : Path, optional
        Where the tasks being served are noted (``<inflight>-<task id>``: each one's token
        and message ids, mode 0600), so that an agent killed mid-task and started again
        answers them as failed at once, instead of leaving the SuperNode to wait out the
        token's expiry (30-60 s, during which it pulls no message: the device would miss the
        next round too).
    wake : Path, optional
        Where to listen for the SuperNode's wakes
        (:func:`~edge_client.task_wake.wake_path` of the secret file); without (or
        where the socket cannot be made) the agent polls.
    """

    def __init__(
        self,
        address: str,
        secret: bytes,
        device_id: str | None = None,
        inflight: Path | None = None,
        wake: Path | None = None,
    ) -> None:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # else a log line per poll
        self.address = address
        self.device_id = device_id
        self.inflight = inflight
        self.served = 0
        self.error = ""  # why it stopped taking tasks on its own
        self._client = TaskClient(address, secret)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="task-taker", daemon=True)
        self._busy_at = -HOT_S
        self._training = threading.Lock()  # one handler at a time: one round at a time
        self._lock = threading.Lock()  # the fields below
        self._workers: set[threading.Thread] = set()
        self._left_answered = False
        self._wake = self._listen(wake)

    @staticmethod
    def _listen(path: Path | None) -> WakeSocket | None:
        if path is None:
            return None
        try:
            return WakeSocket(path)
        except OSError as err:
            log.info("agent: no wake socket (%s): polling for tasks", err)
            return None

    def start(self) -> None:
        """Start taking tasks."""
        self._thread.start()
        log.info("agent: taking %s's tasks from its SuperNode at %s", self.device_id, self.address)

    def stop(self, timeout: float = 600.0) -> None:
        """Take no more tasks, finish those being served, stop."""
        self._stopping.set()
        if self._wake is not None:
            self._wake.poke()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            worker.join(timeout=timeout)
        self._client.close()
        if self._wake is not None:
            self._wake.close()

    @property
    def thread(self) -> threading.Thread:
        """The thread taking tasks."""
        return self._thread

    def _loop(self) -> None:
        try:
            self._take()
        except PermissionError as err:
            self.error = str(err)
            log.error("agent: %s", err)

    def _take(self) -> None:
        reachable = True
        while not self._stopping.is_set():
            try:
                task = self._client.acquire()
            except httpx.HTTPStatusError as err:
                if err.response.status_code in (401, 403):  # the wrong secret: no retry helps
                    raise PermissionError(
                        f"the SuperNode at {self.address} refused this agent's SuperExec "
                        f"secret (HTTP {err.response.status_code}): give the agent the file "
                        "its SuperNode's --superexec-auth-secret-file names"
                    ) from err
                log.warning("agent: SuperNode at %s answered %s: waiting", self.address, err)
                self._stopping.wait(IDLE_POLL_S)
                continue
            except Exception as err:  # connection refused, a SuperNode restarting
                if reachable:
                    log.warning(
                        "agent: SuperNode at %s not reachable (%s): waiting", self.address, err
                    )
                reachable = False
                self._stopping.wait(IDLE_POLL_S)
                continue
            if not reachable:
                log.info("agent: SuperNode at %s is back", self.address)
                reachable = True
            self._answer_left()
            if task is None:
                self._idle()
                continue
            self._busy_at = time.monotonic()
            worker = threading.Thread(
                target=self._serve, args=(task,), name=f"task-{task.task_id}", daemon=True
            )
            with self._lock:
                self._workers = {w for w in self._workers if w.is_alive()} | {worker}
            worker.start()

    def _idle(self) -> None:
        """Wait until a task may be there: a wake, or the next poll."""
        hot = time.monotonic() - self._busy_at < HOT_S
        if self._wake is None:
            self._stopping.wait(HOT_POLL_S if hot else IDLE_POLL_S)
            return
        first = not self._wake.woken  # until then the SuperNode may send none: poll
        woken = self._wake.wait(HOT_POLL_S if hot and first else IDLE_POLL_S)
        if woken and first and not self._stopping.is_set():
            log.info(
                "agent: its SuperNode wakes it when a task is ready (asking every %g s otherwise)",
                IDLE_POLL_S,
            )

    def _notes(self) -> list[Path]:
        """The notes of tasks in flight (this agent's, or a killed one's)."""
        if self.inflight is None:
            return []
        return sorted(self.inflight.parent.glob(f"{self.inflight.name}-*"))

    def _answer_left(self) -> None:
        """Once, when the SuperNode first answers: answer as failed the tasks a killed agent
        left mid-way (their samples wait in the buffer for the next round), so that the
        SuperNode need not wait out their tokens."""
        if self._left_answered:
            return
        self._left_answered = True
        for path in self._notes():
            note = path.read_text()
            path.unlink()
            if not note.strip():
                continue  # killed before its message was in: the token's expiry answers it
            try:
                self._client.answer_failed(note, "the device's agent stopped mid-task; restarted")
            except Exception as err:  # its token expired meanwhile: Flower answered it
                log.info("agent: a task a stopped agent left is not answered here: %s", err)
                continue
            log.warning("agent: answered as failed the task a stopped agent left mid-way")

    def _note(self, task: AcquiredTask, note: str | None) -> None:
        """Note a task in flight (None: it is done) beside :attr:`inflight` (mode 0600)."""
        if self.inflight is None:
            return
        path = self.inflight.with_name(f"{self.inflight.name}-{task.task_id}")
        if note is None:
            path.unlink(missing_ok=True)
            return
        write_private(path, note)

    def _serve(self, task: AcquiredTask) -> None:
        self._note(task, "")
        try:
            self._answer(task)
        finally:
            self._note(task, None)
            self._busy_at = time.monotonic()

    def _answer(self, task: AcquiredTask) -> None:
        acquired = time.perf_counter()
        cpu0 = time.process_time()

        def handle(app: ClientApp, message: Message, context: Context) -> Message:
            entered = time.perf_counter() - acquired
            with self._training:
                reply = app(message=message, context=context)
            if not reply.has_error():
                # No ClientApp process: its start is this task's pull and app loading, its
                # CPU none; the agent's CPU is the task's.
                ReplyMetrics.amend(
                    reply.content,
                    start_s=entered,
                    cpu_s=0.0,
                    peak_rss=0,
                    agent_cpu_s=time.process_time() - cpu0,
                    agent_peak_rss=peak_rss_bytes(),
                )
            return reply

        try:
            failed = self._client.run(task, handle, pulled=lambda n: self._note(task, n))
        except Exception as err:  # the SuperNode went away mid-task: the task expires there
            log.error("agent: task %d of run %d not answered: %s", task.task_id, task.run_id, err)
            return
        with self._lock:
            self.served += 1
        if failed:
            log.error("agent: task %d of run %d failed: %s", task.task_id, task.run_id, failed)
