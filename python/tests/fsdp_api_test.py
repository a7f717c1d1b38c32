"""dtensor.fsdp.fully_shard's API past the core loop (fsdp_test.py), each against one process,
ranks as threads: reshard_after_forward as an int (NOTE [reshard after forward to a smaller
group]), HSDP accumulation without all-reduce (set_requires_all_reduce), set_unshard_in_backward,
set_all_reduce_hook (a custom HSDP), fully_shard on a list of modules,
register_fsdp_forward_method, the stream settings it accepts, and initialization on the meta
device. Every expected value is computed here by one process, as PyTorch's FSDP2 tests do."""

import copy

import pytest
import torch
from torch import nn

import dtensor
from dtensor import DTensor, Replicate, Shard, _C
from dtensor.debug import CommDebugMode
from dtensor.fsdp import (CPUOffloadPolicy, fully_shard, register_fsdp_forward_method,
                          share_comm_ctx)
from fsdp_testing import (TOL, _base_model, _batches, _check_grads, _check_params, _counts,
                          _groups, _local, _loss, _reference, _shard, _train_like_one_process)


def test_reshard_after_forward_to_a_smaller_group():
    """reshard_after_forward=2 on 4 ranks (NOTE [reshard after forward to a smaller group]):
    after forward each group keeps half of its gathered buffer (not all of it, not a quarter),
    backward all-gathers every group again, over 2 ranks, and 10 AdamW steps equal one
    process's. An int that does not divide 4 is refused, 1 means False (no backward
    all-gather) and 4 means True."""
    world = 4
    base = _base_model()
    batches = _batches(world, 10)
    reference = _reference(base, batches, world)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        for bad in (3, 0, 8):
            with pytest.raises(ValueError, match="factor of 4"):
                fully_shard(nn.Linear(2, 2), mesh=mesh, reshard_after_forward=bad)
        for k, bwd_gathers in ((1, 0), (4, 3)):
            model = _shard(copy.deepcopy(base), mesh, reshard_after_forward=k)
            (x, y), = batches[0]
            loss = _loss(model(_local(x, rank)), _local(y, rank))
            with CommDebugMode() as bwd:
                loss.backward()
            assert _counts(bwd).get("all_gather_into_tensor", 0) == bwd_gathers, k
        model = _shard(copy.deepcopy(base), mesh, reshard_after_forward=2)
        groups = _groups(model)
        (x, y), = batches[0]
        with CommDebugMode() as fwd:
            loss = _loss(model(_local(x, rank)), _local(y, rank))
        for m in groups:
            group = m._fsdp_state().group
            # Half of the flat buffer that the forward all-gather filled: S / k rows of it.
            per_rank = sum(group._layout(ps).per_rank_numel for ps, _ in
                           group._post_forward_pieces)
            assert sum(piece.numel() for _, piece in group._post_forward_pieces) == 2 * per_rank
            for p in m.parameters(recurse=False):
                assert isinstance(p, DTensor)  # the sharded parameters are registered
            # The backward all-gather's group: this rank's block of 2 (ranks 0-1 or 2-3).
            assert _C.group_size(group._post_forward_group) == 2
        with CommDebugMode() as bwd:
            loss.backward()
        assert _counts(fwd) == {"all_gather_into_tensor": len(groups)}
        assert _counts(bwd) == {"all_gather_into_tensor": len(groups),
                                "reduce_scatter_tensor": len(groups)}
        model.zero_grad()
        _train_like_one_process(model, batches, rank, reference)

    dtensor.run_threads(world, rank_fn)


def test_hsdp_reshard_after_forward_to_a_smaller_group():
    """HSDP on a (2, 4) mesh with reshard_after_forward=2: the backward all-gathers run over
    blocks of 2 ranks inside each replica's shard group, and 5 AdamW steps equal one process's."""
    world = 8
    base = _base_model()
    batches = _batches(world, 5)
    reference = _reference(base, batches, world)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2, 4), mesh_dim_names=("replicate", "shard"))
        model = _shard(copy.deepcopy(base), mesh, reshard_after_forward=2)
        _train_like_one_process(model, batches, rank, reference)
        for m in _groups(model):
            assert _C.group_size(m._fsdp_state().group._post_forward_group) == 2

    dtensor.run_threads(world, rank_fn)


def test_hsdp_accumulation_without_all_reduce():
    """set_requires_all_reduce(False) on the first micro-batches of each step (NOTE [HSDP
    accumulation without all-reduce]): every backward reduce-scatters over the shard dim, only
    the last all-reduces across replicas and sets the gradients, which equal one process's on
    the whole batch; then AdamW steps as one process. In the second step the last micro-batch
    turns the all-reduce back on with set_requires_gradient_sync(True), as PyTorch's."""
    micro = 3
    base = _base_model()
    batches = _batches(4, 2, micro)
    ref_losses, ref_grads, ref_final = _reference(base, batches, 4)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        model = _shard(copy.deepcopy(base), mesh)
        groups = len(_groups(model))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for step, micro_batches in enumerate(batches):
            for i, (x, y) in enumerate(micro_batches):
                last = i == micro - 1
                if i == 0:
                    model.set_requires_all_reduce(False)
                elif last and step == 0:
                    model.set_requires_all_reduce(True)
                elif last:
                    model.set_requires_gradient_sync(True)  # turns the all-reduce on too
                with CommDebugMode() as comm:
                    loss = _loss(model(_local(x, rank)), _local(y, rank))
                    (loss / micro).backward()
                torch.testing.assert_close(loss.item(), ref_losses[step][i][rank], **TOL)
                want = {"all_gather_into_tensor": 2 * groups - 1,
                        "reduce_scatter_tensor": groups}
                if last:
                    want["all_reduce"] = groups
                assert _counts(comm) == want
                for n, p in model.named_parameters():
                    assert (p.grad is not None) == last, n
            _check_grads(model, ref_grads[step], (Replicate(), Shard(0)))
            opt.step()
            opt.zero_grad()
        _check_params(model, ref_final)

    dtensor.run_threads(4, rank_fn)


@pytest.mark.parametrize("a_group", ["root", "own"])
def test_hsdp_partial_sums_of_parameters_unused_in_the_last_micro_batch_are_all_reduced(a_group):
    """A micro-batch without all-reduce uses head ``a``, the next (with it) head ``b``: a's
    partial sum is all-reduced in the last backward too, and every gradient equals one
    process's. With a in the root's group, that group's reduce-scatter buckets differ ((a's)
    then (b's)); with a in its own group, that group has no gradient in the last backward (its
    partial sum was left out: 2 all-reduces for 3)."""

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(7, 15)
            self.a = nn.Linear(15, 2)
            self.b = nn.Linear(15, 2)

        def forward(self, x, head):
            return getattr(self, head)(torch.relu(self.body(x)))

    torch.manual_seed(0)
    base = TwoHeads()
    (x, y), = _batches(4, 1)[0]
    ref = copy.deepcopy(base)
    for head in ("a", "b"):
        _loss(ref(x, head), y).backward()

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        model = copy.deepcopy(base)
        fully_shard(model.body, mesh=mesh)
        if a_group == "own":
            fully_shard(model.a, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.set_requires_all_reduce(False)
        _loss(model(_local(x, rank), "a"), _local(y, rank)).backward()
        model.set_requires_all_reduce(True)
        with CommDebugMode() as comm:
            _loss(model(_local(x, rank), "b"), _local(y, rank)).backward()
        # body's group, the root's b bucket, and a's partial sum (the root's or its own).
        assert _counts(comm)["all_reduce"] == 3
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, **TOL, msg=n)

    dtensor.run_threads(4, rank_fn)


def test_unshard_in_backward_false_skips_the_backward_all_gather():
    """set_unshard_in_backward(False) on an embedding's group, whose backward does not read its
    weight: backward all-gathers no group (the root keeps its parameters), the embedding's
    gradient is reduce-scattered as usual and every gradient equals one process's."""

    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(11, 6)
            self.out = nn.Linear(6, 2)

        def forward(self, ids):
            return self.out(torch.tanh(self.emb(ids)))

    world = 2
    torch.manual_seed(0)
    base = Embed()
    ids = torch.randint(0, 11, (world * 4,))
    y = torch.randn(world * 4, 2)
    ref = copy.deepcopy(base)
    _loss(ref(ids), y).backward()

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        model = copy.deepcopy(base)
        fully_shard(model.emb, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.emb.set_unshard_in_backward(False)
        loss = _loss(model(_local(ids, rank)), _local(y, rank))
        with CommDebugMode() as bwd:
            loss.backward()
        assert _counts(bwd) == {"reduce_scatter_tensor": 2}
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, **TOL, msg=n)

    dtensor.run_threads(world, rank_fn)


def test_all_reduce_hook_makes_a_custom_hsdp():
    """set_all_reduce_hook with PyTorch's use: FSDP over each pair of ranks of a (2, 2) mesh,
    the hook all-reduces each reduced gradient buffer across the pairs ("rep") and the divide
    factor is the 4 data-parallel ranks: gradients and 3 AdamW steps equal one process's on
    the 4 ranks' batch, as HSDP's. The hook sees sums (the division comes after it)."""
    world = 4
    base = _base_model()
    batches = _batches(world, 3)
    reference = _reference(base, batches, world)

    def rank_fn(rank):
        from dtensor import _functional_collectives as funcol

        mesh = dtensor.init_device_mesh("cpu", (2, 2), mesh_dim_names=("rep", "shard"))
        model = _shard(copy.deepcopy(base), mesh["shard"])
        seen = []

        def across_pairs(out):
            seen.append(out.numel())
            out.copy_(funcol.wait_tensor(funcol.all_reduce(out, "sum", (mesh, 0))))

        for m in _groups(model):
            m.set_all_reduce_hook(across_pairs)
            m.set_gradient_divide_factor(world)
        with pytest.raises(NotImplementedError, match="stream"):
            model.set_all_reduce_hook(across_pairs, stream=object())
        _train_like_one_process(model, batches, rank, reference)
        assert len(seen) == 3 * len(_groups(model))  # once per group and step

    dtensor.run_threads(world, rank_fn)


class _Titan(nn.Module):
    """torchtitan's shape: an input layer, two blocks, then a norm and an output layer."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(7, 6)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(6, 15), nn.ReLU(), nn.Linear(15, 6))
                                     for _ in range(2)])
        self.norm = nn.LayerNorm(6)
        self.output = nn.Linear(6, 2)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = x + block(x)
        return self.output(self.norm(x))


def test_fully_shard_on_a_list_makes_one_group_of_its_modules():
    """fully_shard([model.norm, model.output]) as torchtitan calls it (NOTE [fully_shard on a
    list]): one group for both (one all-gather before norm, one reduce-scatter after norm's
    backward), both classes FSDP*, the list returned; 4 AdamW steps equal one process's with
    the collectives of 4 groups. A list cannot be the root, and a ModuleList (no forward) is
    refused naming it."""
    world = 2
    torch.manual_seed(0)
    base = _Titan()
    batches = _batches(world, 4)
    reference = _reference(base, batches, world)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        model = copy.deepcopy(base)
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        pair = [model.norm, model.output]
        assert fully_shard(pair, mesh=mesh) is pair
        assert type(model.norm).__name__ == "FSDPLayerNorm"
        assert type(model.output).__name__ == "FSDPLinear"
        assert model.norm._fsdp_state() is model.output._fsdp_state()
        fully_shard(model, mesh=mesh)
        groups = 4  # two blocks, the pair, the root (inp)
        (x, y), = batches[0]
        with CommDebugMode() as fwd:
            loss = _loss(model(_local(x, rank)), _local(y, rank))
        with CommDebugMode() as bwd:
            loss.backward()
        assert _counts(fwd) == {"all_gather_into_tensor": groups}
        assert _counts(bwd) == {"all_gather_into_tensor": groups - 1,  # the root keeps its own
                                "reduce_scatter_tensor": groups}
        model.zero_grad()
        _train_like_one_process(model, batches, rank, reference)
        with pytest.raises(ValueError, match="ModuleList"):
            fully_shard(model.blocks, mesh=mesh)

    dtensor.run_threads(world, rank_fn)

    def list_as_root(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        a, b = nn.Linear(4, 4), nn.Linear(4, 4)
        fully_shard([a, b], mesh=mesh)
        with pytest.raises(RuntimeError, match="root must be one module"):
            a(torch.randn(2, 4))

    dtensor.run_threads(world, list_as_root)


def test_register_fsdp_forward_method_unshards_around_the_method():
    """A method other than forward that uses the parameters (``score``), called by the root's
    forward: registered with register_fsdp_forward_method it runs between FSDP's pre- and
    post-forward (one all-gather, parameters unsharded), and the gradients equal one process's.
    Unregistered it sees the sharded parameters and raises; on a plain module it is a no-op."""

    class Head(nn.Linear):
        def score(self, h):
            return h @ self.weight.t() + self.bias

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(7, 15)
            self.head = Head(15, 3)

        def forward(self, x):
            return self.head.score(torch.relu(self.body(x)))

    world = 2
    torch.manual_seed(0)
    base = Model()
    (x, y), = _batches(world, 1)[0]
    y = torch.randn(world * 4, 3)
    ref = copy.deepcopy(base)
    _loss(ref(x), y).backward()
    register_fsdp_forward_method(nn.Linear(2, 2), "forward")  # not an FSDPModule: no-op

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        unregistered = copy.deepcopy(base)
        fully_shard(unregistered.head, mesh=mesh)
        fully_shard(unregistered, mesh=mesh)
        with pytest.raises(RuntimeError, match="plain tensor"):
            unregistered(_local(x, rank))
        model = copy.deepcopy(base)
        fully_shard(model.head, mesh=mesh)
        fully_shard(model, mesh=mesh)
        register_fsdp_forward_method(model.head, "score")
        with pytest.raises(ValueError, match="does not have a method"):
            register_fsdp_forward_method(model.head, "generate")
        with CommDebugMode() as comm:
            _loss(model(_local(x, rank)), _local(y, rank)).backward()
        assert _counts(comm) == {"all_gather_into_tensor": 3, "reduce_scatter_tensor": 2}
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, **TOL, msg=n)

    dtensor.run_threads(world, rank_fn)


def test_stream_settings_are_accepted_and_change_nothing():
    """share_comm_ctx, set_post_optim_event, set_allocate_memory_from_process_group_for_comm and
    set_force_sum_reduction_for_comms are PyTorch's settings for its CUDA streams and
    allocators; the engine accepts them (every collective runs on the current stream, reductions
    are sums) and trains as one process. share_comm_ctx checks its arguments as PyTorch's."""
    world = 2
    base = _base_model()
    batches = _batches(world, 3)
    reference = _reference(base, batches, world)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        model = _shard(copy.deepcopy(base), mesh)
        other = fully_shard(nn.Linear(3, 3), mesh=mesh)
        share_comm_ctx([model, other])
        with pytest.raises(ValueError, match="FSDPModules"):
            share_comm_ctx([model, nn.Linear(2, 2)])
        for m in _groups(model):
            m.set_allocate_memory_from_process_group_for_comm(True)
            m.set_force_sum_reduction_for_comms(True)
        model.set_post_optim_event(object())
        _train_like_one_process(model, batches, rank, reference)

    dtensor.run_threads(world, rank_fn)


@pytest.mark.parametrize("offload", [None, CPUOffloadPolicy(pin_memory=False), CPUOffloadPolicy()],
                         ids=["no_offload", "offload", "offload_pinned"])
def test_meta_device_init_as_torchtitan(offload):
    """torchtitan's initialization: the model built on the meta device, fully_shard, then
    ``to_empty(device="cpu")`` and each module's reset_parameters() on the sharded parameters
    after dtensor.manual_seed: every parameter's full_tensor() equals one process's
    reset_parameters() after torch.manual_seed with the same seed (bit for bit), and 3 AdamW
    steps train as that process. With a CPUOffloadPolicy too (transformers' fsdp_cpu_offload
    shards its meta-device model so): the sharded parameters stay on the meta device until
    materialized, as PyTorch's (which moves only non-meta pieces to the CPU)."""
    world = 2
    torch.manual_seed(0)
    base = _base_model()
    torch.manual_seed(5)
    for m in base.modules():
        if isinstance(m, nn.Linear):
            m.reset_parameters()
    batches = _batches(world, 3)
    reference = _reference(base, batches, world)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        with torch.device("meta"):
            model = type(base)()
        _shard(model, mesh, **({} if offload is None else {"offload_policy": offload}))
        assert all(p.device.type == "meta" for p in model.parameters())
        model.to_empty(device="cpu")
        dtensor.manual_seed(5)
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.reset_parameters()
        for (n, p), q in zip(model.named_parameters(), base.parameters()):
            assert p.placements == (Shard(0),) and p.device.type == "cpu", n
            assert torch.equal(p.full_tensor(), q.detach()), n
        _train_like_one_process(model, batches, rank, reference)

    dtensor.run_threads(world, rank_fn)
