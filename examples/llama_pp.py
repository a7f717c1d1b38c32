"""./x demo pp: the demo's Llama-style model split into 2 pipeline stages, each tensor parallel,
optionally data parallel with FSDP too.

    ./x run -n 4 examples/llama_pp.py [--mesh 2,2] [--steps 5] [--microbatches 4]
                                      [--schedule 1f1b|gpipe]
    ./x run -n 8 examples/llama_pp.py --mesh 2,2,2      (pp, dp, tp)
    python3 tools/launch.py -n 4 -- python3 examples/llama_pp.py --device cuda

The mesh is (pp, tp) or (pp, dp, tp): stage 0 (embedding, attention block) on the first pp
coordinate's ranks, stage 1 (MLP block, norm, head) on the second's. With dp, each stage is
also fully_shard'ed over "dp" (FSDP x TP) and each dp coordinate trains on its share of the
batch; FSDP reduces the stage's gradients once per step, at its last microbatch. Each stage is parallelized with the demo's TP
plan (examples/llama_model.py), so the activations leaving stage 0 are distributed tensors on its
tp mesh; they reach stage 1's tp mesh laid out as they left, by a cross-mesh redistribute
(dtensor.pipelining, NOTE [pipeline transfers]). Each step runs the schedule over the
microbatches; the last stage prints the loss (averaged over dp) next to one process's (the same
model unsplit, on the whole batch), and every rank prints its schedule's timeline of the last step
(forward F / backward B per microbatch, in milliseconds from the step's start), then the largest
loss difference (exit 1 when it exceeds --tol).

``--device cuda``: the meshes are CUDA meshes (NCCL, or cuda_ipc when ranks share a GPU) and the
model, the batch, the stages' transfers and the one-process reference are on each rank's GPU;
nothing else changes.
"""

import argparse
import copy
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import dtensor
from dtensor import Replicate, init_device_mesh
from dtensor import _functional_collectives as fc
from dtensor.fsdp import fully_shard
from dtensor.parallel import parallelize_module
from dtensor.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model import VOCAB, Llama, tp_plan  # noqa: E402

BATCH, SEQ = 8, 32


def causal_mask(seq, device="cpu"):
    return torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=device), 1)


class FirstStage(nn.Module):
    """Embedding and the attention block; the causal mask is made on ``device``."""

    def __init__(self, m, tp_mesh=None, device="cpu"):
        super().__init__()
        self.tok_embeddings, self.attention_norm, self.attention = (
            m.tok_embeddings, m.attention_norm, m.attention)
        self.tp_mesh, self.device = tp_mesh, device

    def forward(self, tokens):
        mask = causal_mask(tokens.shape[1], self.device)
        if self.tp_mesh is not None:  # the TP layers hand the model distributed tensors
            mask = dtensor.distribute_tensor(mask, self.tp_mesh, [Replicate()], src_data_rank=None)
        h = self.tok_embeddings(tokens)
        return h + self.attention(self.attention_norm(h), mask)


class LastStage(nn.Module):
    """The MLP block, the final norm and the head."""

    def __init__(self, m):
        super().__init__()
        self.ffn_norm, self.feed_forward, self.norm, self.output = (
            m.ffn_norm, m.feed_forward, m.norm, m.output)

    def forward(self, h):
        h = h + self.feed_forward(self.ffn_norm(h))
        return self.output(self.norm(h))


def stage_plan(stage):
    names = {n for n, _ in stage.named_modules()}
    return {k: v for k, v in tp_plan().items() if k in names}


def loss_fn(logits, targets):
    if hasattr(logits, "placements"):
        logits = logits.full_tensor()
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mesh", default="2,2", help="pp,tp or pp,dp,tp (default 2,2)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--schedule", default="1f1b", choices=("1f1b", "gpipe"))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="the meshes' device (cuda: the model, data and one-process "
                             "reference on the GPU)")
    parser.add_argument("--tol", type=float, default=1e-4,
                        help="exit 1 when a step's loss differs from one process's by more")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [int(x) for x in args.mesh.split(",")]
    if len(sizes) not in (2, 3) or sizes[0] != 2:
        raise SystemExit("./x demo pp: the demo model splits into 2 stages "
                         "(--mesh 2,TP or 2,DP,TP)")
    names = ("pp", "tp") if len(sizes) == 2 else ("pp", "dp", "tp")
    device = args.device
    mesh = init_device_mesh(device, tuple(sizes), mesh_dim_names=names)
    pp, dp = sizes[0], sizes[1] if len(sizes) == 3 else 1
    rank, stage_index = int(os.environ.get("RANK", "0")), mesh.get_coordinate()[0]
    dp_index = mesh.get_local_rank("dp") if dp > 1 else 0

    torch.manual_seed(0)
    model = Llama().to(device)
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    part = FirstStage(model, mesh["tp"], device) if stage_index == 0 else LastStage(model)
    part = parallelize_module(part, mesh["tp"], stage_plan(part))
    dtensor.distribute_module(part, mesh["tp"])  # the rest (the norms' weights) replicated
    if dp > 1:
        fully_shard(part, mesh=mesh["dp"])
    stage = PipelineStage(part, stage_index, pp, device=device, group=mesh.get_group("pp"))
    cls = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    schedule = cls(stage, args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.SGD(part.parameters(), lr=0.1)

    torch.manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ)).to(device)
    targets = torch.randint(0, VOCAB, (BATCH, SEQ)).to(device)
    rows = slice(dp_index * BATCH // dp, (dp_index + 1) * BATCH // dp)  # this dp share
    d_tokens = dtensor.distribute_tensor(tokens[rows], mesh["tp"], [Replicate()],
                                         src_data_rank=None)
    worst = 0.0
    for step in range(args.steps):
        opt.zero_grad()
        t0 = time.perf_counter()
        losses = []
        schedule.step(*((d_tokens,) if stage.is_first else ()),
                      target=targets[rows] if stage.is_last else None, losses=losses)
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        ref_opt.zero_grad()
        want = loss_fn(reference(tokens, causal_mask(SEQ, device)), targets)
        want.backward()
        ref_opt.step()
        if stage.is_last:
            got = torch.stack(losses).mean()
            if dp > 1:  # the dp shares are equal: the whole batch's loss is their mean
                got = fc.all_reduce(got, "avg", mesh["dp"]).wait()
            got = got.item()
            worst = max(worst, abs(got - want.item()))
            if mesh.get_local_rank("tp") == 0 and dp_index == 0:
                print(f"step {step}: loss {got:.6f} (one process: {want.item():.6f}), "
                      f"{ms:.1f} ms", flush=True)
    start = schedule.timeline[0][3] if schedule.timeline else 0.0
    line = " ".join(f"{kind}{mb}@{(t0 - start) * 1e3:.1f}-{(t1 - start) * 1e3:.1f}"
                    for _, kind, mb, t0, t1 in schedule.timeline)
    print(f"rank {rank} (stage {stage_index}) timeline, ms: {line}", flush=True)
    if stage.is_last and mesh.get_local_rank("tp") == 0 and dp_index == 0:
        label = f"pp={pp} x " + (f"dp={dp} x " if dp > 1 else "") + f"tp={sizes[-1]}"
        verdict = "equal" if worst <= args.tol else "DIFFERENT"
        print(f"{label} on {device}: largest |loss diff| vs one process {worst:.2e} (tolerance "
              f"{args.tol:g}): {verdict}", flush=True)
    if worst > args.tol:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
