"""Flower's Control API asked in-process, for the SuperLinks fedstream starts itself.

``flwr list --run-id ID`` and ``flwr supernode list`` are a process each: about 1.25 CPU-s of
imports on a Raspberry Pi class core for a reply of a few hundred bytes. The demo, the
benchmarks and the tests ask them every few seconds while a run goes on (its status) and
while SuperNodes come up (their count), so on a two-core device those calls took more CPU
than the SuperNodes did. :class:`ControlClient` asks the same Control API over one HTTP
connection, with Flower's own client, interceptors and formatting: the same JSON the CLI
prints, for a few milliseconds each.

It serves only :class:`~deploy.flower.FlowerDeployment` (a SuperLink on this host that
fedstream configured itself: its address, and its CA when TLS is on; no account
authentication). Runs a user points fedstream at, through a connection of their own
``config.toml`` that may carry account login, go through the ``flwr`` CLI as before
(:func:`deploy.flower.run_status`).

Flower 1.42 internals used here (``flwr.supercore.control``, ``flwr.cli.ls``,
``flwr.cli.supernode.ls``, ``flwr.cli.run_utils``): ``tests/integration/test_control.py``
compares every answer with the CLI's own on a live SuperLink, so a Flower release that
changes them fails there; the project allows only ``flwr>=1.42,<1.43``. What would let this
module go: a Flower Python API for the Control API (or a long-lived CLI).
"""

from __future__ import annotations

import json
import logging
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flwr.supercore.control import ControlHttpClient

__all__ = ["ControlClient"]

#: The component name Flower's version check sees (the CLI's own: the SuperLink treats these
#: calls as the CLI's).
COMPONENT = "flwr CLI"


class ControlClient:
    """``flwr list`` and ``flwr supernode list`` of one SuperLink, without a process each.

    Parameters
    ----------
    address : str
        The SuperLink's Control API (``HOST:PORT``).
    root_certificates : Path or None
        The CA that signed the SuperLink's certificate; None: plain HTTP (``--insecure``).
    timeout : float
        Seconds a call may take (the CLI's own bound).
    """

    def __init__(self, address: str, root_certificates: Path | None, timeout: float) -> None:
        self.address = address
        self.root_certificates = root_certificates
        self.timeout = timeout
        self._client: ControlHttpClient | None = None

    def run(self, run_id: str) -> dict[str, Any]:
        """The run's entry of ``flwr list --run-id ID --format json`` (empty if the SuperLink
        does not know it or does not answer)."""
        import httpx
        from flwr.cli.ls import _to_json
        from flwr.cli.run_utils import format_runs
        from flwr.common.serde import run_from_proto
        from flwr.proto.control_pb2 import ListRunsRequest

        try:
            res = self._stub().ListRuns(ListRunsRequest(run_id=int(run_id)))
        except (httpx.HTTPError, ValueError):  # down, or the run unknown: as the CLI's {}
            return {}
        rows = format_runs([run_from_proto(r) for r in res.run_dict.values()], res.now)
        runs = json.loads(_to_json(rows)).get("runs") or []
        return dict(runs[0]) if runs else {}

    def nodes(self) -> list[dict[str, Any]]:
        """``flwr supernode list --format json``'s nodes (empty if the SuperLink does not
        answer)."""
        import httpx
        from flwr.cli.supernode.ls import _format_nodes, _to_json
        from flwr.proto.control_pb2 import ListNodesRequest

        try:
            res = self._stub().ListNodes(ListNodesRequest())
        except (httpx.HTTPError, ValueError):  # the SuperLink is down: as the CLI's []
            return []
        rows = _format_nodes(list(res.nodes_info), res.now)
        return [dict(n) for n in json.loads(_to_json(rows, verbose=False)).get("nodes") or []]

    def _stub(self) -> ControlHttpClient:
        if self._client is None:  # Flower's imports only once asked: the CLI's cost, once
            # httpx logs every request at INFO: a status check each second is not news in
            # the demo's console or a service's journal
            logging.getLogger("httpx").setLevel(logging.WARNING)
            from flwr.cli.cli_client_interceptor import CliClientHttpInterceptor
            from flwr.supercore.control import ControlHttpClient
            from flwr.supercore.interceptors.http.runtime_version import (
                RuntimeVersionHttpInterceptor,
            )

            ca = self.root_certificates
            self._client = ControlHttpClient(
                f"{'https' if ca else 'http'}://{self.address}",
                interceptors=[
                    CliClientHttpInterceptor(),
                    RuntimeVersionHttpInterceptor(component_name=COMPONENT),
                ],
                verify=ssl.create_default_context(cafile=str(ca)) if ca else False,
                timeout=self.timeout,
            )
        return self._client
