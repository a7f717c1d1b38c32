"""FSDP over tensor parallelism (NOTE [FSDP over TP]) against one process, ranks as threads: 2-D
parameter placements as PyTorch's, parity over AdamW steps with hidden dims 3, 16 and 17, HSDP over
TP on 8 ranks (3-D), clip_grad_norm_, size-1 shard dims, checkpoints that reshard 2-D ->
FSDP -> HSDP -> one process, and in-place ops on strided shards. Split from fsdp_test.py (shared
helpers in fsdp_testing.py)."""

import copy

import pytest
import torch
from torch import nn

import dtensor
from dtensor import DTensor, Replicate, Shard
from dtensor.fsdp import fully_shard
from fsdp_testing import (ROWS, TOL, _batches, _check_layout, _loss,
                          _reference, _train_like_one_process)


# ---- 2-D: FSDP over tensor parallelism (NOTE [FSDP over TP]) --------------------------------

class TPMLP(nn.Module):
    """A colwise then a rowwise Linear (hidden dim `hidden`: 3 splits 2/1 over tp=2, then 1/1 and
    1/0 over dp=2; 17 splits 9/8 then 5/4 and 4/4)."""

    def __init__(self, hidden):
        super().__init__()
        self.w_in = nn.Linear(7, hidden)
        self.w_out = nn.Linear(hidden, 2)

    def forward(self, x):
        return self.w_out(torch.relu(self.w_in(x)))


@pytest.mark.parametrize("hidden", [3, 16, 17])
@pytest.mark.parametrize("reshard_after_forward", [True, False])
def test_fsdp_over_tp_parity(hidden, reshard_after_forward):
    """parallelize_module on "tp", fully_shard on "dp" (2x2 mesh): parameter placements as
    PyTorch's (colwise weight (_StridedShard(0, sf=2), Shard(0)), rowwise (Shard(0), Shard(1))),
    full_tensor exact, 10 AdamW steps equal to one process, gradients in the parameters'
    placements, and clip_grad_norm_ over them equal to one process's total norm."""
    from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from dtensor.placement_types import _StridedShard
    dp, tp = 2, 2
    torch.manual_seed(0)
    base = TPMLP(hidden)
    batches = _batches(dp, 10)
    reference = _reference(base, batches, dp)
    ref_norm = torch.nn.utils.get_total_norm([g for g in reference[1][0].values()])

    def rank_fn(rank):
        world = dtensor.init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        dp_rank = world.get_local_rank(0)
        model = copy.deepcopy(base)
        # The hidden activation stays distributed: its uneven global shape (3 over 2 ranks)
        # cannot be inferred from a local piece, as PyTorch's (use_local_output=True) would.
        parallelize_module(model, world["tp"], {"w_in": ColwiseParallel(use_local_output=False),
                                                 "w_out": RowwiseParallel()})
        fully_shard(model.w_in, mesh=world["dp"], reshard_after_forward=reshard_after_forward)
        fully_shard(model.w_out, mesh=world["dp"], reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=world["dp"], reshard_after_forward=reshard_after_forward)
        want = {"w_in.weight": (_StridedShard(0, split_factor=2), Shard(0)),
                "w_in.bias": (_StridedShard(0, split_factor=2), Shard(0)),
                "w_out.weight": (Shard(0), Shard(1)),
                "w_out.bias": (Shard(0), Replicate())}
        _check_layout(model, base, want)
        for p in model.parameters():
            assert tuple(p.device_mesh.mesh_dim_names) == ("dp", "tp")
        # Each unsharded parameter owns exactly its storage (with hidden 3 a TP piece of one row
        # is a contiguous slice of the all-gather output: sharing that buffer, freeing and
        # refilling it wrote past its end, a heap corruption seen as a crash).
        model.w_in.unshard()
        for n, p in model.w_in.named_parameters():
            local = p.to_local()
            assert local.untyped_storage().nbytes() == local.numel() * local.element_size(), n
        model.w_in.reshard()

        def clip_at_first_step(step):
            if step == 0:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e9)
                norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
                torch.testing.assert_close(norm, ref_norm, **TOL)

        _train_like_one_process(model, batches, dp_rank, reference, clip_at_first_step)

    dtensor.run_threads(dp * tp, rank_fn)



def test_fsdp_over_tp_on_a_flattened_dim():
    """fully_shard over a flattened dim of a 3-D world (world["dp", "cp"]._flatten("dp_cp"), as
    torchtitan shards FSDP over dp x cp) with TP on "tp": the parameters live on the (dp_cp, tp)
    mesh and 3 AdamW steps equal one process's."""
    from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    torch.manual_seed(0)
    base = TPMLP(16)
    batches = _batches(2, 3)
    reference = _reference(base, batches, 2)

    def rank_fn(rank):
        world = dtensor.init_device_mesh("cpu", (1, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
        dp_cp = world["dp", "cp"]._flatten("dp_cp")
        model = copy.deepcopy(base)
        parallelize_module(model, world["tp"], {"w_in": ColwiseParallel(use_local_output=False),
                                                 "w_out": RowwiseParallel()})
        fully_shard(model, mesh=dp_cp)
        for p in model.parameters():
            assert tuple(p.device_mesh.mesh_dim_names) == ("dp_cp", "tp")
        _train_like_one_process(model, batches, dp_cp.get_local_rank(0), reference)

    dtensor.run_threads(4, rank_fn)


def test_hsdp_over_tp_parity():
    """3-D (torchtitan's dp_replicate x dp_shard x tp): parallelize_module on "tp", fully_shard on
    the 2-D ("rep", "shard") mesh (HSDP) over it, 8 ranks: placements (Replicate(), FSDP's, TP's),
    full_tensor exact, 10 AdamW steps equal to one process with gradients in the parameters'
    placements."""
    from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from dtensor.placement_types import _StridedShard
    rep, shard, tp = 2, 2, 2
    dp = rep * shard
    torch.manual_seed(0)
    base = TPMLP(17)
    batches = _batches(dp, 10)
    reference = _reference(base, batches, dp)

    def rank_fn(rank):
        world = dtensor.init_device_mesh("cpu", (rep, shard, tp),
                                         mesh_dim_names=("rep", "shard", "tp"))
        dp_rank = world.get_local_rank(0) * shard + world.get_local_rank(1)
        model = copy.deepcopy(base)
        parallelize_module(model, world["tp"], {"w_in": ColwiseParallel(use_local_output=False),
                                                 "w_out": RowwiseParallel()})
        hsdp = world["rep", "shard"]
        fully_shard(model.w_in, mesh=hsdp)
        fully_shard(model.w_out, mesh=hsdp)
        fully_shard(model, mesh=hsdp)
        want = {"w_in.weight": (Replicate(), _StridedShard(0, split_factor=2), Shard(0)),
                "w_in.bias": (Replicate(), _StridedShard(0, split_factor=2), Shard(0)),
                "w_out.weight": (Replicate(), Shard(0), Shard(1)),
                "w_out.bias": (Replicate(), Shard(0), Replicate())}
        _check_layout(model, base, want)
        for p in model.parameters():
            assert tuple(p.device_mesh.mesh_dim_names) == ("rep", "shard", "tp")
        _train_like_one_process(model, batches, dp_rank, reference)

    dtensor.run_threads(rep * shard * tp, rank_fn)


def test_size_one_shard_dims_are_placed_as_pytorch():
    """A (1, 7) weight and a (1,) bias are placed Shard(0) as PyTorch's FSDP2 places them (rank 0
    holds them, the other rank empty pieces: NOTE [size-1 dims under FSDP]), by default and by an
    explicit shard_placement_fn, whose Shard(1) is kept too; full_tensor() is exact. Guards
    against fully_shard refusing the explicit Shard(0) or placing the default on dim 1, as rules
    that never keep a Shard on a size-1 dim would (fsdp_test.py trains such parameters)."""
    torch.manual_seed(0)
    base = nn.Linear(7, 1)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        for fn, weight in ((None, Shard(0)), (lambda p: Shard(0), Shard(0)),
                           (lambda p: Shard(p.dim() - 1), Shard(1))):
            m = fully_shard(copy.deepcopy(base), mesh=mesh, shard_placement_fn=fn)
            assert m.weight.placements == (weight,) and m.bias.placements == (Shard(0),)
            rows = (1, 7) if rank == 0 else (0, 7)
            assert m.weight.to_local().shape == (rows if weight == Shard(0) else (1, 4 - rank))
            for n, p in m.named_parameters():
                assert torch.equal(p.full_tensor(), getattr(base, n).detach()), n

    dtensor.run_threads(2, rank_fn)


def test_checkpoint_reshards_2d_to_fsdp_to_hsdp_to_one_process(tmp_path):
    """The state dicts of FSDP x TP (2, 2), FSDP on 4 ranks and HSDP (2, 2) save with
    dtensor.checkpoint and load into each other's layouts, then into one plain process: model
    and AdamW state equal to the layout they were saved from (full_tensor), and training goes on
    from them equal to one process trained without the round trips."""
    from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    torch.manual_seed(0)
    base = TPMLP(17)  # 17 rows: uneven pieces on every layout
    batches = _batches(4, 3)
    _, _, ref_final = _reference(base, batches, 4)
    ckpt_2d, ckpt_fsdp, ckpt_hsdp = (str(tmp_path / n) for n in ("2d", "fsdp", "hsdp"))

    def train(model, opt, steps, rows, dp_rank):
        for (x, y), in steps:
            loss = _loss(model(x[dp_rank * rows:(dp_rank + 1) * rows]),
                         y[dp_rank * rows:(dp_rank + 1) * rows])
            loss.backward()
            opt.step()
            opt.zero_grad()

    def full(state):
        return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state.items()}

    def layout(kind, source=None):
        """`source` (else a fresh model of another seed whose AdamW has state to load into)
        sharded as `kind`, its AdamW, and the data-parallel rank and size."""
        torch.manual_seed(123)
        model = copy.deepcopy(source) if source is not None else TPMLP(17)
        if kind == "2d":
            mesh = dtensor.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
            parallelize_module(model, mesh["tp"], {"w_in": ColwiseParallel(use_local_output=False),
                                                    "w_out": RowwiseParallel()})
            for m in (model.w_in, model.w_out, model):
                fully_shard(m, mesh=mesh["dp"])
            dp_rank, dp = mesh.get_local_rank(0), 2
        else:
            shape = (4,) if kind == "fsdp" else (2, 2)
            mesh = dtensor.init_device_mesh("cpu", shape)
            for m in (model.w_in, model.w_out, model):
                fully_shard(m, mesh=mesh)
            dp_rank, dp = mesh.get_rank(), 4
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        if source is None:
            for p in model.parameters():  # NOTE [optimizer state]: the state exists before load
                p.grad = torch.zeros_like(p)
            opt.step()
            opt.zero_grad()
        return model, opt, dp_rank, dp

    def state_of(model, opt):
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def rank_fn(rank):
        # 2-D starts from `base`; each later layout loads what the previous one saved, must equal
        # it (model and AdamW moments), trains one step and saves. The last save is the model
        # alone: the plain process below loads exactly those keys.
        stages = [("2d", ckpt_2d), ("fsdp", ckpt_fsdp), ("hsdp", ckpt_hsdp)]
        want = None
        for step, (kind, ckpt) in enumerate(stages):
            model, opt, dp_rank, dp = layout(kind, base if want is None else None)
            if want is not None:
                state = state_of(model, opt)
                dtensor.checkpoint.load(state, checkpoint_id=stages[step - 1][1])
                opt.load_state_dict(state["optim"])
                _assert_equal(full(model.state_dict()), want[0])
                _assert_equal(_moments(opt.state_dict()), want[1])
            train(model, opt, batches[step:step + 1], 4 * ROWS // dp, dp_rank)
            last = step == len(stages) - 1
            saved = {"model": model.state_dict()} if last else state_of(model, opt)
            dtensor.checkpoint.save(saved, checkpoint_id=ckpt)
            want = (full(saved["model"]), _moments(saved["optim"])) if not last else None
        return full(model.state_dict())

    finals = dtensor.run_threads(4, rank_fn)
    # Three steps over three layouts equal three steps of one process.
    _assert_close(finals[0], ref_final)
    # One process, plain tensors: the last checkpoint is the trained model.
    plain = TPMLP(17)
    state = {"model": {k: torch.zeros_like(v) for k, v in plain.state_dict().items()}}
    dtensor.checkpoint.load(state, checkpoint_id=ckpt_hsdp)
    _assert_equal(state["model"], finals[0])


def _moments(optim_state):
    return {(i, k): v.full_tensor() if isinstance(v, DTensor) else v
            for i, s in optim_state["state"].items() for k, v in s.items() if k != "step"}


def _assert_equal(got, want):
    assert got.keys() == want.keys(), (sorted(got), sorted(want))
    for k in want:
        assert torch.equal(got[k], want[k]), k


def _assert_close(got, want):
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], **TOL, msg=k)


@pytest.mark.parametrize("op", ["add_", "mul_", "copy_"])
def test_in_place_ops_keep_a_strided_self(op):
    """An in-place op on a tensor split in another order than the mesh's (FSDP over TP's
    _StridedShard) keeps that order, the other argument moved to it (NOTE [shard order through
    ops]); with the strided tensor as the other argument, self keeps its plain order. Both equal
    one device. Guards against the default-ordered other argument's order winning (a disagreement
    giving every input the ascending order) and the write raising an internal assert."""
    from dtensor.placement_types import _StridedShard
    torch.manual_seed(0)
    x, y = torch.randn(9, 4), torch.randn(9, 4)
    want = getattr(x.clone(), op)(y)

    def fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        strided = [_StridedShard(0, split_factor=2), Shard(0)]
        # The piece of (_StridedShard(0, split_factor=2), Shard(0)): "tp" cuts dim 0 first, then "dp".
        def piece(t):
            return t.chunk(2)[rank % 2].chunk(2)[rank // 2].clone()
        for self_strided in (True, False):
            a = (DTensor.from_local(piece(x), mesh, strided, run_check=False,
                                    shape=x.shape, stride=x.stride()) if self_strided
                 else dtensor.distribute_tensor(x, mesh, [Shard(0), Shard(0)]))
            b = (dtensor.distribute_tensor(y, mesh, [Shard(0), Shard(0)]) if self_strided
                 else DTensor.from_local(piece(y), mesh, strided, run_check=False,
                                         shape=y.shape, stride=y.stride()))
            placements = a.placements
            out = getattr(a, op)(b)
            assert out is a and a.placements == placements, (op, self_strided, a.placements)
            torch.testing.assert_close(a.full_tensor(), want, rtol=0, atol=0)

    dtensor.run_threads(4, fn)
