"""./x demo cp: the demo's Llama-style model trained with context parallelism (ring attention) on
N ranks, on a sequence 4x the demo's, against one process trained on the whole sequence; then
the same composed with FSDP and tensor parallelism on a 3-D mesh.

    ./x run -n 4 examples/llama_cp.py [--steps 5] [--seq 128] [--rotate allgather|alltoall]
                                      [--tol 1e-5]
    ./x run -n 8 examples/llama_cp.py --mesh 2,2,2       (dp, cp, tp)
    python3 tools/launch.py -n 4 -- python3 examples/llama_cp.py --device cuda

The model is examples/llama_model.py's with its attention calling
F.scaled_dot_product_attention(is_causal=True) instead of an explicit mask (CausalLlama below;
the weights are the demo's, drawn from the same seed), and rotary tables taken at the positions
the model is given. Inside
``context_parallel(mesh["cp"], buffers=[tokens, targets, positions], buffer_seq_dims=[1, 1, 1])``
each rank holds its pieces of the sequence (head-tail: chunks r and 2N-1-r of 2N), so its rotary
positions are the global ones and SDPA runs ring attention over the cp ranks. Each rank's loss is
its tokens' summed cross entropy / all tokens of the batch; the sum over ranks (one all_reduce)
is the loss of the whole batch.

``--mesh dp,cp,tp`` (default 1,N,1):
* cp only: the parameters are plain and replicated: their gradients are summed over the cp ranks
  (the engine's functional all_reduce; PyTorch's CP users get this from FSDP/DDP) before AdamW's
  step.
* otherwise each dp coordinate trains on its rows of the batch; the attention's and the MLP's
  linears are parallelize_module'd on "tp" (colwise q/k/v, w1, w3; rowwise o, w2; the heads are
  inferred, so SDPA gets this rank's heads as plain pieces), and fully_shard shards the model
  over the dp x cp ranks as torchtitan's dp_shard x cp, its reduce-scatter summing the gradients
  over dp and cp (gradient divide factor 1: the loss is already divided by all tokens). FSDP over
  TP finds its data-parallel dim by name in the root of the TP mesh, so the (dp_cp, tp) mesh is
  made as a mesh of its own over the same ranks; its groups are the 3-D mesh's (groups are named
  by their ranks).
Either way every step's loss is one process's.

Rank 0 prints both losses per step (exit 1 when they differ by more than --tol) and the peak CPU
tensor memory a training step adds per rank (NOTE [CPU memory meter]; from the second step on,
when AdamW's state exists) next to one process's.

``--device cuda``: the meshes are CUDA meshes (NCCL, or cuda_ipc when ranks share a GPU), the
model, the batch and the one-process reference are on each rank's GPU (ring attention's blocks
then take its explicit path, NOTE [ring attention blocks]), and the memory is the CUDA caching
allocator's peak (torch.cuda.max_memory_allocated) instead of the CPU meter's.
"""

import argparse
import copy
import os
import sys
import time

import torch
import torch.nn.functional as F

import dtensor
from dtensor import _C
from dtensor import _functional_collectives as fc
from dtensor.experimental import context_parallel, set_rotate_method
from dtensor.fsdp import FSDPModule, fully_shard
from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model import HEADS, VOCAB, Attention, Llama, rope_tables, rotate_half  # noqa: E402

BATCH, DEMO_SEQ = 4, 32  # examples/llama_train.py's batch


class CausalAttention(Attention):
    """Attention with the demo's weights through F.scaled_dot_product_attention(is_causal=True)
    (what context_parallel turns into ring attention); ``positions`` [B, S] are the tokens'
    global positions (rotary tables are indexed by them). The head count is inferred, so the
    same code runs on a TP rank's heads."""

    def forward(self, x, positions):
        b, s, d = x.shape
        hd = d // HEADS
        q, k, v = (w(x).view(b, s, -1, hd).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        cos, sin = (t.to(positions.device) for t in
                    rope_tables(int(positions.max()) + 1 if positions.numel() else 1, hd))
        cos, sin = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)  # [B, 1, S, hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class CausalLlama(Llama):
    """The demo's model (same weights for the same seed) with CausalAttention; forward takes the
    tokens and their positions."""

    def __init__(self):
        super().__init__()
        causal = CausalAttention()
        causal.load_state_dict(self.attention.state_dict())
        self.attention = causal

    def forward(self, tokens, positions):
        h = self.tok_embeddings(tokens)
        h = h + self.attention(self.attention_norm(h), positions)
        h = h + self.feed_forward(self.ffn_norm(h))
        return self.output(self.norm(h))


def step_loss(model, tokens, targets, positions, total_tokens):
    """This rank's summed cross entropy / all tokens of the batch (backward run)."""
    logits = model(tokens, positions)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1),
                           reduction="sum") / total_tokens
    loss.backward()
    return loss.detach()


TP_PLAN = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
           "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
           "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
           "feed_forward.w2": RowwiseParallel()}


def parallelize(base, dp, cp, tp, device):
    """This rank's model, the mesh of its sequence pieces ("cp"), the group its losses and
    gradients are summed over (None: FSDP sums the gradients) and this rank's rows of the
    batch (the module docstring's two cases); the meshes are ``device``'s."""
    model = copy.deepcopy(base)
    if dp == 1 and tp == 1:
        mesh = dtensor.init_device_mesh(device, (cp,), mesh_dim_names=("cp",))
        return model, mesh, mesh, slice(None)
    world = dtensor.init_device_mesh(device, (dp, cp, tp), mesh_dim_names=("dp", "cp", "tp"))
    fsdp_tp = dtensor.init_device_mesh(device, (dp * cp, tp), mesh_dim_names=("dp_cp", "tp"))
    if tp > 1:
        parallelize_module(model, fsdp_tp["tp"], TP_PLAN)
    fully_shard(model, mesh=fsdp_tp["dp_cp"])
    model.set_gradient_divide_factor(1.0)
    d = world.get_local_rank("dp")
    return model, world["cp"], fsdp_tp["dp_cp"], slice(d * BATCH // dp, (d + 1) * BATCH // dp)


def sum_grads(model, mesh):
    """Plain replicated parameters: their gradients summed over ``mesh`` (one all_reduce)."""
    grads = [p.grad for p in model.parameters()]
    flat = fc.all_reduce(torch.cat([gr.reshape(-1) for gr in grads]), "sum", group=mesh).wait()
    offset = 0
    for gr in grads:
        gr.copy_(flat[offset:offset + gr.numel()].view_as(gr))
        offset += gr.numel()


class Meter:
    """Tensor memory of this process on ``device``: the bytes live now and the peak since
    ``reset`` (CPU: NOTE [CPU memory meter], installed before any tensor; CUDA: the caching
    allocator's counters of the current device)."""

    def __init__(self, device):
        self.cuda = device == "cuda"
        if not self.cuda:
            _C.install_cpu_memory_meter()

    def reset(self):
        """Starts a new peak; returns the bytes live now."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return torch.cuda.memory_allocated()
        _C.reset_cpu_peak_bytes()
        return _C.cpu_live_bytes()

    def peak(self):
        return torch.cuda.max_memory_allocated() if self.cuda else _C.cpu_peak_bytes()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seq", type=int, default=4 * DEMO_SEQ,
                        help="sequence length (default: 4x the demo's %d)" % DEMO_SEQ)
    parser.add_argument("--mesh", default=None,
                        help="dp,cp,tp (default: 1,N,1, context parallel on every rank)")
    parser.add_argument("--rotate", default="allgather", choices=("allgather", "alltoall"))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="the meshes' device (cuda: the model, data and one-process "
                             "reference on the GPU)")
    parser.add_argument("--tol", type=float, default=1e-5,
                        help="exit 1 when a step's loss differs from one process's by more")
    args = parser.parse_args()

    device = args.device
    meter = Meter(device)  # before any tensor
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    sizes = [1, world, 1] if args.mesh is None else [int(x) for x in args.mesh.split(",")]
    if len(sizes) != 3 or sizes[0] * sizes[1] * sizes[2] != world:
        sys.exit(f"llama_cp: --mesh dp,cp,tp whose product is the {world} processes, got "
                 f"{args.mesh}")
    dp, cp, tp = sizes
    set_rotate_method(args.rotate)
    torch.manual_seed(0)
    base = CausalLlama().to(device)
    model, cp_mesh, sum_mesh, rows = parallelize(base, dp, cp, tp, device)
    rank = cp_mesh.get_rank()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, args.seq), generator=g).to(device)
    targets = torch.roll(tokens, -1, dims=1)
    positions = torch.arange(args.seq, device=device).expand(BATCH, -1).contiguous()
    total = tokens.numel()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    single = copy.deepcopy(base) if rank == 0 else None
    single_opt = torch.optim.AdamW(single.parameters(), lr=1e-2) if rank == 0 else None
    label = "context parallel" if dp == tp == 1 else f"dp={dp} x cp={cp} x tp={tp}"
    if rank == 0:
        n_params = sum(p.numel() for p in base.parameters())
        how = (f"context parallel on {world} ranks" if dp == tp == 1 else
               f"{label} on {world} ranks (FSDP over dp x cp, TP on tp, context parallel on cp)")
        print(f"Llama-style block (causal SDPA), {n_params / 1e6:.2f}M parameters, batch "
              f"{BATCH}x{args.seq} (4x the demo's {DEMO_SEQ} when --seq is left), AdamW; {how} "
              f"(head-tail load balance, rotate {args.rotate})\n", flush=True)
        print(f"{'step':>4} {'loss (cp)':>12} {'loss (1 proc)':>14} {'|diff|':>9} "
              f"{'ms/step (cp)':>13} {'ms (1 proc)':>12}", flush=True)
    worst, cp_peak, one_peak = 0.0, 0, 0
    for step in range(args.steps):
        live = meter.reset()
        t0 = time.perf_counter()
        opt.zero_grad()
        bufs = [t[rows].clone() for t in (tokens, targets, positions)]
        with context_parallel(cp_mesh, buffers=bufs, buffer_seq_dims=[1, 1, 1],
                              no_restore_buffers=set(bufs)):
            piece = step_loss(model, *bufs, total)
        if not isinstance(model, FSDPModule):
            sum_grads(model, sum_mesh)
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        if step >= min(1, args.steps - 1):  # from the second step on: AdamW's state exists
            cp_peak = max(cp_peak, meter.peak() - live)
        loss = fc.all_reduce(piece.reshape(1).double(), "sum", group=sum_mesh).wait().item()
        if rank == 0:
            live = meter.reset()
            t0 = time.perf_counter()
            single_opt.zero_grad()
            one = step_loss(single, tokens, targets, positions, total).item()
            single_opt.step()
            one_ms = (time.perf_counter() - t0) * 1e3
            if step >= min(1, args.steps - 1):
                one_peak = max(one_peak, meter.peak() - live)
            worst = max(worst, abs(loss - one))
            print(f"{step:>4} {loss:>12.7f} {one:>14.7f} {abs(loss - one):>9.2e} {ms:>13.1f} "
                  f"{one_ms:>12.1f}", flush=True)
    everyone = dtensor.init_device_mesh(device, (world,))
    peaks = fc.all_gather_tensor(torch.tensor([float(cp_peak)], device=device), 0,
                                 group=everyone).wait()
    if rank == 0:
        kib = ", ".join(f"{p / 1024:.0f}" for p in peaks.tolist())
        what = "CUDA memory (caching allocator)" if meter.cuda else "CPU tensor memory"
        print(f"\npeak {what} a training step adds (KiB) per rank: {kib}; one process "
              f"on the whole sequence: {one_peak / 1024:.0f} "
              f"({max(peaks.tolist()) / one_peak:.2f}x)", flush=True)
        verdict = "equal" if worst <= args.tol else "DIFFERENT"
        print(f"{label} on {device}: largest |loss diff| vs one process {worst:.2e} (tolerance "
              f"{args.tol:g}): {verdict}", flush=True)
        if worst > args.tol:
            sys.exit(1)


if __name__ == "__main__":
    main()
