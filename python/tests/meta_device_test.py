"""Models built on the meta device, parallelized, then materialized (torchtitan's order, and
transformers' for large models): distribute_tensor, from_local and parallelize_module of meta
tensors issue no collective and give meta pieces of the right local shapes; Module.to_empty then
init gives one device's parameters, and the model computes as one process. Before,
distribute_tensor of a meta tensor raised ("all_to_all_single ... needs flat contiguous CPU
tensors"). A Partial buffer stays Partial through to_empty (empty_like keeps every placement, as
PyTorch's)."""

from launch_ranks import run_on_ranks

WORKER = r'''
import os, torch
from torch import nn
import dtensor
from dtensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from dtensor.debug import CommDebugMode
from dtensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
mesh = dtensor.init_device_mesh("cpu", (world,))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x):
        return self.down(torch.relu(self.up(self.norm(x))))


def init(m):
    torch.manual_seed(3)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_()


with torch.device("meta"):
    model = Block()
with CommDebugMode() as comms:
    d = distribute_tensor(torch.empty(10, 4, device="meta"), mesh, [Shard(0)])
    assert d.is_meta and tuple(d.to_local().shape) == (torch.empty(10).chunk(world)[rank].numel(), 4)
    f = DTensor.from_local(torch.empty(3, 4, device="meta"), mesh, [Shard(1)])
    assert f.is_meta and tuple(f.shape) == (3, 4 * world)
    parallelize_module(model, mesh, {"norm": SequenceParallel(), "up": ColwiseParallel(),
                                     "down": RowwiseParallel()})
    model.register_buffer("total", DTensor.from_local(torch.empty(4, device="meta"), mesh,
                                                      [Partial()], run_check=False))
    model.to_empty(device="cpu")
assert comms.get_total_counts() == 0, comms.get_comm_counts()
assert tuple(model.total.placements) == (Partial(),) and not model.total.is_meta
init(model)  # random fills of distributed parameters draw one device's values
ref = Block()
init(ref)
for (name, p), q in zip(model.named_parameters(), ref.parameters()):
    assert isinstance(p, DTensor) and not p.is_meta and p.to_local().device.type == "cpu", name
    assert torch.equal(p.full_tensor(), q), (name, p.placements)
torch.manual_seed(1)
x = torch.randn(2, 2 * world, 16)
out = model(distribute_tensor(x, mesh, [Shard(1)]))
# RowwiseParallel: a local, replicated output; its sum over ranks rounds as a sum in another order
torch.testing.assert_close(out, ref(x), rtol=1e-5, atol=1e-4)
print("ok")
'''


def test_a_meta_model_is_parallelized_then_materialized_as_one_device(tmp_path):
    run_on_ranks(WORKER, 4, tmp_path)


def test_on_two_processes(tmp_path):
    run_on_ranks(WORKER, 2, tmp_path)
