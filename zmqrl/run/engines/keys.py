"""CURVE keys of a Ray run, made so that no server secret leaves the host it serves on.

* Every node replica's wrapper makes the node's **server keypair on the host it runs on**
  (``<run dir>/ray/<label>/keys/server.key_secret``, mode 600) and publishes only the
  public key, with its addresses, in the run's registry.
* The driver makes **one client keypair per run** and hands it to the wrappers through
  Ray (an actor's arguments): every node and the supervisor let in that one client key,
  and only it. So a host that joins later, or a node placed again on another host,
  needs nothing copied by hand.
* Each node's key directory also holds ``servers.json``: the public key expected at each
  address it connects to (its links' targets and the supervisor), from the registry.
* The supervisor's own server keypair lives only in the driver's memory.

The directory is the layout :mod:`zmqrl.bus.security` reads (``network.curve.keys``), so a
node under Ray runs the same code as one started by hand. Whoever can reach Ray's own
ports can run code on every host anyway (Ray's trust model); CURVE keeps the data plane
(ZeroMQ over tcp) private and authenticated against everyone else on the network.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import zmq
from zmq.auth.certs import load_certificate

from zmqrl.bus import security
from zmqrl.bus.endpoints import private_dir


def write_certificate(path: Path, public: bytes, secret: bytes | None = None) -> None:
    """A certificate file as pyzmq writes them (``load_certificate`` reads it); a secret
    one is created mode 600, never readable by others even for a moment."""
    lines = ["#   ZeroMQ CURVE certificate (zmqrl)", "metadata", "curve",
             f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    tmp.replace(path)


def server_keypair(directory: Path) -> bytes:
    """This node's server keypair in ``directory`` (made here, kept across restarts on
    this host); returns its public key."""
    private_dir(directory)
    secret_file = directory / f"{security.SERVER}.key_secret"
    if secret_file.exists():
        try:
            public, secret = load_certificate(secret_file)
            if secret is not None and len(public) == 40:
                write_certificate(directory / f"{security.SERVER}.key", public)
                return public
        except (OSError, ValueError):
            pass  # unreadable: make a new one
    public, secret = zmq.curve_keypair()
    write_certificate(secret_file, public, secret)
    write_certificate(directory / f"{security.SERVER}.key", public)
    return public


def write_node_keys(directory: Path, client: tuple[bytes, bytes],
                    servers: dict[str, bytes]) -> None:
    """The run's client keypair and the expected server key of every address."""
    private_dir(directory)
    public, secret = client
    write_certificate(directory / f"{security.CLIENT}.key_secret", public, secret)
    write_certificate(directory / f"{security.CLIENT}.key", public)
    tmp = directory / f".{security.SERVER_KEYS}.tmp"
    tmp.write_text(json.dumps({a: k.decode() for a, k in servers.items()}, indent=1))
    tmp.replace(directory / security.SERVER_KEYS)


def supervisor_keys(client_public: bytes, where: Path) -> security.CurveKeys:
    """The supervisor socket's keys: a server keypair in memory only; the run's client
    key is the one client let in."""
    public, secret = zmq.curve_keypair()
    return security.CurveKeys(where, public, secret, client_public, b"",
                              frozenset({client_public}))
