"""The distributed tensor on a CUDA mesh (NOTE [mesh device] in device_mesh/device_mesh.h): every
path keeps local tensors on the mesh's device, and results equal plain CUDA tensors. One process,
a 1-rank NCCL mesh (NCCL refuses two ranks on one GPU). Skipped where torch sees no GPU (here:
Debian's CPU-only torch); on a GPU machine tools/gpu/check.sh runs it after tools/gpu/cuda_probe.py.
"""

import copy
import os
import socket

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mesh():
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    from dtensor import init_device_mesh
    return init_device_mesh("cuda", (1,))


def _on_mesh_device(t, what):
    local = t.to_local() if hasattr(t, "placements") else t
    assert local.device == torch.device("cuda", torch.cuda.current_device()), \
        f"{what}: local piece on {local.device}"


def _close(d, want, atol=1e-5):
    got = d.full_tensor() if hasattr(d, "placements") else d
    assert got.device == want.device, f"result on {got.device}, expected {want.device}"
    torch.testing.assert_close(got, want, atol=atol, rtol=1e-5)


def test_mesh_carries_its_device_type(mesh):
    from dtensor import DeviceMesh
    assert mesh.device_type == "cuda" and mesh._mesh.device_type == "cuda"
    # init_device_mesh selected LOCAL_RANK % device_count, and the C++ mesh reads it.
    assert torch.cuda.current_device() == 0
    assert mesh._mesh.local_device() == "cuda:0"
    assert mesh != DeviceMesh("cpu", [0])


def test_factories_put_pieces_on_the_mesh_device(mesh):
    import dtensor
    from dtensor import Shard
    for name in ("empty", "zeros", "ones", "rand", "randn"):
        d = getattr(dtensor, name)(8, 4, device_mesh=mesh, placements=[Shard(0)])
        _on_mesh_device(d, f"dtensor.{name}")
        assert d.device.type == "cuda"
    full = dtensor.full((8, 4), 2.5, device_mesh=mesh, placements=[Shard(0)])
    _on_mesh_device(full, "dtensor.full")
    _close(full, torch.full((8, 4), 2.5, device="cuda"))
    _close(dtensor.ones(8, 4, device_mesh=mesh), torch.ones(8, 4, device="cuda"))
    # NOTE [random on a CUDA mesh]: one CUDA device's values for the same seed.
    for factory in (torch.rand, torch.randn):
        dtensor.manual_seed(3)
        r = getattr(dtensor, factory.__name__)(8, 4, device_mesh=mesh, placements=[Shard(0)])
        torch.manual_seed(3)
        _close(r, factory(8, 4, device="cuda"), atol=0)
    for like in (torch.zeros_like(full), torch.ones_like(full), full.new_zeros(3),
                 full.new_ones((2, 2)), torch.rand_like(full)):
        _on_mesh_device(like, "*_like / new_*")


@pytest.mark.parametrize("op", ["cauchy_", "log_normal_", "geometric_", "normal", "bernoulli",
                                "multinomial", "rrelu", "uniform_", "normal_", "rand_like",
                                "randn_like", "dropout", "dropout_transposed", "dropout_strided",
                                "dropout_odd"])
def test_random_ops_equal_one_cuda_devices(mesh, op):
    """NOTE [random on a CUDA mesh]: every random op on a CUDA mesh gives one CUDA device's values
    for the same seed (the GPU's Philox generator, the global tensor drawn in one call), and the
    generator advances as one device's (the next draw agrees too). Guards against a CUDA mesh
    giving the CPU generator's values (drawn on the host and copied) and the fallback's ops
    raising "Expected a 'cuda' device type for generator but found 'cpu'"."""
    import dtensor
    from dtensor import Replicate, Shard, distribute_tensor
    fs = {"cauchy_": lambda t: t.cauchy_(), "log_normal_": lambda t: t.log_normal_(),
          "geometric_": lambda t: t.geometric_(0.3),
          "normal": lambda t: torch.normal(t, t.abs() + 1),
          "bernoulli": lambda t: torch.bernoulli(t.abs().clamp(max=1)),
          "multinomial": lambda t: torch.multinomial(t.abs() + 0.1, 3),
          "rrelu": lambda t: torch.nn.functional.rrelu(t, training=True),
          "uniform_": lambda t: t.uniform_(-2, 3), "normal_": lambda t: t.normal_(1, 2),
          "rand_like": torch.rand_like, "randn_like": torch.randn_like,
          "dropout": lambda t: torch.nn.functional.dropout(t, 0.4, training=True),
          # CUDA's kernel draws a dense tensor in memory order, others by logical index:
          "dropout_transposed": lambda t: torch.nn.functional.dropout(t.t(), 0.4, training=True),
          "dropout_strided": lambda t: torch.nn.functional.dropout(t[:, ::2], 0.4, training=True),
          "dropout_odd": lambda t: torch.nn.functional.dropout(t.t()[:5, :3].contiguous().t(),
                                                               0.4, training=True)}
    base = torch.randn(8, 6, generator=torch.Generator().manual_seed(0)).cuda()
    torch.manual_seed(5)
    want = fs[op](base.clone())
    after = torch.rand(3, device="cuda")
    for placements in ([Shard(0)], [Replicate()]):
        d = distribute_tensor(base, mesh, placements)
        dtensor.manual_seed(5)
        got = fs[op](d)
        _on_mesh_device(got, op)
        _close(got, want, atol=0)
        _close(torch.rand(3, device="cuda"), after, atol=0)


def test_distribute_tensor_moves_inputs_to_the_mesh_device(mesh):
    from dtensor import Replicate, Shard, distribute_tensor
    a = torch.randn(8, 6, device="cuda")
    for src in (a, a.cpu()):
        for pl in ([Shard(0)], [Shard(1)], [Replicate()]):
            for src_data_rank in (0, None):
                d = distribute_tensor(src, mesh, pl, src_data_rank=src_data_rank)
                _on_mesh_device(d, f"distribute_tensor {pl} from {src.device}")
                _close(d, a)


def test_from_local_run_check_and_cpu_pieces(mesh):
    from dtensor import DTensor, Replicate, Shard
    a = torch.randn(8, 6, device="cuda")
    for pl in ([Replicate()], [Shard(0)]):
        d = DTensor.from_local(a.clone(), mesh, pl, run_check=True)
        _on_mesh_device(d, f"from_local(run_check) {pl}")
        _close(d, a)
    # A CPU piece on a CUDA mesh moves to the mesh's device, and its gradient flows back.
    cpu = a.cpu().requires_grad_()
    d = DTensor.from_local(cpu, mesh, [Shard(0)], run_check=True)
    _on_mesh_device(d, "from_local(cpu piece)")
    (d * 3).sum().backward()
    assert cpu.grad is not None and cpu.grad.device.type == "cpu"
    torch.testing.assert_close(cpu.grad, torch.full_like(cpu, 3.0))


def test_ops_redistribute_full_tensor_and_the_fallback(mesh):
    from dtensor import DTensor, Replicate, Shard
    torch.manual_seed(0)
    a, b = torch.randn(8, 16, device="cuda"), torch.randn(16, 4, device="cuda")
    da = DTensor.from_local(a, mesh, [Shard(0)])
    db = DTensor.from_local(b, mesh, [Replicate()])
    _close(torch.mm(da, db), a @ b)
    _close(torch.relu(da) + da, torch.relu(a) + a)
    _close(da.sum(), a.sum())
    r = da.redistribute(mesh, [Replicate()])
    _on_mesh_device(r, "redistribute")
    full = da.full_tensor()
    assert full.device.type == "cuda"
    # An op with no sharding rule runs by the replicate fallback on the GPU.
    h = torch.histc(da, bins=5)
    _on_mesh_device(h, "replicate fallback (histc)")
    _close(h, torch.histc(a, bins=5))
    _on_mesh_device(torch.nn.functional.dropout(da, 0.5), "dropout")


def test_parallelize_module_forward_and_backward_equal_plain_cuda(mesh):
    from dtensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                  parallelize_module)
    torch.manual_seed(1)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                              torch.nn.Linear(32, 16), torch.nn.LayerNorm(16)).cuda()
    for source in ("cuda", "cpu"):
        # A CPU module's parameters move to the mesh's device, as PyTorch's distribute_tensor.
        model = copy.deepcopy(ref).to(source)
        tp = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel(),
                                              "3": SequenceParallel()})
        for p in tp.parameters():
            _on_mesh_device(p, f"parameter of a {source} module")
        x = torch.randn(4, 16, device="cuda")
        out, out_ref = tp(x), ref(x)
        _close(out, out_ref)
        out.sum().backward()
        ref.zero_grad()
        out_ref.sum().backward()
        for (name, p), p_ref in zip(tp.named_parameters(), ref.parameters()):
            _on_mesh_device(p.grad, f"grad of {name}")
            _close(p.grad, p_ref.grad, atol=1e-4)
    emb = torch.nn.Embedding(10, 8).cuda()
    tp_emb = parallelize_module(copy.deepcopy(emb), mesh, RowwiseParallel())
    idx = torch.randint(0, 10, (3, 5), device="cuda")
    _close(tp_emb(idx), emb(idx))


def test_loss_parallel_forward_and_backward(mesh):
    from dtensor import Shard, distribute_tensor
    from dtensor.parallel import loss_parallel
    logits = torch.randn(6, 10, device="cuda", requires_grad=True)
    target = torch.randint(0, 10, (6,), device="cuda")
    d = distribute_tensor(logits.detach(), mesh, [Shard(1)]).requires_grad_()
    with loss_parallel():
        loss = torch.nn.functional.cross_entropy(d, target)
        loss.backward()
    ref = torch.nn.functional.cross_entropy(logits, target)
    ref.backward()
    _close(loss, ref)
    _on_mesh_device(d.grad, "loss_parallel grad")
    _close(d.grad, logits.grad)


def test_checkpoint_loads_into_a_cuda_mesh(mesh, tmp_path):
    import dtensor.checkpoint as dcp
    from dtensor import Replicate, Shard, distribute_tensor, zeros
    a = torch.randn(8, 6, device="cuda")
    dcp.save({"w": distribute_tensor(a, mesh, [Shard(0)]), "plain": a.cpu(), "step": 3},
             checkpoint_id=tmp_path / "ck")
    state = {"w": zeros(8, 6, device_mesh=mesh, placements=[Replicate()]),
             "plain": torch.zeros(8, 6), "step": 0}
    dcp.load(state, checkpoint_id=tmp_path / "ck")
    _on_mesh_device(state["w"], "checkpoint.load")
    _close(state["w"], a)
    assert state["step"] == 3


def test_fully_shard_trains_like_plain_cuda(mesh):
    """FSDP on the CUDA mesh: sharded parameters, their gathered copies and the reduce-scattered
    gradients live on the GPU, and 3 AdamW steps equal a plain CUDA model's."""
    from dtensor.fsdp import MixedPrecisionPolicy, fully_shard
    torch.manual_seed(2)
    ref = torch.nn.Sequential(torch.nn.Linear(7, 15), torch.nn.ReLU(),
                              torch.nn.Linear(15, 3)).cuda()
    for reshard in (True, False):
        model = copy.deepcopy(ref)
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float32))
        plain = copy.deepcopy(ref)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        opt_ref = torch.optim.AdamW(plain.parameters(), lr=1e-2)
        for step in range(3):
            x = torch.randn(4, 7, device="cuda")
            # A CPU input moves to the mesh's device at the root, as in PyTorch.
            loss = model(x if reshard else x.cpu()).pow(2).mean()
            loss_ref = plain(x).pow(2).mean()
            _close(loss, loss_ref)
            loss.backward()
            loss_ref.backward()
            for name, p in model.named_parameters():
                _on_mesh_device(p, f"FSDP parameter {name}")
                _on_mesh_device(p.grad, f"FSDP grad of {name}")
            opt.step(); opt_ref.step(); opt.zero_grad(); opt_ref.zero_grad()
        for (name, p), p_ref in zip(model.named_parameters(), plain.parameters()):
            _close(p, p_ref.detach(), atol=1e-5)


def test_grad_scaler_over_fully_shard_trains_like_plain_cuda(mesh):
    """torch.amp.GradScaler("cuda") over FSDP on the CUDA mesh (NOTE [amp unscale]): the unscale
    runs CUDA's kernel on the pieces, and 3 steps (one with an inf gradient, skipped) equal a
    plain CUDA model's, scale included."""
    from dtensor.fsdp import fully_shard
    torch.manual_seed(3)
    ref = torch.nn.Sequential(torch.nn.Linear(7, 15), torch.nn.ReLU(),
                              torch.nn.Linear(15, 3)).cuda()
    model = copy.deepcopy(ref)
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    results = []
    for m in (model, ref):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 8)
        torch.manual_seed(4)
        for step in range(3):
            scaler.scale(m(torch.randn(4, 7, device="cuda")).pow(2).mean()).backward()
            if step == 1:
                with torch.no_grad():
                    g = m[2].bias.grad
                    (g.to_local() if hasattr(g, "placements") else g)[0] = float("inf")
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        results.append((scaler.get_scale(), [p for p in m.parameters()]))
    assert results[0][0] == results[1][0] < 2.0 ** 8
    for p, p_ref in zip(results[0][1], results[1][1]):
        _close(p, p_ref.detach(), atol=1e-5)


def test_fully_shard_cpu_offload_trains_like_plain_cuda(mesh):
    """CPUOffloadPolicy on the CUDA mesh (NOTE [CPU offload]): the sharded parameters (pinned)
    and their gradients are on the CPU, on the mesh's CPU twin; 3 steps of clip_grad_norm_ (its
    norm all-reduced through the device, NOTE [nccl and CPU tensors]) and AdamW on the CPU
    equal a plain CUDA model's."""
    from dtensor.fsdp import CPUOffloadPolicy, fully_shard
    torch.manual_seed(4)
    ref = torch.nn.Sequential(torch.nn.Linear(7, 15), torch.nn.ReLU(),
                              torch.nn.Linear(15, 3)).cuda()
    model = copy.deepcopy(ref)
    for m in (model[0], model[2], model):
        fully_shard(m, mesh=mesh, offload_policy=CPUOffloadPolicy())
    plain = copy.deepcopy(ref)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt_ref = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    for step in range(3):
        x = torch.randn(4, 7, device="cuda")
        loss, loss_ref = model(x).pow(2).mean(), plain(x).pow(2).mean()
        _close(loss, loss_ref)
        loss.backward()
        loss_ref.backward()
        for name, p in model.named_parameters():
            assert p.device_mesh.device_type == "cpu" and p.to_local().is_pinned(), name
            assert p.grad.to_local().device.type == "cpu", f"grad of {name}"
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        norm_ref = torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.5)
        norm = norm.full_tensor() if hasattr(norm, "placements") else norm
        torch.testing.assert_close(norm.cpu(), norm_ref.cpu(), atol=1e-5, rtol=1e-5)
        opt.step(); opt_ref.step(); opt.zero_grad(); opt_ref.zero_grad()
    for (name, p), p_ref in zip(model.named_parameters(), plain.parameters()):
        _close(p, p_ref.detach().cpu(), atol=1e-5)


def test_tp_training_step_copies_nothing_to_the_host(mesh):
    """The target: a TP training step on CUDA issues no device-to-host copy (the profiler's
    CUDA activity records each memcpy; the loss is not read)."""
    from torch.profiler import ProfilerActivity, profile

    from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 16)).cuda()
    model = parallelize_module(model, mesh, {"1": ColwiseParallel(), "3": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    x = torch.randn(4, 8, 16, device="cuda")

    def step():
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    to_host = [n for n in names if "DtoH" in n or n == "aten::_local_scalar_dense"]
    assert any("mm" in n for n in names), "the profiler saw no matrix product"
    assert to_host == [], f"device-to-host copies in one TP step: {to_host}"
