"""The processes of a local deployment as ``fedstream bench deployment`` reads them: CPU
seconds, peak memory and bytes written by role (what each command line runs), sampled in a
thread while a run goes."""

from __future__ import annotations

import os
import statistics
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from edge_client.runtime import usage

__all__ = ["DEVICE_ROLES", "SAMPLE_S", "ProcessSampler"]

#: How often the sampler reads the processes.
SAMPLE_S = 0.5
#: What a device runs besides its ClientApp processes.
DEVICE_ROLES = ("ingest", "supernode", "superexec", "agent")


@dataclass
class _Seen:
    """One sampled process: its role, its CPU seconds and bytes written when first seen, and
    the largest CPU seconds, peak resident bytes and bytes written read since."""

    role: str
    cpu0: float
    cpu: float = 0.0
    peak: int = 0
    written0: int = 0
    written: int = 0
    torch: bool = False  # torch's library mapped (it loads after the process starts)
    cpu_mark: float | None = None  # CPU seconds at the sampler's mark (the first round's end)


@dataclass
class ProcessSampler:
    """Reads the processes this one started, every :data:`SAMPLE_S`, by role (what the
    command line runs): CPU seconds, peak resident memory and bytes written while sampled.

    Short-lived ClientApp processes report their own figures in their replies; this is for
    the long-lived ones (ingest daemon, SuperNode, SuperExec).
    """

    roles: dict[str, str] = field(
        default_factory=lambda: {
            "flower-supernode": "supernode",
            "fedstream-supernode": "supernode",  # Flower's, its waits shortened
            "flower-superexec": "superexec",
            "flwr-clientapp": "clientapp",
            " ingest ": "ingest",
            " agent ": "agent",
            " publish ": "publisher",
            "flower-superlink": "superlink",
            "flwr-serverapp": "serverapp",
        }
    )
    seen: dict[int, _Seen] = field(default_factory=dict)
    #: The largest memory the devices' processes held together at one instant (PSS), and the
    #: most SuperNodes seen alive at once: :attr:`device_pss_peak` is the one over the other.
    together_peak: int = 0
    devices: int = 0
    #: When this turns true (checked at each sample), each process's CPU seconds are noted:
    #: what they spend after it is the steady state, start-up left out.
    mark_when: Callable[[], bool] | None = None
    marked: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)

    def _role(self, pid: int) -> str | None:
        try:
            cmd = " " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return None
        for needle, role in self.roles.items():
            if needle in cmd:
                return role
        return None

    def sample(self) -> None:
        """Read every live descendant of this process once."""
        together = nodes = 0
        for pid in usage.children(os.getpid()):
            entry = self.seen.get(pid)
            if entry is None:
                role = self._role(pid)
                if role is None:
                    continue
                if role == "superexec" and self._role(usage.parent(pid)) != "supernode":
                    role = "superlink-superexec"  # the one that runs the ServerApp
                entry = self.seen[pid] = _Seen(
                    role, usage.cpu_s(pid, reaped=False), written0=usage.disk_write_bytes(pid)
                )
            entry.cpu = max(entry.cpu, usage.cpu_s(pid, reaped=False))
            entry.peak = max(entry.peak, usage.peak_rss_bytes(pid))
            entry.written = max(entry.written, usage.disk_write_bytes(pid))
            if not entry.torch and entry.role in (*DEVICE_ROLES, "clientapp"):
                entry.torch = usage.maps_torch(pid)
            if entry.role in (*DEVICE_ROLES, "clientapp"):
                together += usage.pss_bytes(pid)
            nodes += entry.role == "supernode"
        # Summed over all devices and divided once at the end: the agents and ingest daemons
        # start before the SuperNodes, so dividing by the SuperNodes seen so far overstates.
        self.together_peak = max(self.together_peak, together)
        self.devices = max(self.devices, nodes)
        if not self.marked and self.mark_when is not None and self.mark_when():
            self.marked = True
            for entry in self.seen.values():
                entry.cpu_mark = entry.cpu

    @contextmanager
    def running(self) -> Iterator[ProcessSampler]:
        """Sample in a thread while the block runs."""

        def loop() -> None:
            while not self._stop.wait(SAMPLE_S):
                self.sample()

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()

    @property
    def device_pss_peak(self) -> int:
        """The largest memory the device processes held at one instant, per device (PSS)."""
        return self.together_peak // max(1, self.devices)

    def by_role(self) -> dict[str, dict[str, float]]:
        """Per role: processes, mean CPU seconds and bytes written while sampled, and the
        largest peak resident memory."""
        out: dict[str, dict[str, float]] = {}
        for role in sorted({e.role for e in self.seen.values()}):
            of = [e for e in self.seen.values() if e.role == role]
            out[role] = {
                "processes": len(of),
                "with_torch": sum(e.torch for e in of),
                "cpu_s": statistics.mean(e.cpu - e.cpu0 for e in of),
                # all of them after the mark (a process started after it: all its seconds)
                "cpu_s_after_mark": sum(
                    e.cpu - (e.cpu0 if e.cpu_mark is None else e.cpu_mark) for e in of
                ),
                "peak_rss": max(e.peak for e in of),
                "written": statistics.mean(e.written - e.written0 for e in of),
            }
        return out
