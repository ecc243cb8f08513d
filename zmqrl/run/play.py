"""Watch a run play (``zmqrl play RUN_DIR``): load a learner's checkpoint into the run's
model and play episodes of the run's env on this machine, one env, no bus.

The run's own topology (``RUN_DIR/topology.yaml``, as resolved when it started) says the
env, the model and the behaviour, so what plays is what trained: the behaviour the
topology's algorithm (or its ``parts:``) names, registered like every part, acting through
the same :func:`~zmqrl.parts.acting.act_batched` an actor uses. ``greedy`` takes the
behaviour's greedy action instead (:meth:`~zmqrl.parts.acting.Behaviour.greedy`; an
ε-greedy behaviour plays with ε 0). With ``video`` the env renders ``rgb_array`` frames,
written with imageio (``.mp4`` through imageio-ffmpeg, ``.gif`` through Pillow:
``pip install 'zmqrl[video]'``).

Every way this can go wrong before a step is taken (no run there, no checkpoint, a
checkpoint of another model, an env that cannot render, a behaviour with no greedy
mode) is a :class:`PlayError` whose message names the file or part and what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zmqrl.parts.checkpoint import checkpoint_dir

VIDEO_INSTALL = "pip install 'zmqrl[video]'"


class PlayError(Exception):
    """A run, checkpoint, env or behaviour that cannot be played, and why."""


@dataclass(frozen=True)
class Episode:
    ret: float
    length: int


def learner_checkpoints(run_dir: Path) -> list[Path]:
    """The torch checkpoints under ``run_dir/checkpoints`` that hold a model (a learner's,
    a parameter server's), by name; files that are not such checkpoints are skipped."""
    found = []
    for path in sorted(checkpoint_dir(run_dir).glob("*.pt")):
        try:
            state = _load_state(path)
        except PlayError:
            continue
        if "model" in state:
            found.append(path)
    return found


def find_checkpoint(run_dir: Path, name: str | None = None) -> Path:
    """The checkpoint to play: ``name`` (a file in the run's checkpoints/, with or without
    ``.pt``, or a path), or the run's only learner checkpoint (``learner.pt`` where there
    are several)."""
    if name is not None:
        for candidate in (Path(name), checkpoint_dir(run_dir) / name,
                          checkpoint_dir(run_dir) / f"{name}.pt"):
            if candidate.is_file():
                return candidate
        raise PlayError(f"no checkpoint '{name}' in {checkpoint_dir(run_dir)} "
                        f"(there: {_names(learner_checkpoints(run_dir))})")
    found = learner_checkpoints(run_dir)
    if not found:
        raise PlayError(f"{run_dir} has no learner checkpoint in checkpoints/ yet (a "
                        "learner writes one every checkpoint_every updates and when it "
                        "stops)")
    if len(found) == 1:
        return found[0]
    for path in found:
        if path.name == "learner.pt":
            return path
    raise PlayError(f"{run_dir} has {len(found)} learner checkpoints: name one with "
                    f"--checkpoint ({_names(found)})")


def _names(paths: list[Path]) -> str:
    return ", ".join(p.stem for p in paths) or "none"


def _load_state(path: Path) -> dict[str, Any]:
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated file, a pickle, another format: all unplayable
        raise PlayError(f"{path} is not a zmqrl checkpoint ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:200]})") from None
    if not isinstance(state, dict):
        raise PlayError(f"{path} is not a zmqrl checkpoint (a {type(state).__name__}, "
                        "not a state dict)")
    return state


def load_run(run_dir: str | Path, checkpoint: str | None = None) -> tuple[Any, Any, Path]:
    """The run's topology, its model with the checkpoint's parameters, and the
    checkpoint's path."""
    from zmqrl.parts.envs import env_spec
    from zmqrl.parts.models import build_model
    from zmqrl.run.topology import TopologyError, load

    run_dir = Path(run_dir)
    topo_file = run_dir / "topology.yaml"
    if not topo_file.is_file():
        raise PlayError(f"{run_dir} is not a run directory: it has no topology.yaml "
                        "(zmqrl up writes one in every run it starts)")
    try:
        topo = load(topo_file)
    except TopologyError as exc:
        raise PlayError(f"{topo_file}: " + "; ".join(exc.errors)) from None
    path = find_checkpoint(run_dir, checkpoint)
    state = _load_state(path)
    if "model" not in state:
        raise PlayError(f"{path} holds no model parameters (keys: "
                        f"{', '.join(sorted(map(str, state))[:8])}): not a learner's "
                        "checkpoint")
    model = build_model(topo.model, env_spec(topo.env), topo.seed, algo=topo.algo_config)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())
        raise PlayError(f"{path} does not fit this run's model ({topo.model.get('kind')} "
                        f"on {topo.env['id']}): {detail[:400]}") from None
    model.eval()
    return topo, model, path


def play(run_dir: str | Path, episodes: int = 3, *, greedy: bool = False,
         checkpoint: str | None = None, video: str | Path | None = None, seed: int = 0,
         max_steps: int | None = None,
         on_episode: Callable[[int, Episode], None] | None = None,
         loaded: tuple[Any, Any, Path] | None = None) -> list[Episode]:
    """Play ``episodes`` episodes; returns each one's return and length. ``loaded``: what
    :func:`load_run` returned for this run and checkpoint, when the caller has it."""
    import torch

    torch.set_num_threads(1)
    topo, model, _ = loaded if loaded is not None else load_run(run_dir, checkpoint)
    env, spec = _make_env(topo, video is not None)
    writer = _video_writer(video, env) if video is not None else None
    try:
        act = _policy(topo, model, spec, greedy, seed)
        played = []
        for i in range(episodes):
            episode = _episode(env, spec, act, seed + i, max_steps, writer)
            played.append(episode)
            if on_episode is not None:
                on_episode(i, episode)
        return played
    finally:
        env.close()
        if writer is not None:
            writer.close()


def _make_env(topo: Any, render: bool) -> tuple[Any, Any]:
    import gymnasium as gym

    from zmqrl.parts.envs import env_spec

    kwargs = dict(topo.env.get("kwargs", {}))
    if render:
        modes = _render_modes(topo.env["id"], kwargs)
        if "rgb_array" not in modes:
            raise PlayError(f"env {topo.env['id']} cannot render frames for a video (its "
                            f"render modes: {', '.join(modes) or 'none'})")
        kwargs["render_mode"] = "rgb_array"
    try:
        env = gym.make(topo.env["id"], **kwargs)
    except gym.error.DependencyNotInstalled as exc:
        raise PlayError(f"env {topo.env['id']}: {exc} ({VIDEO_INSTALL} for rendering)"
                        ) from None
    return env, env_spec(topo.env)


def _render_modes(env_id: str, kwargs: dict[str, Any]) -> list[str]:
    import gymnasium as gym

    env = gym.make(env_id, **kwargs)
    try:
        return list(env.metadata.get("render_modes", []))
    finally:
        env.close()


def _policy(topo: Any, model: Any, spec: Any, greedy: bool, seed: int
            ) -> Callable[[np.ndarray, float, bool, bool, bool], np.ndarray]:
    """A function (obs [1, ...], last reward, done, truncated, first step of the episode)
    -> actions [1, ...]."""
    from zmqrl.parts.acting import ActingSetup, act_batched, behaviour_for

    if topo.acting is not None:
        raise PlayError(f"{topo.name} acts through its '{topo.acting.behaviour}' section "
                        "(two seats of a game): play runs one agent against its env; the "
                        "run's league node measures such a policy")
    cls = behaviour_for(topo.parts_config, "experience")
    if cls.step_variant:
        raise PlayError(f"behaviour '{cls.__name__}' acts through a search whose requests "
                        "carry more than observations: zmqrl play steps one env with one "
                        "forward pass per step")
    setup = ActingSetup(spec, model, topo.algo_config, epsilon=0.0 if greedy else 0.01,
                        seed=seed, priorities=False)
    behaviour = cls(setup, 1)
    use_greedy = greedy and not cls.explores_by_epsilon  # ε 0 is its greedy mode

    def act(obs: np.ndarray, reward: float, done: bool, truncated: bool,
            first: bool) -> np.ndarray:
        if not first:
            behaviour.outcome(np.array([reward], np.float32), np.array([done]),
                              np.array([truncated]), np.zeros((0, *spec.obs_shape),
                                                              spec.obs_dtype))
        behaviour.observe(obs)
        behaviour.take()  # the items it would ship: nobody takes them here
        if use_greedy:
            actions = behaviour.greedy()
            if actions is None:
                raise PlayError(f"behaviour '{cls.__name__}' has no greedy mode: play "
                                "without --greedy (it samples as it trained)")
            return actions
        (actions,) = act_batched(model, [behaviour], 0)
        return actions

    return act


def _episode(env: Any, spec: Any, act: Callable[..., np.ndarray], seed: int,
             max_steps: int | None, writer: Any) -> Episode:
    from zmqrl.parts.envs import env_action

    obs, _ = env.reset(seed=seed)
    reward, done, truncated, first = 0.0, False, False, True
    total, steps = 0.0, 0
    if writer is not None:
        writer.append_data(env.render())
    while True:
        actions = act(np.asarray(obs, spec.obs_dtype)[None], reward, done, truncated, first)
        first = False
        obs, reward, terminated, truncated, _ = env.step(env_action(actions, spec)[0])
        total += float(reward)
        steps += 1
        if writer is not None:
            writer.append_data(env.render())
        done = bool(terminated or truncated)
        if done or (max_steps is not None and steps >= max_steps):
            return Episode(total, steps)


def _video_writer(path: str | Path, env: Any) -> Any:
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".mp4", ".gif"):
        raise PlayError(f"--video {path}: write .mp4 or .gif")
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise PlayError(f"--video needs imageio: {VIDEO_INSTALL}") from None
    fps = _fps(env)
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".gif":  # Pillow: frame duration in ms, loop for ever
        return imageio.get_writer(path, mode="I", duration=1000 / fps, loop=0)
    try:
        import imageio_ffmpeg  # noqa: F401  (the ffmpeg binary imageio's mp4 writer runs)
    except ImportError:
        raise PlayError(f"--video {path}: .mp4 needs imageio-ffmpeg ({VIDEO_INSTALL}), "
                        "or write a .gif") from None
    # macro_block_size 1: frames of any size (Atari's 210 x 160) without rescaling
    return imageio.get_writer(path, fps=fps, macro_block_size=1)


def _fps(env: Any) -> float:
    """Frames a second of agent steps: the env's render rate over its frame skip."""
    base = float(env.metadata.get("render_fps") or 30)
    skip = _frame_skip(env)
    return max(1.0, base / skip)


def _frame_skip(env: Any) -> int:
    for wrapper in _wrappers(env):
        skip = getattr(wrapper, "frame_skip", None)
        if isinstance(skip, int) and skip > 1:
            return skip
    return 1


def _wrappers(env: Any) -> Iterator[Any]:
    while env is not None:
        yield env
        env = getattr(env, "env", None)
