"""fedstream's device side, in layers (each a package):

- :mod:`edge_client.wire`: what device and aggregator exchange and agree on (frames, the
  update codec, the round records, the run config);
- :mod:`edge_client.task`: the models and datasets (where a user's own plug in);
- :mod:`edge_client.runtime`: what runs on a device (ingest, buffer, ClientApp);
- :mod:`edge_client.emulation`: what stands in for sensors (publishers, replayed streams);
- :mod:`edge_client.flower_app`: the ClientApp Flower loads, the runtime's with the
  simulation engine's virtual devices (the emulation builds on the runtime, never the
  other way);
- :mod:`edge_client.flower_internals`: every use fedstream makes of Flower's internals
  (pinned to the Flower versions allowed), with :mod:`edge_client.task_wake`, the
  SuperNode's wake for its device's agent; both sides' processes use them, and they stand
  on their own (neither reaches the runtime or the emulation).

The aggregator (:mod:`aggregator`) imports only ``wire``, ``task`` and Flower's internals;
``edge_client`` never imports the aggregator. :mod:`edge_client.lazy` lets each package
export its names without loading what a caller does not use.
"""

__all__ = ["emulation", "runtime", "task", "wire"]
