"""Following a demo run to its end, and the faults it injects on the way: SuperNodes
killed and restarted, the broker killed and started again, the aggregator killed and the
run resumed from its checkpoint."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from aggregator.round_log import read_metrics, rounds_only
from deploy.brokers import MosquittoBroker
from deploy.constants import (
    APP_DIR,
    DEMO_BROKER_OUTAGE_S,
    DEMO_STATUS_CHECK_S,
    DEMO_STATUS_POLL_S,
)
from deploy.demo_config import DemoConfig
from deploy.demo_streams import (
    Streams,
)
from deploy.demo_view import (
    progress_table,
)
from deploy.flower import FlowerDeployment
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.node_config import NodeConfig

__all__ = ["follow_run", "kill_and_resume"]


def follow_run(
    flower: FlowerDeployment,
    run_id: str,
    config: DemoConfig,
    run_dir: Path,
    console: Console,
    node_configs: dict[str, NodeConfig],
    streams: Streams,
) -> tuple[dict[str, Any], list[str]]:
    """Show progress until the run ends (or stalls past every round's timeout).

    Injects the faults asked for: SuperNodes killed and restarted, device agents killed
    mid-round and restarted, the broker killed and
    started again ``DEMO_BROKER_OUTAGE_S`` later (training goes on from the buffers), and the
    aggregator (SuperLink with its ServerApp) killed, started again, and the run resumed from
    its last checkpoint as ``fedstream resume`` would. Returns the last run's status and the run ids
    submitted after the first.
    """
    rounds = config.settings.num_rounds
    deadline = time.monotonic() + 120.0 + rounds * (config.settings.round_timeout + 30.0)
    status: dict[str, Any] = {}
    resumed: list[str] = []
    with Live(console=console, refresh_per_second=2, transient=not config.live) as live:
        shown = -1
        doomed = dict(config.kill)
        revived = dict(config.restart)
        agents_doomed = dict(config.kill_agent)
        aggregator_fault = config.kill_aggregator
        broker_fault = config.kill_broker if streams.mosquitto is not None else None
        outage: _BrokerOutage | None = None
        next_check = 0.0
        try:
            while time.monotonic() < deadline:
                records = rounds_only(read_metrics(run_dir / "metrics.jsonl"))
                if broker_fault is not None and len(records) >= broker_fault:
                    assert streams.mosquitto is not None
                    outage = _BrokerOutage(streams.mosquitto, console, broker_fault)
                    broker_fault = None
                if outage is not None:
                    outage.check()
                if aggregator_fault is not None and len(records) >= aggregator_fault:
                    run_id = kill_and_resume(flower, config, run_dir, console, len(records), run_id)
                    resumed.append(run_id)
                    aggregator_fault = None
                    continue
                for dev, after in list(doomed.items()):
                    if len(records) >= after:  # fault injection: the device dies (SIGKILL)
                        flower.kill_supernode(dev)
                        console.print(
                            f"[yellow]killed {dev}'s SuperNode after round {after}[/yellow]"
                        )
                        del doomed[dev]
                for dev, after in list(agents_doomed.items()):
                    if len(records) >= after and _training(node_configs[dev]):
                        flower.group.kill(f"agent-{dev}")  # mid-round: its samples held aside
                        flower.group.restart(f"agent-{dev}")
                        console.print(
                            f"[yellow]killed {dev}'s agent (SIGKILL) while it trained round "
                            f"{after + 1}; started it again[/yellow]"
                        )
                        del agents_doomed[dev]
                for dev, after in list(revived.items()):
                    if dev not in doomed and len(records) >= after:  # the device comes back
                        flower.start_supernode(dev, node_configs[dev].to_node_config())
                        console.print(f"[yellow]restarted {dev}'s SuperNode after round {after}[/]")
                        del revived[dev]
                # After the faults: asking Flower for the status takes a CLI call (seconds on a
                # busy machine), and a fault "after round N" is meant to land in round N + 1.
                if time.monotonic() >= next_check or len(records) >= rounds:
                    status = flower.status(run_id)
                    next_check = time.monotonic() + DEMO_STATUS_CHECK_S
                if len(records) != shown:
                    shown = len(records)
                    table = progress_table(records, rounds, str(status.get("status", "")))
                    if config.live:
                        live.update(table)
                    elif records:
                        console.print(table)
                if str(status.get("status", "")).startswith("finished"):
                    break
                # an agent to kill mid-round: look often enough to find its round training
                time.sleep(DEMO_STATUS_POLL_S / 5 if agents_doomed else DEMO_STATUS_POLL_S)
        finally:
            if outage is not None:
                outage.end()
    (run_dir / "serverapp.log").write_text(flower.logs(run_id))
    return status, resumed


class _BrokerOutage:
    """The broker killed now and started again ``DEMO_BROKER_OUTAGE_S`` later, on a timer of
    its own: an aggregator fault handled meanwhile (seconds of restarts) must not stretch the
    outage past what the demo says, and the streams' reconnection backoff (1, 2, 4 s ...)
    must find the broker back when promised."""

    def __init__(self, broker: MosquittoBroker, console: Console, after_round: int) -> None:
        self._broker, self._console = broker, console
        self._error: Exception | None = None
        self._killed = time.monotonic()
        broker.kill()
        console.print(f"[yellow]killed the broker (SIGKILL) after round {after_round}[/]")
        self._timer = threading.Timer(DEMO_BROKER_OUTAGE_S, self._restart)
        self._timer.daemon = True
        self._timer.start()

    def _restart(self) -> None:
        try:
            self._broker.restart()
        except Exception as err:  # raised in the demo's own thread, by check()
            self._error = err
            return
        down = time.monotonic() - self._killed
        self._console.print(f"[yellow]restarted the broker ({down:.0f} s down)[/]")

    def check(self) -> None:
        """Raise what the restart raised (a broker that would not start again)."""
        if self._error is not None:
            raise self._error

    def end(self) -> None:
        """Called when the run ends: a restart under way completes, one not due is dropped."""
        self._timer.cancel()
        self._timer.join()


def _training(node: NodeConfig) -> bool:
    """Whether the device's round is training now (its buffer holds samples aside)."""
    with BufferStore(Path(node.buffer)) as store:
        return store.held_aside() > 0


def kill_and_resume(
    flower: FlowerDeployment,
    config: DemoConfig,
    run_dir: Path,
    console: Console,
    done: int,
    run_id: str,
) -> str:
    """The aggregator host dies mid-round and comes back; the run resumes. New run id."""
    flower.kill_superlink()
    console.print(
        f"[yellow]killed the aggregator (SuperLink + ServerApp, SIGKILL) after round {done}[/]"
    )
    flower.start_superlink()  # same port and state database, as systemd would restart it
    flower.wait_nodes(config.devices)  # the SuperNodes reconnect on their own
    # Flower lists the dead run as running until it misses two heartbeats (about a minute),
    # and a resume waits for that; the demo knows it is dead: `flwr stop`, as the guide says.
    flower.stop_run(run_id)
    run_id, last, total = flower.resume(run_dir / "checkpoint", APP_DIR)
    console.print(
        f"[yellow]resumed from the checkpoint of round {last} as run {run_id} "
        f"(rounds {last + 1}..{total})[/]"
    )
    return run_id
