"""The opt-in dtensor.as_torch (NOTE [torch names on the engine]): code written only against
torch's names (torch.distributed.tensor, .parallel, torch.distributed.device_mesh,
torch.distributed.fsdp) runs on the engine, on 2 and 4 processes, and trains as one process.
Also: what the alias swaps and what stays torch's, multiprocessing children, and
init_device_mesh after init_process_group without torchrun's variables (NOTE [joining torch's
default group])."""

import os
import subprocess
import sys
import textwrap

import pytest

# Written against torch's names only; the engine is named only to check whose tensors they are.
TORCH_NAMES_SCRIPT = r'''
import copy
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

from dtensor import _C  # only to check that the tensors are the engine's

TOL = dict(rtol=1e-5, atol=1e-5)
n = int(os.environ["WORLD_SIZE"])


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


def train(model, xs, steps=3):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x in xs[:steps]:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.full_tensor().item() if isinstance(loss, DTensor) else loss.item())
    return losses


mesh = init_device_mesh("cpu", (n,))
rank = mesh.get_rank()
assert type(mesh).__module__ == "dtensor.device_mesh", type(mesh)

# distribute_tensor / redistribute / full_tensor
torch.manual_seed(0)
x = torch.randn(4 * n, 6)
d = distribute_tensor(x, mesh, [Shard(0)])
assert _C.is_dtensor(d) and isinstance(d, DTensor)
assert d.placements == (Shard(0),)
torch.testing.assert_close(d.to_local(), x.chunk(n)[rank])
r = d.redistribute(mesh, [Replicate()])
assert _C.is_dtensor(r) and r.placements == (Replicate(),)
torch.testing.assert_close(r.to_local(), x)
torch.testing.assert_close((d * 2 + 1).full_tensor(), x * 2 + 1)

# The private helpers libraries call (NOTE [private helpers for the engine's tensors])
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
torch.testing.assert_close(d._local_tensor, d.to_local())
for rows in (4 * n + 1, 3):
    pieces = torch.arange(rows).chunk(n)
    shape, offset = compute_local_shape_and_global_offset((rows, 6), mesh, (Shard(0),))
    if rank < len(pieces):
        assert shape == (len(pieces[rank]), 6) and offset == (int(pieces[rank][0]), 0), (
            shape, offset)
    else:
        assert shape[0] == 0, shape

# Tensor parallelism: ColwiseParallel / RowwiseParallel against one process
torch.manual_seed(0)
ref = MLP()
tp = copy.deepcopy(ref)
parallelize_module(tp, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
for name, p in tp.named_parameters():
    assert _C.is_dtensor(p) and isinstance(p, DTensor), name
assert tp.w1.weight.placements == (Shard(0),) and tp.w2.weight.placements == (Shard(1),)
xs = [torch.randn(5, 8) for _ in range(3)]
torch.testing.assert_close(train(tp, xs), train(ref, xs), **TOL)
for name, p in ref.named_parameters():
    torch.testing.assert_close(dict(tp.named_parameters())[name].full_tensor(), p.detach(),
                               **TOL)

# FSDP2: fully_shard per block, then the root, against one process
torch.manual_seed(0)
ref = Stack()
model = copy.deepcopy(ref)
for layer in model.layers:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
assert isinstance(model, FSDPModule)
for name, p in model.named_parameters():
    assert _C.is_dtensor(p) and p.placements == (Shard(0),), name
xs = [torch.randn(4, 8) for _ in range(3)]
torch.testing.assert_close(train(model, xs), train(ref, xs), **TOL)
for name, p in ref.named_parameters():
    torch.testing.assert_close(dict(model.named_parameters())[name].full_tensor(), p.detach(),
                               **TOL)
print("ok")
'''


def _env():
    return dict(os.environ, PYTHONSAFEPATH="1",
                PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def _python(code, tmp_path, name="check", timeout=180):
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(code))
    out = subprocess.run([sys.executable, str(script)], env=_env(), capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.parametrize("ranks", [2, 4])
def test_script_on_torch_names_trains_like_one_process(ranks, tmp_path):
    """`python -m dtensor.as_torch script.py` on every rank (what ./x run --as-torch starts)."""
    script = tmp_path / "torch_names.py"
    script.write_text(TORCH_NAMES_SCRIPT)
    out = subprocess.run([sys.executable, os.environ["LAUNCH_PY"], "-n", str(ranks), "--",
                          sys.executable, "-m", "dtensor.as_torch", str(script)], env=_env(),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("ok") == ranks, out.stdout


# Hugging Face transformers' tensor-parallel loading, unmodified, through the opt-in: a tiny
# random Llama saved by one process, loaded with tp_plan="auto" on every rank.
HF_SCRIPT = r'''
import os
import sys

import torch
from transformers import LlamaForCausalLM

from dtensor import _C  # only to check that the parameters are the engine's

model_dir, ids_file, ref_file = sys.argv[1:4]
model = LlamaForCausalLM.from_pretrained(model_dir, tp_plan="auto")
sharded = [n for n, p in model.named_parameters() if _C.is_dtensor(p)]
assert "model.layers.0.self_attn.q_proj.weight" in sharded, sharded
q = model.model.layers[0].self_attn.q_proj.weight
assert str(q.placements) == "(Shard(dim=0),)", q.placements
assert q.to_local().shape[0] == q.shape[0] // int(os.environ["WORLD_SIZE"])
ids = torch.load(ids_file)
with torch.no_grad():
    logits = model(ids).logits
if _C.is_dtensor(logits):
    logits = logits.full_tensor()
torch.testing.assert_close(logits, torch.load(ref_file), rtol=1e-5, atol=1e-5)
print("ok")
'''


@pytest.mark.parametrize("ranks", [2, 4])
def test_transformers_tp_plan_auto_matches_one_process(ranks, tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=4, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "model")
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        ref = model(ids).logits
    torch.save(ids, tmp_path / "ids.pt")
    torch.save(ref, tmp_path / "ref.pt")
    script = tmp_path / "hf_tp.py"
    script.write_text(HF_SCRIPT)
    env = dict(_env(), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    out = subprocess.run([sys.executable, os.environ["LAUNCH_PY"], "-n", str(ranks), "--",
                          sys.executable, "-m", "dtensor.as_torch", str(script),
                          str(tmp_path / "model"), str(tmp_path / "ids.pt"),
                          str(tmp_path / "ref.pt")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("ok") == ranks, out.stdout


def test_aliases_swap_modules_and_parent_attributes(tmp_path):
    _python(r'''
    import sys
    import torch
    import torch.distributed
    # Bound before the opt-in: keeps PyTorch's class.
    from torch.distributed.device_mesh import DeviceMesh as TorchMesh

    import dtensor.as_torch
    import dtensor
    import dtensor.debug, dtensor.device_mesh, dtensor.experimental, dtensor.fsdp
    import dtensor.parallel, dtensor.placement_types

    assert dtensor.as_torch.installed()
    expect = {
        "torch.distributed.tensor": dtensor,
        "torch.distributed.tensor.placement_types": dtensor.placement_types,
        "torch.distributed.tensor.parallel": dtensor.parallel,
        "torch.distributed.tensor.parallel.style": dtensor.parallel.style,
        "torch.distributed.tensor.debug": dtensor.debug,
        "torch.distributed.tensor.experimental": dtensor.experimental,
        "torch.distributed.tensor.device_mesh": dtensor.device_mesh,
        "torch.distributed.device_mesh": dtensor.device_mesh,
    }
    for name, mod in expect.items():
        assert sys.modules[name] is mod, name
        parent, _, leaf = name.rpartition(".")
        assert getattr(sys.modules[parent], leaf) is mod, name
    assert torch.distributed.tensor is dtensor
    assert torch.distributed.device_mesh is dtensor.device_mesh
    assert torch.distributed.DeviceMesh is dtensor.DeviceMesh
    assert torch.distributed.init_device_mesh is dtensor.init_device_mesh

    import torch.distributed.tensor as T
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.experimental import local_map
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    from torch.distributed.tensor.parallel.style import ParallelStyle
    from torch.distributed.tensor.placement_types import _StridedShard
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    assert T is dtensor and DTensor is dtensor.DTensor and Shard is dtensor.Shard
    assert distribute_tensor is dtensor.distribute_tensor
    assert CommDebugMode is dtensor.debug.CommDebugMode
    assert local_map is dtensor.experimental.local_map
    assert ColwiseParallel is dtensor.parallel.ColwiseParallel
    assert ParallelStyle is dtensor.parallel.ParallelStyle
    assert parallelize_module is dtensor.parallel.parallelize_module
    assert _StridedShard is dtensor.placement_types._StridedShard
    assert DeviceMesh is dtensor.DeviceMesh and init_device_mesh is dtensor.init_device_mesh

    # FSDP2's names are the engine's; FSDP1 stays PyTorch's.
    import torch.distributed.fsdp as F
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel, fully_shard
    for name in dtensor.as_torch.FSDP_NAMES:
        assert getattr(F, name) is getattr(dtensor.fsdp, name), name
    assert fully_shard is dtensor.fsdp.fully_shard and FSDPModule is dtensor.fsdp.FSDPModule
    assert FullyShardedDataParallel.__module__.startswith("torch.distributed.fsdp.")

    # Bound before the opt-in: PyTorch's.
    assert TorchMesh is not dtensor.DeviceMesh and TorchMesh.__module__.startswith("torch.")

    # Private modules stay torch's, in both import forms, and the engine's own are untouched.
    import torch.distributed.tensor._utils as u
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._api import DTensor as TorchDTensor
    import torch.distributed.tensor.debug._visualize_sharding as vs
    import torch.distributed.tensor.parallel.ddp as ddp
    for m in (u, vs, ddp):
        assert "/torch/distributed/tensor/" in m.__file__, m.__file__
    assert DTensorSpec.__module__ == "torch.distributed.tensor._dtensor_spec"
    assert TorchDTensor is not dtensor.DTensor
    assert dtensor._api.__name__ == "dtensor._api" and dtensor._api.DTensor is dtensor.DTensor
    # A private module both have (debug._comm_mode, as _api above): the from-form is torch's,
    # the `import ... as` form the engine's (NOTE [torch names on the engine]).
    from torch.distributed.tensor.debug._comm_mode import CommDebugMode as TorchCommDebugMode
    import torch.distributed.tensor.debug._comm_mode as cm
    assert TorchCommDebugMode.__module__.startswith("torch."), TorchCommDebugMode.__module__
    assert cm is dtensor.debug._comm_mode
    assert "dtensor" in dtensor.debug.CommDebugMode.__module__

    # torch.Tensor._local_tensor is the engine's piece on its tensors only.
    assert not hasattr(torch.ones(2), "_local_tensor")

    # torch.distributed.tensor.experimental's names are the engine's, context_parallel too.
    from torch.distributed.tensor.experimental import context_parallel
    assert context_parallel is dtensor.experimental.context_parallel
    print("ok")
    ''', tmp_path)


def test_python_m_runner_and_spawned_children_opt_in(tmp_path):
    """`python -m dtensor.as_torch script.py args`: the script runs as __main__ with its args;
    multiprocessing's spawn children opt in before they import anything."""
    script = tmp_path / "runner.py"
    script.write_text(textwrap.dedent(r'''
    import multiprocessing
    import sys


    def child(q):
        import torch.distributed.tensor as T
        import dtensor
        q.put((T is dtensor, sys.modules["torch.distributed.device_mesh"].__name__))


    if __name__ == "__main__":
        import torch.distributed.tensor as T
        assert T.__name__ == "dtensor", T
        assert sys.argv[1:] == ["a", "--b"], sys.argv
        ctx = multiprocessing.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        got = q.get(timeout=120)
        p.join()
        assert got == (True, "dtensor.device_mesh"), got
        print("ok")
    '''))
    out = subprocess.run([sys.executable, "-m", "dtensor.as_torch", str(script), "a", "--b"],
                         env=_env(), capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "ok", out.stdout


def test_init_device_mesh_after_init_process_group_without_torchrun_variables(tmp_path):
    """Processes given their rank by init_process_group (file:// here, no RANK / WORLD_SIZE /
    MASTER_PORT) make an engine mesh, 1-D and 2-D (NOTE [joining torch's default group])."""
    _python(r'''
    import os
    import tempfile

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp


    def body(rank, world, path, q):
        try:
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
                os.environ.pop(k, None)
            dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank,
                                    world_size=world)
            import dtensor
            from dtensor import Replicate, Shard, distribute_tensor, init_device_mesh
            mesh = init_device_mesh("cpu", (world,))
            x = torch.arange(24.0).reshape(8, 3)
            d = distribute_tensor(x, mesh, [Shard(0)])
            assert dtensor._C.is_dtensor(d)
            assert torch.equal(d.to_local(), x.chunk(world)[rank])
            assert torch.equal((d + 1).full_tensor(), x + 1)
            mesh2 = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
            e = distribute_tensor(x, mesh2, [Shard(0), Shard(1)])
            assert torch.equal(e.redistribute(mesh2, [Replicate(), Replicate()]).to_local(), x)
            dist.destroy_process_group()
            q.put((rank, "ok"))
        except BaseException as e:  # noqa: BLE001
            q.put((rank, repr(e)))
            raise


    if __name__ == "__main__":
        world = 4
        path = tempfile.mktemp()
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=body, args=(r, world, path, q)) for r in range(world)]
        for p in procs:
            p.start()
        got = sorted(q.get(timeout=150) for _ in range(world))
        for p in procs:
            p.join(30)
        assert got == [(r, "ok") for r in range(world)], got
        print("ok")
    ''', tmp_path, timeout=240)


def test_init_device_mesh_under_the_threaded_backend(tmp_path):
    """Ranks as threads of one process, each having called init_process_group("threaded")
    (PyTorch's MultiThreadedTestCase), share one engine job (NOTE [joining torch's default
    group])."""
    _python(r'''
    import threading

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.multi_threaded_pg import _install_threaded_pg

    import dtensor
    from dtensor import Shard, distribute_tensor, init_device_mesh

    world = 4
    torch._C._distributed_c10d._set_thread_isolation_mode(True)  # as MultiThreadedTestCase
    _install_threaded_pg()
    store = dist.HashStore()
    results = [None] * world


    def body(rank):
        try:
            dist.init_process_group("threaded", rank=rank, world_size=world, store=store)
            mesh = init_device_mesh("cpu", (world,))
            assert mesh.get_rank() == rank
            x = torch.arange(16.0).reshape(8, 2)
            d = distribute_tensor(x, mesh, [Shard(0)])
            assert torch.equal(d.to_local(), x.chunk(world)[rank])
            assert torch.equal(d.full_tensor(), x)
            results[rank] = "ok"
        except BaseException as e:  # noqa: BLE001
            results[rank] = repr(e)


    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == ["ok"] * world, results
    print("ok")
    ''', tmp_path)


def test_comm_counts_answer_pytorch_keys():
    """CommDebugMode's counts are found by name, by PyTorch's functional collective ops and by
    the Python functions of its functional collectives; a collective that did not run counts 0;
    comm_counts is the same view (NOTE [collective count keys])."""
    import torch
    import torch.distributed._functional_collectives as funcol

    import dtensor
    from dtensor import Replicate, Shard, distribute_tensor, init_device_mesh
    from dtensor.debug import CommDebugMode

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        x = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])
        comm = CommDebugMode()
        assert comm.comm_counts == {}
        with comm:
            x.redistribute(mesh, [Replicate()])
        counts = comm.get_comm_counts()
        c10d_functional = torch.ops.c10d_functional
        assert counts == {"all_gather_into_tensor": 1}
        assert counts == {c10d_functional.all_gather_into_tensor: 1}
        assert counts["all_gather_into_tensor"] == 1
        assert counts[c10d_functional.all_gather_into_tensor] == 1
        assert counts[c10d_functional.all_gather_into_tensor.default] == 1
        assert counts[torch.ops._c10d_functional.all_gather_into_tensor] == 1
        assert counts[funcol.all_gather_tensor] == 0  # a Python function: found by its name
        assert counts[funcol.all_reduce] == 0
        assert counts[c10d_functional.all_reduce] == 0 and "all_reduce" not in counts
        assert c10d_functional.all_gather_into_tensor in counts
        assert counts.get(c10d_functional.reduce_scatter_tensor, 0) == 0
        assert list(counts) == ["all_gather_into_tensor"]
        assert comm.comm_counts[c10d_functional.all_gather_into_tensor] == 1
        # Per-module counts compare alike (unittest's assertDictEqual uses !=).
        global_fwd = comm.comm_module_counts["Global"]["forward"]
        assert not global_fwd != {c10d_functional.all_gather_into_tensor: 1}
        assert global_fwd[c10d_functional.all_gather_into_tensor] == 1
        with pytest.raises(KeyError):
            counts[torch.ops.aten.mm]
        return True

    assert dtensor.run_threads(2, fn) == [True, True]


def test_strided_shard_is_not_a_plain_shard():
    """PyTorch's _StridedShard.is_shard() is False (it is not an even split of its dim)."""
    from dtensor import Shard, _C
    from dtensor.placement_types import _StridedShard

    s = _StridedShard(0, split_factor=2)
    assert not s.is_shard() and not s.is_shard(0)
    # As PyTorch 2.11's (_StridedShard subclasses torch._C._distributed.StridedShard, a
    # subclass of the C++ Shard class, not the Python Shard).
    assert not isinstance(s, Shard) and Shard(0).is_shard() and Shard(0).is_shard(0)
    assert isinstance(s, _C.Shard)
    assert s != Shard(0) and s == _StridedShard(0, split_factor=2)
