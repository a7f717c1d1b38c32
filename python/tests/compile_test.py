"""torch.compile over tensor-parallel models (NOTE [distributed tensors under torch.compile] in
dtensor/_compile.py): Dynamo graph-breaks on distributed tensors, which run eagerly in the engine,
and compiles the plain code between. Each case trains on 2 shm processes (FSDP x TP: 4) and
equals one process computed in the same worker. Processes, as users run it: Dynamo does not
compile on two threads of one process at once."""

import pytest

from launch_ranks import run_on_ranks

_WORKER = r'''
import copy
import os

MODE, BACKEND = os.environ["MODE"], os.environ["COMPILE_BACKEND"]
if MODE == "dynamo imported first":
    import torch._dynamo  # noqa: F401  (before dtensor: the patch is applied at dtensor's import)

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch._dynamo.utils

import dtensor
from dtensor import Replicate, Shard
from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

DIM, HEADS, HIDDEN = 16, 4, 24


class Block(nn.Module):
    """A transformer block as torchtitan writes it: the head count is inferred (-1), so the same
    code runs on the local pieces (its heads on this rank) and on distributed tensors."""

    def __init__(self):
        super().__init__()
        self.attention_norm = nn.LayerNorm(DIM)
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.ffn_norm = nn.LayerNorm(DIM)
        self.w1 = nn.Linear(DIM, HIDDEN)
        self.w2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.attention_norm(x)
        # No generator over wq, wk and wv: Dynamo cannot resume a generator after a graph break
        # and would run the whole forward eagerly.
        q = self.wq(h).view(b, s, -1, DIM // HEADS).transpose(1, 2)
        k = self.wk(h).view(b, s, -1, DIM // HEADS).transpose(1, 2)
        v = self.wv(h).view(b, s, -1, DIM // HEADS).transpose(1, 2)
        a = torch.softmax(q @ k.transpose(-2, -1) / (DIM // HEADS) ** 0.5, dim=-1) @ v
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.w2(F.gelu(self.w1(self.ffn_norm(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(5, DIM)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.out = nn.Linear(DIM, 3)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def plan(local):
    """torchtitan's plan (the pieces between the parallel linears plain: ``local``), or one that
    keeps distributed tensors everywhere."""
    keep = {} if local else dict(use_local_output=False)
    block = {"wq": ColwiseParallel(**keep), "wk": ColwiseParallel(**keep),
             "wv": ColwiseParallel(**keep), "wo": RowwiseParallel(**keep),
             "w1": ColwiseParallel(**keep), "w2": RowwiseParallel(**keep)}
    if local:
        return {f"blocks.{i}.{k}": s for i in range(2) for k, s in block.items()}
    return {"inp": ColwiseParallel(output_layouts=Replicate(), use_local_output=False),
            **{f"blocks.{i}.{k}": s for i in range(2) for k, s in block.items()},
            "out": ColwiseParallel(output_layouts=Replicate())}


def train(model, batches):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


torch.manual_seed(0)
base = Model()
batches = [(torch.randn(2, 6, 5), torch.randn(2, 6, 3)) for _ in range(3)]
ref = copy.deepcopy(base)
ref_losses = train(ref, batches)

fsdp = MODE == "fsdp x tp"  # torchtitan's 2-D: every dp rank trains on the same batch here
if fsdp:
    from dtensor.fsdp import fully_shard

    world = dtensor.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    mesh = world["tp"]
else:
    mesh = dtensor.init_device_mesh("cpu", (2,))
model = copy.deepcopy(base)
local = MODE != "distributed everywhere"
parallelize_module(model, mesh, plan(local))
if not local:
    dtensor.distribute_module(model, mesh)  # the rest (the norms) replicated
    batches = [(dtensor.distribute_tensor(x, mesh, [Replicate()]), y) for x, y in batches]
for block in model.blocks:
    block.compile(backend=BACKEND)
    if fsdp:
        fully_shard(block, mesh=world["dp"])
if fsdp:
    fully_shard(model, mesh=world["dp"])
model.compile(backend=BACKEND)
losses = train(model, batches)

torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-5)
for (name, p), q in zip(model.named_parameters(), ref.parameters()):
    got = p.full_tensor() if isinstance(p, dtensor.DTensor) else p
    torch.testing.assert_close(got, q, rtol=1e-5, atol=1e-5, msg=name)
counters = torch._dynamo.utils.counters
breaks = [k for k in counters["graph_break"] if k.startswith("dtensor: distributed tensor")]
assert breaks, dict(counters["graph_break"])
if local:  # the plain code between the parallel linears compiled
    assert counters["stats"]["unique_graphs"] > 0, dict(counters["stats"])

# fullgraph=True: Dynamo's error, naming the distributed tensor and why.
t = dtensor.distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)])
try:
    torch.compile(lambda a: a * 2 + 1, backend=BACKEND, fullgraph=True)(t)
    raise AssertionError("fullgraph over a distributed tensor did not raise")
except torch._dynamo.exc.Unsupported as e:
    assert "dtensor: distributed tensor" in str(e) and "cannot trace" in str(e), str(e)
# Without fullgraph, a compiled function of distributed tensors equals the eager engine.
got = torch.compile(lambda a, b: (a @ b).relu() + 1, backend=BACKEND)(t, t.T)
torch.testing.assert_close(got.full_tensor(), (t @ t.T).relu().full_tensor() + 1)
assert got.placements == (t @ t.T).relu().placements
print("ok")
'''


@pytest.mark.parametrize("mode, backend, ranks", [
    ("local pieces", "inductor", 2),
    ("local pieces", "aot_eager", 2),
    ("distributed everywhere", "aot_eager", 2),
    ("dynamo imported first", "eager", 2),
    ("fsdp x tp", "aot_eager", 4),
])
def test_compiled_tensor_parallel_model_trains_like_one_process(mode, backend, ranks, tmp_path):
    """A 2-block transformer under ``parallelize_module``, each block compiled and then the whole
    model (torchtitan's order), trains 3 AdamW steps equal to one process: losses and final
    parameters. With torchtitan's plan the code between the parallel linears compiles (Dynamo
    made graphs); with distributed tensors everywhere every op runs in the engine. Guards against
    Dynamo raising "Cannot access storage of DTensorImpl" on the first distributed tensor it meets.
    "fsdp x tp": each block also fully sharded over "dp" of a 2x2 mesh (FSDP's hooks eager,
    NOTE [FSDP hooks under torch.compile])."""
    run_on_ranks(_WORKER, ranks, tmp_path, MODE=mode, COMPILE_BACKEND=backend)
