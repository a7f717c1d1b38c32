"""FLOPs per rank of tensor-parallel training steps (NOTE [compute in the cost model], NOTE [FLOP
counter]): on 2 and 4 processes, the matmul FLOPs each rank runs in bench/python_bench.py's
linear_step and in the demo's TP training step (examples/llama_train.py's model and plan) are at
most 1.05 x one process's FLOPs / TP degree, and each loss equals one process's. Counted with
dtensor.debug.FlopCounterMode (deterministic, from shapes). Each rank prints its figures as one
JSON line {"bench":"tp_flops",...}; the test prints rank 0's."""

import json
import os

import pytest

from launch_ranks import run_on_ranks

TARGET = 1.05  # per-rank matmul FLOPs <= TARGET x single-process FLOPs / TP degree

WORKER = r'''
import copy
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

import dtensor
from dtensor import Replicate, Shard, distribute_tensor, init_device_mesh
from dtensor.debug import FlopCounterMode
from dtensor.parallel import parallelize_module

sys.path.insert(0, os.environ["LLAMA_DIR"])
from llama_model import VOCAB, Llama, tp_plan  # noqa: E402

TARGET = float(os.environ["FLOPS_TARGET"])
MATMUL = {"mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "addbmm", "addr"}


def matmul_flops(counter):
    return sum(n for op, n in counter.get_flop_counts()["Global"].items()
               if op.__name__.split(".")[-1] in MATMUL)


def counted(step):
    with FlopCounterMode(display=False) as counter:
        loss = step()
    return loss, matmul_flops(counter)


torch.set_num_threads(1)
mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
n, rank = mesh.size(), mesh.get_rank()
lines = []


def report(name, single, per_rank, loss, single_loss):
    ratio = per_rank / (single / n)
    lines.append(json.dumps(dict(bench="tp_flops", step=name, ranks=n, rank=rank,
                                 single_flops=single, per_rank_flops=per_rank,
                                 ratio=round(ratio, 4), loss=loss, single_loss=single_loss)))
    assert ratio <= TARGET, lines[-1]
    assert abs(loss - single_loss) <= 1e-4 * max(1.0, abs(single_loss)), lines[-1]


# linear_step, as bench/python_bench.py: nn.Linear(256, 256), weight and bias S(0), input [B,256]
# replicated; zero_grad, loss = out.sum(), backward, SGD step.
torch.manual_seed(0)
ref = nn.Linear(256, 256)
x = torch.randn(32, 256)
dmod = copy.deepcopy(ref)
dmod.weight = nn.Parameter(distribute_tensor(ref.weight.detach().clone(), mesh, [Shard(0)]))
dmod.bias = nn.Parameter(distribute_tensor(ref.bias.detach().clone(), mesh, [Shard(0)]))
dx = distribute_tensor(x, mesh, [Replicate()])


def linear_step(model, inp):
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad()
        loss = model(inp).sum()
        loss.backward()
        opt.step()
        return loss
    return step


single_loss, single = counted(linear_step(ref, x))
loss, per_rank = counted(linear_step(dmod, dx))
report("linear_step", single, per_rank, loss.full_tensor().item(), single_loss.item())
torch.testing.assert_close(dmod.weight.full_tensor(), ref.weight.detach())

# The demo's TP training step (examples/llama_train.py): the model parallelized by tp_plan(), the
# rest replicated, cross-entropy over the replicated logits, backward, SGD step.
BATCH, SEQ = 4, 32
torch.manual_seed(0)
model = Llama()
single_model = copy.deepcopy(model)
ids = torch.randint(0, VOCAB, (BATCH, SEQ))
targets = torch.roll(ids, -1, dims=1)
mask = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
parallelize_module(model, mesh, tp_plan())
dtensor.distribute_module(model, mesh)
rep = [Replicate()]
d_ids, d_targets, d_mask = (distribute_tensor(t, mesh, rep, src_data_rank=None)
                            for t in (ids, targets, mask))


def llama_step(m, a, t, msk):
    opt = torch.optim.SGD(m.parameters(), lr=0.5)

    def step():
        opt.zero_grad()
        logits = m(a, msk)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), t.reshape(-1))
        loss.backward()
        opt.step()
        return loss
    return step


single_loss, single = counted(llama_step(single_model, ids, targets, mask))
loss, per_rank = counted(llama_step(model, d_ids, d_targets, d_mask))
report("llama_train_step", single, per_rank, loss.full_tensor().item(), single_loss.item())

for line in lines:
    print(line, flush=True)
print("ok", flush=True)
'''


@pytest.mark.parametrize("n", [2, 4])
def test_tp_steps_compute_a_shard_per_rank(n, tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    llama_dir = os.path.join(os.path.dirname(os.path.dirname(here)), "examples")
    assert os.path.exists(os.path.join(llama_dir, "llama_model.py")), llama_dir
    out = run_on_ranks(WORKER, n, tmp_path, name="flops_worker", LLAMA_DIR=llama_dir,
                       FLOPS_TARGET=str(TARGET))
    rows = [json.loads(line[line.index("{"):]) for line in out.splitlines()
            if '"bench": "tp_flops"' in line]
    assert len(rows) == 2 * n, out
    for row in rows:
        if row["rank"] == 0:
            print(json.dumps(row))
