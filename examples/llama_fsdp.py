"""./x demo fsdp: the demo's Llama-style model trained with FSDP on N ranks, then with FSDP x TP
on a (dp, tp) mesh, each against one process trained on the whole batch.

    ./x run -n 4 examples/llama_fsdp.py [--steps 5] [--tp 2] [--tol 1e-4]

FSDP (dtensor.fsdp.fully_shard, PyTorch's FSDP2 API): fully_shard on the attention, the MLP and
then the root (three parameter groups); every parameter becomes a Shard(0) distributed tensor on
the data-parallel mesh, gathered per group around forward and backward; gradients are
reduce-scattered into shards. Each rank trains on its slice of the batch (data parallelism), so
the mean of the ranks' losses is the loss of one process on the whole batch, step by step, with
AdamW.

FSDP x TP (torchtitan's 2-D recipe): parallelize_module with the demo's tensor-parallel plan on
the "tp" dim of a (dp, tp) mesh, then fully_shard on its "dp" dim.

Rank 0 prints both losses per step, the collectives of one step, and the training state each
rank holds (parameters, gradients and AdamW's two moments) against one process's.
"""

import argparse
import copy
import os
import sys
import time

import torch
import torch.nn.functional as F

import dtensor
from dtensor import DTensor, Replicate, Shard, init_device_mesh
from dtensor.debug import CommDebugMode
from dtensor.fsdp import fully_shard
from dtensor.parallel import parallelize_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model import VOCAB, Llama, tp_plan  # noqa: E402

SEQ = 32


def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def state_bytes(model, opt):
    """Bytes of this rank's pieces of the parameters, their gradients and the optimizer state."""
    total = 0
    for p in model.parameters():
        total += _local(p).numel() * _local(p).element_size()
        if p.grad is not None:
            total += _local(p.grad).numel() * _local(p.grad).element_size()
        for v in opt.state.get(p, {}).values():
            if torch.is_tensor(v) and v.dim() > 0:
                total += _local(v).numel() * _local(v).element_size()
    return total


def mean_over(value, mesh):
    """The mean of one float per rank of the 1-D `mesh` (every rank gets it)."""
    piece = torch.tensor([value], dtype=torch.float64)
    return DTensor.from_local(piece, mesh, [Shard(0)]).full_tensor().mean().item()


def train(kind, model, mesh_dp, tokens, targets, mask, steps, single, rank, tol):
    """Trains `model` (already sharded) on this data-parallel rank's slice; rank 0 trains
    `single` on the whole batch. Returns the largest |loss difference| (rank 0)."""
    dp, dp_rank = mesh_dp.size(), mesh_dp.get_local_rank()
    rows = tokens.shape[0] // dp
    mine = slice(dp_rank * rows, (dp_rank + 1) * rows)
    x, y = tokens[mine], targets[mine]
    tp_mesh = getattr(model, "_demo_tp_mesh", None)
    if tp_mesh is not None:  # FSDP x TP: the inputs are replicated on the "tp" dim
        x, y, m = (dtensor.distribute_tensor(t, tp_mesh, [Replicate()], src_data_rank=None)
                   for t in (x, y, mask))
    else:
        m = mask
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    single_opt = torch.optim.AdamW(single.parameters(), lr=1e-2)
    if rank == 0:
        print(f"{'step':>4} {'loss (' + kind + ')':>16} {'loss (1 proc)':>14} {'|diff|':>9} "
              f"{'ms/step':>8}", flush=True)
    worst, counts = 0.0, None
    for step in range(steps):
        t0 = time.perf_counter()
        with CommDebugMode() as comm:
            opt.zero_grad()
            loss = F.cross_entropy(model(x, m).reshape(-1, VOCAB), y.reshape(-1))
            loss.backward()
            opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        if step == 0:
            counts = {k: v for k, v in comm.get_comm_counts().items() if v}
        value = loss.full_tensor().item() if isinstance(loss, DTensor) else loss.item()
        got = mean_over(value, mesh_dp)
        if rank == 0:
            single_opt.zero_grad()
            one = F.cross_entropy(single(tokens, mask).reshape(-1, VOCAB), targets.reshape(-1))
            one.backward()
            single_opt.step()
            worst = max(worst, abs(got - one.item()))
            print(f"{step:>4} {got:>16.6f} {one.item():>14.6f} {abs(got - one.item()):>9.2e} "
                  f"{ms:>8.1f}", flush=True)
    mine_bytes = state_bytes(model, opt)
    if rank == 0:
        one_bytes = state_bytes(single, single_opt)
        print(f"collectives of one step on rank 0: {counts}", flush=True)
        print(f"training state per rank (parameters, gradients, AdamW moments): "
              f"{mine_bytes / 1024:.0f} KiB; one process: {one_bytes / 1024:.0f} KiB "
              f"({mine_bytes / one_bytes:.2f}x)", flush=True)
        verdict = "equal" if worst <= tol else "DIFFERENT"
        print(f"{kind}: largest |loss diff| vs one process {worst:.2e} (tolerance {tol:g}): "
              f"{verdict}\n", flush=True)
    return worst


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--tp", type=int, default=2, help="the tp size of the 2-D run (0: skip)")
    parser.add_argument("--tol", type=float, default=1e-4,
                        help="exit 1 when a step's loss differs from one process's by more")
    args = parser.parse_args()

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(0)
    base = Llama()
    tokens = torch.randint(0, VOCAB, (max(4, world), SEQ))
    targets = torch.roll(tokens, -1, dims=1)
    mask = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
    n_params = sum(p.numel() for p in base.parameters())
    worst = 0.0

    # FSDP on every rank.
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    rank = mesh.get_rank()
    if rank == 0:
        print(f"Llama-style block, {n_params / 1e6:.2f}M parameters, batch {tokens.shape[0]}x"
              f"{SEQ}, AdamW\n\nFSDP on {world} ranks (fully_shard: attention, feed_forward, "
              f"root)", flush=True)
    model = copy.deepcopy(base)
    for sub in (model.attention, model.feed_forward, model):
        fully_shard(sub, mesh=mesh)
    worst = max(worst, train("FSDP", model, mesh, tokens, targets, mask, args.steps,
                             copy.deepcopy(base), rank, args.tol))

    # FSDP x TP on (dp, tp).
    if args.tp > 1 and world % args.tp == 0 and world > args.tp:
        dp = world // args.tp
        mesh2 = init_device_mesh("cpu", (dp, args.tp), mesh_dim_names=("dp", "tp"))
        if rank == 0:
            print(f"FSDP x TP on a ({dp}, {args.tp}) mesh: parallelize_module on 'tp', then "
                  f"fully_shard on 'dp'", flush=True)
        model = copy.deepcopy(base)
        parallelize_module(model, mesh2["tp"], tp_plan())
        dtensor.distribute_module(model, mesh2["tp"])  # the norms' weights replicated on tp
        for sub in (model.attention, model.feed_forward, model):
            fully_shard(sub, mesh=mesh2["dp"])
        model._demo_tp_mesh = mesh2["tp"]
        if rank == 0:
            w = model.feed_forward.w1.weight
            print(f"feed_forward.w1.weight: {tuple(w.shape)} placed {w.placements} on "
                  f"{tuple(w.device_mesh.mesh_dim_names)}", flush=True)
        worst = max(worst, train("FSDPxTP", model, mesh2["dp"], tokens, targets, mask,
                                 args.steps, copy.deepcopy(base), rank, args.tol))
    if rank == 0 and worst > args.tol:
        sys.exit(1)


if __name__ == "__main__":
    main()
