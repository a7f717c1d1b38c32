"""./x bench compile: torch.compile over a tensor-parallel model, the engine against PyTorch's
own DTensor, eager and compiled, in the same 2 processes of one run.

    ./x bench compile [--dim 256] [--heads 8] [--hidden 1024] [--batch 4] [--seq 64]
                      [--blocks 2] [--steps 10] [--reps 5] [--backend inductor]

The model: --blocks transformer blocks as torchtitan writes them (LayerNorm, attention with
q/k/v/o projections and the head count inferred, LayerNorm, GELU MLP, residuals), under
torchtitan's plan (q, k, v and the MLP's up projection ColwiseParallel, o and the down projection
RowwiseParallel, local outputs). A training step: forward on a replicated [batch, seq, dim]
input, loss = mean of the output squared, backward, SGD. Four sides from the same weights:
  dtensor          the engine (its parallelize_module), eager, on its shm backend
  dtensor_compiled the same, each block compiled (block.compile(backend=--backend)): distributed
                   tensors run eagerly in the engine, the code between compiles (NOTE
                   [distributed tensors under torch.compile])
  pytorch          torch.distributed.tensor.parallel on a Gloo group of the same processes
  pytorch_compiled the same, each block compiled (PyTorch traces its DTensor, collectives included)
Every side takes 3 warm-up steps (compilation), then --reps windows of --steps steps, the sides
interleaved; all sides take the same number of steps on the same data and must end with the same
weights (checked; a wrong answer is no benchmark). ms per step is the median of the windows; the
ratios are medians of the per-window ratios (NOTE [ratios per window]). One JSON line:
  {"bench":"compile","ranks":2,"dtensor_ms":..,"dtensor_compiled_ms":..,"pytorch_ms":..,
   "pytorch_compiled_ms":..,"ratio_compiled_to_eager":..,"pytorch_ratio_compiled_to_eager":..,
   "ratio_to_pytorch":..,"ratio_compiled_to_pytorch_compiled":..}
"""

import argparse
import copy
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import free_port, launch_self, per_call_us  # noqa: E402

SIDES = ["dtensor", "dtensor_compiled", "pytorch", "pytorch_compiled"]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="./x bench compile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--steps", type=int, default=10, help="steps per timed window")
    p.add_argument("--reps", type=int, default=5, help="timed windows per side (median)")
    p.add_argument("--backend", default="inductor", help="torch.compile backend")
    return p.parse_args(argv)


def model(args):
    import torch
    import torch.nn.functional as F
    from torch import nn

    dim, head_dim = args.dim, args.dim // args.heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm = nn.LayerNorm(dim)
            self.wq = nn.Linear(dim, dim, bias=False)
            self.wk = nn.Linear(dim, dim, bias=False)
            self.wv = nn.Linear(dim, dim, bias=False)
            self.wo = nn.Linear(dim, dim, bias=False)
            self.ffn_norm = nn.LayerNorm(dim)
            self.w1 = nn.Linear(dim, args.hidden, bias=False)
            self.w2 = nn.Linear(args.hidden, dim, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            h = self.attention_norm(x)
            q = self.wq(h).view(b, s, -1, head_dim).transpose(1, 2)
            k = self.wk(h).view(b, s, -1, head_dim).transpose(1, 2)
            v = self.wv(h).view(b, s, -1, head_dim).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.wo(a.transpose(1, 2).reshape(b, s, -1))
            return x + self.w2(F.gelu(self.w1(self.ffn_norm(x))))

    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(args.blocks)])


def plan(colwise, rowwise):
    return {"*.wq": colwise(), "*.wk": colwise(), "*.wv": colwise(), "*.wo": rowwise(),
            "*.w1": colwise(), "*.w2": rowwise()}


def body(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh as pt_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel as PTColwise
    from torch.distributed.tensor.parallel import RowwiseParallel as PTRowwise
    from torch.distributed.tensor.parallel import parallelize_module as pt_parallelize

    from dtensor import init_device_mesh
    from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['ANCHOR_PORT']}",
                            rank=rank, world_size=2)
    mesh, pmesh = init_device_mesh("cpu", (2,)), pt_mesh("cpu", (2,))
    base = model(args)
    models = {}
    for side in SIDES:
        m = copy.deepcopy(base)
        if side.startswith("dtensor"):
            parallelize_module(m, mesh, plan(ColwiseParallel, RowwiseParallel))
        else:
            pt_parallelize(m, pmesh, plan(PTColwise, PTRowwise))
        if side.endswith("compiled"):
            for block in m:
                block.compile(backend=args.backend)
        models[side] = m
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.seq, args.dim, generator=g)
    opts = {side: torch.optim.SGD(m.parameters(), lr=1e-3) for side, m in models.items()}

    def loop(side):
        m, opt = models[side], opts[side]

        def run(n):
            for _ in range(n):
                opt.zero_grad()
                m(x).pow(2).mean().backward()
                opt.step()
        return run

    loops = {side: loop(side) for side in SIDES}
    for run in loops.values():
        run(3)
    times = {side: [] for side in SIDES}
    for _ in range(args.reps):
        for side, run in loops.items():
            times[side].append(per_call_us(run, args.steps) / 1e3)
    def whole(p):  # the engine's and PyTorch's distributed tensors; the norms' plain weights
        return p.full_tensor() if hasattr(p, "placements") else p

    for side in SIDES[1:]:
        for (name, a), b in zip(models["dtensor"].named_parameters(), models[side].parameters()):
            torch.testing.assert_close(whole(b), whole(a), rtol=1e-4, atol=1e-5,
                                       msg=lambda m: f"{side} {name}: {m}")
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return

    def ratio(a, b):
        return round(statistics.median(x / y for x, y in zip(times[a], times[b])), 4)

    ms = {side: statistics.median(t) for side, t in times.items()}
    print(f"{args.blocks} transformer blocks (dim {args.dim}, {args.heads} heads, hidden "
          f"{args.hidden}), input [{args.batch}, {args.seq}, {args.dim}], TP on 2 processes, "
          f"compiled with {args.backend}; ms per training step:")
    for side in SIDES:
        print(f"  {side:18s} {ms[side]:8.2f}")
    r = {"bench": "compile", "ranks": 2, "backend": args.backend,
         **{f"{side}_ms": round(ms[side], 3) for side in SIDES},
         "ratio_compiled_to_eager": ratio("dtensor_compiled", "dtensor"),
         "pytorch_ratio_compiled_to_eager": ratio("pytorch_compiled", "pytorch"),
         "ratio_to_pytorch": ratio("dtensor", "pytorch"),
         "ratio_compiled_to_pytorch_compiled": ratio("dtensor_compiled", "pytorch_compiled")}
    print(json.dumps(r, separators=(",", ":")))


def main(argv):
    args = parse_args(argv)
    if "RANK" not in os.environ:
        # launch_self's args.backend is the engine's collectives backend: its default (shm).
        return launch_self(argv, argparse.Namespace(backend=None), __file__, 2,
                           {"ANCHOR_PORT": str(free_port())})
    import torch

    torch.set_num_threads(1)
    body(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
