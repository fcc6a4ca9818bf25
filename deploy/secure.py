"""Secrets for a secured run: one CA for MQTT and Flower, broker passwords and ACL, node keys.

``fedstream demo --secure`` makes everything here for the run, under ``<run>/secrets``:

- ``certs/ca.crt``, ``certs/server.crt`` (SAN localhost and 127.0.0.1): Mosquitto's TLS
  listener and the SuperLink both present the server certificate;
- ``passwd``, ``acl``, ``credentials/<device>.txt``: Mosquitto's password file (one user per
  device plus ``aggregator``) and per-device ACL, from ``broker_config/make-dev-certs.sh``
  (the one place certificates and passwords are made);
- ``node-keys/<device>`` and ``<device>.pub``: each SuperNode's ECDSA P-384 key pair in
  OpenSSH format; the public key is registered with ``flwr supernode register`` so that a
  SuperLink started with ``--enable-supernode-auth`` admits that SuperNode and no other.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from deploy.brokers import BROKER_CONFIG_DIR

__all__ = ["RunSecrets", "make_node_key", "make_run_secrets"]

CERT_SCRIPT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RunSecrets:
    """Paths of a secured run's certificates, broker credentials and SuperNode keys."""

    root: Path

    @property
    def ca(self) -> Path:
        """The CA certificate every client verifies the servers with."""
        return self.root / "certs" / "ca.crt"

    @property
    def server_cert(self) -> Path:
        """The server certificate (Mosquitto's TLS listener and the SuperLink)."""
        return self.root / "certs" / "server.crt"

    @property
    def server_key(self) -> Path:
        """The server certificate's private key."""
        return self.root / "certs" / "server.key"

    def password(self, user: str) -> str:
        """The broker password of ``user`` (a device id, ``sensor.<id>`` or ``aggregator``)."""
        return (self.root / "credentials" / f"{user}.txt").read_text().strip()

    def client_cert(self, user: str) -> tuple[Path, Path]:
        """The client certificate of ``user`` and its key (its CN is the username)."""
        clients = self.root / "certs" / "clients"
        return clients / f"{user}.crt", clients / f"{user}.key"

    def node_key(self, device_id: str) -> Path:
        """The SuperNode private key of ``device_id`` (OpenSSH format)."""
        return self.root / "node-keys" / device_id

    def node_public_key(self, device_id: str) -> Path:
        """The public half, for ``flwr supernode register``."""
        return self.root / "node-keys" / f"{device_id}.pub"


def make_node_key(path: Path) -> Path:
    """Write a new ECDSA P-384 SuperNode key pair to ``path`` and ``path.pub``.

    Flower's SuperNode authentication wants an OpenSSH private key on a NIST curve (what
    ``ssh-keygen -t ecdsa -b 384`` makes); this writes the same without needing OpenSSH.

    Returns
    -------
    Path
        The public key file.
    """
    key = ec.generate_private_key(ec.SECP384R1())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    os.chmod(path, 0o600)
    public = path.with_name(path.name + ".pub")
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        + b"\n"
    )
    return public


def make_run_secrets(
    root: Path, device_ids: list[str], inject: list[str] | None = None
) -> RunSecrets:
    """Make a CA, the server certificate, broker credentials (passwords and client
    certificates) and ACL, and node keys.

    Parameters
    ----------
    root : Path
        Folder to write into (created; private).
    device_ids : list of str
        One broker user, one sensor user (``sensor.<id>``) and one SuperNode key per device.
    inject : list of str, optional
        The devices the ACL lets use the data-injection topic (None: every device, as the
        demo's devices may all opt in).

    Raises
    ------
    RuntimeError
        If ``openssl`` or ``mosquitto_passwd`` is missing or the certificate script fails.
    """
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    proc = subprocess.run(
        ["bash", str(BROKER_CONFIG_DIR / "make-dev-certs.sh"), str(root), *device_ids],
        env={**os.environ, "FEDSTREAM_INJECT": ",".join(device_ids if inject is None else inject)},
        capture_output=True,
        text=True,
        timeout=CERT_SCRIPT_TIMEOUT_S,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"make-dev-certs.sh failed: {(proc.stderr or proc.stdout).strip()}")
    secrets = RunSecrets(root)
    for dev in device_ids:
        make_node_key(secrets.node_key(dev))
    return secrets
