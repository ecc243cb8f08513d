"""A zmqrl actor written against docs/protocol.md alone: pyzmq, msgpack, numpy, gymnasium.

It connects a DEALER to an inference broker's ``policy`` port, sends one ``step`` per
vector step (observations plus the rewards/dones of the previous actions), applies the
``act`` reply, and exits 0 after STEPS round trips.

    python examples/plain_actor.py ipc:///path/to/ipc/broker-0-policy 8 1000
"""

from __future__ import annotations

import argparse
import sys

import gymnasium as gym
import msgpack
import numpy as np
import zmq

INLINE_MAX_BYTES = 16 * 1024  # a sender's choice; receivers accept both forms


def encode(msg_type: str, arrays: dict[str, np.ndarray], **fields) -> list[bytes]:
    specs, frames = [], []
    for name, arr in arrays.items():
        arr = np.asarray(arr, arr.dtype.newbyteorder("<"))  # little-endian; tobytes is C order
        if arr.nbytes <= INLINE_MAX_BYTES:
            specs.append([name, arr.dtype.name, list(arr.shape), arr.tobytes()])
        else:
            specs.append([name, arr.dtype.name, list(arr.shape)])
            frames.append(arr.tobytes())
    header = {"v": 1, "t": msg_type, **fields, "arrays": specs}
    return [msgpack.packb(header, use_bin_type=True), *frames]


def decode(frames: list[bytes]) -> tuple[str, dict, dict[str, np.ndarray]]:
    header = msgpack.unpackb(frames[0], raw=False)
    if not isinstance(header, dict) or header.get("v") != 1:
        raise ValueError(f"not a version-1 message: {header!r:.80}")
    rest = iter(frames[1:])
    arrays = {}
    for name, dtype, shape, *inline in header.get("arrays", []):
        data = inline[0] if inline else next(rest)
        arrays[name] = np.frombuffer(data, np.dtype(dtype).newbyteorder("<")).reshape(shape)
    fields = {k: v for k, v in header.items() if k not in ("v", "t", "arrays")}
    return header["t"], fields, arrays


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("address", help="the broker's policy port, e.g. ipc://.../broker-0-policy")
    p.add_argument("envs", type=int, help="environments stepped together")
    p.add_argument("steps", type=int, help="step/act round trips before exiting")
    p.add_argument("--env", default="CartPole-v1", help="must match the broker's topology")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for a reply")
    args = p.parse_args()

    env = gym.make_vec(args.env, num_envs=args.envs, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    obs, _ = env.reset(seed=0)
    reward = np.zeros(args.envs, np.float32)  # nothing happened yet: zeros / False
    done = np.zeros(args.envs, np.bool_)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(args.address)

    steps = 0
    for seq in range(1, args.steps + 1):
        sock.send_multipart(encode("step", {"obs": obs.astype(np.float32), "reward": reward,
                                            "done": done}, seq=seq))
        if not sock.poll(int(args.timeout * 1000)):
            print(f"plain_actor: no reply to step {seq} within {args.timeout}s", file=sys.stderr)
            return 1
        msg_type, fields, arrays = decode(sock.recv_multipart())
        if msg_type == "error":
            print(f"plain_actor: broker rejected step {seq}: {fields.get('error')}",
                  file=sys.stderr)
            return 1
        if msg_type != "act" or fields.get("seq") != seq:
            print(f"plain_actor: unexpected reply {msg_type} {fields}", file=sys.stderr)
            return 1
        obs, r, terminated, truncated, _ = env.step(arrays["action"])
        reward, done = r.astype(np.float32), terminated | truncated
        steps += 1
    print(f"plain_actor: steps={steps} env_steps={steps * args.envs}")
    sock.close()
    env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
