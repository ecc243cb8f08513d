"""The ``zmqrl`` command line: up, node, procfile, endpoints, validate, keys, bench, status,
plot, play."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click
import yaml

from zmqrl.bus import cores, lifetime, security
from zmqrl.run import forkstart, launch
from zmqrl.run.topology import Topology, TopologyError, load, merge


def _overrides(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``--set nodes.actor.replicas=2`` pairs as one nested dict (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"'{pair}' is not KEY=VALUE", param_hint="--set")
        nested: Any = yaml.safe_load(value)
        if isinstance(nested, str):
            try:  # YAML 1.1 reads 1e-3 as a string; on a command line it means a number
                nested = float(nested)
            except ValueError:
                pass
        for part in reversed(key.split(".")):
            nested = {part: nested}
        out = merge(out, nested)
    return out


def _load(path: str, sets: tuple[str, ...] = (), node: str | None = None) -> Topology:
    try:
        return load(path, _overrides(sets), node=node)
    except TopologyError as exc:
        for line in exc.errors:
            click.echo(f"error: {line}", err=True)
        sys.exit(2)


_set_option = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                           help="Override a topology field, e.g. nodes.actor.replicas=2.")


@click.group()
@click.version_option(package_name="zmqrl")
def main() -> None:
    """zmqrl: distributed reinforcement learning as ZeroMQ nodes wired by YAML."""


def _check_cores(topo: Topology, engine: str) -> None:
    """Pinning (node field ``cores``) is for nodes this machine runs: refuse it under
    Ray, and refuse cores this machine does not have, before anything starts."""
    pinned = sorted(name for name, spec in topo.nodes.items() if spec.cores)
    if not pinned:
        return
    if engine == "ray":
        raise click.UsageError(f"node(s) {', '.join(pinned)}: 'cores' pins threads on this "
                               "machine; with --engine ray, Ray places the nodes (use "
                               "resources.cpus)")
    problems = [p for host in {s.host for s in topo.nodes.values()}
                for p in cores.host_errors(topo, host)]
    if problems:
        raise click.UsageError(f"{topo.source}: " + "; ".join(problems))


@main.command()
@click.argument("topology", required=False, type=click.Path(dir_okay=False))
@click.option("--run-dir", type=click.Path(file_okay=False),
              help="Default: runs/<name>-<time>. Must hold no checkpoints (see --resume).")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False), metavar="RUN_DIR",
              help="Continue the stopped (or crashed) run in RUN_DIR, in that directory: the "
                   "learner and the replay restore their checkpoints. TOPOLOGY defaults to "
                   "the run's own RUN_DIR/topology.yaml; give one (or --set) to change e.g. "
                   "the actors or, by surgery, the model and the observations "
                   "(docs/surgery.md).")
@click.option("--surgery-inputs", metavar="COLS",
              help="With --resume and new observation features: the new column of each old "
                   "one, as 0,2 (default: the old features first).")
@click.option("--max-steps", type=click.IntRange(min=1),
              help="Stop after this many env steps (a resumed run counts its earlier steps).")
@click.option("--max-seconds", type=click.FloatRange(min=0, min_open=True),
              help="Stop after this long (this invocation).")
@click.option("--target-return", type=float,
              help="Stop once the mean return of the last --target-window episodes reaches "
                   "this.")
@click.option("--target-window", type=click.IntRange(min=1), default=100, show_default=True,
              metavar="N", help="The episodes --target-return (and the progress line's "
                                "return) averages over.")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local",
              show_default=True,
              help="local: every node on this machine. ray: every node replica placed on a "
                   "Ray cluster (pip install 'zmqrl[ray]'; docs/scale-out.md).")
@click.option("--address", metavar="ADDR",
              help="With --engine ray: the cluster to join (default: RAY_ADDRESS, else a "
                   "local Ray started for the run).")
@click.option("--strategy", type=click.Choice(["pack", "spread", "strict-pack",
                                               "strict-spread"]),
              default="pack", show_default=True,
              help="With --engine ray: how the run's placement group packs node replicas.")
@click.option("--curve/--no-curve", default=None,
              help="With --engine ray: encrypt and authenticate every tcp link (default: "
                   "on whenever an address is not loopback: several Ray nodes or a "
                   "routable address; --no-curve there runs plain tcp, with a warning).")
@click.option("--placement-timeout", default=120.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True), metavar="S",
              help="With --engine ray: give up if the cluster cannot place the run in S.")
@_set_option
def up(topology: str | None, run_dir: str | None, resume_dir: str | None,
       surgery_inputs: str | None, max_steps: int | None, max_seconds: float | None,
       target_return: float | None,
       target_window: int, engine: str, address: str | None, strategy: str, curve: bool | None,
       placement_timeout: float, sets: tuple[str, ...]) -> None:
    """Run every node of TOPOLOGY on this machine (or, with --engine ray, on a Ray
    cluster) until stopped.

    A new run refuses a --run-dir that holds checkpoints (it would silently resume or
    overwrite that run): continue such a run with --resume RUN_DIR.
    """
    if engine != "ray" and (address is not None or strategy != "pack" or curve is not None):
        raise click.UsageError("--address, --strategy and --curve need --engine ray")
    def check(directory: Path) -> None:
        try:
            launch.check_run_dir(directory, resume=resume_dir is not None)
        except launch.RunDirError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)

    if resume_dir is not None:
        if run_dir is not None and Path(run_dir).resolve() != Path(resume_dir).resolve():
            raise click.UsageError("--resume RUN_DIR names the run directory; drop --run-dir")
        run_dir = resume_dir
        check(Path(resume_dir))
        if topology is None:
            topology = str(Path(resume_dir) / "topology.yaml")
    elif topology is None:
        raise click.UsageError("missing TOPOLOGY (or --resume RUN_DIR)")
    if engine == "local":  # before any torch op or thread here (zmqrl.run.forkstart)
        forkstart.open_template()
    topo = _load(topology, sets)
    directory = Path(run_dir) if run_dir else launch.default_run_dir(topo)
    check(directory)
    if resume_dir is not None:
        _surgery_if_needed(directory, topo, _columns(surgery_inputs, "--surgery-inputs"))
    elif surgery_inputs is not None:
        raise click.UsageError("--surgery-inputs needs --resume")
    stop = launch.StopConditions(max_steps=max_steps, max_seconds=max_seconds,
                                 target_return=target_return, window=target_window)
    _check_cores(topo, engine)
    if engine == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise click.ClickException("--engine ray needs Ray: pip install 'zmqrl[ray]'")
        from zmqrl.run.engines.ray_supervisor import RayOptions, RaySupervisor

        supervisor: launch.Supervisor = RaySupervisor(
            topo, directory, stop, RayOptions(address, strategy, curve, placement_timeout),
            resume=resume_dir is not None)
    else:
        supervisor = launch.Supervisor(topo, directory, stop, resume=resume_dir is not None)
    try:
        code = supervisor.run()
    except launch.RunDirError as exc:  # another run took the directory meanwhile
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    if engine == "local":
        # every node stopped, every file and socket closed: skip the interpreter's teardown
        lifetime.exit_now(code)
    sys.exit(code)


def _columns(text: str | None, option: str) -> list[int] | None:
    try:
        return [int(c) for c in text.split(",")] if text else None
    except ValueError:
        raise click.BadParameter(f"{text!r}: give column numbers, as 0,2",
                                 param_hint=option) from None


def _surgery_if_needed(run_dir: Path, topo: Any, inputs: list[int] | None) -> None:
    """Before a resumed run starts: carry its trained models into ``topo``'s where the
    model or the env's spaces changed (zmqrl.run.surgery), or stop naming what cannot
    be carried, the run untouched."""
    from zmqrl.run import surgery

    if not (run_dir / "topology.yaml").exists() or not surgery.needed(run_dir, topo):
        if inputs is not None:
            raise click.UsageError("--surgery-inputs: the model and the observations are "
                                   "unchanged, there is no surgery to do")
        return
    try:
        results, fates = surgery.perform(run_dir, topo, inputs)
    except surgery.SurgeryError as exc:
        click.echo(f"error: surgery refused, the run is untouched: {exc}", err=True)
        sys.exit(2)
    for checked in results:
        diffs = ", ".join(f"{k} {v:.2g}" for k, v in checked.differences.items())
        click.echo(f"surgery: {checked.path.name}: largest output difference {diffs} "
                   f"({checked.observations})")
        for line in checked.lines:
            if not line.startswith("copied"):
                click.echo(f"  {line}")
    for fate in fates:
        click.echo(f"surgery: {fate}")
    if not fates:
        click.echo("surgery: the run holds no checkpoints, nothing to carry")
        return
    click.echo(f"surgery: the old checkpoints are in {run_dir}/checkpoints/"
               f"{surgery.BACKUP_PREFIX}{surgery.surgeries(run_dir)}/ (docs/surgery.md)")


@main.command()
@click.argument("topology", type=click.Path(dir_okay=False))
@click.argument("name")
@click.option("--replica", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--run-dir", type=click.Path(file_okay=False),
              help="Shared by every node of the run (ipc sockets live there). "
                   "Default: runs/<name>.")
@click.option("--supervisor", help="Address of the supervisor to report to (set by `up`).")
@click.option("--endpoints", "endpoints_file", type=click.Path(dir_okay=False, exists=True),
              help="Addresses resolved after placement (JSON, written by `up --engine ray`) "
                   "instead of those derived from TOPOLOGY.")
@click.option("--restart-in-process", "--watchdog", "watch", is_flag=True,
              help="Run the node as a child process and restart it by its restart policy "
                   "after any exit, signals included (for honcho: one node's death must "
                   "not end the Procfile).")
@_set_option
def node(topology: str, name: str, replica: int, run_dir: str | None, supervisor: str | None,
         endpoints_file: str | None, watch: bool, sets: tuple[str, ...]) -> None:
    """Run node NAME of TOPOLOGY (one replica) in this process (or, with --watchdog, in a
    child process that is restarted). Stops on SIGTERM, SIGINT and SIGHUP."""
    # Only what this node needs is checked: building the model to check it would load
    # torch into a node that runs none (`up` and `validate` check the whole topology).
    topo = _load(topology, sets, node=name)
    if name not in topo.nodes:
        raise click.BadParameter(f"no node '{name}' in {topology} (nodes: "
                                 f"{', '.join(topo.nodes)})", param_hint="NAME")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    directory = Path(run_dir) if run_dir else launch.default_run_dir(topo, timestamped=False)
    if not watch:
        table = None
        if endpoints_file is not None:
            from zmqrl.bus.endpoints import Endpoints

            table = Endpoints.load(endpoints_file)
        # the node has closed its sockets and files: skip the interpreter's teardown
        lifetime.exit_now(launch.run_node(topo, name, replica, directory, supervisor, table))
    child = [sys.executable, "-m", "zmqrl.cli", "node", topology, name, "--replica",
             str(replica), "--run-dir", str(directory)]
    child += ["--supervisor", supervisor] if supervisor else []
    child += ["--endpoints", endpoints_file] if endpoints_file else []
    for pair in sets:
        child += ["--set", pair]
    sys.exit(launch.watchdog(topo, name, replica, directory, child))


@main.command()
@click.argument("topology", type=click.Path(dir_okay=False))
@click.option("--run-dir", default=None, help="Default: runs/<name>.")
@click.option("--host", metavar="H",
              help="Only the nodes whose `host:` is H: the Procfile of that host in a "
                   "hand-placed run (docs/scale-out.md).")
@_set_option
def procfile(topology: str, run_dir: str | None, host: str | None,
             sets: tuple[str, ...]) -> None:
    """Print a Procfile (for honcho/foreman) that runs TOPOLOGY."""
    topo = _load(topology, sets)
    if host is not None and not any(spec.host == host for spec in topo.nodes.values()):
        known = sorted({s.host for s in topo.nodes.values() if s.host})
        raise click.BadParameter(f"no node of {topology} has host: {host} (hosts: "
                                 f"{', '.join(known) or 'none'})", param_hint="--host")
    directory = run_dir or str(launch.default_run_dir(topo, timestamped=False))
    click.echo(launch.procfile(topo, topology, directory, host), nl=False)


@main.command()
@click.argument("topology", type=click.Path(dir_okay=False))
@click.option("--run-dir", default=None, help="Default: runs/<name> (ipc addresses live there).")
@_set_option
def endpoints(topology: str, run_dir: str | None, sets: tuple[str, ...]) -> None:
    """Print the address of every bound port of TOPOLOGY (what to connect a client to;
    send it `describe` to learn what it takes)."""
    from zmqrl.bus.endpoints import Endpoints, supervisor_address
    from zmqrl.bus.labels import label
    from zmqrl.run.topology import ports_of

    topo = _load(topology, sets)
    directory = Path(run_dir) if run_dir else launch.default_run_dir(topo, timestamped=False)
    table = Endpoints(topo, directory)
    for name, spec in topo.nodes.items():
        for port in sorted(ports_of(spec)):
            for replica in range(spec.replicas):
                click.echo(f"{label(name, replica, spec.replicas)}.{port}\t"
                           f"{table.bind_address(name, port, replica)}")
    click.echo(f"supervisor\t{supervisor_address(directory)}")


@main.command()
@click.argument("topologies", nargs=-1, required=True, type=click.Path(dir_okay=False))
@_set_option
def validate(topologies: tuple[str, ...], sets: tuple[str, ...]) -> None:
    """Check topology files; print every problem with its file, node and field. With
    --set, each file as `up --set` would run it (the same overrides, applied to each)."""
    overrides = _overrides(sets)
    failed = False
    for path in topologies:
        try:
            topo = load(path, overrides)
        except TopologyError as exc:
            failed = True
            for line in exc.errors:
                click.echo(f"error: {line}", err=True)
            continue
        replicas = sum(s.replicas for s in topo.nodes.values())
        click.echo(f"ok: {path}: {len(topo.nodes)} nodes, {replicas} processes")
    sys.exit(1 if failed else 0)


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.argument("topology", type=click.Path(dir_okay=False, exists=True))
@click.option("--check", is_flag=True, required=True,
              help="Report what would be carried, transformed or refused; change nothing.")
@click.option("--inputs", metavar="I,J,...",
              help="The new observation's column of each old one (default: the old "
                   "features first).")
@click.option("--logit-tolerance", type=click.FloatRange(min=0, min_open=True, max=0.5),
              default=1e-4, show_default=True,
              help="The probability a new action may get, and the old ones may move by.")
@_set_option
def surgery(run_dir: str, topology: str, check: bool, inputs: str | None,
            logit_tolerance: float, sets: tuple[str, ...]) -> None:
    """What TOPOLOGY's model would make of RUN_DIR's trained ones (docs/surgery.md): for
    each model checkpoint, every parameter copied, transformed or new, or the layer that
    cannot be carried and why; and the largest output difference on sample observations.
    Exits 1 if any checkpoint cannot be carried."""
    from zmqrl.run.surgery import check as check_surgery

    columns = _columns(inputs, "--inputs")
    new = _load(topology, sets)
    results = check_surgery(Path(run_dir), new, columns, logit_tolerance)
    if not results:
        click.echo(f"error: {run_dir} holds no model checkpoint", err=True)
        sys.exit(1)
    for checked in results:
        click.echo(f"== {checked.path.name}")
        if checked.refused:
            click.echo(f"refused: {checked.refused}")
            continue
        for line in checked.lines:
            click.echo(f"  {line}")
        diffs = ", ".join(f"{k} {v:.2g}" for k, v in checked.differences.items())
        click.echo(f"largest output difference ({checked.observations}): {diffs}")
    sys.exit(1 if any(c.refused for c in results) else 0)


@main.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Replace keys that already exist.")
def keys(directory: str, force: bool) -> None:
    """Make CURVE keys in DIRECTORY for a topology's `network: {curve: {keys: DIRECTORY}}`.

    Writes a server keypair (server.key, server.key_secret) and a client keypair
    (client.key, client.key_secret). Copy the directory to every host of the run; add
    another client's public key as NAME.key to let it in too.
    """
    try:
        written = security.write_keys(Path(directory), force)
    except FileExistsError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    for path in written:
        secret = path.name.endswith("_secret")
        click.echo(f"wrote {path}" + (" (secret key: mode 600, keep it private)" if secret
                                      else " (public key)"))
    click.echo(f"use it with: network: {{curve: {{keys: {Path(directory).resolve()}}}}}")


@main.command()
@click.option("--actors", default=4, show_default=True, type=click.IntRange(min=1))
@click.option("--envs", default=32, show_default=True, type=click.IntRange(min=1),
              help="Envs per actor.")
@click.option("--seconds", default=10.0, show_default=True, type=float)
@click.option("--topology", "topology_path", default="topologies/seed.yaml", show_default=True)
@click.option("--lanes", default=1, show_default=True, type=click.IntRange(min=1),
              help="Pipelined request lanes per actor.")
@click.option("--with-learner", is_flag=True, help="Keep the learner instead of a sink.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Also write the figures to this file.")
@click.option("--pin", is_flag=True,
              help="Give each actor a core of its own (node field 'cores'), the rest of "
                   "the run the other cores.")
def bench(actors: int, envs: int, seconds: float, topology_path: str, lanes: int,
          with_learner: bool, json_path: str | None, pin: bool) -> None:
    """SEED acting throughput against the no-network limit, measured in one run."""
    from zmqrl.run.bench import run_bench

    forkstart.open_template()  # before the limit's torch ops (zmqrl.run.forkstart)

    try:
        run_bench(topology_path, actors, envs, seconds, with_learner, json_path, lanes, pin)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@main.command()
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, exists=True))
@click.option("--once", is_flag=True, help="Print one snapshot and exit (for scripts).")
@click.option("--interval", default=1.0, show_default=True,
              type=click.FloatRange(min=0.1), help="Seconds between refreshes.")
def status(run_dir: str | None, once: bool, interval: float) -> None:
    """A live table of every node of a run: pid, host, incarnation, state, restarts,
    env steps/s, and per socket its peer, messages/s in and out, bytes/s and queue;
    an inference broker's batch, a learner's policy lag. RUN_DIR defaults to the run
    under runs/ that reported last. Works for `zmqrl up`, honcho and any run whose
    nodes share the run directory. Ctrl-C ends it."""
    import time

    from rich.console import Console
    from rich.live import Live

    from zmqrl.bus.status import latest_run, render, snapshot

    directory = Path(run_dir) if run_dir else latest_run()
    if directory is None:
        raise click.UsageError("no run with status files under runs/; name a RUN_DIR")
    console = Console(highlight=False)
    if once or not console.is_terminal:
        if not console.is_terminal:  # a pipe or a file: no wrapping of the table
            console = Console(highlight=False, width=max(console.width, 200))
        console.print(render(snapshot(directory), console.width))
        return
    try:
        with Live(render(snapshot(directory), console.width), console=console,
                  auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(render(snapshot(directory), console.width), refresh=True)
    except KeyboardInterrupt:
        pass


@main.command()
@click.argument("run_dirs", nargs=-1, required=True,
                type=click.Path(file_okay=False, exists=True))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="The PNG to write.")
@click.option("--metric", default="return_mean_100", show_default=True,
              type=click.Choice(["return_mean_100", "return_mean_20"]),
              help="Which mean return to draw.")
@click.option("--title", help="Default: the env ids and the metric.")
@click.option("--size", default="1200x450", show_default=True, metavar="WxH",
              help="Size of the PNG in pixels.")
@click.option("--learner-metric", "learner_metrics", multiple=True, metavar="COLUMN",
              help="Add a row of panels for this learner column (e.g. entropy); repeatable.")
@click.option("--frame-skip", default=1, show_default=True, type=click.IntRange(min=1),
              help="Count the step axis in frames: env steps x this (Atari: 4).")
def plot(run_dirs: tuple[str, ...], output: str, metric: str, title: str | None,
         size: str, learner_metrics: tuple[str, ...], frame_skip: int) -> None:
    """Learning curves of RUN_DIRS into one PNG: return against env steps and against
    wall time. Runs of the same topology (seeds) are drawn as their mean with a band;
    different topologies are overlaid. Needs matplotlib (pip install -e '.[plot]')."""
    try:
        width, height = (int(v) for v in size.lower().split("x"))
    except ValueError:
        raise click.BadParameter(f"'{size}' is not WxH, e.g. 1200x450",
                                 param_hint="--size") from None
    from zmqrl.run.plot import plot_runs  # numpy and yaml; matplotlib only when drawing

    try:
        out = plot_runs([Path(d) for d in run_dirs], Path(output), metric, title,
                        (width, height), learner_metrics=learner_metrics,
                        frame_skip=frame_skip)
    except ImportError as exc:
        raise click.ClickException(f"{exc}; install it with pip install -e '.[plot]'") \
            from None
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {out}")


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--episodes", "-n", default=3, show_default=True, type=click.IntRange(min=1))
@click.option("--greedy/--sample", default=False, show_default=True,
              help="The policy's likeliest action (Q-learning: epsilon 0), or sample as "
                   "it trained.")
@click.option("--checkpoint", metavar="NAME",
              help="A checkpoint in RUN_DIR/checkpoints (e.g. learner) or a path. Default: "
                   "the run's learner checkpoint.")
@click.option("--video", type=click.Path(dir_okay=False), metavar="FILE",
              help="Record the episodes to FILE (.mp4 or .gif; pip install 'zmqrl[video]').")
@click.option("--seed", default=0, show_default=True, type=int,
              help="The first episode's env seed (episode i: seed + i).")
@click.option("--max-steps", type=click.IntRange(min=1), help="Cut each episode here.")
def play(run_dir: str, episodes: int, greedy: bool, checkpoint: str | None,
         video: str | None, seed: int, max_steps: int | None) -> None:
    """Load RUN_DIR's checkpoint into its model and play episodes of its env here, one
    env, printing each return (and recording them with --video)."""
    from zmqrl.run.play import PlayError, load_run
    from zmqrl.run.play import play as play_run

    def show(i: int, episode) -> None:
        click.echo(f"episode {i + 1}: return {episode.ret:g} in {episode.length} steps")

    try:
        loaded = load_run(run_dir, checkpoint)
        click.echo(f"playing {loaded[2]} ({'greedy' if greedy else 'sampled'} actions)")
        played = play_run(run_dir, episodes, greedy=greedy, checkpoint=checkpoint,
                          video=video, seed=seed, max_steps=max_steps, on_episode=show,
                          loaded=loaded)
    except PlayError as exc:
        raise click.ClickException(str(exc)) from None
    returns = [e.ret for e in played]
    click.echo(f"mean return {sum(returns) / len(returns):g} over {len(returns)} episodes")
    if video is not None:
        click.echo(f"wrote {video}")


if __name__ == "__main__":
    main()
