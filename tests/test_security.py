"""Security: Flower TLS and SuperNode authentication with real processes.

``fedstream demo --secure`` end to end is in ``tests/faults/test_aggregator_and_broker.py``
(with a broker crash and an aggregator kill). The broker side (no credentials refused, no
cross-device topics, TLS with a password per device) is in ``test_mosquitto_prod.py``;
refusing updates with wrong shapes or non-finite values is in ``test_training.py`` and
``test_codec.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

from deploy.flower import FlowerDeployment
from deploy.local import ProcessGroup
from deploy.secure import make_node_key, make_run_secrets
from tests.conftest import needs_mosquitto

REFUSED_WAIT_S = 60.0


@needs_mosquitto  # make-dev-certs.sh writes the broker's password file with mosquitto_passwd
def test_only_registered_supernodes_join_a_secured_superlink(tmp_path: Path) -> None:
    # Prepare: TLS SuperLink with --enable-supernode-auth; dev-a's key registered, not dev-b's.
    secrets = make_run_secrets(tmp_path / "secrets", ["dev-a"])
    stranger = make_node_key(tmp_path / "stranger" / "dev-b")
    with ProcessGroup() as group:
        flower = FlowerDeployment(group, tmp_path / "flwr", secrets=secrets)
        flower.start_superlink()
        node_id = flower.register_supernode(secrets.node_public_key("dev-a"))
        # Execute
        flower.start_supernode("dev-a", {"device-id": "dev-a"})
        intruder = flower.start_supernode(
            "dev-b", {"device-id": "dev-b"}, key=stranger.with_suffix("")
        )
        flower.wait_nodes(1, timeout=60)
        deadline = time.monotonic() + REFUSED_WAIT_S
        while intruder.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        nodes = flower.list_nodes()
        # Assert: the registered node is online under its registered id; the other one was
        # refused by the SuperLink and gave up, and is not in the federation.
        assert [(int(n["node-id"]), n["status"]) for n in nodes] == [(node_id, "online")]
        assert intruder.poll() not in (None, 0)
        log = (tmp_path / "flwr" / "logs" / "superlink.log").read_text()
        assert "No SuperNode found with the given public key" in log
        assert group.procs["supernode-dev-a"].poll() is None
