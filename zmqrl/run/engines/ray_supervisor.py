"""``zmqrl up --engine ray``: the supervisor, with every node replica placed by Ray.

The driver is ``zmqrl up``'s :class:`~zmqrl.run.launch.Supervisor` (the same reports, run
metrics, progress line, stop conditions and restart policy); only where a node process
runs changes:

1. **Placement.** One placement group per run, one bundle per node replica (its
   ``resources``; :mod:`zmqrl.run.engines.placement`), with the strategy asked for (pack,
   spread, or their strict forms). If the cluster cannot hold it within the deadline,
   the run stops with what it needed and what the cluster has.
2. **Addresses after placement.** Each replica gets a wrapper actor in its bundle
   (:mod:`zmqrl.run.engines.ray_host`), which picks tcp ports on its Ray node's address and
   registers them in the run's registry actor (:mod:`zmqrl.run.engines.ray_registry`); a
   wrapper looks up the nodes it links to before starting its node. The supervisor
   socket binds tcp on the driver's Ray address. Parameters and experience travel on
   ZeroMQ only, never through Ray's object store. When the cluster is this machine (a
   Ray we started, which runs on loopback, or every Ray node an address of this host),
   every port binds loopback instead (:mod:`zmqrl.run.engines.exposure`).
3. **CURVE** is on when the cluster has more than one node or any address is not
   loopback (``--curve``/``--no-curve`` decide otherwise; ``--no-curve`` on routable
   addresses is warned about loudly): per-replica server keys made on their hosts, one
   client key per run (:mod:`zmqrl.run.engines.keys`). A topology that names
   ``network.curve.keys`` uses that directory instead, which must then exist on every
   host. Each node process gets a secret of its own for its hello
   (:mod:`zmqrl.run.runmetrics`), passed to its wrapper with its start.
4. **Restarts.** A node that exits, or whose wrapper actor dies (kill, lost Ray node),
   is started again by its ``restart`` policy, as under ``up``; a lost wrapper is made
   anew in the same bundle (Ray places the bundle again if its node is gone). Ray itself
   restarts no actor, so no call ever goes into a restarting actor (ray#44719).
5. **Logs and progress** come back to the driver: each wrapper returns its node's
   output when polled; the nodes report to the supervisor socket as under ``up``.
6. **Stop.** Ctrl-C (or a stop condition) stops every node on every host (SIGTERM, then
   SIGKILL to its process group), kills the wrappers and the registry and removes the
   placement group. If the driver dies, Ray ends its actors, and their nodes die with
   them (the kernel's die-with-parent signal).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
from rich.console import Console

from zmqrl.bus import security, sockets
from zmqrl.bus.labels import label as make_label
from zmqrl.run.engines import exposure, keys, placement
from zmqrl.run.engines.ray_host import NodeHost, Role, RunSpec
from zmqrl.run.engines.ray_registry import Registry
from zmqrl.run.launch import STOP_GRACE_S, Supervisor, _Proc
from zmqrl.run.runmetrics import StopConditions, new_secret
from zmqrl.run.topology import Topology, ports_of

POLL_S = 0.2  # how often each wrapper is asked for its node's output and exit
START_TIMEOUT_S = 120.0  # a wrapper's making, prepare and start, each
HOST_LOST = -int(signal.SIGKILL)  # the exit code reported when a wrapper actor died
LOCAL_OBJECT_STORE_BYTES = 128 * 2**20  # a local Ray's; nothing of ours goes through it


@dataclass
class RayOptions:
    address: str | None = None  # None: RAY_ADDRESS, else a Ray started on this machine
    strategy: str = "pack"  # a key of placement.STRATEGIES
    curve: bool | None = None  # None: on for several Ray nodes or any routable address
    placement_timeout_s: float = 120.0
    lookup_timeout_s: float = 60.0


@dataclass
class _Remote:
    """One replica's wrapper actor and what the driver knows of it."""

    slot: placement.Slot
    bundle_index: int
    role: Role
    host: Any = None  # the actor handle; None until made, and after it died
    poll_ref: Any = None
    polled_at: float = 0.0
    running: bool = False  # its node process runs (started, no exit seen)
    ip: str = ""
    addresses: dict[str, str] = field(default_factory=dict)  # port -> where it binds
    secret: str = ""  # handed to its node process at its latest start


class RaySupervisor(Supervisor):
    def __init__(self, topo: Topology, run_dir: Path, stop: StopConditions,
                 options: RayOptions, console: Console | None = None, resume: bool = False):
        # Every host uses the same absolute run directory path.
        super().__init__(topo, Path(run_dir).resolve(), stop, console, resume)
        self.options = options
        self.run_id = f"{topo.name}-{uuid.uuid4().hex[:8]}"
        self.remote: dict[str, _Remote] = {}
        self.pg: Any = None
        self.registry: Any = None
        self.auth: security.Authenticator | None = None
        self.run_spec: RunSpec | None = None
        self.relinking: set[str] = set()  # stopped to start again at new addresses
        self.width = 0
        self.started_ray = False  # we started the Ray (on loopback, on this machine)
        self.exposure: exposure.Exposure | None = None
        self.local_nodes: tuple[str, ...] = ()  # Ray node ids alive at the start

    def run(self) -> int:
        address = self.options.address or os.environ.get("RAY_ADDRESS")
        if address:
            import ray

            ray.init(address=address, namespace="zmqrl", log_to_driver=False,
                     logging_level=logging.WARNING)
        else:
            # A Ray of our own on this machine, on loopback (no other host reaches its
            # services), sized so the run fits as it would under `up` (Ray's CPUs and
            # custom resources are accounting, not cores).
            need = placement.totals([s.bundle for s in placement.slots(self.topo)])
            self.started_ray = True
            with exposure.local_ray_env() as on_loopback:
                import ray  # in here: Ray reads the setting when it is first imported

                ray.init(address="local", namespace="zmqrl", log_to_driver=False,
                         logging_level=logging.WARNING,
                         num_cpus=max(os.cpu_count() or 1, math.ceil(need.get("CPU", 0))),
                         resources={k: v for k, v in need.items() if k not in ("CPU", "GPU")
                                    and not k.startswith("node:")},
                         object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                         include_dashboard=False, **on_loopback)
            ip = ray.util.get_node_ip_address()
            if not exposure.is_loopback(ip):  # Ray was imported before we could say so
                self.console.print(f"zmqrl up: WARNING: the local Ray's services listen on "
                                   f"{ip}, not loopback (our nodes bind loopback)",
                                   markup=False)
        try:
            return super().run()
        finally:
            ray.shutdown()

    # ----- the supervisor socket: tcp on the driver's Ray address ----------------------
    def _open_socket(self) -> None:
        import ray

        alive = [n for n in ray.nodes() if n.get("Alive")]
        configured = security.keys_for(self.topo)
        self.exposure = exposure.decide([n["NodeManagerAddress"] for n in alive],
                                        self.started_ray, self.options.curve,
                                        configured is not None)
        self.local_nodes = tuple(n["NodeID"] for n in alive)
        if self.exposure.warning:
            self.console.print(self.exposure.warning, style="bold red", markup=False)
            logging.getLogger("supervisor").warning(self.exposure.warning)
        ip = exposure.bind_ip(ray.util.get_node_ip_address(), self.exposure.loopback)
        self.client: tuple[bytes, bytes] | None = None
        sup_keys: security.CurveKeys | None = None
        if configured is not None:
            sup_keys = configured  # the topology's own key directory, on every host
        elif self.exposure.curve:
            self.client = zmq.curve_keypair()
            sup_keys = keys.supervisor_keys(self.client[0], self.run_dir / "ray")
        exposure.check_bind("the supervisor", ip, sup_keys is not None,
                            self.exposure.plain_tcp_ok)
        ctx = zmq.Context.instance()
        if sup_keys is not None:
            self.auth = security.Authenticator(ctx, sup_keys, logging.getLogger("supervisor"))
            self.auth.start()
        host = f"[{ip}]" if ":" in ip else ip
        self.sock = sockets.bind(ctx, "router", f"tcp://{host}:*",
                                 sockets.SocketOptions(hwm=10_000, curve=sup_keys))
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.sup_public = sup_keys.server_public if sup_keys is not None and \
            configured is None else None
        mode = ("CURVE (keys: " + str(configured.directory) + ")" if configured else
                "CURVE (per-node server keys made on their hosts)" if self.client else
                "plain tcp on loopback only (--curve to encrypt)" if self.exposure.loopback
                else "plain tcp (--no-curve)")
        self.console.print(f"zmqrl up: Ray cluster of {len(alive)} node(s); supervisor at "
                           f"{self.address}; {mode}", markup=False)

    def _close_socket(self) -> None:
        self.sock.close(linger=0)
        if self.auth is not None:
            self.auth.stop()

    # ----- placement and the first start --------------------------------------------------
    def _start_all(self) -> None:
        import ray
        from ray.util.placement_group import placement_group

        slots = placement.slots(self.topo)
        strategy = placement.STRATEGIES[self.options.strategy]
        self.pg = placement_group([s.bundle for s in slots], strategy=strategy,
                                  name=f"zmqrl-{self.run_id}")
        if not self._wait([self.pg.ready()], self.options.placement_timeout_s):
            if not self.stopping:
                need = placement.totals([s.bundle for s in slots])
                self.console.print(
                    f"zmqrl up: the Ray cluster cannot place the run ({self.options.strategy}"
                    f") within {self.options.placement_timeout_s:.0f}s: it needs "
                    f"{_resources(need)} in {len(slots)} bundles "
                    f"({'; '.join(f'{s.label}: {_resources(s.bundle)}' for s in slots)}); "
                    f"the cluster has {_resources(ray.cluster_resources())}, free "
                    f"{_resources(ray.available_resources())}", markup=False)
                self._finish("placement failed", 1)
            return
        self.registry = ray.remote(Registry).options(
            name=f"zmqrl-registry-{self.run_id}", num_cpus=0, max_restarts=0).remote()
        self.run_spec = RunSpec(
            topology_yaml=self.topo_file.read_text(), run_dir=str(self.run_dir),
            cwd=os.getcwd(), supervisor=self.address, supervisor_key=self.sup_public,
            client=self.client, lookup_timeout_s=self.options.lookup_timeout_s,
            loopback=self.exposure.loopback, local_nodes=self.local_nodes,
            encrypted=self.client is not None or security.keys_for(self.topo) is not None,
            plain_tcp_ok=self.exposure.plain_tcp_ok)
        self.width = max(len(p.label) for p in self.procs)
        for index, (proc, slot) in enumerate(zip(self.procs, slots, strict=True)):
            self.remote[proc.label] = _Remote(slot, index, self._role(slot))
            proc.log_file = open(self.run_dir / "logs" / f"{proc.label}.log", "a")  # noqa: SIM115
        # All wrappers register before any node starts, so lookups never wait on a
        # start order (links may even form cycles).
        prepared = {p.label: self._make_host(p) for p in self.procs}
        if not self._placed(prepared):
            return
        starts = {p.label: self._start(p) for p in self.procs}
        self._wait(list(starts.values()), START_TIMEOUT_S + self.options.lookup_timeout_s)
        for proc in self.procs:
            self._started(proc, starts[proc.label])

    def _start(self, proc: _Proc) -> Any:
        """Ask ``proc``'s wrapper to start its node, with a new secret; the ``start`` ref."""
        remote = self.remote[proc.label]
        remote.secret = new_secret()
        return remote.host.start.remote(remote.secret)

    def _role(self, slot: placement.Slot) -> Role:
        spec = self.topo.nodes[slot.node]
        links = {}
        for target in spec.all_targets():  # a many-link: each of its targets
            node = target.partition(".")[0]
            replicas = self.topo.nodes[node].replicas
            links[target] = [make_label(node, r, replicas) for r in range(replicas)]
        return Role(slot.label, slot.node, slot.replica, tuple(sorted(ports_of(spec))), links,
                    tuple(make_label(slot.node, r, spec.replicas)
                          for r in range(spec.replicas)),
                    tuple(spec.command) if spec.command is not None else None)

    def _make_host(self, proc: _Proc) -> Any:
        """Make the wrapper actor of ``proc`` in its bundle; its ``prepare`` ref."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote = self.remote[proc.label]
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.pg, placement_group_bundle_index=remote.bundle_index)
        actor = ray.remote(NodeHost).options(
            max_restarts=0, max_task_retries=0, scheduling_strategy=strategy,
            **remote.slot.actor_options())
        remote.host = actor.remote(self.run_spec, remote.role, self.registry)
        return remote.host.prepare.remote()

    def _placed(self, prepared: dict[str, Any]) -> bool:
        """Wait for the wrappers' ``prepare``; print where each replica is."""
        import ray

        self._wait(list(prepared.values()), START_TIMEOUT_S)
        ok = True
        for label, ref in prepared.items():
            try:
                where = ray.get(ref, timeout=0)
            except Exception as exc:  # noqa: BLE001  (Ray wraps the wrapper's error)
                ok = False
                if not self.stopping:
                    self.console.print(f"zmqrl up: {label} could not be placed: "
                                       f"{_short(exc)}", markup=False)
                continue
            remote = self.remote[label]
            moved = bool(remote.addresses) and remote.addresses != where["addresses"]
            remote.ip, remote.addresses = where["ip"], where["addresses"]
            if moved:
                self._relink(label)
            ports = ", ".join(f"{p} {a}" for p, a in sorted(where["addresses"].items()))
            self.console.print(f"zmqrl up: placed {label} on {where['ip']} "
                               f"({where['hostname']}){': ' + ports if ports else ''}",
                               markup=False)
        if not ok and not self.stopping:
            self._finish("placement failed", 1)
        return ok

    def _relink(self, label: str) -> None:
        """``label`` was placed again at other addresses (its Ray node is gone): stop the
        nodes linked to it, whose sockets still point at the old ones; each is started
        again by its restart policy and looks the new addresses up."""
        for other, remote in self.remote.items():
            if remote.running and any(label in labels for labels in remote.role.links.values()):
                self.console.print(f"supervisor: {label} moved; restarting {other}, which "
                                   "links to it", markup=False)
                self.relinking.add(other)
                remote.host.stop.remote(STOP_GRACE_S)  # its exit comes with the next poll

    def _started(self, proc: _Proc, ref: Any) -> bool:
        """Take a ``start`` result: the node runs (its pid is the one whose hello the
        supervisor believes), or the start failed (an exit, for the restart policy)."""
        import ray

        remote = self.remote[proc.label]
        now = time.monotonic()
        try:
            pid = ray.get(ref, timeout=0)
        except Exception as exc:  # noqa: BLE001
            if self.stopping:
                return False
            self.console.print(f"supervisor: {proc.label} did not start: {_short(exc)}",
                               markup=False)
            if isinstance(exc, ray.exceptions.RayActorError):
                remote.host = None
            proc.started_at = now
            self._on_exit(proc, HOST_LOST if remote.host is None else 1, now)
            return False
        self.metrics.started(proc.label, proc.node, pid, remote.secret)
        remote.running = True
        remote.polled_at = 0.0
        proc.last_heartbeat = proc.started_at = now
        proc.reported_silent = False
        return True

    def _wait(self, refs: list[Any], timeout_s: float) -> bool:
        """Wait for every ref (or a stop: Ctrl-C stays prompt while Ray places)."""
        import ray

        deadline = time.monotonic() + timeout_s
        pending = list(refs)
        while pending and not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=min(left, 0.25))
        return not pending

    # ----- a restart --------------------------------------------------------------------
    def _spawn(self, proc: _Proc) -> None:
        remote = self.remote[proc.label]
        if remote.host is None:  # its wrapper died: a new one, placed in the same bundle
            if not self._placed({proc.label: self._make_host(proc)}):
                return
        ref = self._start(proc)
        self._wait([ref], START_TIMEOUT_S + self.options.lookup_timeout_s)
        self._started(proc, ref)

    # ----- watching -----------------------------------------------------------------------
    def _check_children(self) -> None:
        import ray

        now = time.monotonic()
        pending = {r.poll_ref: self._proc(label) for label, r in self.remote.items()
                   if r.poll_ref is not None}
        if pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
            for ref in ready:
                self._polled(pending[ref], ref, now)
        for proc in self.procs:
            remote = self.remote.get(proc.label)
            if proc.failed or remote is None or self.stopping:
                continue
            if not remote.running:
                if proc.restart_at is not None and now >= proc.restart_at:
                    proc.restart_at = None
                    self._spawn(proc)
                continue
            if remote.poll_ref is None and now - remote.polled_at >= POLL_S:
                remote.poll_ref = remote.host.poll.remote()
                remote.polled_at = now
            silent_after = self.topo.network.get("peer_timeout_s", 10.0)
            if now - proc.last_heartbeat > silent_after and not proc.reported_silent:
                proc.reported_silent = True
                self.console.print(f"supervisor: {proc.label} silent for "
                                   f"{now - proc.last_heartbeat:.0f}s", markup=False)

    def _proc(self, label: str) -> _Proc:
        return next(p for p in self.procs if p.label == label)

    def _polled(self, proc: _Proc, ref: Any, now: float) -> None:
        import ray

        remote = self.remote[proc.label]
        remote.poll_ref = None
        try:
            result = ray.get(ref, timeout=0)
        except ray.exceptions.ActorUnavailableError:
            return  # a transient failure to reach it: ask again next time
        except ray.exceptions.RayActorError as exc:
            remote.host = None
            if remote.running:
                remote.running = False
                self.console.print(f"supervisor: {proc.label}'s Ray actor on {remote.ip} is "
                                   f"gone ({_short(exc)}); its node went with it",
                                   markup=False)
                self._on_exit(proc, HOST_LOST, now)
            return
        self._lines(proc, result)
        if result["exit"] is not None and remote.running:
            remote.running = False
            if proc.label in self.relinking:  # stopped by _relink: not a failure
                self.relinking.discard(proc.label)
                proc.restart_at = now
            else:
                self._on_exit(proc, result["exit"], now)

    def _lines(self, proc: _Proc, result: dict[str, Any]) -> None:
        if result.get("dropped"):
            self._print_line(proc, f"[{result['dropped']} lines dropped: the driver fell "
                                   "behind]", self.width)
        for line in result["lines"]:
            self._print_line(proc, line, self.width)

    # ----- stopping ---------------------------------------------------------------------
    def _shutdown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        stops = {r.host.stop.remote(STOP_GRACE_S): label for label, r in self.remote.items()
                 if r.host is not None}
        if stops:
            ray.wait(list(stops), num_returns=len(stops), timeout=STOP_GRACE_S + 10)
        for ref, label in stops.items():
            try:
                self._lines(self._proc(label), ray.get(ref, timeout=0))
            except Exception as exc:  # noqa: BLE001  (gone, or past the grace period)
                self.console.print(f"supervisor: {label} did not stop cleanly: "
                                   f"{_short(exc)}; killing its Ray actor", markup=False)
        # Killing a wrapper also ends whatever of its node is left (die-with-parent).
        for actor in [r.host for r in self.remote.values() if r.host is not None] + \
                [self.registry]:
            if actor is not None:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # noqa: BLE001, S110  (already gone)
                    pass
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001, S110
                pass
        for proc in self.procs:
            if proc.log_file:
                proc.log_file.close()
        self._close_socket()


def _resources(res: dict[str, float]) -> str:
    shown = {k: v for k, v in res.items() if not k.startswith("node:") and
             k not in ("memory", "object_store_memory")}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(shown.items())) + "}"


def _short(exc: BaseException, limit: int = 200) -> str:
    """The gist of a (possibly Ray-wrapped) error: its last line's first sentence (Ray's
    actor-death messages go on with paragraphs of possible causes)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    first = lines[-1].split(". ")[0].rstrip(".")
    return first if len(first) <= limit else first[:limit - 1] + "…"
