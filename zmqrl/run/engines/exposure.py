"""Who can reach a Ray run's ports: loopback when the cluster is this machine, CURVE when not.

``zmqrl up --engine ray`` binds every node port and the supervisor socket on tcp (the
nodes find each other through the run's registry). Where those sockets bind decides
who can send to them:

* **The cluster is this machine** (zmqrl started the Ray itself, or every alive Ray node
  has an address of this host): everything binds loopback (the Ray node's own address
  if that is already a loopback one, such as 127.0.0.2, else 127.0.0.1), so no other
  host reaches any of it. A Ray that zmqrl starts runs on loopback too
  (:func:`local_ray_env`).
* **Any address is not loopback** (a cluster of several hosts, or one elsewhere): CURVE
  is on unless the user says ``--no-curve``, which is then warned about loudly; a wrapper
  asked to bind a routable address in the clear without that refuses
  (:func:`check_bind`).

Plain functions of addresses, so they are tested without Ray.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"
# Ray (2.x) replaces a node address of 127.0.0.1 with the machine's routable one unless
# it is told this is no cluster: then its GCS, raylet and workers all listen on
# 127.0.0.1 (any other address makes them listen on every interface).
NO_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def is_loopback(ip: str) -> bool:
    try:
        address = ipaddress.ip_address(ip.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is loopback too
    return (mapped or address).is_loopback


def on_this_host(ip: str) -> bool:
    """Whether ``ip`` is an address of this machine (in this network namespace): only
    those can be bound."""
    if is_loopback(ip):
        return True
    try:
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as s:
            s.bind((ip.strip("[]"), 0))
        return True
    except OSError:
        return False


def bind_ip(ray_ip: str, loopback: bool) -> str:
    """Where a replica whose Ray node has address ``ray_ip`` binds: loopback when the
    cluster is this machine (keeping a loopback Ray address as it is), else ``ray_ip``."""
    return ray_ip if not loopback or is_loopback(ray_ip) else LOOPBACK


@dataclass(frozen=True)
class Exposure:
    """What a run decided about its addresses and encryption."""

    loopback: bool  # every port binds loopback: the cluster is this machine
    curve: bool  # generated per-run CURVE keys (a topology's own keys are separate)
    plain_tcp_ok: bool  # may bind a routable address in the clear (the user said so)
    warning: str | None = None  # to be shown loudly before anything starts


def decide(node_ips: Iterable[str], started_here: bool, curve: bool | None,
           configured: bool) -> Exposure:
    """Decide for a run over Ray nodes at ``node_ips``. ``started_here``: zmqrl started
    that Ray on this machine; ``curve``: ``--curve``/``--no-curve`` (None: neither);
    ``configured``: the topology names its own CURVE keys (``network.curve.keys``)."""
    ips = list(node_ips)
    loopback = started_here or all(map(on_this_host, ips))
    exposed = not loopback
    on = curve if curve is not None else (len(ips) > 1 or exposed)
    warning = None
    if exposed and not on and not configured:
        where = ", ".join(sorted(set(ips)))
        warning = (
            "WARNING: --no-curve on a cluster reachable from the network: every node port "
            f"and the supervisor socket bind plain tcp on {where}. Anyone who can reach "
            "these addresses can feed experience, take parameters or batches, and send "
            "the nodes anything they accept. Use it only on a network nobody else is on.")
    return Exposure(loopback, on and not configured, exposed and curve is False, warning)


def check_bind(label: str, ip: str, encrypted: bool, plain_tcp_ok: bool) -> None:
    """Refuse to bind ``ip`` in the clear when it is not loopback, unless told so."""
    if not encrypted and not plain_tcp_ok and not is_loopback(ip):
        raise RuntimeError(
            f"{label}: refusing to bind plain tcp on {ip}, which is not loopback: other "
            "hosts could send to it. Use CURVE (--curve, or network.curve.keys), or "
            "--no-curve to accept it")


@contextmanager
def local_ray_env() -> Iterator[dict[str, str]]:
    """The environment and arguments that start a Ray of our own on loopback only: yields
    the extra ``ray.init`` arguments. Ray must be imported (or re-read its constant)
    inside the block."""
    before = os.environ.get(NO_CLUSTER_ENV)
    os.environ[NO_CLUSTER_ENV] = "0"
    try:
        yield {"_node_ip_address": LOOPBACK}
    finally:
        if before is None:
            os.environ.pop(NO_CLUSTER_ENV, None)
        else:
            os.environ[NO_CLUSTER_ENV] = before
