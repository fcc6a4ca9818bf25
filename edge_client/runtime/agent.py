"""``fedstream agent``: the device's long-lived trainer.

Flower 1.42 starts a new ``flwr-clientapp`` process for every message; a process that imports
torch pays 2-3 s and 200+ MB for it each time, on a Raspberry Pi far more. The agent loads
torch once and keeps it; the ClientApp (:mod:`~edge_client.runtime.client_app`), when its
node config names the agent's socket, imports no torch and hands each message over
(:mod:`~edge_client.runtime.agent_channel`). The agent runs the round exactly as the
ClientApp would in its own process (:func:`~edge_client.runtime.rounds.train_round`), on the
same buffer file, and returns the reply.

- **One process, one device.** Messages are served one at a time (a device trains one
  round at a time); one torch thread by default. ``fedstream infer --agent-socket`` serves
  the same socket from the inference daemon, so a device that predicts on its live stream
  holds torch in one process, not two.
- **The run's code.** A request names the task (an import path, or the run config's) and the
  directory Flower installed the run's app into. A new run puts that directory first on the
  import path and forgets the previous run's packages (by name: never fedstream's or a
  library's), so each run imports its own version of the app's modules. A task that cannot
  be loaded gets an error reply that says why.
- **Faults.** The buffer holds a round's samples aside until its reply is ready
  (:meth:`~edge_client.runtime.buffer.BufferStore.take` with ``hold``): an agent killed
  mid-round loses none, and its next round puts them back. A request from another fedstream
  version is refused with a message naming both.
- **Its socket** lies in a directory only its user may enter (0700) and is itself 0600.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from edge_client.runtime.agent_channel import (
    AgentError,
    AgentReply,
    AgentRequest,
    fedstream_version,
    read_frame,
    socket_dir_ok,
    write_frame,
)
from edge_client.runtime.constants import AGENT_ACCEPT_RETRY_S, AGENT_THREADS
from edge_client.runtime.signals import run_until_signalled
from edge_client.runtime.usage import peak_rss_bytes
from edge_client.task.constants import IMPORT_PATH
from edge_client.task_wake import MAX_SOCKET_PATH
from edge_client.wire.records import ReplyMetrics

if TYPE_CHECKING:
    from flwr.app import Message

    from edge_client.runtime.task_taker import TaskTaker
    from edge_client.task.interface import Task

__all__ = ["DeviceAgent"]

log = logging.getLogger(__name__)

#: Packages a run's code never replaces (fedstream's own, and what it is built on).
_KEPT = frozenset({"edge_client", "aggregator", "deploy", "flwr", "torch", "numpy"})


class DeviceAgent:
    """Serve the ClientApp's messages on a Unix socket, with torch and the task loaded once.

    Parameters
    ----------
    socket_path : Path
        Where to listen (its directory is made private to this user).
    threads : int
        torch intra-op threads (a node config's ``threads`` overrides it per run).
    device_id : str, optional
        Serve only this device (a request for another is refused); None: any.
    tasks : TaskTaker, optional
        Also take the device's SuperNode's tasks itself
        (:mod:`~edge_client.runtime.task_taker`); with it ``socket_path`` may be None.
    """

    def __init__(
        self,
        socket_path: Path | None,
        threads: int = AGENT_THREADS,
        device_id: str | None = None,
        tasks: TaskTaker | None = None,
    ) -> None:
        if socket_path is None and tasks is None:
            raise ValueError("an agent serves a socket, its SuperNode's tasks, or both")
        self.socket_path = Path(socket_path) if socket_path is not None else None
        self.threads = threads
        self.device_id = device_id
        self.tasks = tasks
        self.served = 0
        self._sock: socket.socket | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="agent", daemon=True)
        self._run: tuple[int, str | None, str | None] | None = None  # the loaded run's code
        self._task: Task | None = None
        self._packages: set[str] = set()  # the loaded run's own packages
        self._app_dir: str | None = None  # on the import path for the loaded run only

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Load torch, bind the socket and serve in a thread.

        Raises
        ------
        PermissionError
            If the socket's directory is not private to this user.
        OSError
            If another agent already listens on the socket.
        """
        if self.socket_path is None:
            self._warm_up()
            self._start_tasks()
            return
        if len(os.fsencode(self.socket_path)) > MAX_SOCKET_PATH:
            raise OSError(
                f"socket path {self.socket_path} is longer than a Unix socket's "
                f"{MAX_SOCKET_PATH} bytes: choose a shorter one (e.g. /run/fedstream/<device>)"
            )
        socket_dir_ok(self.socket_path)
        self._warm_up()
        self._unlink_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket is born 0600: no window where others may connect
        try:
            sock.bind(str(self.socket_path))
        finally:
            os.umask(old)
        sock.listen(8)
        sock.settimeout(0.5)  # to notice stop()
        self._sock = sock
        self._thread.start()
        self._start_tasks()
        log.info(
            "agent (fedstream %s, torch threads %d) serving %s on %s",
            fedstream_version(),
            self.threads,
            self.device_id or "any device",
            self.socket_path,
        )

    def _start_tasks(self) -> None:
        if self.tasks is not None:
            self.tasks.start()

    def stop(self) -> None:
        """Stop accepting, finish the message being served, remove the socket."""
        self._stopping.set()
        if self.tasks is not None:
            self.tasks.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=600)
        if self._sock is not None and self.socket_path is not None:
            self._sock.close()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        served = self.served + (self.tasks.served if self.tasks is not None else 0)
        log.info("agent stopped after %d messages", served)

    def run(self) -> None:
        """Serve until SIGTERM, SIGINT or SIGHUP (what ``fedstream agent`` runs)."""
        # The tasks, where it takes them, are its main work: their thread is the one watched.
        thread = self.tasks.thread if self.tasks is not None else self._thread
        try:
            run_until_signalled(self.start, self.stop, thread, "agent")
        except RuntimeError:
            if self.tasks is not None and self.tasks.error:
                raise PermissionError(self.tasks.error) from None
            raise

    def _warm_up(self) -> None:
        """Import torch and the round's code, and run one step: the first message then pays
        for none of it."""
        t0 = time.perf_counter()
        import torch

        from edge_client.runtime import rounds  # noqa: F401  (torch, the trainer, the codec)

        if self.threads > 0:
            torch.set_num_threads(self.threads)
        layer = torch.nn.Linear(8, 2)
        loss = torch.nn.functional.cross_entropy(layer(torch.zeros(4, 8)), torch.zeros(4).long())
        loss.backward()  # type: ignore[no-untyped-call]
        log.info("agent: torch loaded and warm in %.1f s", time.perf_counter() - t0)

    def _unlink_stale(self) -> None:
        """Remove the socket a killed agent left behind; refuse to take over a live one."""
        assert self.socket_path is not None
        if not self.socket_path.exists():
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.socket_path))
            except OSError:
                self.socket_path.unlink()
                return
        raise OSError(f"an agent already listens on {self.socket_path}")

    # -- serving ---------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as err:
                if self._stopping.is_set() or self._sock.fileno() < 0:
                    return
                # A connection that went away before it was taken, or a full fd table:
                # this caller's problem, not the next one's (as socketserver treats it).
                log.warning("agent: a connection could not be taken: %s", err)
                self._stopping.wait(AGENT_ACCEPT_RETRY_S)
                continue
            with conn:
                conn.settimeout(None)
                try:
                    self._serve(conn)
                except Exception:  # one broken exchange never takes the agent down
                    log.exception("agent: a request failed")

    def _serve(self, conn: socket.socket) -> None:
        """One request, one reply; a broken request gets an error reply where possible."""
        try:
            request = AgentRequest.from_bytes(read_frame(conn))
        except AgentError as err:
            log.warning("agent: refused a request: %s", err)
            with contextlib.suppress(OSError):
                write_frame(conn, AgentReply(error=str(err)).to_bytes())
            return
        except OSError as err:  # the peer reset the connection mid-request
            log.warning("agent: a request was cut off: %s", err)
            return
        reply = self.handle(request)
        try:
            write_frame(conn, reply.to_bytes())
        except OSError as err:  # the ClientApp is gone (its SuperNode stopped, TTL passed)
            log.warning("agent: the reply for run %d was not taken: %s", request.run_id, err)
        self.served += 1

    def handle(self, request: AgentRequest) -> AgentReply:
        """The reply to one request (in the calling thread)."""
        if request.version != fedstream_version():
            why = (
                f"refused: this agent runs fedstream {fedstream_version()}, the ClientApp "
                f"fedstream {request.version}; restart the agent after upgrading "
                "(systemctl restart fedstream-agent@<device>)"
            )
            log.warning("agent: %s", why)
            return AgentReply(error=why)
        device = request.node_config.get("device-id")
        if self.device_id is not None and device != self.device_id:
            return AgentReply(error=f"refused: this agent serves {self.device_id}, not {device}")
        try:
            task = self._code_for(request)
        except ValueError as err:
            log.error("agent: run %d: %s", request.run_id, err)
            return AgentReply(error=f"cannot load the run's code: {err}")
        cpu0 = time.thread_time()
        try:
            reply = self._round(request, task)
        except Exception as err:  # as Flower reports a ClientApp that raised, with the cause
            log.exception("agent: run %d: the %s handler raised", request.run_id, request.kind)
            return AgentReply(
                error=f"the {request.kind} handler raised {type(err).__name__}: {err}"
            )
        if not reply.has_error():
            spent = time.thread_time() - cpu0
            ReplyMetrics.amend(reply.content, agent_cpu_s=spent, agent_peak_rss=peak_rss_bytes())
        return AgentReply(reply)

    def _round(self, request: AgentRequest, task: Task | None) -> Message:
        from flwr.app import Context, RecordDict

        from edge_client.runtime.rounds import probe_steps, train_round

        context = Context(
            run_id=request.run_id,
            node_id=0,
            node_config=dict(request.node_config),
            state=RecordDict(),
            run_config=dict(request.run_config),
        )
        if request.kind == "query":
            return probe_steps(request.message, context, task)
        return train_round(request.message, context, task)

    # -- the run's code --------------------------------------------------------------------

    def _code_for(self, request: AgentRequest) -> Task | None:
        """The run's task (None: the run config names a built-in one, loaded per round), its
        app's packages imported from the run's app directory.

        Raises
        ------
        ValueError
            If the task's import path does not load.
        """
        key = (request.run_id, request.task, request.app_dir)
        if key == self._run:
            return self._task
        paths = [p for p in (request.task, request.run_config.get("task")) if isinstance(p, str)]
        packages = {p.split(":")[0].split(".")[0] for p in paths if IMPORT_PATH.match(p)}
        self._use_app(request.app_dir, packages - _KEPT)
        from edge_client.task.loading import task_at

        self._task = task_at(request.task) if request.task else None
        self._run = key
        log.info(
            "agent: run %d's code loaded (task %s, app %s)",
            request.run_id,
            request.task or request.run_config.get("task"),
            request.app_dir or "-",
        )
        return self._task

    def _use_app(self, app_dir: str | None, packages: set[str]) -> None:
        """Forget the previous run's packages and put ``app_dir`` first on the import path:
        the next import of ``packages`` loads this run's version."""
        for name in list(sys.modules):
            if name.split(".")[0] in self._packages | packages:
                del sys.modules[name]
        if self._app_dir is not None and self._app_dir in sys.path:
            sys.path.remove(self._app_dir)
        self._app_dir = None
        if app_dir is not None and app_dir not in sys.path:  # not site-packages, say
            sys.path.insert(0, app_dir)
            self._app_dir = app_dir
        importlib.invalidate_caches()
        self._packages = packages
