"""A mesh's groups are torch.distributed process groups (NOTE [mesh groups as torch process
groups]): torch's own collectives (torch.distributed.* with group=, the functional collectives
by group object, name or (mesh, dim), their autograd forms, the _c10d_functional ops) run on
them with one device's values on 4 processes, under the opt-in as PyTorch's code calls them;
CommDebugMode counts torch's collectives on plain tensors, on a mesh's group and on a Gloo
group, as PyTorch's does. Each case failed before mesh groups were c10d groups ("ProcessGroup
name not set", "Invalid tuple for group must be (DeviceMesh, int)")."""

import pytest

from launch_ranks import run_on_ranks

SCRIPT = r"""
import dtensor.as_torch  # noqa: F401  (torch's names resolve to the engine, as a user opts in)
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
coord = mesh.get_coordinate()
tp = mesh.get_group("tp")
members = mesh.mesh[coord[0], :].tolist()

# The group as torch.distributed sees it.
assert isinstance(tp, dist.ProcessGroup), type(tp)
assert tp.group_name.startswith("dtensor:"), tp.group_name
assert mesh._dim_group_names[1] == tp.group_name
assert dist.get_rank(tp) == coord[1] and dist.get_world_size(tp) == 2
assert dist.get_process_group_ranks(tp) == members, dist.get_process_group_ranks(tp)
assert mesh.get_group("tp") is tp

def x_of(r, n=4):
    return torch.arange(n, dtype=torch.float32) + 100 * r

want_sum = sum(x_of(r) for r in members)

# torch.distributed's in-place collectives with group=.
t = x_of(rank)
dist.all_reduce(t, group=tp)
assert torch.equal(t, want_sum), t
out = torch.empty(8)
dist.all_gather_into_tensor(out, x_of(rank), group=tp)
assert torch.equal(out, torch.cat([x_of(r) for r in members])), out
outs = [torch.empty(4) for _ in range(2)]
dist.all_gather(outs, x_of(rank), group=tp)
assert all(torch.equal(o, x_of(r)) for o, r in zip(outs, members))
b = x_of(rank)
dist.broadcast(b, src=members[1], group=tp)  # a global rank, as torch.distributed takes
assert torch.equal(b, x_of(members[1])), b
dist.barrier(group=tp)

# The functional collectives: group object, registered name, (mesh, dim), autograd.
for group in (tp, tp.group_name, (mesh, 1)):
    r = funcol.all_reduce(x_of(rank), "sum", group)
    assert torch.equal(funcol.wait_tensor(r), want_sum), (group, r)
g = funcol.all_gather_tensor(x_of(rank).view(2, 2), 0, (mesh, 1))
assert torch.equal(g, torch.cat([x_of(r).view(2, 2) for r in members])), g
rs = funcol.reduce_scatter_tensor(x_of(rank), "sum", 0, tp)
assert torch.equal(rs, want_sum[2 * coord[1]:2 * coord[1] + 2]), rs
r = torch.ops._c10d_functional.wait_tensor(
    torch.ops._c10d_functional.all_reduce(x_of(rank), "sum", tp.group_name))
assert torch.equal(r, want_sum), r

# all_to_all_single_autograd (transformers' expert-parallel dispatch): uneven splits, backward.
me = coord[1]
# Rank q sends (q + 1) * (p + 1) elements of arange(3 (q + 1)) to group rank p, in order.
def sent(q, p):
    start = sum((q + 1) * (k + 1) for k in range(p))
    return torch.arange(3.0 * (q + 1))[start:start + (q + 1) * (p + 1)]
send = torch.arange(3.0 * (me + 1), requires_grad=True)
in_splits = [(me + 1) * (p + 1) for p in range(2)]
out_splits = [(q + 1) * (me + 1) for q in range(2)]
recv = funcol.wait_tensor(funcol.all_to_all_single_autograd(send, out_splits, in_splits, tp))
assert torch.equal(recv, torch.cat([sent(q, me) for q in range(2)])), recv
(recv * (me + 2)).sum().backward()
# The gradient of each element sent is the weight (p + 2) of the group rank p that received it.
want_grad = torch.cat([torch.full((in_splits[p],), p + 2.0) for p in range(2)])
assert torch.equal(send.grad, want_grad), send.grad

# CommDebugMode counts torch's own collectives: on the mesh's group (run by the engine) and on
# a Gloo group the engine never sees, once each.
# new_group is collective: every rank makes every row's group, in the same order.
gloo = [dist.new_group(mesh.mesh[i, :].tolist(), backend="gloo") for i in range(2)][coord[0]]
with CommDebugMode() as comm:
    funcol.wait_tensor(funcol.all_reduce(x_of(rank), "sum", tp))
    funcol.wait_tensor(funcol.all_gather_tensor(x_of(rank), 0, (mesh, 1)))
    funcol.wait_tensor(funcol.all_reduce(x_of(rank), "sum", gloo))
    t = x_of(rank)
    dist.all_reduce(t, group=gloo)
counts = comm.get_comm_counts()
assert comm.get_total_counts() == 4, counts
assert counts[funcol.all_reduce] == 3, counts
assert counts[torch.ops.c10d_functional.all_gather_into_tensor] == 1, counts

# send/recv on a mesh group: a clear error naming the group (the engine has no point-to-point).
try:
    dist.send(torch.ones(1), dst=members[1 - coord[1]], group=tp)
except RuntimeError as e:
    assert "point-to-point" in str(e) and "dtensor:" in str(e), e
else:
    raise AssertionError("send on a mesh group did not raise")
print("ok")
"""


def test_mesh_groups_are_torch_process_groups(tmp_path):
    run_on_ranks(SCRIPT, 4, tmp_path)


THREADS = r"""
import torch
import torch.distributed._functional_collectives as funcol
import dtensor

def body(rank):
    mesh = dtensor.init_device_mesh("cpu", (4,))
    pg = mesh.get_group()
    r = funcol.wait_tensor(funcol.all_reduce(torch.full((3,), float(rank)), "sum", pg))
    assert torch.equal(r, torch.full((3,), 6.0)), r
    r = funcol.wait_tensor(funcol.all_reduce(torch.full((3,), float(rank)), "max", (mesh, 0)))
    assert torch.equal(r, torch.full((3,), 3.0)), r

dtensor.run_threads(4, body)
print("ok")
"""


def test_ranks_as_threads_each_resolve_their_own_group(tmp_path):
    """Ranks as threads of one process register one group name each (c10d's per-thread
    registry): each thread's collectives reach its own rank's group."""
    run_on_ranks(THREADS, 1, tmp_path)


FAKE = r"""
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
import dtensor
from dtensor import Replicate, Shard, distribute_tensor, init_device_mesh
from dtensor.debug import CommDebugMode

# PyTorch's fake process group: this process is rank 1 of 4 absent ranks (NOTE [fake backend]).
dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
mesh = init_device_mesh("cpu", (2, 2))
assert mesh.get_coordinate() == (0, 1), mesh.get_coordinate()
x = distribute_tensor(torch.randn(9, 4), mesh, [Shard(0), Shard(1)])
assert x.to_local().shape == (5, 2), x.to_local().shape  # 9 rows cut 5/4, then 4 cols 2/2
with CommDebugMode() as comm:
    w = distribute_tensor(torch.randn(4, 3), mesh, [Replicate(), Replicate()])
    y = (x @ w).redistribute(mesh, [Replicate(), Replicate()])
assert y.shape == (9, 3) and y.to_local().shape == (9, 3), y.to_local().shape
assert comm.get_total_counts() >= 1, str(comm)
assert isinstance(mesh.get_group(0), dist.ProcessGroup)
print("ok")
"""


def test_fake_process_group(tmp_path):
    """After torch's init_process_group("fake") a process joins the engine as that rank of
    absent peers: meshes, layouts, shapes and collective counts as on real ranks (values are
    meaningless there, as on PyTorch's fake group). Before, joining raised c10d's INTERNAL
    ASSERT (FakeStore has no set/get)."""
    run_on_ranks(FAKE, 1, tmp_path)
