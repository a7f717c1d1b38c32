"""The dtensor package's API surface against one device: 1-D and 2-D meshes, ranks as threads
(simulation mode) and as real processes (shm), errors as Python exceptions carrying the C++
message, and the public names."""

import copy

import pytest
import torch

import dtensor
from dtensor import (
    DTensor,
    DeviceMesh,
    Partial,
    Placement,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
    empty,
    full,
    init_device_mesh,
    ones,
    rand,
    randn,
    zeros,
)
from dtensor import _C
from dtensor import _functional_collectives as funcol
from dtensor.debug import CommDebugMode, visualize_sharding
from launch_ranks import run_on_ranks

MESHES = [(4,), (2, 2)]


def layouts(ndim_mesh, ndim_tensor):
    choices = [Replicate()] + [Shard(d) for d in range(ndim_tensor)]
    out = [[]]
    for _ in range(ndim_mesh):
        out = [p + [c] for p in out for c in choices]
    return out


def world(shape):
    n = 1
    for s in shape:
        n *= s
    return n


@pytest.mark.parametrize("mesh_shape", MESHES)
def test_distribute_and_ops_match_one_device(mesh_shape):
    torch.manual_seed(0)
    a, b = torch.randn(8, 6, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)

    def fn(rank):
        mesh = init_device_mesh("cpu", mesh_shape)
        for pa in layouts(len(mesh_shape), 2):
            da = distribute_tensor(a, mesh, pa, src_data_rank=None)
            db = distribute_tensor(b, mesh, [Replicate()] * len(mesh_shape))
            assert isinstance(da, DTensor) and isinstance(da, torch.Tensor)
            assert da.shape == a.shape and da.size() == a.size() and da.dtype == a.dtype
            assert da.stride() == a.stride()
            assert tuple(da.placements) == tuple(pa)
            assert da.device_mesh == mesh
            for got, want in [
                (torch.mm(da, db), a @ b),
                (da + da * 2, a + a * 2),
                (torch.nn.functional.linear(da, db.t()), a @ b),
                (da.sum(0), a.sum(0)),
                (torch.relu(da).mean(), torch.relu(a).mean()),
                (da.t().contiguous(), a.t()),
            ]:
                assert isinstance(got, DTensor)
                torch.testing.assert_close(got.full_tensor(), want)
        return True

    assert all(dtensor.run_threads(world(mesh_shape), fn))


@pytest.mark.parametrize("mesh_shape", MESHES)
def test_from_local_to_local_redistribute_and_grad(mesh_shape):
    x = torch.arange(48, dtype=torch.float64).reshape(8, 6)

    def fn(rank):
        mesh = init_device_mesh("cpu", mesh_shape)
        pl = [Shard(0)] + [Shard(1)] * (len(mesh_shape) - 1)
        ref = distribute_tensor(x, mesh, pl)
        local = ref.to_local().clone().requires_grad_(True)
        dt = DTensor.from_local(local, mesh, pl)
        torch.testing.assert_close(dt.full_tensor(), x)
        moved = dt.redistribute(mesh, [Replicate()] * len(mesh_shape))
        assert tuple(moved.placements) == (Replicate(),) * len(mesh_shape)
        torch.testing.assert_close(moved.to_local(), x)
        (moved * moved).sum().backward()
        torch.testing.assert_close(local.grad, 2 * ref.to_local())
        # Partial from_local sums the shares.
        p = DTensor.from_local(torch.ones(2, 3, dtype=torch.float64), mesh,
                               [Partial()] * len(mesh_shape))
        torch.testing.assert_close(p.full_tensor(), torch.full((2, 3), float(world(mesh_shape)),
                                                               dtype=torch.float64))
        return True

    assert all(dtensor.run_threads(world(mesh_shape), fn))


def test_factories_random_and_modules():
    seed = 7
    torch.manual_seed(seed)
    want_rand = torch.rand(6, 5)
    want_randn = torch.randn(6, 5)
    # Data for every rank, made before the threads (they share torch's default generator).
    torch.manual_seed(0)
    module = torch.nn.Linear(5, 3)
    x = torch.randn(4, 5)
    import copy

    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2))
        pl = [Shard(0), Shard(1)]
        dtensor.manual_seed(seed)
        torch.testing.assert_close(rand(6, 5, device_mesh=mesh, placements=pl).full_tensor(),
                                   want_rand, rtol=0, atol=0)
        torch.testing.assert_close(randn((6, 5), device_mesh=mesh, placements=pl).full_tensor(),
                                   want_randn, rtol=0, atol=0)
        torch.testing.assert_close(zeros(6, 5, device_mesh=mesh, placements=pl).full_tensor(),
                                   torch.zeros(6, 5))
        torch.testing.assert_close(ones(6, 5, device_mesh=mesh).full_tensor(), torch.ones(6, 5))
        torch.testing.assert_close(full((6, 5), 2.5, device_mesh=mesh, placements=pl).full_tensor(),
                                   torch.full((6, 5), 2.5))
        assert empty(6, 5, device_mesh=mesh, placements=pl).shape == (6, 5)
        # distribute_module replicates parameters; the module trains with an optimizer.
        m, ref = copy.deepcopy(module), copy.deepcopy(module)
        distribute_module(m, mesh)
        assert all(isinstance(p, DTensor) for p in m.parameters())
        dx = distribute_tensor(x, mesh, [Shard(0), Replicate()])
        for mod, inp in [(m, dx), (ref, x)]:
            opt = torch.optim.Adam(mod.parameters(), lr=0.1)
            for _ in range(2):
                opt.zero_grad()
                mod(inp).pow(2).mean().backward()
                opt.step()
        for p, q in zip(m.parameters(), ref.parameters()):
            assert tuple(p.grad.placements) == (Replicate(), Replicate())
            torch.testing.assert_close(p.full_tensor(), q.detach())
        return True

    assert all(dtensor.run_threads(4, fn))


@pytest.mark.parametrize("mesh_shape,placements", [
    ((2, 2), [Shard(0), Shard(1)]), ((2, 2), [Shard(1), Shard(1)]), ((3,), [Shard(1)]),
    ((2,), [Replicate()])])
def test_random_ops_drawn_in_chunks_match_one_device(monkeypatch, mesh_shape, placements):
    """NOTE [DTensor random]: with a chunk far below the tensor (and not a multiple of 16, nor is
    the shape) every random op equals one device's draw bit for bit, and later draws stay in step."""
    monkeypatch.setenv("DTENSOR_RANDOM_CHUNK", "100")
    seed, shape = 11, (37, 29)
    x = torch.rand(shape, generator=torch.Generator().manual_seed(3))

    def sequence(make, x):
        return [make(False), make(True), torch.zeros_like(x).uniform_(-1, 2),
                torch.zeros_like(x).normal_(0.5, 2), torch.zeros_like(x).bernoulli_(0.3),
                torch.rand_like(x), torch.randn_like(x), torch.randint_like(x, 3, 9),
                torch.nn.functional.dropout(x, 0.4)]

    torch.manual_seed(seed)
    want = sequence(lambda normal: torch.randn(shape) if normal else torch.rand(shape), x)
    want.append(torch.rand(1))  # a draw after them all: the generators stay in step

    def fn(rank):
        mesh = init_device_mesh("cpu", mesh_shape)
        dx = distribute_tensor(x, mesh, placements)
        dtensor.manual_seed(seed)
        got = sequence(lambda normal: (randn if normal else rand)(
            shape, device_mesh=mesh, placements=placements), dx)
        got.append(rand(1, device_mesh=mesh, placements=[Replicate()] * len(mesh_shape)))
        for g, w in zip(got, want):
            torch.testing.assert_close(g.full_tensor(), w, rtol=0, atol=0)
        return True

    assert all(dtensor.run_threads(world(mesh_shape), fn))


def test_debug_counts_visualize_strict_and_cache(capsys):
    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        a = distribute_tensor(torch.ones(4, 4), mesh, [Shard(1)])
        b = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])
        with CommDebugMode() as comm:
            (a @ b).redistribute(mesh, [Replicate()])
        counts = comm.get_comm_counts()
        assert comm.get_total_counts() == sum(counts.values()) >= 1
        a.redistribute(mesh, [Replicate()])  # after the block: not counted
        assert comm.get_comm_counts() == counts
        assert set(counts) <= {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                               "all_to_all_single"}
        with dtensor.strict_mode():
            with pytest.raises(RuntimeError, match="redistribute"):
                torch.mm(a, a)
        stats = dtensor.debug.propagation_cache_stats()
        assert stats["hits"] + stats["misses"] > 0
        assert "aten::mm" in dtensor.debug.explain("aten::mm", a, b)
        if rank == 0:
            visualize_sharding(a)
        return True

    assert all(dtensor.run_threads(2, fn))
    assert "0" in capsys.readouterr().out


def test_errors_carry_the_engine_message():
    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        other = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        a = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])
        with pytest.raises(RuntimeError, match="plain tensor"):
            a + torch.ones(4, 4)
        with dtensor.replicate_plain_tensors():
            torch.testing.assert_close((a + torch.ones(4, 4)).full_tensor(), torch.full((4, 4), 2.))
        with dtensor.strict_mode(), pytest.raises(RuntimeError, match="aten::trace"):
            torch.trace(a)  # no rule, and strict mode: no replicate fallback
        # Outside strict mode the replicate fallback runs it (NOTE [replicate fallback]).
        torch.testing.assert_close(torch.trace(a).full_tensor(), torch.trace(torch.ones(4, 4)))
        c = distribute_tensor(torch.ones(4, 4), other, [Shard(1)])
        del c  # same ranks, other names: one mesh? meshes differ by names only
        # NOTE [error convention]: engine errors are RuntimeError whichever way they travel.
        with pytest.raises(RuntimeError, match="dim"):
            distribute_tensor(torch.ones(4, 4), mesh, [Shard(3)])
        with pytest.raises(RuntimeError, match="world"):
            init_device_mesh("cpu", (3,))
        with pytest.raises(TypeError, match="Placement"):
            distribute_tensor(torch.ones(4), mesh, ["S(0)"])
        with pytest.raises(RuntimeError, match="plain tensor"):
            torch.ones(2).to_local()
        assert not hasattr(torch.ones(2), "placements")
        assert not hasattr(torch.ones(2), "device_mesh")
        assert not isinstance(torch.ones(2), DTensor)
        return True

    assert all(dtensor.run_threads(2, fn))


@pytest.mark.parametrize("stats", ["replicate", "shard_uneven"])
def test_batch_norm_writes_running_stats_like_one_device(stats):
    # native_batch_norm writes its running statistics (Rule::written_inputs): they keep their
    # placements, and when no layout can keep them (C=5 over 4 ranks leaves an empty piece, which
    # ATen's kernel cannot take) the op runs by the replicate fallback, which writes them back.
    torch.manual_seed(0)
    x = torch.randn(6, 5, 3)
    mean, var = torch.randn(5), torch.rand(5) + 0.5
    want_mean, want_var = mean.clone(), var.clone()
    want = torch.nn.functional.batch_norm(x, want_mean, want_var, training=True)
    want_eval = torch.nn.functional.batch_norm(x, want_mean, want_var, training=False)

    def fn(rank):
        mesh = init_device_mesh("cpu", (4,))
        stat = [Replicate()] if stats == "replicate" else [Shard(0)]
        dm, dv = distribute_tensor(mean, mesh, stat), distribute_tensor(var, mesh, stat)
        dx = distribute_tensor(x, mesh, [Shard(0)])
        got = torch.nn.functional.batch_norm(dx, dm, dv, training=True)
        torch.testing.assert_close(got.full_tensor(), want)
        assert dm.placements == tuple(stat) and dv.placements == tuple(stat)
        torch.testing.assert_close(dm.full_tensor(), want_mean)
        torch.testing.assert_close(dv.full_tensor(), want_var)
        got_eval = torch.nn.functional.batch_norm(dx, dm, dv, training=False)
        torch.testing.assert_close(got_eval.full_tensor(), want_eval)
        return True

    assert all(dtensor.run_threads(4, fn))


def test_submesh_by_name():
    a = torch.arange(24.0).reshape(4, 6)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        tp = mesh["tp"]
        assert tp.ndim == 1 and tp.size() == 2 and tp.mesh_dim_names == ("tp",)
        assert rank in tp.mesh.tolist()
        assert tp.mesh.tolist() == [rank - rank % 2, rank - rank % 2 + 1]
        da = distribute_tensor(a, tp, [Shard(1)])
        torch.testing.assert_close((da * 2).full_tensor(), a * 2)
        assert mesh["dp", "tp"].shape == (2, 2)
        with pytest.raises(KeyError, match="pp"):
            mesh["pp"]
        return True

    assert all(dtensor.run_threads(4, fn))


def test_mesh_device_type_round_trips_between_python_and_cpp():
    """NOTE [mesh device]: the C++ mesh carries the device type; Python's reads it from there,
    sub-meshes and the meshes of distributed tensors keep it, and a CPU and a CUDA mesh over the
    same ranks are different meshes. A CUDA mesh can be described without a GPU; making a tensor
    on it then fails (no silent CPU tensor)."""
    assert _C.DeviceMesh([2], [0, 1]).device_type == "cpu"
    assert _C.DeviceMesh([2], [0, 1], [], "cuda").device_type == "cuda"
    assert _C.DeviceMesh.arange([2], [], "cuda") == _C.DeviceMesh([2], [0, 1], [], "cuda")
    assert _C.DeviceMesh([2], [0, 1], [], "cuda") != _C.DeviceMesh([2], [0, 1])
    assert repr(_C.DeviceMesh([2], [0, 1], [], "cuda")).endswith("device=cuda)")
    assert repr(_C.DeviceMesh([2], [0, 1])) == "DeviceMesh((2), ranks=[0,1])"
    with pytest.raises(RuntimeError, match="not a device type"):
        _C.DeviceMesh([2], [0, 1], [], "cuda:0")

    def fn(rank):
        cpu = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        assert cpu.device_type == "cpu" and cpu._mesh.device_type == "cpu"
        assert cpu._mesh.local_device() == "cpu"
        cuda = DeviceMesh("cuda", [[0, 1], [2, 3]], mesh_dim_names=("dp", "tp"))
        assert cuda.device_type == "cuda" and cuda._mesh.device_type == "cuda"
        assert cuda != cpu and cuda._mesh != cpu._mesh
        assert hash(cuda) != hash(cpu)
        assert repr(cuda).startswith("DeviceMesh('cuda'")
        assert cuda["tp"].device_type == "cuda" and cuda["tp"]._mesh.device_type == "cuda"
        assert cpu["tp"].device_type == "cpu" and cpu["tp"] != cuda["tp"]
        # Wrapping a C++ mesh keeps its type; naming another type makes the C++ mesh agree.
        assert DeviceMesh._wrap(cuda._mesh).device_type == "cuda"
        assert DeviceMesh._wrap(cpu._mesh, "cuda")._mesh == cuda._mesh
        # A distributed tensor's mesh is the one it was made on, device type included.
        d = distribute_tensor(torch.ones(4, 4), cpu, [Shard(0), Replicate()])
        assert d.device_mesh == cpu and d.device_mesh.device_type == "cpu"
        assert d.to_local().device.type == "cpu"
        assert zeros(4, 4, device_mesh=cpu).to_local().device.type == "cpu"
        if not torch.cuda.is_available():
            for make in (lambda: zeros(4, 4, device_mesh=cuda),
                         lambda: distribute_tensor(torch.ones(4, 4), cuda, [Shard(0), Shard(1)]),
                         lambda: DTensor.from_local(torch.ones(2, 2), cuda,
                                                    [Shard(0), Shard(1)])):
                with pytest.raises(RuntimeError, match="cuda"):
                    make()
        return True

    assert all(dtensor.run_threads(4, fn))


def test_src_data_rank_is_a_rank_of_the_mesh():
    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        tp = mesh["tp"]  # ranks [0,1] or [2,3]
        mine = torch.full((4, 2), float(rank))
        got = distribute_tensor(mine, tp, [Shard(0)], src_data_rank=1).full_tensor()
        torch.testing.assert_close(got, torch.full((4, 2), float(tp.mesh.tolist()[1])))
        default = distribute_tensor(mine, tp, [Replicate()]).full_tensor()
        torch.testing.assert_close(default, torch.full((4, 2), float(tp.mesh.tolist()[0])))
        with pytest.raises(ValueError, match="src_data_rank 2"):
            distribute_tensor(mine, tp, [Shard(0)], src_data_rank=2)
        return True

    assert all(dtensor.run_threads(4, fn))


@pytest.mark.parametrize("placements", [[Replicate(), Replicate()], [Shard(0), Shard(1)],
                                        [Replicate(), Shard(0)]])
def test_src_data_rank_on_a_2d_mesh_is_a_group_rank_on_every_dim(placements):
    """PyTorch broadcasts or scatters from group rank k on each mesh dim in turn, so the data
    is the rank at coordinate (k, k): on a 2x2 mesh src_data_rank=1 is rank 3 (not rank 1, the
    mesh's second rank, which would silently give another rank's data than PyTorch's)."""
    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2))
        mine = torch.full((4, 4), float(rank))
        got = distribute_tensor(mine, mesh, placements, src_data_rank=1).full_tensor()
        torch.testing.assert_close(got, torch.full((4, 4), 3.0))
        got = distribute_tensor(mine, mesh, placements).full_tensor()
        torch.testing.assert_close(got, torch.full((4, 4), 0.0))
        return True

    assert all(dtensor.run_threads(4, fn))


def test_functional_collectives_in_simulation():
    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        t = torch.full((2,), float(rank + 1))
        torch.testing.assert_close(funcol.all_reduce(t, "sum", (mesh, 0)), torch.full((2,), 3.))
        g = funcol.all_gather_tensor(t, 0, mesh)
        torch.testing.assert_close(g, torch.tensor([1., 1., 2., 2.]))
        r = funcol.reduce_scatter_tensor(torch.arange(4.), "sum", 0, mesh)
        torch.testing.assert_close(r, torch.arange(4.)[2 * rank:2 * rank + 2] * 2)
        out = funcol.all_to_all_single(torch.arange(2.) + 10 * rank, [1, 1], [1, 1], mesh)
        torch.testing.assert_close(out, torch.tensor([0., 10.]) + rank)
        b = funcol.broadcast(t, 0, mesh, async_op=True)
        torch.testing.assert_close(funcol.wait_tensor(b), torch.full((2,), 1.))
        # An async result waits on first use.
        s = funcol.all_reduce(torch.full((1000,), float(rank + 1)), "sum", mesh, async_op=True)
        assert isinstance(s, funcol.AsyncCollectiveTensor)
        total = s * 2
        assert type(total) is torch.Tensor
        torch.testing.assert_close(total, torch.full((1000,), 6.))
        return True

    assert all(dtensor.run_threads(2, fn))


def test_default_backend(monkeypatch):
    from dtensor.device_mesh import default_backend

    monkeypatch.delenv("DTENSOR_BACKEND", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert default_backend("cpu") == "shm"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert default_backend("cpu") == "c10d"
    assert default_backend("cuda") == "nccl"
    # Ranks that outnumber the host's GPUs share one: cuda_ipc (NCCL refuses that), on one host.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert default_backend("cuda") == "nccl"  # the ranks span hosts
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert default_backend("cuda") == "cuda_ipc"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert default_backend("cuda") == "nccl"
    monkeypatch.setenv("DTENSOR_BACKEND", "threads")
    assert default_backend("cpu") == "threads"


def test_public_names_only():
    public = set(dtensor.__all__)
    for name in ["DeviceMesh", "init_device_mesh", "Shard", "Replicate", "Partial", "Placement",
                 "DTensor", "distribute_tensor", "distribute_module", "zeros", "ones", "empty",
                 "full", "rand", "randn"]:
        assert name in public and getattr(dtensor, name).__doc__, name
    assert issubclass(Shard, Placement) and DeviceMesh is not None


@pytest.mark.parametrize("backend", ["shm"])
def test_real_processes(backend, tmp_path):
    run_on_ranks(WORKER, 4, tmp_path, DTENSOR_BACKEND=backend)


def test_from_group_wraps_a_torch_distributed_gloo_group(tmp_path):
    run_on_ranks(FROM_GROUP_WORKER, 2, tmp_path)


def test_from_group_builds_a_2d_mesh_from_two_gloo_groups(tmp_path):
    run_on_ranks(FROM_GROUPS_2D_WORKER, 4, tmp_path)


FROM_GROUPS_2D_WORKER = r'''
import pytest
import torch
import torch.distributed as dist
from dtensor import DeviceMesh, Shard, Replicate, distribute_tensor

dist.init_process_group("gloo")
rank = dist.get_rank()
layout = [[0, 1], [2, 3]]
# Every rank creates every group (torch.distributed's rule); each keeps its own.
columns = [dist.new_group([0, 2]), dist.new_group([1, 3])]
rows = [dist.new_group([0, 1]), dist.new_group([2, 3])]
dp, tp = columns[rank % 2], rows[rank // 2]
mesh = DeviceMesh.from_group([dp, tp], "cpu", mesh=layout, mesh_dim_names=("dp", "tp"))
assert mesh.shape == (2, 2) and mesh.mesh_dim_names == ("dp", "tp")
assert mesh.get_coordinate() == (rank // 2, rank % 2)
torch.manual_seed(0)
a, b = torch.randn(8, 6), torch.randn(6, 4)
da = distribute_tensor(a, mesh, [Shard(0), Shard(1)])
db = distribute_tensor(b, mesh, [Replicate(), Shard(0)])
torch.testing.assert_close(torch.mm(da, db).full_tensor(), a @ b)
# The groups in the wrong order do not match the layout: a clear error, not another mesh.
with pytest.raises(ValueError, match="group 0 has ranks"):
    DeviceMesh.from_group([tp, dp], "cpu", mesh=layout)
with pytest.raises(ValueError, match="pass `mesh`"):
    DeviceMesh.from_group([dp, tp], "cpu")
dist.barrier()
dist.destroy_process_group()  # as above: torch.distributed's rule before exit
print("ok")
'''


FROM_GROUP_WORKER = r'''
import torch
import torch.distributed as dist
from dtensor import DeviceMesh, Shard, Replicate, distribute_tensor
from dtensor.debug import CommDebugMode

dist.init_process_group("gloo")
mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
torch.manual_seed(0)
a, b = torch.randn(8, 6), torch.randn(6, 4)
da = distribute_tensor(a, mesh, [Shard(1)])
db = distribute_tensor(b, mesh, [Shard(0)])
with CommDebugMode() as comm:
    out = torch.mm(da, db).full_tensor()
torch.testing.assert_close(out, a @ b)
assert comm.get_total_counts() >= 1
# torch.distributed's rule: a process ends its group before it exits. Without it a rank whose peer
# had already exited aborted now and then in Gloo's threads ("terminate called without an active
# exception", after "ok"), which is torch's own shutdown, not the engine's.
dist.barrier()
dist.destroy_process_group()
print("ok")
'''


WORKER = r'''
import torch
import dtensor
from dtensor import Shard, Replicate, distribute_tensor, init_device_mesh

torch.manual_seed(0)
a, b = torch.randn(8, 6), torch.randn(6, 4)
mesh = init_device_mesh("cpu", (2, 2))
da = distribute_tensor(a, mesh, [Shard(0), Shard(1)])
db = distribute_tensor(b, mesh, [Replicate(), Shard(0)])
torch.testing.assert_close(torch.mm(da, db).full_tensor(), a @ b)
w = torch.nn.Parameter(distribute_tensor(b.clone(), mesh, [Replicate(), Shard(1)]))
loss = torch.nn.functional.gelu(da @ w).sum()
loss.backward()
ref = b.clone().requires_grad_()
torch.nn.functional.gelu(a @ ref).sum().backward()
torch.testing.assert_close(w.grad.full_tensor(), ref.grad)
# As PyTorch's: the gradient of a replicated dim stays Partial (NOTE [leaf gradients keep the
# parameter's placements]); the other dims take the parameter's placements.
assert tuple(w.grad.placements) == (dtensor.Partial(), Shard(1)), w.grad.placements
print("ok")
'''


def test_deepcopy_of_distributed_tensors_and_modules():
    """copy.deepcopy of a distributed tensor is a new tensor with the same layout and values,
    although torch 1.13 deep-copies through storage, which a distributed tensor lacks; a
    distributed module deep-copies with its parameters, which train as the original's."""
    torch.manual_seed(0)
    module, x = torch.nn.Linear(5, 6), torch.randn(4, 5)
    w = torch.randn(6, 5)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2))
        for pl in ([Shard(0), Shard(1)], [Replicate(), Shard(0)], [Partial(), Shard(1)]):
            # Partial: each pair of ranks holds halves of the [6, 4] head of w, split by column.
            d = distribute_tensor(w, mesh, pl) if not pl[0].is_partial() else \
                DTensor.from_local(w[:, rank % 2 * 2:rank % 2 * 2 + 2] / 2, mesh, pl)
            c = copy.deepcopy(d)
            assert isinstance(c, DTensor) and c is not d
            assert c.placements == d.placements and c.device_mesh == d.device_mesh
            torch.testing.assert_close(c.full_tensor(), d.full_tensor(), rtol=0, atol=0)
            c.to_local().add_(1)  # independent storage
            assert not torch.equal(c.to_local(), d.to_local())
        m = copy.deepcopy(module)
        distribute_module(m, mesh)
        m(distribute_tensor(x, mesh, [Shard(0), Replicate()])).sum().backward()
        m2 = copy.deepcopy(m)
        for p, q in zip(m.parameters(), m2.parameters()):
            assert isinstance(q, torch.nn.Parameter) and isinstance(q, DTensor) and q is not p
            assert q.placements == p.placements
            torch.testing.assert_close(q.full_tensor(), p.full_tensor(), rtol=0, atol=0)
            # As for plain modules, Parameter.__deepcopy__ leaves the copy's grad unset.
            assert q.grad is None
        m2(distribute_tensor(x, mesh, [Shard(0), Replicate()])).sum().backward()
        for p, q in zip(m.parameters(), m2.parameters()):
            torch.testing.assert_close(q.grad.full_tensor(), p.grad.full_tensor(), rtol=0, atol=0)
        with pytest.raises(RuntimeError, match="graph leaves"):
            copy.deepcopy(distribute_tensor(w, mesh).requires_grad_() * 2)
        return True

    assert all(dtensor.run_threads(4, fn))


def test_inference_mode_with_a_parallelized_module():
    """torch.inference_mode() over a tensor-parallel module: the outputs equal one device's
    (the first view of a weight does not raise "Cannot set version_counter for inference
    tensor"; NOTE [views in inference mode] in dtensor/dtensor_impl.h)."""
    from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    x = torch.randn(4, 8)
    with torch.inference_mode():
        want = mlp(x)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        local = copy.deepcopy(mlp)
        parallelize_module(local, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        with torch.inference_mode():
            out = local(x)
            torch.testing.assert_close(out, want)
            w = local[0].weight
            assert not w.t().is_inference() and local[0](x).is_inference()
        return True

    assert all(dtensor.run_threads(2, fn))


