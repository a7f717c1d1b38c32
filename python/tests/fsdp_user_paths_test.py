"""dtensor.fsdp.fully_shard on the paths a user's training code takes beyond one forward and one
backward per step, each against one process (or PyTorch's documented FSDP2 behaviour): a module
run twice before one backward, two separately sharded models in one backward (on shm processes,
whose reduce-scatter scratch every root shares), parameter dtypes changed after fully_shard,
load_state_dict(assign=True), post-accumulate-grad hooks on the sharded parameters (the
optimizer-in-backward pattern), activation checkpointing in its four forms, and compiled blocks
(eager, aot_eager and inductor, on shm processes)."""

import copy
import functools

import pytest
import torch
from torch import nn

import dtensor
from dtensor.fsdp import fully_shard
from fsdp_testing import TOL, Blocks, _local
from launch_ranks import run_on_ranks


def _grads_equal(model, reference):
    for (n, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad.full_tensor(), q.grad, **TOL, msg=n)


def _small(seed=0):
    """Two Linear layers, (7, 15) uneven over 2 ranks; with one process's gradients for a batch."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(7, 15), nn.ReLU(), nn.Linear(15, 2))


def _reference_grads(base, x):
    ref = copy.deepcopy(base)
    ref(x).pow(2).mean().backward()
    return ref


def _shard_small(model, mesh):
    """fully_shard on the first layer, then the root (two groups)."""
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


class Twice(nn.Module):
    """`block` runs twice in one forward (weights reused, as a recurrent step or two views)."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(5, 6)
        self.block = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.block(torch.tanh(self.block(self.first(x)))))


def _twice_loss(model, x):
    """Two forwards of the whole model in one loss."""
    return model(x).pow(2).mean() + model(2 * x).pow(2).mean()


def _twice_case(base, x, use_model):
    """One process's gradients of _twice_loss, then on 2 ranks fully_shard on the block, the head
    and the root, ``use_model(model, rows)`` (which runs the backward) and the gradients equal."""
    ref = copy.deepcopy(base)
    _twice_loss(ref, x).backward()

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        model = copy.deepcopy(base)
        fully_shard(model.block, mesh=mesh)
        fully_shard(model.head, mesh=mesh)
        fully_shard(model, mesh=mesh)
        # The mean over each rank's rows: the gradients are the average over ranks.
        use_model(model, _local(x, rank))
        _grads_equal(model, ref)

    dtensor.run_threads(2, rank_fn)


def test_module_run_twice_before_one_backward_matches_one_process():
    """The later call's post-backward reshards the block; the earlier call's pre-backward must
    unshard it again (the group's state decides, as PyTorch's), not skip it: autograd read a freed
    storage ("setStorage ... out of bounds for storage of size 0"). Also two forwards of the whole
    model in one loss."""
    torch.manual_seed(0)
    base = Twice()
    _twice_case(base, torch.randn(8, 5), lambda model, x: _twice_loss(model, x).backward())


_TWO_ROOTS_WORKER = r'''
import copy
import torch
from torch import nn
import dtensor
from dtensor.fsdp import fully_shard
from fsdp_testing import TOL, _local

def make(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 4))

a0, b0 = make(0), make(1)
torch.manual_seed(2)
x = torch.randn(8, 16)
ra, rb = copy.deepcopy(a0), copy.deepcopy(b0)
(ra(x).pow(2).mean() + rb(x).pow(2).mean()).backward()
mesh = dtensor.init_device_mesh("cpu", (2,))
rank = mesh.get_rank()
a, b = copy.deepcopy(a0), copy.deepcopy(b0)
for m in (a, b):
    fully_shard(m[0], mesh=mesh)
    fully_shard(m[2], mesh=mesh)
    fully_shard(m, mesh=mesh)
for step in range(3):
    for m in (a, b):
        for p in m.parameters():
            p.grad = None
    (a(_local(x, rank)).pow(2).mean() + b(_local(x, rank)).pow(2).mean()).backward()
    for m, r in ((a, ra), (b, rb)):
        for (n, p), q in zip(m.named_parameters(), r.parameters()):
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, **TOL,
                                       msg=f"step {step} {n}")
print("ok")
'''


def test_processes_two_roots_in_one_backward_match_one_process(tmp_path):
    """Two models, each with its own fully_shard root, in one loss, on shm processes: the
    reduce-scatter input is one symmetric scratch per (shard group, dtype) that every root shares;
    guards against a root's reduce overwriting it while the other root's reduce-scatter still
    reads it, which gives wrong gradients (errors up to 0.1, varying run to run)."""
    run_on_ranks(_TWO_ROOTS_WORKER, 2, tmp_path, DTENSOR_SHM_SYMMETRIC_MIN_BYTES="0")


def test_parameter_dtype_changed_after_fully_shard():
    """model.double() after fully_shard and before the first forward: FSDP's original dtype is
    re-read at lazy init, as PyTorch's (keeping float32 fails: "mat1 and mat2 must have the
    same dtype"); gradients in float64, equal to a float64 process."""
    base = _small()
    x = torch.randn(8, 7, dtype=torch.float64)
    ref = _reference_grads(base.double(), x)
    base.float()

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        model = _shard_small(copy.deepcopy(base), mesh)
        model.double()
        out = model(_local(x, rank))
        assert out.dtype == torch.float64
        out.pow(2).mean().backward()
        for p in model.parameters():
            assert p.dtype == p.grad.dtype == torch.float64
        _grads_equal(model, ref)

    dtensor.run_threads(2, rank_fn)


def test_load_state_dict_with_assign_trains_the_loaded_parameters():
    """load_state_dict(sd, assign=True) registers new parameter objects: FSDP adopts them (as
    PyTorch's reset_sharded_param), so forward uses the loaded values and an optimizer built on
    model.parameters() afterwards gets their gradients. Guards against forward all-gathering the
    old parameters (output equal to the model before loading) while the new ones get no gradient.
    A state dict of another layout is refused, naming the parameter."""
    src0, dst0 = _small(0), _small(1)
    x = torch.randn(8, 7)
    ref = _reference_grads(src0, x)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        src = _shard_small(copy.deepcopy(src0), mesh)
        dst = _shard_small(copy.deepcopy(dst0), mesh)
        dst.load_state_dict(src.state_dict(), assign=True)
        opt = torch.optim.SGD(dst.parameters(), lr=0.1)  # on the registered (loaded) ones
        xs = _local(x, rank)
        with torch.no_grad():
            torch.testing.assert_close(dst(xs), ref(xs), **TOL)
        dst(xs).pow(2).mean().backward()
        _grads_equal(dst, ref)
        opt.step()  # the registered parameters are the ones trained
        with torch.no_grad():
            for p, q in zip(dst.parameters(), ref.parameters()):
                torch.testing.assert_close(p.full_tensor(), q - 0.1 * q.grad, **TOL)
        bad = {k: v.full_tensor() for k, v in src.state_dict().items()}  # plain tensors
        try:
            dst.load_state_dict(bad, assign=True)
        except ValueError as e:
            assert "'weight'" in str(e) and "assign=True" in str(e), e
        else:
            raise AssertionError("a state dict of plain tensors was accepted with assign=True")

    dtensor.run_threads(2, rank_fn)


def test_post_accumulate_grad_hooks_see_the_sharded_gradients():
    """As PyTorch's FSDP2 (foreach_reduce calls them): a hook registered with
    register_post_accumulate_grad_hook on a sharded parameter runs once its reduced gradient is
    set (optimizer in backward)."""
    base = _small()
    x = torch.randn(8, 7)
    ref = _reference_grads(base, x)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        model = _shard_small(copy.deepcopy(base), mesh)
        seen = {}
        for n, p in model.named_parameters():
            p.register_post_accumulate_grad_hook(
                lambda param, n=n: seen.__setitem__(n, param.grad.full_tensor().clone()))
        model(_local(x, rank)).pow(2).mean().backward()
        assert sorted(seen) == sorted(n for n, _ in model.named_parameters()), seen.keys()
        for (n, _), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(seen[n], q.grad, **TOL, msg=n)

    dtensor.run_threads(2, rank_fn)


# ---- activation checkpointing (NOTE [activation checkpointing] in _fsdp_state.py) -------------

@pytest.mark.parametrize("reshard_after_forward", [True, None])
@pytest.mark.parametrize("ac", ["checkpoint_wrapper", "non-reentrant",
                                "non-reentrant, no early stop", "reentrant"])
def test_activation_checkpointing_trains_like_one_process_with_the_same_collectives(
        ac, reshard_after_forward):
    """fully_shard on each block and the root, each block's forward recomputed in backward:
    checkpoint_wrapper under fully_shard (torchtitan's order: the recompute runs inside the FSDP
    module, no FSDP hook sees it), or torch.utils.checkpoint around the FSDP block (its hooks run
    again in backward). Every step's loss, gradients and parameters equal one process's over 4
    AdamW steps, and a step makes the collectives of one without checkpointing: one all-gather
    per group forward, one per resharded group backward, one reduce-scatter per group. Guards
    against a recomputed forward that runs to its end (early stop off) resharding the block its
    backward is about to use ("setStorage ... out of bounds for storage of size 0"), and a
    reentrant recompute resharding it and all-gathering it again (9 backward all-gathers for 4)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import set_checkpoint_early_stop

    from dtensor.debug import CommDebugMode
    from fsdp_testing import _batches, _counts, _loss, _reference, _train_like_one_process

    world = 2
    torch.manual_seed(0)
    base = Blocks()
    if ac == "checkpoint_wrapper":
        for i, block in enumerate(base.blocks):
            base.blocks[i] = checkpoint_wrapper(block)
    batches = _batches(world, 4)
    reference = _reference(base, batches, world)
    groups = 4
    bwd_gathers = groups if reshard_after_forward else groups - 1  # None: the root keeps its own

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (world,))
        model = copy.deepcopy(base)
        if ac != "checkpoint_wrapper":
            model.ac = ac
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
        with set_checkpoint_early_stop(ac != "non-reentrant, no early stop"):
            x, y = batches[0][0]
            with CommDebugMode() as fwd:
                loss = _loss(model(_local(x, rank)), _local(y, rank))
            with CommDebugMode() as bwd:
                loss.backward()
            assert _counts(fwd) == {"all_gather_into_tensor": groups}
            assert _counts(bwd) == {"all_gather_into_tensor": bwd_gathers,
                                    "reduce_scatter_tensor": groups}
            model.zero_grad()
            _train_like_one_process(model, batches, rank, reference)

    dtensor.run_threads(world, rank_fn)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing_of_a_module_run_twice_matches_one_process(use_reentrant):
    """The block of Twice runs twice, each call checkpointed (early stop off, so the recompute
    runs its post-forward too). With reentrant checkpointing the first call's recompute comes
    after the second call's post-backward: following the module's state alone (PyTorch's rule)
    it skipped its own post-backward, leaving that call's gradients unreduced and the
    parameters unsharded ("full_tensor: expected a distributed tensor")."""
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    class Checkpointed(Twice):
        use_reentrant = False

        def forward(self, x):
            run = functools.partial(checkpoint, self.block, use_reentrant=self.use_reentrant)
            return self.head(run(torch.tanh(run(self.first(x)))))

    def use(model, x):
        model.use_reentrant = use_reentrant
        with set_checkpoint_early_stop(False):
            _twice_loss(model, x).backward()

    torch.manual_seed(0)
    base = Checkpointed()
    _twice_case(base, torch.randn(8, 5), use)


# ---- torch.compile (NOTE [FSDP hooks under torch.compile] in _fsdp_state.py) -------------------

_COMPILE_WORKER = r'''
import copy
import os
import torch
import dtensor
from dtensor.fsdp import fully_shard
from fsdp_testing import Blocks, _batches, _reference, _train_like_one_process

backend = os.environ["COMPILE_BACKEND"]
torch.manual_seed(0)
base = Blocks()
batches = _batches(2, 3)
reference = _reference(base, batches, 2)
mesh = dtensor.init_device_mesh("cpu", (2,))
model = copy.deepcopy(base)
for block in model.blocks:
    block.compile(backend=backend)
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
model.compile(backend=backend)
_train_like_one_process(model, batches, mesh.get_rank(), reference)
print("ok")
'''


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_processes_compiled_blocks_train_like_one_process(backend, tmp_path):
    """Each block compiled (``block.compile()``, torchtitan's per-block compile) and fully
    sharded, then the whole model compiled too, on 2 shm processes: FSDP's hooks run eagerly
    around the compiled forwards, and 3 AdamW steps equal one process's; Dynamo does not trace
    into the hooks, where it fails ("Cannot access storage of DTensorImpl"). Processes, as users run
    it: Dynamo does not compile on two threads of one process at once."""
    run_on_ranks(_COMPILE_WORKER, 2, tmp_path, COMPILE_BACKEND=backend)
