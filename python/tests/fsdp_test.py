"""dtensor.fsdp.fully_shard (NOTE [fully_shard]) against one process, ranks as threads: training
parity over AdamW steps with uneven and empty shards and several groups, the collectives of a
step, gradient accumulation without sync, parameter registration across a step, HSDP on a 2-D
mesh, the gradient divide factor, mixed precision, mixed dtypes in one group, unshard/reshard,
explicit prefetch, the state dict and ranks that reach different groups (FSDP over TP is in
fsdp_tp_test.py, the rest of the API in fsdp_api_test.py; shared helpers in fsdp_testing.py).
Every expected value is computed here by one process (or from the model's structure), as
PyTorch's FSDP2 tests do."""

import copy
import threading

import pytest
import torch
from torch import nn

import dtensor
from dtensor import DTensor, Replicate, Shard
from dtensor.debug import CommDebugMode
from dtensor.fsdp import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy,
                          fully_shard)
from launch_ranks import run_on_ranks
from fsdp_testing import (TOL, MLP, _base_model, _batches, _check_grads, _check_layout,
                          _check_params, _counts, _groups, _local, _loss, _reference, _shard,
                          _train_like_one_process, _train_step)


# ---- training parity and collectives ---------------------------------------------------------

@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("reshard_after_forward", [True, False, None])
def test_train_parity_multi_group(world, reshard_after_forward):
    base = _base_model()
    batches = _batches(world, 10)
    ref_losses, ref_grads, ref_final = _reference(base, batches, world)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        model = _shard(copy.deepcopy(base), mesh, reshard_after_forward=reshard_after_forward)
        groups = _groups(model)
        non_root = [m for m in groups if m is not model]
        # Backward all-gathers: every group that resharded after forward; by default (None)
        # the root keeps its parameters (PyTorch's rule).
        bwd_gathers = {True: len(groups), False: 0, None: len(non_root)}[reshard_after_forward]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for step, ((x, y),) in enumerate(batches):
            with CommDebugMode() as fwd:
                loss = _loss(model(_local(x, rank)), _local(y, rank))
            with CommDebugMode() as bwd:
                loss.backward()
            torch.testing.assert_close(loss.item(), ref_losses[step][0][rank], **TOL)
            assert _counts(fwd) == {"all_gather_into_tensor": len(groups)}
            expected = {"reduce_scatter_tensor": len(groups)}
            if bwd_gathers:
                expected["all_gather_into_tensor"] = bwd_gathers
            assert _counts(bwd) == expected
            for n, p in model.named_parameters():
                assert p.grad.placements == (Shard(0),)
                assert p.grad.to_local().shape == p.to_local().shape
                torch.testing.assert_close(p.grad.full_tensor(), ref_grads[step][n], **TOL)
            with CommDebugMode() as optim:
                opt.step()
                opt.zero_grad()
            assert optim.get_total_counts() == 0
        _check_params(model, ref_final)

    dtensor.run_threads(world, rank_fn)


def test_hsdp_parity():
    """A (2, 2) mesh: shard on dim 1, replicate on dim 0; the data-parallel size is 4."""
    base = _base_model()
    batches = _batches(4, 10)
    ref_losses, ref_grads, ref_final = _reference(base, batches, 4)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        model = _shard(copy.deepcopy(base), mesh)
        groups = _groups(model)
        for p in model.parameters():
            assert p.placements == (Replicate(), Shard(0))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for step, ((x, y),) in enumerate(batches):
            loss, comm = _train_step(model, x, y, rank)
            torch.testing.assert_close(loss.item(), ref_losses[step][0][rank], **TOL)
            c = _counts(comm)
            assert c["reduce_scatter_tensor"] == len(groups)
            assert c["all_reduce"] == len(groups)
            _check_grads(model, ref_grads[step], (Replicate(), Shard(0)))
            opt.step()
            opt.zero_grad()
        _check_params(model, ref_final)

    dtensor.run_threads(4, rank_fn)


@pytest.mark.parametrize("reshard_after_forward", [True, False])
def test_gradient_accumulation(reshard_after_forward):
    """No gradient sync on the first micro-batches (no reduce-scatter), sync on the last."""
    world, micro = 2, 3
    base = _base_model()
    batches = _batches(world, 3, micro)
    ref_losses, _, ref_final = _reference(base, batches, world)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        model = _shard(copy.deepcopy(base), mesh, reshard_after_forward=reshard_after_forward)
        groups = _groups(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for step, micro_batches in enumerate(batches):
            for i, (x, y) in enumerate(micro_batches):
                last = i == micro - 1
                model.set_requires_gradient_sync(last)
                with CommDebugMode() as comm:
                    loss = _loss(model(_local(x, rank)), _local(y, rank))
                    (loss / micro).backward()
                torch.testing.assert_close(loss.item(), ref_losses[step][i][rank], **TOL)
                scatters = comm.get_comm_counts().get("reduce_scatter_tensor", 0)
                assert scatters == (len(groups) if last else 0)
                for p in model.parameters():
                    assert (p.grad is not None) == last
            opt.step()
            opt.zero_grad()
        _check_params(model, ref_final)

    dtensor.run_threads(world, rank_fn)


def test_accumulation_without_reshard_after_backward():
    """Micro-batches that neither sync nor reshard after backward: only the first one
    all-gathers, only the last one reduce-scatters, and training equals one process."""
    world, micro = 2, 3
    base = _base_model()
    batches = _batches(world, 3, micro)
    ref_losses, _, ref_final = _reference(base, batches, world)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        model = _shard(copy.deepcopy(base), mesh, reshard_after_forward=False)
        groups = _groups(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for step, micro_batches in enumerate(batches):
            for i, (x, y) in enumerate(micro_batches):
                last = i == micro - 1
                model.set_requires_gradient_sync(last)
                model.set_reshard_after_backward(last)
                with CommDebugMode() as comm:
                    loss = _loss(model(_local(x, rank)), _local(y, rank))
                    (loss / micro).backward()
                torch.testing.assert_close(loss.item(), ref_losses[step][i][rank], **TOL)
                counts = comm.get_comm_counts()
                assert counts.get("all_gather_into_tensor", 0) == (len(groups) if i == 0 else 0)
                assert counts.get("reduce_scatter_tensor", 0) == (len(groups) if last else 0)
            opt.step()
            opt.zero_grad()
        _check_params(model, ref_final)

    dtensor.run_threads(world, rank_fn)


# ---- registration, state dict, API -----------------------------------------------------------

@pytest.mark.parametrize("reshard_after_forward", [True, False])
def test_param_registration_across_step(reshard_after_forward):
    """Sharded parameters are registered except between a forward without reshard and its
    backward, when the unsharded (plain, full) ones are."""
    world = 2
    base = _base_model()
    (((x, y),),) = _batches(world, 1)
    full = dict(base.named_parameters())

    def check_sharded(model):
        for n, p in model.named_parameters():
            assert isinstance(p, nn.Parameter) and isinstance(p, DTensor), n
            assert p.placements == (Shard(0),) and p.shape == full[n].shape, n

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        model = _shard(copy.deepcopy(base), mesh, reshard_after_forward=reshard_after_forward)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        check_sharded(model)
        used = []  # the parameters l1 computes with (registered by FSDP's pre-forward)
        model.l1.register_forward_pre_hook(lambda m, i: used.append(m.weight))
        loss = _loss(model(_local(x, rank)), _local(y, rank))
        (unsharded,) = used
        assert not isinstance(unsharded, DTensor) and unsharded.shape == full["l1.weight"].shape
        # Resharding frees the unsharded storage (refilled by the backward's all-gather).
        freed = unsharded.untyped_storage().nbytes() == 0
        assert freed == reshard_after_forward
        if reshard_after_forward:
            check_sharded(model)
        else:
            for n, p in model.named_parameters():
                assert isinstance(p, nn.Parameter) and not isinstance(p, DTensor), n
                torch.testing.assert_close(p.detach(), full[n].detach(), rtol=0, atol=0)
        loss.backward()
        check_sharded(model)
        assert unsharded.untyped_storage().nbytes() == 0
        opt.step()
        check_sharded(model)
        assert set(model.parameters()) == set(opt.param_groups[0]["params"])

    dtensor.run_threads(world, rank_fn)


def test_state_dict_without_communication():
    world = 3
    base = _base_model()
    batches = _batches(world, 1)
    _, _, ref_final = _reference(base, batches, world)
    ref_state = copy.deepcopy(base).state_dict()

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        model = _shard(copy.deepcopy(base), mesh)  # the root keeps its parameters after forward
        with CommDebugMode() as comm:
            sd = model.state_dict()
        assert comm.get_total_counts() == 0
        assert list(sd) == list(ref_state)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        ((x, y),) = batches[0]
        _loss(model(_local(x, rank)), _local(y, rank)).backward()
        opt.step()
        with torch.no_grad():
            model(_local(x, rank))  # the root's parameters stay unsharded after this forward
        with CommDebugMode() as comm:
            sd = model.state_dict()
        assert comm.get_total_counts() == 0
        assert list(sd) == list(ref_state)
        for k, v in sd.items():
            assert isinstance(v, DTensor) and v.placements == (Shard(0),), k
            torch.testing.assert_close(v.full_tensor(), ref_final[k], **TOL)
        # Loading the state dict back into a fresh sharded model gives the same parameters.
        fresh = _shard(copy.deepcopy(base), mesh)
        fresh.load_state_dict(sd)
        _check_params(fresh, ref_final)

    dtensor.run_threads(world, rank_fn)


def test_gradient_divide_factor():
    """Gradients are the sum over ranks divided by the factor (default: the world size)."""
    world, factor = 2, 8.0
    base = _base_model()
    batches = _batches(world, 1)
    _, ref_grads, _ = _reference(base, batches, world)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        model = _shard(copy.deepcopy(base), mesh)
        for m in _groups(model):
            m.set_gradient_divide_factor(factor)
        ((x, y),) = batches[0]
        _loss(model(_local(x, rank)), _local(y, rank)).backward()
        for n, p in model.named_parameters():
            # The reference's gradient is the mean over ranks: the sum is world times it.
            torch.testing.assert_close(p.grad.full_tensor(), ref_grads[0][n] * world / factor,
                                       **TOL)

    dtensor.run_threads(world, rank_fn)


def test_mixed_precision_parity():
    """param_dtype/reduce_dtype float64 over float32 parameters: compute and reduction in
    float64, sharded parameters and gradients in float32, outputs cast to output_dtype."""
    world = 3
    base = _base_model()
    batches = _batches(world, 5)
    ref_losses, _, ref_final = _reference(base, batches, world, compute_dtype=torch.float64)
    policy = MixedPrecisionPolicy(param_dtype=torch.float64, reduce_dtype=torch.float64)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        model = copy.deepcopy(base)
        fully_shard(model.l1, mesh=mesh, mp_policy=policy)
        fully_shard(model.l2, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(
            param_dtype=torch.float64, reduce_dtype=torch.float64, output_dtype=torch.float32))
        seen = []
        # Runs after FSDP's pre-forward (prepended): the unsharded weight and the cast input.
        model.l1.register_forward_pre_hook(
            lambda m, i: seen.append((m.weight.dtype, i[0].dtype)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for step, ((x, y),) in enumerate(batches):
            out = model(_local(x, rank))
            assert out.dtype == torch.float32 and seen[-1] == (torch.float64, torch.float64)
            loss = _loss(out.double(), _local(y, rank).double())
            loss.backward()
            torch.testing.assert_close(loss.item(), ref_losses[step][0][rank], **TOL)
            for p in model.parameters():
                assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
            opt.step()
            opt.zero_grad()
        _check_params(model, ref_final)

    dtensor.run_threads(world, rank_fn)


def test_unshard_reshard_and_prefetch():
    """unshard (sync and async) registers the full parameters with one all-gather per group;
    reshard registers the sharded ones; explicit prefetch keeps the result and the counts."""
    world = 2
    base = _base_model()
    batches = _batches(world, 3)
    ref_losses, _, ref_final = _reference(base, batches, world)
    full = {n: p.detach() for n, p in base.named_parameters()}

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        model = _shard(copy.deepcopy(base), mesh, reshard_after_forward=True)
        groups = _groups(model)
        with CommDebugMode() as comm:
            model.l1.unshard()
            handle = model.l2.unshard(async_op=True)
            handle.wait()
        assert _counts(comm) == {"all_gather_into_tensor": 2}
        for n, p in list(model.l1.named_parameters()) + list(model.l2.named_parameters()):
            assert not isinstance(p, DTensor)
        torch.testing.assert_close(model.l1.weight.detach(), full["l1.weight"], rtol=0, atol=0)
        torch.testing.assert_close(model.l2.bias.detach(), full["l2.bias"], rtol=0, atol=0)
        model.l1.reshard()
        model.l2.reshard()
        assert all(isinstance(p, DTensor) for p in model.parameters())

        model.set_modules_to_forward_prefetch([model.l1])
        model.l1.set_modules_to_forward_prefetch([model.l2])
        model.l2.set_modules_to_backward_prefetch([model.l1])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for step, ((x, y),) in enumerate(batches):
            loss, comm = _train_step(model, x, y, rank)
            torch.testing.assert_close(loss.item(), ref_losses[step][0][rank], **TOL)
            assert _counts(comm) == {"all_gather_into_tensor": 2 * len(groups),
                                     "reduce_scatter_tensor": len(groups)}
            opt.step()
            opt.zero_grad()
        _check_params(model, ref_final)

    dtensor.run_threads(world, rank_fn)


def test_shard_placement_fn_and_class():
    """shard_placement_fn's Shard(1) for weights; the module's class derives from FSDPModule."""
    world = 3
    base = _base_model()
    batches = _batches(world, 3)
    ref_losses, _, ref_final = _reference(base, batches, world)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        model = _shard(copy.deepcopy(base), mesh,
                       shard_placement_fn=lambda p: Shard(1) if p.dim() == 2 else None)
        assert isinstance(model, FSDPModule) and isinstance(model, MLP)
        assert isinstance(model.l1, FSDPModule) and isinstance(model.l1, nn.Linear)
        for n, p in model.named_parameters():
            assert p.placements == ((Shard(1),) if p.dim() == 2 else (Shard(0),)), n
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for step, ((x, y),) in enumerate(batches):
            loss = _loss(model(_local(x, rank)), _local(y, rank))
            loss.backward()
            torch.testing.assert_close(loss.item(), ref_losses[step][0][rank], **TOL)
            for p in model.parameters():
                assert p.grad.placements == p.placements
            opt.step()
            opt.zero_grad()
        _check_params(model, ref_final)

    dtensor.run_threads(world, rank_fn)


class TwoExperts(nn.Module):
    """Two experts of one shape: their groups' all-gathers have equal sizes."""

    def __init__(self):
        super().__init__()
        self.expert0 = nn.Linear(8, 8)
        self.expert1 = nn.Linear(8, 8)

    def forward(self, x, order):
        for i in order:
            x = getattr(self, f"expert{i}")(x)
        return x


@pytest.mark.parametrize("case", ["skipped", "reordered"])
def test_ranks_that_reach_different_groups_fail_naming_the_modules(case):
    """Rank 1 skips expert0 (an unused expert), or runs the experts in the other order: the
    ranks' all-gathers pair different groups of equal size. Every rank must fail at once with an
    error naming both modules (PyTorch hangs: pytorch/pytorch#158719), never exchange one
    expert's parameters for the other's."""
    orders = {"skipped": ([0, 1], [1]), "reordered": ([0, 1], [1, 0])}[case]

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        torch.manual_seed(0)
        model = TwoExperts()
        fully_shard(model.expert0, mesh=mesh)
        fully_shard(model.expert1, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model(torch.randn(4, 8), orders[rank]).sum().backward()

    with pytest.raises(Exception, match=r"purpose differs: .*'FSDP expert0'.*'FSDP expert1'"):
        dtensor.run_threads(2, rank_fn)


class MixedDtypes(nn.Module):
    """A float64 layer and a float32 layer in one parameter group."""

    def __init__(self):
        super().__init__()
        self.wide = nn.Linear(7, 15).double()
        self.narrow = nn.Linear(15, 2)

    def forward(self, x):
        return self.narrow(torch.relu(self.wide(x.double())).float())


def test_one_group_with_mixed_dtypes_matches_one_process():
    """fully_shard on the root only: one group of float64 and float32 parameters (PyTorch's FSDP2
    refuses it, pytorch/pytorch#156784): one all-gather and one reduce-scatter per dtype, and
    5 AdamW steps equal one process's, each parameter and gradient in its own dtype."""
    torch.manual_seed(0)
    base = MixedDtypes()
    batches = _batches(2, 5)
    ref_losses, ref_grads, ref_final = _reference(base, batches, 2)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        model = fully_shard(copy.deepcopy(base), mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for step, ((x, y),) in enumerate(batches):
            loss, comm = _train_step(model, x, y, rank)
            torch.testing.assert_close(loss.item(), ref_losses[step][0][rank], **TOL)
            assert _counts(comm) == {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2}
            for n, p in model.named_parameters():
                assert p.dtype == p.grad.dtype == dict(base.named_parameters())[n].dtype, n
                torch.testing.assert_close(p.grad.full_tensor(), ref_grads[step][n], **TOL)
            opt.step()
            opt.zero_grad()
        _check_params(model, ref_final)

    dtensor.run_threads(2, rank_fn)


def test_implicit_backward_prefetch_issues_the_next_groups_all_gather_early():
    """NOTE [implicit backward prefetch]: in backward, the group that ran forward before this
    one is all-gathered at this one's pre-backward, before this group's reduce-scatter (without
    prefetch it came after); the counts and the result stay those without prefetch, and an
    empty explicit list turns it off."""
    from dtensor.fsdp._param_group import FSDPParamGroup

    world = 2
    base = _base_model()
    batches = _batches(world, 2)
    ref_losses, _, ref_final = _reference(base, batches, world)
    events = {}  # thread -> [(kind, group name)] during backward
    unshard, reduce = FSDPParamGroup.unshard, FSDPParamGroup._reduce

    def record(kind, real):
        def wrapped(group, *args, **kwargs):
            if threading.get_ident() in events:
                events[threading.get_ident()].append((kind, group.name))
            return real(group, *args, **kwargs)
        return wrapped

    def rank_fn(rank, prefetch):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        model = _shard(copy.deepcopy(base), mesh, reshard_after_forward=True)
        if not prefetch:
            for m in (model, model.l1, model.l2):
                m.set_modules_to_backward_prefetch([])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for step, ((x, y),) in enumerate(batches):
            with CommDebugMode() as comm:
                loss = _loss(model(_local(x, rank)), _local(y, rank))
                events[threading.get_ident()] = []
                loss.backward()
            seq = events.pop(threading.get_ident())
            torch.testing.assert_close(loss.item(), ref_losses[step][0][rank], **TOL)
            assert _counts(comm) == {"all_gather_into_tensor": 2 * 3, "reduce_scatter_tensor": 3}
            # l1 is all-gathered before l2's reduce-scatter only when prefetched (the root's
            # reduce-scatter comes last either way: its inputs need no gradient).
            gathered, reduced = seq.index(("unshard", "l1")), seq.index(("reduce", "l2"))
            assert (gathered < reduced) == prefetch, (prefetch, seq)
            opt.step()
            opt.zero_grad()
        _check_params(model, ref_final)

    FSDPParamGroup.unshard = record("unshard", unshard)
    FSDPParamGroup._reduce = record("reduce", reduce)
    try:
        for prefetch in (True, False):
            dtensor.run_threads(world, lambda rank: rank_fn(rank, prefetch))
    finally:
        FSDPParamGroup.unshard, FSDPParamGroup._reduce = unshard, reduce


# ---- size-1 dims (NOTE [size-1 dims under FSDP]) ----------------------------------------------

class SizeOneParams(nn.Module):
    """A token (1, 15) added to every row (as ViT's cls_token), a 0-dim scale, and a
    Linear(15, 1) head whose weight is (1, 15) and bias (1,)."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(7, 15)
        self.token = nn.Parameter(torch.randn(1, 15))
        self.scale = nn.Parameter(torch.tensor(0.5))
        self.head = nn.Linear(15, 1)
        self.out = nn.Linear(1, 2)

    def forward(self, x):
        return self.out(self.head(torch.relu(self.l1(x) + self.token)) * self.scale)


@pytest.mark.parametrize("offload", [None, CPUOffloadPolicy(pin_memory=False)])
@pytest.mark.parametrize("shape", [(2,), (3,), (2, 2)])
def test_size_one_dims_train_like_one_process(shape, offload):
    """As PyTorch's FSDP2, a dim 0 of size 1 is Shard(0) too (rank 0 holds it, the others empty
    pieces: NOTE [size-1 dims under FSDP]); a 0-dim parameter stays whole (Replicate) with its
    gradient averaged; 10 AdamW steps equal one process (FSDP on 2 and 3 ranks, HSDP on (2, 2)),
    and the optimizer's in-place steps keep every placement. With CPUOffloadPolicy the pieces are
    cut as on a CUDA mesh (NOTE [CPU offload]), where a CPU mesh is its own CPU twin."""
    world = shape[0] * (shape[1] if len(shape) > 1 else 1)
    hsdp = (Replicate(),) if len(shape) > 1 else ()
    torch.manual_seed(0)
    base = SizeOneParams()
    batches = _batches(world, 10)
    reference = _reference(base, batches, world)
    want = {"l1.weight": (Shard(0),), "l1.bias": (Shard(0),), "token": (Shard(0),),
            "scale": (Replicate(),), "head.weight": (Shard(0),), "head.bias": (Shard(0),),
            "out.weight": (Shard(0),), "out.bias": (Shard(0),)}
    want = {n: hsdp + p for n, p in want.items()}

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", shape)
        model = copy.deepcopy(base)
        for m in (model.l1, model.head, model):
            fully_shard(m, mesh=mesh, offload_policy=offload or OffloadPolicy())
        _check_layout(model, base, want)
        _train_like_one_process(model, batches, rank, reference)
        for n, p in model.named_parameters():  # AdamW's in-place steps kept them
            assert p.placements == want[n], (n, p.placements)

    dtensor.run_threads(world, rank_fn)


_PROCESS_WORKER = r'''
import copy
import torch
import dtensor
from dtensor.fsdp import _param_group
from fsdp_testing import TOL, _base_model, _batches, _check_params, _local, _loss, _reference, _shard

world = 2
base = _base_model()
batches = _batches(world, 4)
ref_losses, _, ref_final = _reference(base, batches, world)
mesh = dtensor.init_device_mesh("cpu", (world,))
rank = mesh.get_rank()
model = _shard(copy.deepcopy(base), mesh, reshard_after_forward=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step, ((x, y),) in enumerate(batches):
    loss = _loss(model(_local(x, rank)), _local(y, rank))
    loss.backward()
    torch.testing.assert_close(loss.item(), ref_losses[step][0][rank], **TOL)
    opt.step()
    opt.zero_grad()
_check_params(model, ref_final)
groups = sum(1 for m in model.modules() if type(m).__name__.startswith("FSDP"))
pools = {k: len(v) for k, v in _param_group._GATHER_POOL.items()}
# As many all-gather inputs as are in flight at once (a group's and a prefetched one's), not one
# per group (NOTE [FSDP buffers in symmetric memory]).
assert groups >= 3 and pools and all(n <= 2 for n in pools.values()), (groups, pools)
print("ok")
'''


def test_processes_on_shm_train_like_one_process_with_a_bounded_buffer_pool(tmp_path):
    """The shm backend's path (processes, flat buffers in symmetric memory, the zero-copy
    algorithm forced for these small sizes): parity with one process, and a pool of at most two
    symmetric all-gather inputs for every group of the model."""
    run_on_ranks(_PROCESS_WORKER, 2, tmp_path, DTENSOR_SHM_SYMMETRIC_MIN_BYTES="0")
