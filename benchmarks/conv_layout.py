"""pv_conv's activation layout: channels-last (what its forward does) against plain NCHW.

    python benchmarks/conv_layout.py [--game connect_four] [--rounds 5]

One process, one torch thread (as the broker and the learner run), the same weights:
the forward pass at a batch the inference broker makes in the connect-four topology
(~186 positions) and the learner's training step (batch 256, Adam), each timed with the
net as it is (channels-last activations) and with the same layers applied to plain
NCHW tensors, alternating for ``--rounds`` rounds. Prints each round's ratio and the
median: this machine drifts by tens of percent between runs, a ratio within one holds.
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from collections.abc import Callable

import torch

from zmqrl.parts.envs import env_spec
from zmqrl.parts.games import env_id
from zmqrl.parts.models import build_model


def plain(model: torch.nn.Module, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The net's layers on NCHW tensors: its forward without the layout switch."""
    x = model.blocks(model.stem(obs))
    return model.policy(x), torch.tanh(model.value(x)).squeeze(-1)


def best_ms(fn: Callable[[], object], number: int) -> float:
    fn()
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default="connect_four")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--act-batch", type=int, default=186)
    parser.add_argument("--train-batch", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = env_spec({"id": env_id(args.game)})
    model = build_model({"kind": "pv_conv", "hidden": 64}, spec, seed=0)
    acting = torch.rand(args.act_batch, *spec.obs_shape)
    training = torch.rand(args.train_batch, *spec.obs_shape)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    Forward = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

    def act(forward: Forward) -> None:
        with torch.inference_mode():
            forward(acting)

    def train(forward: Forward) -> None:
        logits, value = forward(training)
        (logits.logsumexp(-1).mean() + value.square().mean()).backward()
        optimizer.step()
        optimizer.zero_grad()

    ratios: dict[str, list[float]] = {"forward": [], "training step": []}
    print(f"pv_conv on {args.game} {spec.obs_shape}, 1 torch thread; ms channels-last / "
          "NCHW (ratio)")
    for i in range(args.rounds):
        for name, step, number in (("forward", act, 50), ("training step", train, 10)):
            last = best_ms(lambda step=step: step(model), number)
            nchw = best_ms(lambda step=step: step(lambda obs: plain(model, obs)), number)
            ratios[name].append(last / nchw)
            print(f"round {i + 1} {name:13s}: {last:6.2f} / {nchw:6.2f} ms "
                  f"({last / nchw:.2f})", flush=True)
    for name, values in ratios.items():
        print(f"median {name}: channels-last takes {statistics.median(values):.2f} of NCHW's time")


if __name__ == "__main__":
    main()
