"""How fedstream is launched and checked: the ``fedstream`` CLI and what it runs.

- :mod:`deploy.cli`: the ``fedstream`` command (``python -m deploy``), a module per audience;
- :mod:`~deploy.demo`: ``fedstream demo``, everything on one machine (its options in
  :mod:`~deploy.demo_config`, its streams in :mod:`~deploy.demo_streams`, following the run
  in :mod:`~deploy.demo_follow`, what it shows in :mod:`~deploy.demo_view`);
- :mod:`~deploy.fleet_status`: the operator's fleet view (``fedstream fleet``);
- :mod:`~deploy.flower`: Flower's SuperLink, SuperNodes and runs on one machine;
- :mod:`~deploy.brokers`: the embedded broker and Mosquitto;
- :mod:`~deploy.inprocess`: the in-process runner (virtual clock) for tests and benchmarks;
- :mod:`~deploy.local`, :mod:`~deploy.secure`: processes and ports; run certificates and keys;
- :mod:`~deploy.report`: a run's summary and plots;
- :mod:`~deploy.probes`: fault and security probes shared by tests and the reliability report;
- :mod:`deploy.bench`: the benchmarks (``fedstream bench``).

systemd units and the install notes are in ``deploy/systemd`` and ``docs/deployment.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_client.lazy import lazy_exports

if TYPE_CHECKING:
    from deploy.brokers import EmbeddedBroker, MosquittoBroker, mosquitto_available
    from deploy.demo import run_demo
    from deploy.demo_config import DemoConfig
    from deploy.flower import FlowerDeployment, FlowerError, resume_run, submit_run
    from deploy.inprocess import InProcessGrid, LocalGrid, StaticGrid, VirtualDevice
    from deploy.local import ProcessGroup, fedstream_command
    from deploy.report import summarize, write_report
    from deploy.secure import RunSecrets, make_run_secrets

_EXPORTS = {
    "DemoConfig": "demo_config",
    "EmbeddedBroker": "brokers",
    "FlowerDeployment": "flower",
    "FlowerError": "flower",
    "InProcessGrid": "inprocess",
    "LocalGrid": "inprocess",
    "MosquittoBroker": "brokers",
    "ProcessGroup": "local",
    "RunSecrets": "secure",
    "StaticGrid": "inprocess",
    "VirtualDevice": "inprocess",
    "fedstream_command": "local",
    "make_run_secrets": "secure",
    "mosquitto_available": "brokers",
    "resume_run": "flower",
    "run_demo": "demo",
    "submit_run": "flower",
    "summarize": "report",
    "write_report": "report",
}
__all__ = [
    "DemoConfig",
    "EmbeddedBroker",
    "FlowerDeployment",
    "FlowerError",
    "InProcessGrid",
    "LocalGrid",
    "MosquittoBroker",
    "ProcessGroup",
    "RunSecrets",
    "StaticGrid",
    "VirtualDevice",
    "fedstream_command",
    "make_run_secrets",
    "mosquitto_available",
    "resume_run",
    "run_demo",
    "submit_run",
    "summarize",
    "write_report",
]
__getattr__ = lazy_exports(__name__, _EXPORTS)
