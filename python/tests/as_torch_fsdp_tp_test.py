"""torchtitan's recipe written only against torch's names, unmodified, on the engine through the
opt-in (NOTE [torch names on the engine]): a 2-D ("dp", "tp") mesh, tensor parallelism on "tp"
(ColwiseParallel / RowwiseParallel), then FSDP2's fully_shard on "dp" per block and at the root;
AdamW steps give one process's losses and parameters, and every parameter is the engine's with
the 2-D placements (Shard(0) on dp, the TP layout on tp)."""

import os
import subprocess
import sys

SCRIPT = r'''
import copy
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

from dtensor import _C  # only to check that the tensors are the engine's

TOL = dict(rtol=1e-5, atol=1e-5)


class MLP(nn.Module):
    def __init__(self, dim=8, hidden=16):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(F.relu(self.w1(x)))


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([MLP(), MLP()])

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def train(model, xs):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x in xs:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.full_tensor().item() if isinstance(loss, DTensor) else loss.item())
    return losses


world = int(os.environ["WORLD_SIZE"])
mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)
ref = Stack()
model = copy.deepcopy(ref)
for layer in model.layers:
    parallelize_module(layer, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    fully_shard(layer, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
assert isinstance(model, FSDPModule)
for name, p in model.named_parameters():
    assert _C.is_dtensor(p) and isinstance(p, DTensor), name
    # Shard(0) on dp; _StridedShard(0) where tp shards dim 0 too (PyTorch's FSDP over TP)
    assert getattr(p.placements[0], "dim", None) == 0, (name, p.placements)
w1 = model.layers[0].w1.weight
assert w1.placements[1] == Shard(0) and model.layers[0].w2.weight.placements[1] == Shard(1)
# Every rank sees the whole batch (the dp ranks hold the same data here), as one process.
xs = [torch.randn(4, 8) for _ in range(3)]
torch.testing.assert_close(train(model, xs), train(ref, xs), **TOL)
for name, p in ref.named_parameters():
    torch.testing.assert_close(dict(model.named_parameters())[name].full_tensor(), p.detach(),
                               **TOL)
print("ok")
'''


def test_fsdp2_over_tp_on_torch_names_trains_like_one_process(tmp_path):
    script = tmp_path / "fsdp_tp.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONSAFEPATH="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, os.environ["LAUNCH_PY"], "-n", "4", "--",
                          sys.executable, "-m", "dtensor.as_torch", str(script)], env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("ok") == 4, out.stdout
