"""PyTorch's DTensor documentation examples run on this engine after changing only the import
lines (torch.distributed.tensor -> dtensor). Each example runs on 4 real processes (shm)."""

import pytest
from launch_ranks import run_on_ranks

IMPORTS = {
    "from torch.distributed.tensor.debug import": "from dtensor.debug import",
    "from torch.distributed.tensor import": "from dtensor import",
    "from torch.distributed.device_mesh import": "from dtensor.device_mesh import",
    "import torch.distributed._functional_collectives as funcol":
        "import dtensor._functional_collectives as funcol",
}

# Adapted from the torch.distributed.tensor docs and README (CPU device type; asserts added).
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
}


def ported(code):
    for old, new in IMPORTS.items():
        code = code.replace(old, new)
    assert "torch.distributed.tensor" not in code and "torch.distributed._func" not in code
    return code


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_docs_example_runs_after_changing_the_import(name, tmp_path):
    run_on_ranks(ported(EXAMPLES[name]) + '\nprint("ok")\n', 4, tmp_path, name)
