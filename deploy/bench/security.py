"""Security checks for the reliability report, against real processes.

Each check tries something that must be refused and records whether it was:

- the broker (Mosquitto, production config: TLS, a password per device, per-device ACL):
  a client without credentials, a wrong password, device B reading and writing device A's
  topic;
- the SuperLink (TLS, ``--enable-supernode-auth``): a SuperNode whose key is not
  registered (a registered one must get in);
- the aggregator's decoder: updates with the wrong shapes, a NaN, more values than the model.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from deploy.brokers import BROKER_CONFIG_DIR, MosquittoBroker, mosquitto_available
from deploy.local import wait_until
from deploy.probes import MqttProbe, nan_frame, supernode_admission
from deploy.secure import RunSecrets, make_run_secrets
from edge_client.wire.codec import CodecError, decode, encode, raw_size_limit
from edge_client.wire.topics import samples_topic

__all__ = ["security_checks"]

SETTLE_S = 1.0  # how long a denied message gets to (not) arrive


def _check(name: str, refused: bool, detail: str) -> dict[str, Any]:
    return {"check": name, "refused": bool(refused), "detail": detail}


def _broker_checks(secrets: RunSecrets, broker: MosquittoBroker) -> list[dict[str, Any]]:
    tls = f"mqtts://127.0.0.1:{broker.ports[0]}"
    plain = f"mqtt://127.0.0.1:{broker.ports[1]}"
    ca = str(secrets.ca)
    anonymous = MqttProbe(plain, "anonymous")
    wrong = MqttProbe(tls, "wrong", username="dev-a", password=secrets.password("dev-b"), cafile=ca)
    wait_until(lambda: anonymous.refused is not None and wrong.refused is not None, 10)
    checks = [
        _check(
            "broker: client without credentials", not anonymous.connected, str(anonymous.refused)
        ),
        _check("broker: wrong password", not wrong.connected, str(wrong.refused)),
    ]
    anonymous.close()
    wrong.close()
    a = MqttProbe(tls, "a", username="dev-a", password=secrets.password("dev-a"), cafile=ca)
    b = MqttProbe(tls, "b", username="dev-b", password=secrets.password("dev-b"), cafile=ca)
    a.subscribe(samples_topic("dev-a"))
    b.subscribe(samples_topic("dev-a"))  # denied by the ACL
    time.sleep(SETTLE_S / 2)
    b.publish(samples_topic("dev-a"), b"from-b")  # denied: the broker drops it
    a.publish(samples_topic("dev-a"), b"from-a")
    wait_until(lambda: len(a.messages) >= 1, 10)
    time.sleep(SETTLE_S)
    got_a = [m.payload for m in a.messages]
    checks += [
        _check(
            "broker: device B writes device A's topic", b"from-b" not in got_a, f"A got {got_a}"
        ),
        _check(
            "broker: device B reads device A's topic", not b.messages, f"B got {len(b.messages)}"
        ),
    ]
    a.close()
    b.close()
    return checks


def _superlink_checks(secrets: RunSecrets, tmp: Path) -> list[dict[str, Any]]:
    seen = supernode_admission(secrets, tmp)
    node_id, exit_code = seen["node-id"], seen["intruder-exit"]
    listed = [int(n["node-id"]) for n in seen["nodes"]]
    return [
        _check(
            "SuperLink: unregistered SuperNode",
            exit_code not in (None, 0) and listed == [node_id],
            f"exit code {exit_code}; nodes in the federation {listed}",
        ),
        _check(
            "SuperLink: registered SuperNode gets in (must NOT be refused)",
            node_id not in listed,
            f"registered node {node_id} listed: {node_id in listed}",
        ),
    ]


def _decoder_checks() -> list[dict[str, Any]]:
    shapes = {"w": (4, 3), "b": (3,)}
    good = {k: np.ones(s, np.float32) for k, s in shapes.items()}
    cap = raw_size_limit(shapes)
    cases = {
        "aggregator: update with wrong shapes": encode({"w": np.ones((3, 4), np.float32)}, "none"),
        "aggregator: update with a NaN": nan_frame(good),
        "aggregator: oversized update": encode({"w": np.ones((1000, 1000), np.float32)}, "none"),
    }
    checks = []
    for name, frame in cases.items():
        try:
            decode(frame, shapes, cap)
            checks.append(_check(name, False, "accepted"))
        except CodecError as err:
            checks.append(_check(name, True, err.reason))
    return checks


def security_checks() -> dict[str, Any]:
    """Run every check; ``refused`` counts those refused out of ``tried`` (the registered
    SuperNode's check passes when it is *not* refused)."""
    checks = _decoder_checks()
    if mosquitto_available():
        with tempfile.TemporaryDirectory(prefix="fedstream-security-") as name:
            tmp = Path(name)
            secrets = make_run_secrets(tmp / "secrets", ["dev-a", "dev-b"])
            with MosquittoBroker(BROKER_CONFIG_DIR / "mosquitto-prod.conf", secrets.root) as mq:
                checks = _broker_checks(secrets, mq) + checks
            checks = _superlink_checks(secrets, tmp) + checks
    passed = [c["refused"] != c["check"].endswith("(must NOT be refused)") for c in checks]
    for c, ok in zip(checks, passed, strict=True):
        c["passed"] = ok
    return {
        "tried": len(checks),
        "passed": sum(passed),
        "checks": checks,
        "skipped": None if mosquitto_available() else "mosquitto not installed: broker checks",
    }
