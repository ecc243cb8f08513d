"""A known-good single-process learner on zmqrl's own Atari frames and network: the
reference that tells a defect in the bus from a configuration that does not learn.

CleanRL's ``ppo_atari.py`` (Huang et al. 2022, "The 37 implementation details of PPO")
with its settings — 8 envs, 128 steps, 4 epochs of 4 minibatches, clip 0.1, GAE 0.95,
normalized advantages, entropy 0.01, lr 2.5e-4 annealed, grad norm 0.5 — but stepping
``zmqrl.parts.envs.make_vector_env`` (the frames every zmqrl actor sends: uint8
[4, 84, 84], sticky actions, no episodic life) and training ``build_model`` (the
``nature_cnn`` the topologies name, /255 in its first layer). Nothing here goes over a
socket. If this learns and a topology on the same env and net does not, the difference
is in the topology's algorithm or configuration, or in the bus.

``--algo vtrace`` keeps the loop and swaps the update for the learner a topology names
(``--topology``'s ``algo`` section, ``--set algo.KEY=VALUE`` to change it): zmqrl's own
``VTraceLearner`` on unrolls of ``algo.unroll`` steps from ``algo.batch_size`` envs, acted
by the current policy. Learning here but not through the bus points at the bus; not
learning here either points at the algorithm's configuration.

    python benchmarks/pong_reference.py --steps 1000000 --out runs/pong-reference
    python benchmarks/pong_reference.py --algo vtrace --topology topologies/seed_atari.yaml

Prints a progress line every ~10 s and writes ``progress.csv`` (env steps, frames,
return(100), entropy, ...) under ``--out``, and the same rows as a run directory's
``metrics/run.csv`` and ``metrics/learner.csv`` (with a ``topology.yaml`` naming it), so
``zmqrl plot`` draws the reference beside a topology's runs and
``benchmarks/pong_compare.py`` compares their times to a return. Torch uses ``--threads``
threads (a single process: it may use every core).

    python benchmarks/pong_reference.py --steps 10000000 --target-return -15 \
        --out runs/pong-reference
"""

from __future__ import annotations

import argparse
import csv
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from zmqrl.parts.envs import env_spec, make_vector_env
from zmqrl.parts.models import build_model

FRAME_SKIP = 4


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="zmqrl/Atari-Pong-v5")
    p.add_argument("--model", default="nature_cnn")
    p.add_argument("--steps", type=int, default=1_000_000, help="env steps (agent steps)")
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--rollout", type=int, default=128)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--minibatches", type=int, default=4)
    p.add_argument("--lr", type=float, default=2.5e-4)
    p.add_argument("--clip", type=float, default=0.1)
    p.add_argument("--entropy", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--algo", choices=["ppo", "vtrace"], default="ppo",
                   help="ppo: CleanRL's update; vtrace: the topology's own learner")
    p.add_argument("--topology", type=Path, default=Path("topologies/seed_atari.yaml"))
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="topology override (--algo vtrace)")
    p.add_argument("--out", type=Path, default=Path("runs/pong-reference"))
    p.add_argument("--target-return", type=float, default=None,
                   help="stop once return(100) reaches this (the lr schedule still spans --steps)")
    p.add_argument("--max-seconds", type=float, default=None, help="stop after this wall time")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    env_cfg = {"id": a.env}
    model = build_model({"kind": a.model}, env_spec(env_cfg), seed=a.seed)
    learner = None
    if a.algo == "vtrace":
        learner = topology_learner(a, model)
        a.rollout, a.envs = learner.cfg.unroll, learner.cfg.batch_size
    envs = make_vector_env(env_cfg, a.envs, seed=a.seed)
    # CleanRL's optimizer (--algo ppo); the topology's learner brings its own
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, eps=1e-5) if learner is None else None
    log = RunLog(a.out, a.env, f"pong-reference-{a.algo}")

    T, N = a.rollout, a.envs
    obs_buf = torch.zeros((T, N, *envs.single_observation_space.shape), dtype=torch.uint8)
    act_buf = torch.zeros((T, N), dtype=torch.long)
    logp_buf, rew_buf, done_buf, val_buf = (torch.zeros((T, N)) for _ in range(4))
    obs, _ = envs.reset(seed=a.seed)
    obs = torch.from_numpy(obs)
    ep_return = np.zeros(N)
    returns: deque[float] = deque(maxlen=100)
    episodes, steps, updates = 0, 0, 0
    start = time.monotonic()
    n_updates = a.steps // (T * N)
    for update in range(n_updates):
        for g in opt.param_groups if opt is not None else ():  # CleanRL anneals to 0
            g["lr"] = a.lr * (1 - update / n_updates)
        for t in range(T):
            with torch.no_grad():
                logits, value = model(obs)
                logp_all = torch.log_softmax(logits, -1)
                action = torch.multinomial(logp_all.exp(), 1).squeeze(-1)
            obs_buf[t], act_buf[t], val_buf[t] = obs, action, value
            logp_buf[t] = logp_all.gather(-1, action[:, None]).squeeze(-1)
            next_obs, reward, term, trunc, _ = envs.step(action.numpy())
            done = term | trunc  # SAME_STEP autoreset: next_obs starts the next episode
            rew_buf[t] = torch.from_numpy(reward.astype(np.float32))
            done_buf[t] = torch.from_numpy(done.astype(np.float32))
            ep_return += reward
            for i in np.flatnonzero(done):
                returns.append(float(ep_return[i]))
                ep_return[i] = 0.0
                episodes += 1
            obs = torch.from_numpy(next_obs)
        steps += T * N
        if learner is not None:  # the topology's learner on this unroll, then on
            terms = learner.update({
                "obs": torch.cat([obs_buf, obs[None]]), "action": act_buf, "logp": logp_buf,
                "reward": rew_buf, "done": done_buf.bool()})
            updates += 1
            report(a, log, start, steps, updates, episodes, returns, terms["entropy"],
                   terms["loss_baseline"], 0.0, update == n_updates - 1)
            if finished(a, start, returns):
                break
            continue
        with torch.no_grad():
            next_value = model(obs)[1]
        adv = torch.zeros((T, N))
        gae = torch.zeros(N)
        for t in reversed(range(T)):  # GAE(0.99, 0.95), cut at every episode end
            nv = next_value if t == T - 1 else val_buf[t + 1]
            nonterminal = 1.0 - done_buf[t]
            delta = rew_buf[t] + 0.99 * nv * nonterminal - val_buf[t]
            gae = delta + 0.99 * 0.95 * nonterminal * gae
            adv[t] = gae
        ret = adv + val_buf

        b_obs, b_act = obs_buf.reshape(T * N, *obs_buf.shape[2:]), act_buf.reshape(-1)
        b_logp, b_adv, b_ret, b_val = (x.reshape(-1) for x in (logp_buf, adv, ret, val_buf))
        for _ in range(a.epochs):
            for idx in torch.randperm(T * N).chunk(a.minibatches):
                logp, entropy, value = model.evaluate(b_obs[idx], b_act[idx])
                ratio = torch.exp(logp - b_logp[idx])
                mb_adv = (b_adv[idx] - b_adv[idx].mean()) / (b_adv[idx].std() + 1e-8)
                pg = torch.max(-mb_adv * ratio,
                               -mb_adv * torch.clamp(ratio, 1 - a.clip, 1 + a.clip)).mean()
                v_clipped = b_val[idx] + torch.clamp(value - b_val[idx], -a.clip, a.clip)
                v_loss = 0.5 * torch.max((value - b_ret[idx]) ** 2,
                                         (v_clipped - b_ret[idx]) ** 2).mean()
                loss = pg - a.entropy * entropy.mean() + 0.5 * v_loss
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
                with torch.no_grad():
                    kl = float(((ratio - 1) - torch.log(ratio)).mean())
                    entropy, v_loss = entropy.detach(), v_loss.detach()
        updates += 1
        report(a, log, start, steps, updates, episodes, returns, float(entropy.mean()),
               float(v_loss), kl, update == n_updates - 1)
        if finished(a, start, returns):
            break
    envs.close()


def finished(a: argparse.Namespace, start: float, returns) -> bool:
    """--target-return reached over 100 episodes, or --max-seconds spent."""
    if a.max_seconds is not None and time.monotonic() - start >= a.max_seconds:
        print(f"stopped: {a.max_seconds:.0f} s spent", flush=True)
        return True
    if a.target_return is not None and len(returns) == 100 and np.mean(returns) >= a.target_return:
        print(f"stopped: return(100) {np.mean(returns):.2f} >= {a.target_return}", flush=True)
        return True
    return False


def topology_learner(a: argparse.Namespace, model: torch.nn.Module):
    """The learner ``--topology``'s algo section names, on ``model``."""
    from zmqrl.cli import _overrides
    from zmqrl.plugins import load_path
    from zmqrl.run.topology import load

    topo = load(a.topology, _overrides(tuple(a.sets)))
    cfg = topo.algo_config
    return load_path(type(cfg).learner)(cfg, model)


class RunLog:
    """``progress.csv``, and the same rows in a run directory's layout: ``metrics/run.csv``
    (the return ``zmqrl plot`` draws), ``metrics/learner.csv`` (entropy, losses) and a
    ``topology.yaml`` that names the curve."""

    def __init__(self, out: Path, env_id: str, name: str):
        (out / "metrics").mkdir(parents=True, exist_ok=True)
        (out / "topology.yaml").write_text(f"name: {name}\nenv: {{id: {env_id}}}\n")
        self.files = [open(out / f, "w", newline="")  # noqa: SIM115 (open for the run)
                      for f in ("progress.csv", "metrics/run.csv", "metrics/learner.csv")]
        self.progress, self.run, self.learner = (csv.writer(f) for f in self.files)
        self.progress.writerow(["seconds", "env_steps", "frames", "updates", "episodes",
                                "return_100", "entropy", "value_loss", "approx_kl"])
        self.run.writerow(["time_s", "env_steps", "episodes", "return_mean_100", "updates"])
        self.learner.writerow(["time_s", "env_steps", "updates", "return_mean_100", "entropy",
                               "loss_value", "approx_kl"])

    def row(self, seconds: float, steps: int, updates: int, episodes: int, r100: float,
            entropy: float, value_loss: float, kl: float) -> None:
        r100 = round(r100, 2)
        self.progress.writerow([seconds, steps, steps * FRAME_SKIP, updates, episodes, r100,
                                round(entropy, 4), round(value_loss, 5), round(kl, 5)])
        self.run.writerow([seconds, steps, episodes, "" if np.isnan(r100) else r100, updates])
        self.learner.writerow([seconds, steps, updates, "" if np.isnan(r100) else r100,
                               round(entropy, 4), round(value_loss, 5), round(kl, 5)])
        for f in self.files:
            f.flush()


def report(a, log: RunLog, start: float, steps: int, updates: int, episodes: int, returns,
           entropy: float, value_loss: float, kl: float, last: bool) -> None:
    """One CSV row per update; a progress line every ~10 s."""
    now = time.monotonic()
    r100 = float(np.mean(returns)) if returns else float("nan")
    log.row(round(now - start, 1), steps, updates, episodes, r100, entropy, value_loss, kl)
    if now - report.printed_at >= 10 or last:
        report.printed_at = now
        print(f"{now - start:7.0f} s  {steps:>9,} steps ({steps * FRAME_SKIP / 1e6:.2f}M frames)"
              f"  {steps / (now - start):5.0f} steps/s  updates {updates}  episodes {episodes}"
              f"  return(100) {r100:6.2f}  entropy {entropy:.3f}  kl {kl:.4f}", flush=True)


report.printed_at = 0.0  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
