"""Shared by the FSDP tests (fsdp_test.py, fsdp_tp_test.py, fsdp_user_paths_test.py): the models,
batches and the one-process reference every expected value comes from."""

import copy

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from dtensor import DTensor
from dtensor.fsdp import FSDPModule, fully_shard

TOL = dict(rtol=1e-5, atol=1e-5)
ROWS = 4  # rows of the batch per data-parallel rank


class MLP(nn.Module):
    """Uneven shapes: on 2 ranks l1's weight splits 8/7 rows, on 3 ranks l3's 1/1/0 (empty)."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(7, 15)
        self.l2 = nn.Linear(15, 3)
        self.l3 = nn.Linear(3, 2)

    def forward(self, x):
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))


class Block(nn.Module):
    """A residual block; (6, 15) and (15, 6) weights are uneven over 2 and 4 ranks."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 15)
        self.b = nn.Linear(15, 6)

    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))


class Blocks(nn.Module):
    """Three residual blocks between an input and an output layer (torchtitan's shape, for the
    activation checkpointing and torch.compile tests); ``ac`` says how each block's activations
    are recomputed in backward instead of saved (None: saved)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(7, 6)
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.out = nn.Linear(6, 2)
        self.ac = None

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            if self.ac in ("non-reentrant", "non-reentrant, no early stop"):
                x = checkpoint(block, x, use_reentrant=False)
            elif self.ac == "reentrant":
                x = checkpoint(block, x, use_reentrant=True)
            else:
                x = block(x)
        return self.out(x)


def _base_model(seed=0):
    torch.manual_seed(seed)
    return MLP()


def _batches(dp, steps, microbatches=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(dp * ROWS, 7, generator=g), torch.randn(dp * ROWS, 2, generator=g))
             for _ in range(microbatches)] for _ in range(steps)]


def _loss(out, y):
    return (out - y).pow(2).mean()


def _local(t, dp_rank):
    return t[dp_rank * ROWS:(dp_rank + 1) * ROWS]


def _train_step(model, x, y, rank):
    """Forward and backward on data-parallel rank ``rank``'s rows of ``x``/``y``; returns the
    loss and the CommDebugMode that saw the step's collectives."""
    from dtensor.debug import CommDebugMode

    with CommDebugMode() as comm:
        loss = _loss(model(_local(x, rank)), _local(y, rank))
        loss.backward()
    return loss, comm


def _reference(base, batches, dp, compute_dtype=None):
    """One process: AdamW on the full batch (mean loss over micro-batches). Returns, per step and
    micro-batch, each data-parallel rank's loss on its slice, the gradients of each step (before
    the optimizer step) and the final parameters."""
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads = [], []
    for step in batches:
        step_losses = []
        for x, y in step:
            if compute_dtype is None:
                out = model(x)
            else:  # mixed precision: compute with casts of the float32 parameters
                p = {n: t.to(compute_dtype) for n, t in model.named_parameters()}
                out = torch.func.functional_call(model, p, (x.to(compute_dtype),))
            step_losses.append([_loss(_local(out, r), _local(y, r)).item() for r in range(dp)])
            (_loss(out, y) / len(step)).backward()
        losses.append(step_losses)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    return losses, grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def _shard(model, mesh, **kwargs):
    """fully_shard on l1, l2, then the root (which keeps l3): three parameter groups."""
    fully_shard(model.l1, mesh=mesh, **kwargs)
    fully_shard(model.l2, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return model


def _groups(model):
    """The FSDP modules that own a parameter group: a parameter of their subtree that no inner
    FSDP module holds."""
    fsdp = [m for m in model.modules() if isinstance(m, FSDPModule)]

    def own(m):
        inner = {p for sub in m.modules() if sub is not m and isinstance(sub, FSDPModule)
                 for p in sub.parameters()}
        return [p for p in m.parameters() if p not in inner]

    return [m for m in fsdp if own(m)]


def _check_params(model, expected):
    for n, p in model.named_parameters():
        assert isinstance(p, nn.Parameter) and isinstance(p, DTensor), n
        torch.testing.assert_close(p.full_tensor(), expected[n], **TOL, msg=n)


def _counts(comm):
    return {k: v for k, v in comm.get_comm_counts().items() if v}


def _check_grads(model, ref_grads, placements=None):
    """Each gradient is placed ``placements`` (default: its parameter's) and its full_tensor()
    equals ``ref_grads[name]`` (one process's)."""
    for n, p in model.named_parameters():
        assert p.grad.placements == (placements or p.placements), n
        torch.testing.assert_close(p.grad.full_tensor(), ref_grads[n], **TOL, msg=n)


def _check_layout(model, base, want):
    """Each parameter is placed ``want[name]`` and its full_tensor() is ``base``'s exactly."""
    for n, p in model.named_parameters():
        assert p.placements == want[n], (n, p.placements)
        assert torch.equal(p.full_tensor(), dict(base.named_parameters())[n].detach()), n


def _train_like_one_process(model, batches, dp_rank, reference, after_backward=None):
    """AdamW over ``batches`` on data-parallel rank ``dp_rank``'s rows: every step's loss and
    gradients (in the parameters' placements) and the final parameters equal ``reference``'s
    (what _reference returns). ``after_backward(step)`` runs before each optimizer step."""
    ref_losses, ref_grads, ref_final = reference
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step, ((x, y),) in enumerate(batches):
        loss = _loss(model(_local(x, dp_rank)), _local(y, dp_rank))
        loss.backward()
        torch.testing.assert_close(loss.item(), ref_losses[step][0][dp_rank], **TOL)
        _check_grads(model, ref_grads[step])
        if after_backward is not None:
            after_backward(step)
        opt.step()
        opt.zero_grad()
    _check_params(model, ref_final)
