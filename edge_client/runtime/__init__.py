"""What runs on a device: ingest, the buffer file, and the ClientApp.

- :mod:`~edge_client.runtime.ingest`: the ingest daemon (MQTT in, buffer out, exactly once),
  which logs with :mod:`~edge_client.runtime.ingest_status`;
- :mod:`~edge_client.runtime.buffer`: the durable, bounded sample buffer (SQLite);
- :mod:`~edge_client.runtime.device_state`, :mod:`~edge_client.runtime.outbox`: what the
  device keeps between rounds, and what it leaves for the daemon to publish, in the same
  file (:mod:`~edge_client.runtime.schema`: its layout versions and migrations);
- :mod:`~edge_client.runtime.dedup`, :mod:`~edge_client.runtime.rate`: exact
  de-duplication, the stream-rate EWMA;
- :mod:`~edge_client.runtime.client_app`: the ClientApp (``app``, or
  :func:`make_client_app` around a user's task), which runs a round
  (:mod:`~edge_client.runtime.rounds`: evaluation and training with
  :mod:`~edge_client.runtime.trainer`) in its own process, or hands it to the device's
  agent, as its :mod:`~edge_client.runtime.node_config` says;
- :mod:`~edge_client.runtime.agent`: ``fedstream agent``, the device's long-lived trainer
  (torch and the task loaded once), and :mod:`~edge_client.runtime.agent_channel`, the
  Unix-socket channel the ClientApp reaches it by;
- :mod:`~edge_client.runtime.virtual_nodes`: the hook through which the simulation engine's
  virtual devices reach the ClientApp (the stream emulation provides it; the runtime never
  imports the emulation);
- :mod:`~edge_client.runtime.injection`: ScaDLES data injection, device side (sharing what
  a device trained on, receiving into its pool, mixing pool samples into its batches);
- :mod:`~edge_client.runtime.mqtt`, :mod:`~edge_client.runtime.seeding`,
  :mod:`~edge_client.runtime.signals`: broker clients, reproducible randomness per device,
  running a daemon until SIGTERM;
- :mod:`~edge_client.runtime.usage`: what a process costs its device (age, CPU, memory,
  bytes written), which the ClientApp reports with each reply;
- :mod:`~edge_client.runtime.infer`: ``fedstream infer``, the newest model version run on
  every sample of the stream, predictions published; the versions come from
  :mod:`~edge_client.runtime.model_store` (each global model the ClientApp receives);
- :mod:`~edge_client.runtime.drift_watch`: a change detector (ADWIN) on the prequential error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_client.lazy import lazy_exports

if TYPE_CHECKING:
    from edge_client.runtime.agent import DeviceAgent
    from edge_client.runtime.buffer import AppendResult, BufferStore, BufferStoreError
    from edge_client.runtime.client_app import make_client_app
    from edge_client.runtime.dedup import SeqWindow
    from edge_client.runtime.device_state import DeviceStateStore
    from edge_client.runtime.drift_watch import DriftStatus, DriftWatch
    from edge_client.runtime.infer import InferConfig, InferenceDaemon
    from edge_client.runtime.ingest import IngestConfig, IngestDaemon
    from edge_client.runtime.injection import (
        InjectionRelay,
        inject_pool_path,
        open_pool,
        receive,
        share,
    )
    from edge_client.runtime.model_store import store_model
    from edge_client.runtime.mqtt import BrokerOptions, BrokerURL, connect_async, make_client
    from edge_client.runtime.node_config import NodeConfig
    from edge_client.runtime.outbox import Outbox
    from edge_client.runtime.rate import RateEstimator
    from edge_client.runtime.seeding import device_rng
    from edge_client.runtime.trainer import TrainResult, pick_device, train_local
    from edge_client.runtime.virtual_nodes import VirtualNodes, provide_virtual_nodes

_EXPORTS = {
    "AppendResult": "buffer",
    "BrokerOptions": "mqtt",
    "BrokerURL": "mqtt",
    "BufferStore": "buffer",
    "BufferStoreError": "buffer",
    "make_client_app": "client_app",
    "DeviceStateStore": "device_state",
    "IngestConfig": "ingest",
    "IngestDaemon": "ingest",
    "InjectionRelay": "injection",
    "NodeConfig": "node_config",
    "Outbox": "outbox",
    "RateEstimator": "rate",
    "SeqWindow": "dedup",
    "TrainResult": "trainer",
    "VirtualNodes": "virtual_nodes",
    "connect_async": "mqtt",
    "device_rng": "seeding",
    "inject_pool_path": "injection",
    "make_client": "mqtt",
    "open_pool": "injection",
    "pick_device": "trainer",
    "provide_virtual_nodes": "virtual_nodes",
    "receive": "injection",
    "DriftStatus": "drift_watch",
    "DriftWatch": "drift_watch",
    "InferConfig": "infer",
    "InferenceDaemon": "infer",
    "store_model": "model_store",
    "share": "injection",
    "train_local": "trainer",
    "DeviceAgent": "agent",
}
__all__ = [
    "AppendResult",
    "BrokerOptions",
    "BrokerURL",
    "BufferStore",
    "BufferStoreError",
    "DeviceAgent",
    "DeviceStateStore",
    "DriftStatus",
    "DriftWatch",
    "InferConfig",
    "InferenceDaemon",
    "IngestConfig",
    "IngestDaemon",
    "InjectionRelay",
    "NodeConfig",
    "Outbox",
    "RateEstimator",
    "SeqWindow",
    "TrainResult",
    "VirtualNodes",
    "connect_async",
    "device_rng",
    "inject_pool_path",
    "make_client",
    "make_client_app",
    "open_pool",
    "pick_device",
    "provide_virtual_nodes",
    "receive",
    "share",
    "store_model",
    "train_local",
]
__getattr__ = lazy_exports(__name__, _EXPORTS)
