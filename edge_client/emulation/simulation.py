"""Virtual devices of Flower's simulation engine, fed by replayed streams.

In the simulation engine a node has only ``partition-id``: it becomes a virtual device whose
stream delivers at the rate, whose training runs with the slowdown, and which is away when,
the run config's ``sim-population`` (or ``sim-rates`` and ``sim-slowdowns``) gives it
(:mod:`edge_client.emulation.population`). Its stream is the synthetic task's (of the run's
``sample-shape`` and ``num-classes``; device ``sim-<partition-id>``), or with ``sim-source``
its part of a recording, split by ``sim-partition`` (:mod:`edge_client.emulation.partitions`)
and streamed in recorded order, starting over when it ends (device ``user-14`` for the group
``14`` of ``sim-partition-by user``, ``part-<id>`` otherwise). An away device answers each
message with Flower's ``NODE_UNAVAILABLE`` error at once (the aggregator counts it as failed);
its stream goes on (the broker would queue it).

Time is virtual: round ``r`` (a model version, in asynchronous mode) is ``r x sim-round-s``
seconds on every device's clock, so what a stream has delivered, and whether a device is
away, depend on the round, not on how fast this machine runs it: a seeded run repeats.

With ``sim-buffers = "lazy"`` (the default) the device's buffer is a
:class:`~edge_client.emulation.lazy_buffer.LazyBuffer` kept in the node's Flower state
(``context.state``) between rounds: counts, a few hundred bytes, samples made only when a
round takes them; so is the device state a real device keeps in its buffer file
(error-feedback residual, standardisation, drift): no file at all (but the injection pool
below). With ``"files"`` a
replayed stream tops a buffer file up before each round
(:func:`~edge_client.emulation.replay.replay_into`), as a real device's ingest would.

With ``inject-alpha`` above 0 every virtual device takes part in ScaDLES data injection: what
a picked device shares goes to :class:`~edge_client.emulation.shared_topic.SharedTopic`, the
run's stand-in for the broker's topic, and reaches the others' pools (files next to where
their buffer files would be) when their next round starts.

The ClientApp reaches these through the runtime's hook
(:class:`~edge_client.runtime.virtual_nodes.VirtualNodes`): :class:`SimulationNodes`, which
:mod:`edge_client.flower_app` provides.
"""

from __future__ import annotations

import contextlib
import json
import random
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, RecordDict
from flwr.common.constant import NUM_PARTITIONS_KEY, PARTITION_ID_KEY

from edge_client.emulation.constants import SIM_STEP_FIXED_S, SIM_STEP_PER_SAMPLE_S
from edge_client.emulation.lazy_buffer import LazyBuffer, RecordingSamples, Samples, StreamSamples
from edge_client.emulation.partitions import split_recording
from edge_client.emulation.population import DeviceProfile, profile_of
from edge_client.emulation.replay import replay_into
from edge_client.emulation.shared_topic import SharedTopic
from edge_client.emulation.sources import pick_classes
from edge_client.runtime.constants import DEFAULT_CAPACITY
from edge_client.runtime.device_state import DeviceState, MemoryDeviceState
from edge_client.runtime.injection import Post, open_pool, receive
from edge_client.runtime.node_config import NodeConfig
from edge_client.wire.partitioning import scheme_of
from edge_client.wire.population import parse_population
from edge_client.wire.run_config import RunSettings, number_list
from edge_client.wire.secagg_records import MASKED_INPUT

__all__ = [
    "SimulationNodes",
    "absence",
    "lazy_device",
    "profile",
    "receive_shared",
    "simulated_node",
    "virtual_step_s",
    "virtual_stream",
    "virtual_time",
]

#: Where a lazy virtual device's buffer lives between rounds, in its ``context.state``.
LAZY_STATE_KEY = "fedstream.lazy-buffer"
#: When the virtual device got its first message (its availability counts from there).
START_STATE_KEY = "fedstream.sim-start"


def virtual_time(settings: RunSettings, server_round: int) -> float:
    """Seconds on the streams' virtual clock at round ``server_round``."""
    return server_round * settings.sim_round_s


def virtual_stream(node_config: Mapping[str, Any], settings: RunSettings) -> tuple[str, Samples]:
    """The virtual device's id and stream: its part of ``sim-source``, or the synthetic task.

    Raises
    ------
    ValueError
        If the recording cannot be read or split, this node has no part of it, or (without a
        recording) the run's ``dataset`` is not the synthetic task.
    """
    pid = int(node_config[PARTITION_ID_KEY])
    if settings.sim_source:
        split = split_recording(
            settings.sim_source,
            scheme_of(settings.sim_partition, settings.sim_partition_by),
            key=settings.sim_partition_by,
            num_partitions=int(node_config.get(NUM_PARTITIONS_KEY, 0)) or None,
            seed=settings.seed,
            shape=settings.shape,
        )
        try:
            x, y = split.part(pid)
        except IndexError as err:
            raise ValueError(f"simulation node {pid}: {err}") from err
        return split.device(pid), RecordingSamples(x, y)
    if settings.dataset != "synthetic":
        raise ValueError(
            f"the simulation engine replays the synthetic task (sample-shape "
            f"{settings.sample_shape}) or a recording (sim-source), not dataset "
            f"{settings.dataset!r}"
        )
    return f"sim-{pid}", _samples(settings, pid, f"sim-{pid}")


def profile(settings: RunSettings, pid: int) -> DeviceProfile:
    """Virtual device ``pid``'s slowdown, stream rate and availability: ``sim-population``,
    with ``sim-slowdowns`` and ``sim-rates`` for what it leaves out."""
    return profile_of(
        parse_population(settings.sim_population),
        pid,
        settings.seed,
        number_list(settings.sim_slowdowns, "sim-slowdowns", 1.0),
        number_list(settings.sim_rates, "sim-rates", 1e-9),
    )


def absence(
    node_config: Mapping[str, Any],
    settings: RunSettings,
    state: RecordDict,
    server_round: int,
    stage: str = "",
) -> str:
    """Why the virtual device is away at round ``server_round`` (empty: it is there). Its
    availability counts on the virtual clock from its first message, kept in ``state``.
    ``sim-secagg-dropout`` of the devices (a seeded draw per round) vanish each round: under
    secure aggregation after sharing their keys, before their masked input (the aggregator
    must then remove their pairwise masks with their shares); in a plain run the same
    devices send no update that round (the run to compare with)."""
    pid = int(node_config[PARTITION_ID_KEY])
    if settings.simulation.sim_secagg_dropout > 0 and server_round >= 1:
        draw = random.Random(f"{settings.seed}-{server_round}-{pid}-secagg-dropout").random()
        if draw < settings.simulation.sim_secagg_dropout:
            if settings.secure.secure_aggregation and stage == MASKED_INPUT:
                return f"sim-{pid} vanished before its masked input (sim-secagg-dropout)"
            if not settings.secure.secure_aggregation and not stage:
                return f"sim-{pid} sends no update this round (sim-secagg-dropout)"
    saved = state.get(START_STATE_KEY)
    now = virtual_time(settings, server_round)
    if isinstance(saved, ConfigRecord):
        start = float(str(saved["start"]))
    else:
        start = now
        state[START_STATE_KEY] = ConfigRecord({"start": repr(now)})
    if profile(settings, pid).online(now - start):
        return ""
    device_id, _stream = virtual_stream(node_config, settings)
    return f"{device_id} is offline {now - start:.0f} s into the run (sim-population)"


def _samples(settings: RunSettings, pid: int, device_id: str) -> StreamSamples:
    k = settings.sim_labels
    return StreamSamples(
        device_id,
        settings.seed,
        settings.shape,
        settings.num_classes,
        labels=pick_classes(k, settings.num_classes, index=pid) if k else None,
        dirichlet=settings.sim_dirichlet or None,
        feature_shift=settings.sim_feature_shift,
    )


def simulated_node(
    node_config: Mapping[str, Any], run_id: int, settings: RunSettings, server_round: int = 0
) -> NodeConfig:
    """The virtual device of a simulation node (with ``sim-buffers = "files"``, its buffer
    file topped up to round ``server_round`` of the virtual clock).

    Parameters
    ----------
    node_config : Mapping
        Flower's node config (``partition-id``).
    run_id : int
        The Flower run (files are kept per run under ``sim-dir``).
    settings : RunSettings
        The run's settings (``sim-*`` keys, ``seed``).

    Returns
    -------
    NodeConfig
        Device ``sim-<partition-id>``, its file under ``sim-dir`` (lazy: none), its slowdown,
        opted in to data injection when the run injects (``inject-alpha`` > 0).

    Raises
    ------
    ValueError
        As :func:`virtual_stream`.
    """
    pid = int(node_config[PARTITION_ID_KEY])
    device_id, samples = virtual_stream(node_config, settings)
    device = profile(settings, pid)
    root = Path(settings.sim_dir or Path(tempfile.gettempdir()) / "fedstream-sim")
    path = root / f"run-{run_id}" / f"{device_id}.sqlite"
    if settings.sim_buffers == "files":  # lazy: no file, buffer and state in context.state
        replay_into(
            path,
            samples,
            device.rate,
            initial=settings.sim_initial,
            capacity=DEFAULT_CAPACITY,
            now=virtual_time(settings, server_round),
        )
    # One torch thread: Ray runs one ClientApp per CPU it was given (--client-resources-num-cpus).
    return NodeConfig(
        device_id,
        str(path),
        slowdown=device.slowdown,
        threads=1,
        inject=settings.inject_alpha > 0,
    )


def receive_shared(
    node: NodeConfig, settings: RunSettings, state: DeviceState, server_round: int
) -> None:
    """Receive into the virtual device's injection pool what the others shared since its
    last round, up to round ``server_round`` (excluded), as its ingest daemon would have;
    the last round received is kept in ``state``. Nothing for a device not opted in."""
    if not node.inject:
        return
    received = state.inject_received()
    payloads = SharedTopic(Path(node.buffer).parent).frames(received, server_round)
    if payloads:
        with open_pool(node.buffer, settings.shape) as pool:
            receive(
                pool,
                payloads,
                node.device_id,
                settings.num_classes,
                now=virtual_time(settings, server_round),
            )
    if server_round - 1 > received:
        state.set_inject_received(server_round - 1)


@contextlib.contextmanager
def lazy_device(
    node_config: Mapping[str, Any], settings: RunSettings, state: RecordDict, server_round: int
) -> Iterator[tuple[LazyBuffer, MemoryDeviceState]]:
    """The virtual device's lazy buffer, advanced to round ``server_round`` of the virtual
    clock, and its device state; both kept in ``state`` on exit.

    Parameters
    ----------
    node_config : Mapping
        Flower's node config (``partition-id``).
    settings : RunSettings
        The run's settings.
    state : RecordDict
        The node's ``context.state``, which the simulation engine keeps between rounds.
    server_round : int
        The round (the model version, in asynchronous mode): the virtual clock's time.
    """
    pid = int(node_config[PARTITION_ID_KEY])
    _device_id, samples = virtual_stream(node_config, settings)
    now = virtual_time(settings, server_round)
    # No clock: the buffer holds what arrived by the round's virtual time, and nothing arrives
    # while the round trains (training takes what it holds, without waiting in wall time).
    saved = state.get(LAZY_STATE_KEY)
    if isinstance(saved, ConfigRecord):
        buffer = LazyBuffer.from_state(samples, json.loads(str(saved["buffer"])))
        values = {k: v for k, v in saved.items() if isinstance(v, bytes)}
        device = MemoryDeviceState(values)
    else:
        buffer = LazyBuffer(
            samples,
            profile(settings, pid).rate,
            DEFAULT_CAPACITY,
            initial=settings.sim_initial,
        )
        device = MemoryDeviceState()
    buffer.advance(now)
    try:
        yield buffer, device
    finally:
        record = ConfigRecord({"buffer": json.dumps(buffer.to_state())})
        for key, value in device.values.items():
            record[key] = value
        state[LAZY_STATE_KEY] = record


class SimulationNodes:
    """The virtual devices of Flower's simulation engine, for the runtime's hook
    (:class:`~edge_client.runtime.virtual_nodes.VirtualNodes`): :func:`absence`,
    :func:`simulated_node` and :func:`lazy_device`."""

    def absence(
        self,
        node_config: Mapping[str, Any],
        settings: RunSettings,
        state: RecordDict,
        server_round: int,
        stage: str = "",
    ) -> str:
        """Why the virtual device is away at the round (empty: it is there): :func:`absence`."""
        return absence(node_config, settings, state, server_round, stage)

    def node(
        self,
        node_config: Mapping[str, Any],
        run_id: int,
        settings: RunSettings,
        server_round: int,
    ) -> NodeConfig:
        """The virtual device: :func:`simulated_node`."""
        return simulated_node(node_config, run_id, settings, server_round)

    def open_device(
        self,
        node_config: Mapping[str, Any],
        settings: RunSettings,
        state: RecordDict,
        server_round: int,
    ) -> contextlib.AbstractContextManager[tuple[LazyBuffer, MemoryDeviceState]]:
        """Its lazy buffer and device state: :func:`lazy_device`."""
        return lazy_device(node_config, settings, state, server_round)

    def receive_shared(
        self, node: NodeConfig, settings: RunSettings, state: DeviceState, server_round: int
    ) -> None:
        """Injected samples into its pool: :func:`receive_shared`."""
        receive_shared(node, settings, state, server_round)

    def post_shared(self, node: NodeConfig, server_round: int) -> Post:
        """Where the samples it shares in round ``server_round`` go: the run's
        :class:`~edge_client.emulation.shared_topic.SharedTopic`."""
        topic = SharedTopic(Path(node.buffer).parent)
        return lambda payload: topic.publish(server_round, node.device_id, payload)

    def step_s(self, node: NodeConfig, batch: int) -> float:
        """Seconds one SGD step of ``batch`` samples takes: :func:`virtual_step_s`."""
        return virtual_step_s(node.slowdown, batch)


def virtual_step_s(slowdown: float, batch: int) -> float:
    """A virtual device's SGD step of ``batch`` samples on the virtual clock:
    (:data:`SIM_STEP_FIXED_S` + :data:`SIM_STEP_PER_SAMPLE_S` x ``batch``) x ``slowdown``."""
    return (SIM_STEP_FIXED_S + SIM_STEP_PER_SAMPLE_S * batch) * slowdown
