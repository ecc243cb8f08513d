"""Learner: trains the model on experience and hands the parameters on.

A learner is a data source x an updater x the algorithm (``zmqrl.parts.learning``), each a
part named by the topology (``topo.parts_config``, :mod:`zmqrl.plugins`), not chosen by
branches here:

* the source, the algorithm's ``source`` unless ``parts.source`` names another: unroll
  algorithms (vtrace, a2c, ppo) take unrolls on the ``experience`` port (``unrolls``:
  ``UnrollInbox``, from an inference broker, or from local-policy actors as in IMPALA);
  replay algorithms (dqn, r2d2, alphazero) ask the ``replay`` link for batches of their
  item kind and send priorities back (``replay``: ``ReplayClient``);
* the updater, ``parts.updater`` or else by the links and replicas: a ``param_server``
  link (Gorila) pushes gradients there and trains on from the parameters that come back
  (``GradientPush``); ``replicas > 1`` without one are data-parallel replicas that
  average gradients over gloo (``AllReduce``: each trains on ``batch_size / replicas``
  columns, all hold identical parameters; they pool the unrolls they receive, since
  producers' round-robin need not split them evenly: ``SharedUnrollInbox``); else
  the optimizer steps here (``LocalStep``).

This node is the shell around them: its sockets, publishing, checkpoints, metrics.

The updated parameters go out on the ``params`` port (PUB) every ``publish_every``
updates, and to every new subscriber as soon as it subscribes (the port is bound as an
XPUB, so a broker or actor that joins late need not wait for the next update).

Checkpoint and resume: ``checkpoints/<label>.pt`` in the run directory holds the model,
the algorithm's state (optimizer, target network, its counters: ``algo.state_dict()``),
the update and env-step counters, the episode statistics and the RNG states. It is
written every ``checkpoint_every`` updates and at exit, crash-safely
(``zmqrl.parts.checkpoint.Checkpointer``). A learner that finds its checkpoint when it starts
(a restart after a crash, or ``zmqrl up --resume``) restores it and publishes the
restored parameters with the restored update count as their version.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from zmqrl import plugins
from zmqrl.bus import roles, wire
from zmqrl.bus.metrics import RETURN_WINDOW
from zmqrl.bus.node import Link, Node
from zmqrl.parts.algo_config import Parts, config_type
from zmqrl.parts.checkpoint import TORCH, Checkpointer, node_checkpoint
from zmqrl.parts.envs import env_spec
from zmqrl.parts.learning.pbt_member import RANKED_EPISODES
from zmqrl.run.topology import NodeSpec, Topology, load_class

# torch and the parts made of it are imported where they are used, not here: every node
# of a topology imports this class (for its ports), and a node that runs no model must
# not load torch.
if TYPE_CHECKING:
    import torch

    from zmqrl.parts.learning.sources import Source
    from zmqrl.parts.learning.updaters import Updater

# Data-parallel replicas report a digest of their parameters every this many updates
# (metrics ``digest_updates``, ``params_digest``): equal digests at equal update counts
# show that the replicas hold bitwise identical parameters.
_DIGEST_EVERY = 2
_UPDATES_PER_TURN = 8  # then the loop reads its sockets again
_CHECKPOINT_FORMAT = 1


def params_digest(model: torch.nn.Module) -> str:
    """A short hash of every parameter and buffer, bit for bit."""
    sha = hashlib.sha1()
    for name, tensor in sorted(model.state_dict().items()):
        sha.update(name.encode())
        sha.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return sha.hexdigest()[:16]


def _unroll_producers(name: str, topo: Topology) -> list[tuple[str, int | None]]:
    """(node, widest unroll it can send, None if it cannot tell) for each node linked
    to ``name.experience`` (``Node.largest_insert``: its envs per message; a
    ``command:`` node cannot tell)."""
    out: list[tuple[str, int | None]] = []
    for other in topo.nodes.values():
        if not other.links_to("experience", f"{name}.experience"):
            continue
        try:
            widest = load_class(other.target).largest_insert(other, topo) \
                if other.target is not None else None
        except (ImportError, AttributeError, TypeError, ValueError):
            widest = None  # its own checks report it
        out.append((other.name, int(widest) if widest else None))
    return out


def unroll_width_cap(spec: NodeSpec, topo: Topology, configured: int) -> int:
    """The widest unroll the learner ``spec`` takes: its ``max_unroll_envs``, narrowed to
    its widest producer when every producer can tell (an unroll wider than any of them
    is no producer's: refused, however plausible its values)."""
    widths = [envs for _, envs in _unroll_producers(spec.name, topo)]
    if widths and all(w is not None for w in widths):
        return min(configured, max(w for w in widths if w is not None))
    return configured


class Learner(Node):
    binds = {"experience": "router", "params": "pub"}
    accepts = {"experience": (wire.UNROLL,)}
    role = roles.LEARNS
    port_hwm = {"params": 4}  # a subscriber that falls behind gets fresh params, not old
    xpub_ports = frozenset({"params"})  # each new subscriber gets the current params at once
    links = {"replay": Link("dealer", required=False),
             "param_server": Link("dealer", required=False),
             "pbt": Link("dealer", required=False)}  # PBT controller (nodes/pbt.py)
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        device: str = "auto"
        # torch's intra-op threads for the update. One process, one core is the rule; a
        # learner that is the run's bottleneck while the other nodes leave part of a core
        # idle may take more (BENCHMARKS.md, "Pong on two cores", measures it).
        threads: int = 1
        publish_every: int = 1  # updates between parameter broadcasts
        # updates between checkpoints (0: only at exit); a crash loses at most this many
        checkpoint_every: int = 200
        prefetch: int = 2  # replay sample requests kept in flight
        # Gorila: gradients in flight to the parameter server. 1 waits for fresh
        # parameters after each push; k computes on parameters up to k - 1 of our own
        # pushes (and whatever the other learners pushed meanwhile) stale.
        max_pending_grads: int = 1
        # The training forward pass's arithmetic (algorithms whose config says
        # reduced_precision):
        # float32, bfloat16, float16 on CUDA, or auto (bfloat16 where native).
        # AlphaZero's conv net trains ~1.5x as fast in bfloat16 on a CPU with AVX-512
        # BF16 (BENCHMARKS.md).
        precision: str = "float32"
        # The widest unroll (env columns) the experience port takes; wider ones get an
        # error (validate checks the producers linked to it stay within it).
        max_unroll_envs: int = 1024
        # PBT (set by zmqrl/run/population.py): this member's index and hyperparameters
        member: int = -1
        hyperparameters: dict | None = None
        # ... and how many of its latest episodes its reported mean return is over
        ranked_episodes: int = RANKED_EPISODES

    def port_frame_cap(self, port: str) -> int | None:
        # A learner fed by a replay refuses every unroll: its experience port takes pings
        # only, and a peer's megabytes need never reach its memory (the soak: 300 MiB
        # of hostile unrolls queued at an Ape-X learner while it trained).
        if port == "experience" and not self.ctx.topo.parts_config.unrolls:
            return wire.CONTROL_FRAME_BYTES
        return None

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        kind = topo.algo.get("kind", "vtrace")
        try:
            cfg = config_type(kind)
        except ValueError:
            return []  # an unknown algorithm: reported with the algo section
        parts = Parts.of(cfg, topo.parts)
        where = ("nodes", spec.name, "links")
        if not parts.unrolls and "replay" not in spec.links:
            return [(where, f"algo '{kind}' learns from a replay ({parts.items}): add a "
                            "'replay' link")]
        if parts.unrolls and "replay" in spec.links:
            return [(where, f"algo '{kind}' learns from unrolls on the 'experience' port; "
                            "remove the 'replay' link")]
        if parts.unrolls and "param_server" in spec.links:
            return [(where, f"a 'param_server' link needs a replay algorithm, not '{kind}'")]
        data_parallel = spec.replicas > 1 and "param_server" not in spec.links
        if data_parallel and not cfg.data_parallel:
            able = [name for name in plugins.names("algo")
                    if getattr(plugins.resolve("algo", name), "data_parallel", False)]
            return [(("nodes", spec.name, "replicas"),
                     f"data-parallel learner replicas need algo {' or '.join(able)}, not "
                     f"'{kind}' (an algorithm's config says data_parallel)")]
        batch = topo.algo.get("batch_size")
        if data_parallel and isinstance(batch, int) and batch % spec.replicas:
            return [(("algo", "batch_size"), f"{batch} does not split evenly over "
                                             f"{spec.replicas} learner replicas")]
        for name in ("max_pending_grads", "threads"):
            if spec.args.get(name, 1) < 1:
                return [(("nodes", spec.name, "args", name), "must be >= 1")]
        ranked = spec.args.get("ranked_episodes", cls.Args.ranked_episodes)
        if not 2 <= ranked <= RETURN_WINDOW:  # a spread needs two; a source keeps 100
            return [(("nodes", spec.name, "args", "ranked_episodes"),
                     f"{ranked}: must be 2 to {RETURN_WINDOW}")]
        widest = spec.args.get("max_unroll_envs", cls.Args.max_unroll_envs)
        if parts.unrolls and isinstance(widest, int):
            for producer, envs in _unroll_producers(spec.name, topo):
                if widest < 1 or (envs is not None and envs > widest):
                    return [(("nodes", spec.name, "args", "max_unroll_envs"),
                             f"{widest}: '{producer}' sends unrolls of up to {envs} envs")]
        precision = spec.args.get("precision", "float32")
        if precision != "float32" and not cfg.reduced_precision:
            return [(("nodes", spec.name, "args", "precision"),
                     f"algo '{kind}' trains in float32 only (its config's "
                     "reduced_precision is False)")]
        from zmqrl.parts.precision import check_precision

        problem = check_precision(precision, spec.args.get("device", "auto"))
        return [(("nodes", spec.name, "args", "precision"), problem)] if problem else []

    def setup(self) -> None:
        import torch

        from zmqrl.parts.algos import make_algo
        from zmqrl.parts.devices import pick_device, resolve_precision
        from zmqrl.parts.learning import checks
        from zmqrl.parts.models import build_model

        torch.set_num_threads(self.args.threads)
        topo = self.ctx.topo
        self.cfg = topo.algo_config
        self.kind, self.parts = self.cfg.kind, topo.parts_config
        self.device = pick_device(self.args.device, self.ctx.replica)
        self.env = env_spec(topo.env)
        self.model = build_model(topo.model, self.env, topo.seed, algo=self.cfg).to(self.device)
        recurrent = getattr(self.model, "recurrent", False)
        self.check = checks.context(  # what every message we take in must match
            self.env, self.model, unroll=getattr(self.cfg, "unroll", None),
            sequence_length=getattr(self.cfg, "sequence_length", None),
            state_size=self.model.state_size if recurrent else 0, algo=self.cfg)
        self.updater = self._make_updater()
        precision = resolve_precision(self.args.precision, self.device)
        self.algo = make_algo(self.cfg, self.model, **self.updater.algo_options,
                              **({"precision": precision} if precision != "float32" else {}))
        self.updater.bind(self.algo, self._after_update)
        # what the source's inbox takes (unrolls): see unroll_width_cap
        self.unroll_width_cap = unroll_width_cap(self.ctx.spec, topo, self.args.max_unroll_envs)
        self.source = self._make_source()
        self.pbt = None
        if "pbt" in self.ctx.spec.links:
            from zmqrl.parts.learning.pbt_member import PBTMember

            self.pbt = PBTMember(self, self.args.member, self.args.hyperparameters or {},
                                 ranked_episodes=self.args.ranked_episodes)
        self.updates = 0
        self.updates_skipped = 0  # updates with a step not taken: non-finite gradient norm
        self.unweighted_batches = 0  # prioritized batches whose weights the learner ignored
        self._more_waiting = False  # the last turn stopped at _UPDATES_PER_TURN
        self.last_terms: dict[str, float] = {}
        self.digest: tuple[int, str] | None = None
        self.checkpointer = Checkpointer(
            node_checkpoint(self.ctx.run_dir, self.ctx.label, TORCH.suffix), self,
            every=self.args.checkpoint_every, format=TORCH, log=self.log)
        if self.checkpointer.restore_if_present():
            self.log.info("resumed from %s at update %d", self.checkpointer.path, self.updates)
        self._publish()  # the restored parameters, if any, with their version
        self.log.info("%s on %s, batch %d, forward passes in %s", self.kind, self.device,
                      self.cfg.batch_size, precision)

    def _make_updater(self) -> Updater:
        """``parts.updater`` if the topology names one, else by the links and replicas:
        a ``param_server`` link (Gorila: replicas are independent learners) pushes
        gradients there, replicas without one average gradients, else a local step."""
        spec = self.ctx.spec
        name = self.parts.updater or ("gradient_push" if "param_server" in spec.links
                                      else "allreduce" if spec.replicas > 1 else "local")
        return plugins.resolve("updater", name).for_learner(self)

    @property
    def world(self) -> int:
        """Replicas that split each batch (data-parallel), else 1."""
        return self.ctx.spec.replicas if getattr(self.updater, "data_parallel", False) else 1

    def _make_source(self) -> Source:
        return plugins.resolve("source", self.parts.source).for_learner(self)

    # ----- messages -------------------------------------------------------------------
    def on_experience(self, envelope: list, msg: wire.Message) -> None:
        if not self.parts.unrolls:
            raise wire.ProtocolError(f"this learner ({self.kind}) takes no unrolls")
        self.source.on_message(envelope, msg)

    def on_replay(self, envelope: list, msg: wire.Message) -> None:
        self.source.on_message(envelope, msg)

    def on_pbt(self, _envelope: list, msg: wire.Message) -> None:
        self.pbt.on_message(msg)

    def on_param_server(self, _envelope: list, msg: wire.Message) -> None:
        self.updater.on_reply(msg)

    def on_peer_silent(self, name: str) -> None:
        # Nothing from it, pongs included, for peer_timeout_s: dead or cut off, and our
        # requests with it. (A replay that only holds samples back still answers pings.)
        # The source and the updater say which links they wait on.
        for part in (self.source, self.updater):
            if name in part.peers():
                part.lost()

    # ----- training -------------------------------------------------------------------
    def after_poll(self) -> None:
        self.source.poll()
        # At most a few updates per loop turn: however much waits, pings and the
        # other ports are answered between them.
        self._more_waiting = False
        for turn in range(_UPDATES_PER_TURN):
            # Told to stop: the updates left can wait (the supervisor's grace is seconds,
            # and a loaded machine's update can take one). Data-parallel replicas go on:
            # they stop together, at their source's next exchange.
            if not self.updater.ready() or (self.stopping and self.world == 1):
                break
            self._more_waiting = turn == _UPDATES_PER_TURN - 1
            batch = self.source.next_batch(self.updates)
            if batch is None:
                break
            self.last_terms, priorities = self.updater.step(batch.tensors)
            self._note_unread_weights(batch.tensors)
            # An optimizer step skipped for a non-finite gradient norm reports that norm
            # (zmqrl.parts.algos.gradients.clip_and_step): counted, never applied.
            if not math.isfinite(self.last_terms.get("grad_norm", 0.0)):
                self.updates_skipped += 1
            self.source.done(batch, priorities)

    def _note_unread_weights(self, tensors: dict) -> None:
        """A learner that never reads a prioritized batch's importance weights trains
        as if sampling were uniform, without an error: counted, and said once."""
        from zmqrl.parts.learning.sources import WEIGHT, ReadTensors

        if not isinstance(tensors, ReadTensors) or WEIGHT in tensors.read or \
                WEIGHT not in tensors or not bool((dict.__getitem__(tensors, WEIGHT) != 1).any()):
            return
        self.unweighted_batches += 1
        if self.unweighted_batches == 1:
            self.log.warning("%s never read the batch's '%s', the importance weights of a "
                             "prioritized replay: it trains as if sampling were uniform",
                             type(getattr(self.updater, "algo", self.algo)).__name__, WEIGHT)

    def _after_update(self) -> None:
        self.updates += 1
        if self.world > 1 and self.updates % _DIGEST_EVERY == 0:
            self.digest = (self.updates, params_digest(self.model))
        if self.updates % self.args.publish_every == 0:
            self._publish()
        self.checkpointer.maybe_save(self.updates)

    def _publish(self) -> None:
        from zmqrl.parts.models import nonfinite, state_arrays

        arrays = state_arrays(self.model)
        bad = nonfinite(arrays)
        if bad:  # never: every step is guarded; but a NaN published acts on everywhere
            self.log_rejection("params", f"not publishing version {self.updates}: "
                                         f"'{bad[0]}' is not finite")
            return
        self.send("params", wire.encode(wire.PARAMS, arrays,
                                        version=self.updates, source=self.incarnation))

    def on_subscribe(self, port: str) -> None:
        """Someone subscribed to ``params``: publish the current parameters at once (the
        runtime coalesces subscriptions, so at most one publish per loop turn; the
        others ignore a version they already hold)."""
        self._publish()

    # ----- persistence (zmqrl.parts.checkpoint.Saveable) ------------------------------------
    def save_checkpoint(self) -> None:
        self.checkpointer.save(self.updates)

    def state(self) -> dict[str, Any]:
        """Everything :meth:`restore` needs (the file format of checkpoint format 1)."""
        from zmqrl.parts.models import nonfinite

        bad = nonfinite(self.model)
        if bad:  # keep the last good checkpoint rather than overwrite it with poison
            raise ValueError(f"parameter '{bad[0]}' is not finite: not checkpointed")
        source = self.source.state()
        out = {
            "format": _CHECKPOINT_FORMAT,
            "model": self.model.state_dict(),
            "algo": self.algo.state_dict(),
            "updates": self.updates,
            "env_steps": source["env_steps"],
            "episodes": source["episodes"],
            "rng": _rng_state(),
        }
        if self.pbt is not None:  # hyperparameters PBT gave it survive a restart
            out["pbt"] = self.pbt.state()
        return out

    def restore(self, state: dict[str, Any]) -> None:
        from zmqrl.parts.models import nonfinite

        bad = nonfinite(state["model"])
        if bad:
            raise ValueError(f"its parameter '{bad[0]}' is not finite")
        self.model.load_state_dict(state["model"])
        if "algo" in state:
            self.algo.load_state_dict(state["algo"])
        else:  # a checkpoint from before algorithms had state_dict
            self.algo.optimizer.load_state_dict(state["optimizer"])
            self.log.warning("checkpoint has no algorithm state; target network and "
                             "counters start afresh")
        self.updates = int(state["updates"])
        self.source.restore({"env_steps": state["env_steps"],
                             "episodes": state.get("episodes")})
        if "rng" in state:
            _set_rng_state(state["rng"])
        if self.pbt is not None and "pbt" in state:
            self.pbt.restore(state["pbt"])

    def metrics(self) -> dict[str, Any]:
        row: dict[str, Any] = {"updates": self.updates, "updates_skipped": self.updates_skipped,
                               "unweighted_batches": self.unweighted_batches}
        row.update(self.source.metrics())
        row.update(self.updater.metrics())
        row.update({k: round(v, 5) for k, v in self.last_terms.items()})
        if self.digest is not None:
            row["digest_updates"], row["params_digest"] = self.digest
        if self.pbt is not None:
            row.update(self.pbt.metrics())
        return row

    def teardown(self) -> None:
        try:
            self.save_checkpoint()  # refuses non-finite parameters (state): then we exit 1
        finally:
            self.source.close()  # before the group goes: data-parallel peers hear the stop
            self.updater.close()

    def poll_timeout_ms(self) -> int:
        # more batches wait than one turn trained on: come straight back for them
        return 0 if self._more_waiting else super().poll_timeout_ms()


def _rng_state() -> dict[str, Any]:
    """torch's, numpy's global and Python's RNG states, as tensors and plain values (so
    the checkpoint loads with ``weights_only``)."""
    import torch

    kind, key, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["key"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
