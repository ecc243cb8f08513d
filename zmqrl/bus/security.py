"""CURVE encryption and ZAP authentication for a topology's tcp endpoints.

A topology turns it on with ``network: {curve: {keys: DIR}}``. ``DIR`` holds the layout
``zmqrl keys DIR`` writes (pyzmq's certificate files, :func:`write_keys`):

* ``server.key`` / ``server.key_secret``: the keypair of every bound tcp socket;
* ``client.key`` / ``client.key_secret``: the keypair every connecting tcp socket uses;
* any further ``NAME.key`` (public only): another client allowed to connect;
* optionally ``servers.json``: ``{"tcp://host:port": "<z85 public key>"}``, the server
  key of each address that is not ``server.key``'s. An engine that makes one server
  keypair per node on the host it runs on (``up --engine ray``) writes it, so no server
  secret leaves its host.

Every socket on a tcp endpoint is then encrypted and authenticated. A bound socket is a
CURVE server with the server secret key and asks its process's ZAP handler
(:class:`Authenticator`, a pyzmq ``ThreadAuthenticator``) about every client; the handler
lets in only the client public keys in ``DIR`` and counts the rest. A connecting socket
is a CURVE client with the client keypair and the server's public key, so it talks only
to a server holding the server secret. ipc endpoints stay plain: they are files in the
run directory, guarded by file permissions, so a run on one machine needs no keys.
:mod:`zmqrl.bus.sockets` applies this per socket; :mod:`zmqrl.bus.node` runs the handler.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import zmq
from zmq.auth.certs import create_certificates, load_certificate
from zmq.auth.thread import ThreadAuthenticator

SERVER = "server"
CLIENT = "client"
SERVER_KEYS = "servers.json"  # optional: per-address server public keys
# Every bound tcp socket asks the ZAP handler under this domain.
ZAP_DOMAIN = "zmqrl"
# A refused client may retry every reconnect interval; log each key at most this often.
_DENIED_LOG_EVERY_S = 60.0


def key_files(directory: Path) -> dict[str, Path]:
    """The four files of a key directory, by role."""
    return {
        "server public key": directory / f"{SERVER}.key",
        "server secret key": directory / f"{SERVER}.key_secret",
        "client public key": directory / f"{CLIENT}.key",
        "client secret key": directory / f"{CLIENT}.key_secret",
    }


def write_keys(directory: Path, force: bool = False) -> list[Path]:
    """Make a server and a client keypair in ``directory``; return the files written.

    Refuses (``FileExistsError``) to replace existing keys unless ``force``: new keys
    would lock every host still holding the old ones out of the run.
    """
    directory = Path(directory)
    files = key_files(directory)
    existing = [p.name for p in files.values() if p.exists()]
    if existing and not force:
        raise FileExistsError(f"{directory} already holds {', '.join(existing)}; "
                              "use --force to replace the keys")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    written: list[Path] = []
    # Created under umask 077, so a secret key is never readable by others, not even
    # for a moment; the public keys are then opened up.
    old_umask = os.umask(0o077)
    try:
        for name in (SERVER, CLIENT):
            public, secret = create_certificates(directory, name)
            written += [Path(public), Path(secret)]
    finally:
        os.umask(old_umask)
    for path in written:
        os.chmod(path, 0o600 if path.name.endswith("_secret") else 0o644)
    return written


def _load(path: Path, secret: bool) -> tuple[bytes, bytes | None]:
    """A certificate's (public, secret) z85 keys; ValueError saying what is wrong."""
    if not path.is_file():
        raise ValueError(f"{path} is missing")
    try:
        public, secret_key = load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a CURVE certificate: {exc}") from None
    for key in (public, secret_key):
        if key is not None and len(key) != 40:  # z85 of 32 bytes
            raise ValueError(f"{path} holds a malformed key (not 40 z85 characters)")
    if secret and secret_key is None:
        raise ValueError(f"{path} holds no secret key")
    return public, secret_key


def check_key_dir(directory: Path) -> list[str]:
    """Every problem with a key directory, one line each (``zmqrl validate``)."""
    directory = Path(directory)
    if not directory.exists():
        return [f"key directory {directory} does not exist (make one with: "
                f"zmqrl keys {directory})"]
    if not directory.is_dir():
        return [f"{directory} is not a directory"]
    problems = []
    keys: dict[str, tuple[bytes, bytes | None]] = {}
    for role, path in key_files(directory).items():
        try:
            keys[role] = _load(path, secret="secret" in role)
        except ValueError as exc:
            problems.append(f"{role}: {exc}")
    for name in (SERVER, CLIENT):
        public, secret = keys.get(f"{name} public key"), keys.get(f"{name} secret key")
        if public and secret and public[0] != secret[0]:
            problems.append(f"{name}.key and {name}.key_secret are not one keypair")
    for path in sorted(directory.glob("*.key")):  # further allowed clients
        if path.name not in (f"{SERVER}.key", f"{CLIENT}.key"):
            try:
                _load(path, secret=False)
            except ValueError as exc:
                problems.append(f"allowed client key: {exc}")
    try:
        _server_keys(directory)
    except ValueError as exc:
        problems.append(str(exc))
    return problems


def _server_keys(directory: Path) -> dict[str, bytes]:
    """``servers.json`` of a key directory (empty without one); ValueError if malformed."""
    path = directory / SERVER_KEYS
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(raw, dict) or not all(
            isinstance(a, str) and isinstance(k, str) and len(k) == 40 for a, k in raw.items()):
        raise ValueError(f"{path} must map addresses to z85 public keys (40 characters)")
    return {address: key.encode() for address, key in raw.items()}


@dataclass(frozen=True)
class CurveKeys:
    """The keys of one run, z85-encoded as pyzmq's socket options take them."""

    directory: Path
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes
    allowed_clients: frozenset[bytes]  # public keys the ZAP handler lets in
    # address -> its server's public key, where not server_public (servers.json)
    server_keys: dict[str, bytes] = field(default_factory=dict, hash=False, compare=False)

    def server_key_for(self, address: str) -> bytes:
        """The public key a client must expect from the server at ``address``."""
        return self.server_keys.get(address, self.server_public)


def load_keys(directory: Path) -> CurveKeys:
    """Read a key directory; ValueError listing every problem."""
    directory = Path(directory)
    problems = check_key_dir(directory)
    if problems:
        raise ValueError("; ".join(problems))
    # check_key_dir made sure each .key file matches the public key in its secret file.
    server_public, server_secret = _load(directory / f"{SERVER}.key_secret", secret=True)
    client_public, client_secret = _load(directory / f"{CLIENT}.key_secret", secret=True)
    # Every public certificate but the server's is a client allowed in.
    allowed = {_load(p, secret=False)[0] for p in directory.glob("*.key")
               if p.name != f"{SERVER}.key"}
    assert server_secret is not None and client_secret is not None  # secret=True checked
    return CurveKeys(directory, server_public, server_secret, client_public, client_secret,
                     frozenset(allowed), _server_keys(directory))


def configured_dir(network: dict[str, Any]) -> Path | None:
    """The key directory a topology's ``network`` section names, if CURVE is on."""
    curve = network.get("curve") if isinstance(network, dict) else None
    keys = curve.get("keys") if isinstance(curve, dict) else None
    return Path(keys) if isinstance(keys, str) and keys else None


class _Networked(Protocol):
    """What this module reads of a topology (zmqrl.run.topology imports this module)."""

    network: dict[str, Any]


def keys_for(topo: _Networked) -> CurveKeys | None:
    """The topology's CURVE keys, or None when its tcp endpoints are plain."""
    directory = configured_dir(topo.network)
    return load_keys(directory) if directory is not None else None


def is_tcp(address: str) -> bool:
    return address.startswith("tcp://")


def make_server(sock: zmq.Socket, keys: CurveKeys) -> None:
    """Make a socket that will bind a CURVE server; call before ``bind``."""
    sock.curve_secretkey = keys.server_secret
    sock.curve_publickey = keys.server_public
    sock.curve_server = True
    sock.zap_domain = ZAP_DOMAIN.encode()
    # Fail closed: without a ZAP handler in this process (not started, or crashed)
    # libzmq would let every CURVE client in; with this it refuses them all instead.
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)


def make_client(sock: zmq.Socket, keys: CurveKeys) -> None:
    """Make a socket that will connect as a CURVE client; call before ``connect``."""
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey = keys.client_public
    sock.curve_secretkey = keys.client_secret


class Authenticator:
    """This process's ZAP handler: lets in only ``keys.allowed_clients``.

    Runs in a thread (pyzmq's ``ThreadAuthenticator``) on the process's ZeroMQ context,
    so it answers handshakes while the node's loop is busy. ``denied`` counts refused
    handshakes (a client retries every reconnect interval, so one bad client counts
    many times); each refused key is logged at most once a minute.
    """

    def __init__(self, ctx: zmq.Context, keys: CurveKeys, log: logging.Logger):
        self.keys = keys
        self.log = log
        self.denied = 0  # written by the ZAP thread only, read by the node's loop
        self._last_logged: dict[bytes, float] = {}
        self._lock = threading.Lock()
        self._auth = ThreadAuthenticator(ctx, log=log.getChild("zap"))

    def start(self) -> None:
        self._auth.start()
        self._auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=self)

    def stop(self) -> None:
        self._auth.stop()

    def callback(self, _domain: str, key: bytes) -> bool:
        """Called by the ZAP thread for every CURVE handshake; ``key`` is z85."""
        if key in self.keys.allowed_clients:
            return True
        with self._lock:
            self.denied += 1
            now = time.monotonic()
            if len(self._last_logged) > 1000:  # a peer inventing keys must not grow it
                self._last_logged.clear()
            if now - self._last_logged.get(key, -_DENIED_LOG_EVERY_S) >= _DENIED_LOG_EVERY_S:
                self._last_logged[key] = now
                self.log.warning("refused a CURVE client with unknown public key %s "
                                 "(not in %s)", key.decode(errors="replace"),
                                 self.keys.directory)
        return False
