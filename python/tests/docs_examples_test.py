"""PyTorch's DTensor documentation examples run on this engine after changing only the import
lines (torch.distributed.tensor -> dtensor). Each example runs on 4 real processes (shm)."""

import pytest
from launch_ranks import run_on_ranks

IMPORTS = {
    "from torch.distributed.tensor.parallel import": "from dtensor.parallel import",
    "from torch.distributed.tensor.experimental import": "from dtensor.experimental import",
    "from torch.distributed.tensor.debug import": "from dtensor.debug import",
    "from torch.distributed.tensor import": "from dtensor import",
    "from torch.distributed.device_mesh import": "from dtensor.device_mesh import",
    "import torch.distributed._functional_collectives as funcol":
        "import dtensor._functional_collectives as funcol",
}

# The model of PyTorch's TP and SP examples (two linears around a ReLU), in our words.
TWO_LAYERS = r"""
class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(32, 5)

    def forward(self, x):
        return self.out_proj(self.relu(self.in_proj(x)))
"""

# The tensor-parallel tutorial's plan (sequence parallel norms, PrepareModuleInput before attention
# and feed-forward, local heads, a vocabulary-sharded output under loss_parallel) on a small
# Llama-shaped model of our own.
TP_TUTORIAL = r"""
import copy
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, Replicate
from torch.distributed.tensor.parallel import (
    parallelize_module, ColwiseParallel, RowwiseParallel, PrepareModuleInput, SequenceParallel,
    loss_parallel,
)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x, rope):
        bsz, seqlen, _ = x.shape
        cos, sin = rope
        q = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        k = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        v = self.wv(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) / self.head_dim ** 0.5
        mask = torch.ones(seqlen, seqlen, dtype=torch.bool).triu(1)
        out = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.wo(out.transpose(1, 2).reshape(bsz, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, 4 * dim)

    def forward(self, x, rope):
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, vocab=64, dim=32, n_heads=8, n_layers=2, max_seq=16):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, n_heads) for _ in range(n_layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        half = dim // n_heads // 2
        angles = torch.outer(torch.arange(max_seq).float(),
                             1.0 / 10000 ** (torch.arange(half).float() / half))
        self.rope = (angles.cos()[:, None, :], angles.sin()[:, None, :])

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        rope = tuple(t[:tokens.shape[1]] for t in self.rope)
        for layer in self.layers:
            h = layer(h, rope)
        return self.output(self.norm(h))


tp_mesh = init_device_mesh("cpu", (4,))
torch.manual_seed(0)
model = Transformer()
single = copy.deepcopy(model)
model = parallelize_module(model, tp_mesh, {
    "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
    "norm": SequenceParallel(),
    "output": ColwiseParallel(input_layouts=Shard(1), use_local_output=False),
})
for transformer_block in model.layers:
    layer_tp_plan = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1), None),
                                        desired_input_layouts=(Replicate(), None)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                           desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }
    # The attention module works on this rank's heads.
    transformer_block.attention.n_heads //= tp_mesh.size()
    parallelize_module(module=transformer_block, device_mesh=tp_mesh,
                       parallelize_plan=layer_tp_plan)

optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
single_opt = torch.optim.AdamW(single.parameters(), lr=3e-3, foreach=True)
for i in range(3):
    torch.manual_seed(i)
    tokens = torch.randint(64, (2, 16))
    labels = torch.randint(64, (2, 16))
    with loss_parallel():
        pred = model(tokens)
        assert pred.placements == (Shard(2),)  # the logits are never gathered
        loss = F.cross_entropy(pred.flatten(0, 1), labels.flatten(0, 1))
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    expected = F.cross_entropy(single(tokens).flatten(0, 1), labels.flatten(0, 1))
    expected.backward()
    single_opt.step()
    single_opt.zero_grad()
    torch.testing.assert_close(loss.full_tensor(), expected.detach(), rtol=1e-4, atol=1e-5)
for name, p in single.named_parameters():
    torch.testing.assert_close(model.get_parameter(name).full_tensor(), p, rtol=1e-3, atol=1e-4)
"""

# Adapted from the torch.distributed.tensor docs and README and from PyTorch's tensor-parallel
# tutorial and examples (written here in their shape: the same API calls and plans, our own models;
# CPU device type; each run checked against one device in the same process).
EXAMPLES = {
    "distribute_tensor": r'''
import torch
from torch.distributed.tensor import init_device_mesh, Shard, Replicate, distribute_tensor

mesh = init_device_mesh("cpu", (4,))
torch.manual_seed(0)
big_tensor = torch.randn(100, 88)
# Shard this tensor over the mesh by sharding `big_tensor`'s 0th dimension over the 0th
# dimension of `mesh`.
my_dtensor = distribute_tensor(big_tensor, mesh, [Shard(dim=0)])
assert my_dtensor.to_local().shape == (25, 88)
torch.testing.assert_close(my_dtensor.full_tensor(), big_tensor)
replica = distribute_tensor(big_tensor, mesh, [Replicate()])
torch.testing.assert_close((my_dtensor + replica).full_tensor(), big_tensor * 2)
''',
    "from_local_redistribute": r'''
import torch
from torch.distributed.tensor import DTensor, Shard, Replicate, Partial
from torch.distributed.device_mesh import init_device_mesh

mesh = init_device_mesh("cpu", (4,))
# create a DistributedTensor that shards on dim 0, from a local torch.Tensor
local_tensor = torch.randn((8, 8), requires_grad=True)
rowwise_placement = [Shard(0)]
rowwise_tensor = DTensor.from_local(local_tensor, mesh, rowwise_placement)
assert rowwise_tensor.shape == (32, 8)

# reshard the current row-wise tensor to a colwise tensor or replicate tensor
colwise_placement = [Shard(1)]
colwise_tensor = rowwise_tensor.redistribute(mesh, colwise_placement)
assert colwise_tensor.shape == rowwise_tensor.shape
assert colwise_tensor.to_local().size() == torch.Size([32, 2])

replica_placement = [Replicate()]
replica_tensor = colwise_tensor.redistribute(mesh, replica_placement)
assert replica_tensor.to_local().size() == torch.Size([32, 8])

# a Partial tensor reduces its shares when replicated
partial = DTensor.from_local(torch.ones(4, 4), mesh, [Partial()])
torch.testing.assert_close(partial.redistribute(mesh, [Replicate()]).to_local(),
                           torch.full((4, 4), 4.0))
replica_tensor.sum().backward()
torch.testing.assert_close(local_tensor.grad, torch.ones(8, 8))
''',
    "comm_debug_mode": r'''
import torch
import torch.nn as nn
from torch.distributed.tensor import distribute_tensor, init_device_mesh, Shard, Replicate
from torch.distributed.tensor.debug import CommDebugMode

mesh = init_device_mesh("cpu", (4,))
torch.manual_seed(0)
mod = nn.Linear(16, 8)
mod.weight = nn.Parameter(distribute_tensor(mod.weight.detach(), mesh, [Shard(0)]))
mod.bias = nn.Parameter(distribute_tensor(mod.bias.detach(), mesh, [Shard(0)]))
x = distribute_tensor(torch.randn(4, 16), mesh, [Replicate()])
comm_mode = CommDebugMode()
with comm_mode:
    mod(x).redistribute(mesh, [Replicate()]).sum().backward()
counts = comm_mode.get_comm_counts()
print(counts)
assert counts.get("all_gather_into_tensor", 0) >= 1
assert comm_mode.get_total_counts() == sum(counts.values())
''',
    "functional_collectives": r'''
import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import init_device_mesh

mesh = init_device_mesh("cpu", (4,))
rank = mesh.get_rank()
t = torch.full((4,), float(rank))
torch.testing.assert_close(funcol.all_reduce(t, "sum", mesh), torch.full((4,), 6.0))
gathered = funcol.all_gather_tensor(t, 0, mesh)
torch.testing.assert_close(gathered, torch.arange(4.0).repeat_interleave(4))
scattered = funcol.reduce_scatter_tensor(torch.arange(16.0), "sum", 0, mesh)
torch.testing.assert_close(scattered, torch.arange(16.0)[4 * rank:4 * rank + 4] * 4)
''',
    "local_map": r'''
import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import distribute_tensor, init_device_mesh, Shard, Replicate
from torch.distributed.tensor.experimental import local_map

mesh = init_device_mesh("cpu", (4,))


def mm_then_allreduce(device_mesh, w, x):
    partial = torch.mm(w, x)  # this rank's columns of w times its rows of x
    return funcol.all_reduce(partial, "sum", device_mesh).wait()


sharded_mm = local_map(mm_then_allreduce, out_placements=[Replicate()],
                       in_placements=(None, [Shard(1)], [Shard(0)]), device_mesh=mesh)
torch.manual_seed(0)
w, x = torch.randn(12, 8), torch.randn(8, 16)
y = sharded_mm(mesh, distribute_tensor(w, mesh, [Shard(1)]), distribute_tensor(x, mesh, [Shard(0)]))
torch.testing.assert_close(y.full_tensor(), w @ x)
''',
    "tensor_parallel_example": r'''
import copy
import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel

''' + TWO_LAYERS + r'''


device_mesh = init_device_mesh(device_type="cpu", mesh_shape=(4,))
torch.manual_seed(0)
model = TwoLayers()
single = copy.deepcopy(model)
model = parallelize_module(module=model, device_mesh=device_mesh,
                           parallelize_plan={"in_proj": ColwiseParallel(),
                                             "out_proj": RowwiseParallel()})
# After parallelize_module, which replaces the parameters by distributed ones (as PyTorch's).
optimizer = torch.optim.AdamW(model.parameters(), lr=0.25, foreach=True)
single_opt = torch.optim.AdamW(single.parameters(), lr=0.25, foreach=True)
for i in range(10):
    torch.manual_seed(i)  # every TP rank reads the same input
    inp = torch.rand(20, 10)
    output = model(inp)
    expected = single(inp)
    torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-5)
    output.sum().backward()  # as the example: gradients accumulate (no zero_grad)
    optimizer.step()
    expected.sum().backward()
    single_opt.step()
for name, p in single.named_parameters():
    torch.testing.assert_close(model.get_parameter(name).full_tensor(), p, rtol=1e-4, atol=1e-5)
''',
    "sequence_parallel_example": r'''
import copy
import torch
import torch.nn as nn
from torch.distributed.tensor import Shard
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel

''' + TWO_LAYERS + r'''


device_mesh = init_device_mesh(device_type="cpu", mesh_shape=(4,))
rank = device_mesh.get_rank()
torch.manual_seed(0)
model = TwoLayers()
single = copy.deepcopy(model)
model = parallelize_module(module=model, device_mesh=device_mesh, parallelize_plan={
    "in_proj": ColwiseParallel(input_layouts=Shard(0)),
    "out_proj": RowwiseParallel(output_layouts=Shard(0)),
})
optimizer = torch.optim.AdamW(model.parameters(), lr=0.25, foreach=True)
single_opt = torch.optim.AdamW(single.parameters(), lr=0.25, foreach=True)
for i in range(10):
    # Sequence parallel: each rank reads its own rows of the batch.
    batches = [torch.rand(4, 10, generator=torch.Generator().manual_seed(100 * i + r))
               for r in range(4)]
    output = model(batches[rank])
    output.sum().backward()
    optimizer.step()
    whole = single(torch.cat(batches))
    torch.testing.assert_close(output, whole[4 * rank:4 * rank + 4].detach())
    whole.sum().backward()
    single_opt.step()
for name, p in single.named_parameters():
    torch.testing.assert_close(model.get_parameter(name).full_tensor(), p, rtol=1e-4, atol=1e-5)
''',
    "tp_tutorial_llama": TP_TUTORIAL,
}


def ported(code):
    for old, new in IMPORTS.items():
        code = code.replace(old, new)
    assert "torch.distributed.tensor" not in code and "torch.distributed._func" not in code
    return code


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_docs_example_runs_after_changing_the_import(name, tmp_path):
    run_on_ranks(ported(EXAMPLES[name]) + '\nprint("ok")\n', 4, tmp_path, name)
