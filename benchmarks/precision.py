"""AlphaZero's conv net in float32 against bfloat16 (``precision``, torch.autocast), in one run.

    python benchmarks/precision.py [--game connect_four] [--rounds 5]

One process, one torch thread (as the broker and the learner run), the same weights:
the forward pass at a batch the inference broker makes in the connect-four topology
(~245 positions, under ``inference_mode`` as the broker runs it) and the learner's
update (``AlphaZeroLearner.update``, batch 256, the topology's algo settings), each
timed in float32 and in bfloat16 (the one lower precision a CPU runs), alternating for
``--rounds`` rounds. Prints each round's times and ratio and the medians: this machine
drifts by tens of percent between runs, a ratio within one holds. It also prints how far
bfloat16's outputs are from float32's on the same positions.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
import yaml
from conv_layout import best_ms

from zmqrl.parts import algo_config
from zmqrl.parts.alphazero.learner import AlphaZeroLearner
from zmqrl.parts.devices import autocast, native_bfloat16
from zmqrl.parts.envs import env_spec
from zmqrl.parts.games import env_id
from zmqrl.parts.models import build_model

TOPOLOGY = Path(__file__).resolve().parents[1] / "topologies" / "alphazero.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default="connect_four")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--act-batch", type=int, default=245)
    args = parser.parse_args()
    args.precision = "bfloat16"
    torch.set_num_threads(1)
    raw = yaml.safe_load(TOPOLOGY.read_text())
    spec = env_spec({"id": env_id(args.game)})
    model = build_model(raw["model"], spec, seed=0)
    cfg = algo_config.parse(raw["algo"])
    cpu = torch.device("cpu")
    learners = {p: AlphaZeroLearner(cfg, model, precision=p) for p in ("float32", args.precision)}
    gen = torch.Generator().manual_seed(0)
    acting = torch.randint(0, 2, (args.act_batch, *spec.obs_shape), generator=gen).float()
    batch = {"obs": torch.randint(0, 2, (cfg.batch_size, *spec.obs_shape), generator=gen).float(),
             "policy": torch.softmax(torch.randn(cfg.batch_size, spec.num_actions,
                                                 generator=gen), -1),
             "outcome": torch.randint(-1, 2, (cfg.batch_size,), generator=gen).float()}

    def act(precision: str) -> tuple[torch.Tensor, torch.Tensor]:
        with autocast(cpu, precision):
            return model.predict(acting)

    full, low = act("float32"), act(args.precision)
    print(f"pv_conv {raw['model']} on {args.game}, 1 torch thread, native bfloat16: "
          f"{native_bfloat16(cpu)}; {args.precision} against float32 on the same positions: "
          f"logits within {(low[0].float() - full[0]).abs().max():.1e}, values within "
          f"{(low[1].float() - full[1]).abs().max():.1e}")
    print(f"ms {args.precision} / float32 (ratio)")
    ratios: dict[str, list[float]] = {"forward": [], "update": []}
    for i in range(args.rounds):
        for name, step, number in (("forward", act, 30),
                                   ("update", lambda p: learners[p].update(batch), 5)):
            low_ms = best_ms(lambda step=step: step(args.precision), number)
            full_ms = best_ms(lambda step=step: step("float32"), number)
            ratios[name].append(low_ms / full_ms)
            print(f"round {i + 1} {name:7s}: {low_ms:6.2f} / {full_ms:6.2f} ms "
                  f"({low_ms / full_ms:.2f})", flush=True)
    for name, values in ratios.items():
        print(f"median {name}: {args.precision} takes {statistics.median(values):.2f} of "
              "float32's time")


if __name__ == "__main__":
    main()
