"""./x demo: tensor-parallel training of a small Llama-style model on N local ranks.

    ./x run -n 4 examples/llama_train.py [--mesh 4|2,2] [--steps 5] [--save DIR]

Every rank builds the same model (examples/llama_model.py, seeded), parallelizes it with
parallelize_module (ColwiseParallel for q/k/v and the MLP's up/gate projections, RowwiseParallel for
the output and down projections, the embedding row-wise, the head column-wise) and trains a few SGD
steps on the same batch. Rank 0 also trains an unparallelized copy on one device and prints both
losses per step, the time per step, and the collectives of one step. The model code is plain
PyTorch: the parallel layers hand distributed tensors to it (use_local_output=False), and the engine
shards every op. At the end every rank saves the trained model with dtensor.checkpoint (--save,
default out/checkpoints/llama in the repository); README's "Checkpoints" shows how to load it on
another number of ranks or into one process.
"""

import argparse
import copy
import os
import sys
import time

import torch
import torch.nn.functional as F

import dtensor
from dtensor import Replicate, init_device_mesh
from dtensor.debug import CommDebugMode
from dtensor.parallel import parallelize_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model import DIM, HEADS, HIDDEN, VOCAB, Llama, tp_plan  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, SEQ = 4, 32


def train_step(model, opt, tokens, targets, mask):
    opt.zero_grad()
    logits = model(tokens, mask)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    loss.backward()
    opt.step()
    return loss


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mesh", default="", help="mesh shape, e.g. 4 or 2,2 (default: world)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="the mesh's device (cuda: the model, data and one-device copy on "
                             "the GPU)")
    parser.add_argument("--tol", type=float, default=None,
                        help="exit 1 when a step's TP loss differs from one device's by more")
    parser.add_argument("--save", default=os.path.join(REPO, "out", "checkpoints", "llama"),
                        help="directory to save the trained model into (dtensor.checkpoint)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Llama().to(args.device)
    single = copy.deepcopy(model)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ)).to(args.device)
    targets = torch.roll(tokens, -1, dims=1)
    mask = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1).to(args.device)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    shape = tuple(int(x) for x in args.mesh.split(",")) if args.mesh else (world,)
    mesh = init_device_mesh(args.device, shape, mesh_dim_names=("dp", "tp")[-len(shape):])
    rank = mesh.get_rank()
    parallelize_module(model, mesh, tp_plan())
    dtensor.distribute_module(model, mesh)  # the rest (the norms' weights) replicated
    rep = [Replicate()] * mesh.ndim
    d_tokens = dtensor.distribute_tensor(tokens, mesh, rep, src_data_rank=None)
    d_targets = dtensor.distribute_tensor(targets, mesh, rep, src_data_rank=None)
    d_mask = dtensor.distribute_tensor(mask, mesh, rep, src_data_rank=None)

    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    single_opt = torch.optim.SGD(single.parameters(), lr=0.5)
    if rank == 0:
        n_params = sum(p.numel() for p in single.parameters())
        print(f"Llama-style block: vocab {VOCAB}, dim {DIM}, {HEADS} heads, hidden {HIDDEN}, "
              f"{n_params / 1e6:.2f}M parameters; batch {BATCH}x{SEQ}; mesh {shape} "
              f"({world} ranks)", flush=True)
        print(f"{'step':>4} {'loss (TP)':>12} {'loss (1 proc)':>14} {'|diff|':>9} "
              f"{'ms/step TP':>11} {'ms/step 1 proc':>15}", flush=True)
    counts = None
    worst = 0.0
    for step in range(args.steps):
        t0 = time.perf_counter()
        with CommDebugMode() as comm:
            loss = train_step(model, opt, d_tokens, d_targets, d_mask)
            tp_loss = loss.full_tensor().item()
        tp_ms = (time.perf_counter() - t0) * 1e3
        if step == 0:
            counts = comm.get_comm_counts()
        if rank == 0:
            t1 = time.perf_counter()
            one = train_step(single, single_opt, tokens, targets, mask).item()
            one_ms = (time.perf_counter() - t1) * 1e3
            worst = max(worst, abs(tp_loss - one))
            print(f"{step:>4} {tp_loss:>12.6f} {one:>14.6f} {abs(tp_loss - one):>9.2e} "
                  f"{tp_ms:>11.1f} {one_ms:>15.1f}", flush=True)
    if rank == 0:
        print(f"collectives of one training step on rank 0: {counts}", flush=True)
        if args.tol is not None:
            verdict = "equal" if worst <= args.tol else "DIFFERENT"
            print(f"loss vs one device: largest |diff| {worst:.2e} (tolerance {args.tol:g}): "
                  f"{verdict}", flush=True)
            if worst > args.tol:
                sys.exit(1)
    # The model's state dict as it is (no prefix): its keys are the module's parameter names, so
    # it loads with dtensor.checkpoint.load(model.state_dict(), ...) into any layout.
    dtensor.checkpoint.save(model.state_dict(), checkpoint_id=args.save)
    if rank == 0:
        print(f"saved the trained model to {args.save} (dtensor.checkpoint)", flush=True)


if __name__ == "__main__":
    main()
