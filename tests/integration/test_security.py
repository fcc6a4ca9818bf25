"""Security: Flower TLS and SuperNode authentication with real processes.

``fedstream demo --secure`` end to end is in ``tests/faults/test_aggregator_and_broker.py``
(with a broker crash and an aggregator kill). The broker side (no credentials refused, no
cross-device topics, TLS with a password per device) is in
``tests/integration/test_mosquitto_prod.py``; refusing updates with wrong shapes or
non-finite values is in ``tests/unit/test_strategy.py`` and ``tests/unit/test_codec.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.probes import supernode_admission
from deploy.secure import make_run_secrets


@pytest.mark.mosquitto  # make-dev-certs.sh writes the broker's password file with mosquitto_passwd
def test_only_registered_supernodes_join_a_secured_superlink(tmp_path: Path) -> None:
    # Prepare: run secrets with dev-a's SuperNode key.
    secrets = make_run_secrets(tmp_path / "secrets", ["dev-a"])
    # Execute: a TLS SuperLink with --enable-supernode-auth and dev-a's key registered;
    # dev-a's SuperNode and one with an unregistered key try to join.
    seen = supernode_admission(secrets, tmp_path)
    # Assert: the registered node is online under its registered id; the other one was
    # refused by the SuperLink and gave up, and is not in the federation.
    nodes = [(int(n["node-id"]), n["status"]) for n in seen["nodes"]]
    assert nodes == [(seen["node-id"], "online")] and seen["member-alive"]
    assert seen["intruder-exit"] not in (None, 0)
    assert "No SuperNode found with the given public key" in seen["superlink-log"]
