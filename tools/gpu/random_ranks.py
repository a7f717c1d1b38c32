"""Random ops on distributed tensors across ranks against one device's draw (NOTE [DTensor random];
on a CUDA mesh NOTE [random on a CUDA mesh]: every rank draws the global tensor from its GPU's
generator in one call and keeps its box). Run by tools/gpu/check.sh (stage random) on 2 processes
sharing the GPU (cuda_ipc):
    python3 tools/launch.py -n 2 -- python3 tools/gpu/random_ranks.py cuda
and runnable on CPU ranks (`... random_ranks.py cpu`, shm) to check the script itself. For uneven
shapes, Shard on either dim and Replicate, each op's full_tensor() must equal the same op on one
device of that type after the same seed, bit for bit, and the generator must end where one
device's does (the next plain draw agrees). Rank 0 prints one summary line; exits 1 on a mismatch.
"""

import sys

import torch
import torch.nn.functional as F

import dtensor
from dtensor import Replicate, Shard, distribute_tensor, init_device_mesh


def main():
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    world = int(__import__("os").environ["WORLD_SIZE"])
    mesh = init_device_mesh(device, (world,))
    on = torch.device(device, torch.cuda.current_device()) if device == "cuda" else "cpu"
    rank = mesh.get_rank()
    factories = {"rand": torch.rand, "randn": torch.randn}
    ops = {"uniform_": lambda t: t.uniform_(-1, 2), "normal_": lambda t: t.normal_(0.5, 2),
           "bernoulli_": lambda t: t.bernoulli_(0.3), "rand_like": torch.rand_like,
           "randn_like": torch.randn_like,
           "dropout": lambda t: F.dropout(t, 0.25, training=True),
           # a transposed (dense) and a strided (gapped) global tensor: CUDA's kernel draws the
           # first in memory order when its element count is even, else by logical index
           "dropout_t": lambda t: F.dropout(t.t(), 0.25, training=True),
           "dropout_strided": lambda t: F.dropout(t[:, ::2], 0.25, training=True)}
    cases = bad = 0
    for shape in ((7, 5), (8, 6), (3, 11)):
        base = torch.arange(shape[0] * shape[1], dtype=torch.float32).view(shape).to(on) / 7 + 1
        for placements in ([Shard(0)], [Shard(1)], [Replicate()]):
            for name in list(factories) + list(ops):
                seed = 1000 + cases
                torch.manual_seed(seed)
                if name in factories:
                    want = factories[name](*shape, device=on)
                else:
                    want = ops[name](base.clone())
                want_next = torch.rand(4, device=on)
                torch.manual_seed(seed)  # a process per rank: the process generators
                if name in factories:
                    got = getattr(dtensor, name)(*shape, device_mesh=mesh, placements=placements)
                else:
                    got = ops[name](distribute_tensor(base, mesh, placements))
                got = got.full_tensor()
                got_next = torch.rand(4, device=on)
                cases += 1
                if not (torch.equal(got, want) and torch.equal(got_next, want_next)):
                    bad += 1
                    if rank == 0:
                        print(f"MISMATCH {name} {tuple(shape)} {placements}: max |diff| "
                              f"{(got - want).abs().max().item():.3g}, next draw equal "
                              f"{torch.equal(got_next, want_next)}", flush=True)
    if rank == 0:
        print(f"random ops on {world} {device} ranks: {cases - bad} of {cases} cases equal one "
              f"device's", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
