"""dtensor.pipelining (NOTE [pipeline stages], [pipeline schedules], [pipeline transfers]):
every schedule's loss and every gradient equal the un-pipelined model's on one device (fp32),
with plain stages, with tensor-parallel stages whose distributed activations cross the stage
boundary laid out as they left, with fully_shard'ed stages on pp x dp (x tp) meshes, and as
processes on the shm backend."""

import copy

import pytest
import torch
from torch import nn

import dtensor
from dtensor import init_device_mesh
from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from dtensor.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble,
                                ScheduleLoopedBFS)

from launch_ranks import run_on_ranks

DIM, BATCH, MICRO = 8, 8, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


def _model(n_blocks):
    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(n_blocks)])


def _reference(model, x, y):
    ref = copy.deepcopy(model)
    loss = nn.functional.mse_loss(ref(x), y)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in ref.named_parameters()}


SINGLE = [ScheduleGPipe, Schedule1F1B]
MULTI = [ScheduleInterleaved1F1B, ScheduleLoopedBFS, ScheduleInterleavedZeroBubble]


@pytest.mark.parametrize("schedule", SINGLE + MULTI, ids=lambda s: s.__name__)
def test_schedules_equal_one_device(schedule):
    world = 2
    stages_per_rank = 2 if schedule in MULTI else 1
    n_stages = world * stages_per_rank
    model = _model(n_stages)
    torch.manual_seed(1)
    x, y = torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)
    want_loss, want_grads = _reference(model, x, y)

    def fn(rank):
        mine = copy.deepcopy(model)
        stages = [PipelineStage(mine[k], k, n_stages) for k in range(rank, n_stages, world)]
        loss_fn = nn.functional.mse_loss
        if schedule in MULTI:
            sched = schedule(stages, MICRO, loss_fn=loss_fn)
        else:
            sched = schedule(stages[0], MICRO, loss_fn=loss_fn)
        losses = []
        sched.step(*((x,) if rank == 0 else ()), target=y if rank == world - 1 else None,
                   losses=losses)
        grads = {n: p.grad for k in range(rank, n_stages, world)
                 for n, p in ((f"{k}.{m}", q) for m, q in mine[k].named_parameters())}
        return losses, grads

    got = dtensor.run_threads(world, fn)
    losses = got[world - 1][0]
    assert len(losses) == MICRO
    torch.testing.assert_close(torch.stack(losses).mean(), want_loss, rtol=1e-5, atol=1e-6)
    for _, grads in got:
        for name, g in grads.items():
            torch.testing.assert_close(g, want_grads[name], rtol=1e-5, atol=1e-6)


def test_eval_runs_forwards_only():
    model = _model(2)
    x = torch.randn(BATCH, DIM)
    want = model(x).detach()

    def fn(rank):
        mine = copy.deepcopy(model)
        sched = Schedule1F1B(PipelineStage(mine[rank], rank, 2), MICRO)
        out = sched.eval(*((x,) if rank == 0 else ()))
        return out, [p.grad for p in mine.parameters()]

    got = dtensor.run_threads(2, fn)
    torch.testing.assert_close(got[1][0], want)
    assert got[0][0] is None and all(g is None for _, gs in got for g in gs)


def _tp_stage(block, mesh):
    # use_local_output=False: the stage's output stays distributed, and crosses to the next
    # stage's mesh laid out as it left (NOTE [pipeline transfers]).
    return parallelize_module(block, mesh, {"up": ColwiseParallel(),
                                            "down": RowwiseParallel(use_local_output=False)})


@pytest.mark.parametrize("schedule", [Schedule1F1B, ScheduleGPipe], ids=lambda s: s.__name__)
def test_tensor_parallel_stages(schedule):
    """pp=2 x tp=2 on 4 ranks: each stage's block is tensor parallel on its tp mesh; the
    activations between stages are distributed tensors moved mesh to mesh."""
    model = _model(2)
    torch.manual_seed(1)
    x, y = torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)
    want_loss, want_grads = _reference(model, x, y)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))
        pp = mesh.get_coordinate()[0]
        block = _tp_stage(copy.deepcopy(model[pp]), mesh["tp"])
        stage = PipelineStage(block, pp, 2, group=mesh.get_group("pp"))

        def loss_fn(out, target):
            return nn.functional.mse_loss(out.full_tensor() if hasattr(out, "placements")
                                          else out, target)

        losses = []
        xd = dtensor.distribute_tensor(x, mesh["tp"], [dtensor.Replicate()])
        schedule(stage, MICRO, loss_fn=loss_fn).step(
            *((xd,) if pp == 0 else ()), target=y if pp == 1 else None, losses=losses)
        grads = {f"{pp}.{n}": (p.grad.full_tensor() if hasattr(p.grad, "placements") else p.grad)
                 for n, p in block.named_parameters()}
        return losses, grads

    got = dtensor.run_threads(4, fn)
    torch.testing.assert_close(torch.stack(got[2][0]).mean(), want_loss, rtol=1e-5, atol=1e-6)
    for _, grads in got:
        for name, g in grads.items():
            torch.testing.assert_close(g, want_grads[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tp", [1, 2])
def test_fully_sharded_stages_on_a_3d_mesh(tp):
    """pp=2 x dp=2 (x tp=2): each stage tensor parallel on "tp" (when tp=2) and fully_shard'ed
    on "dp", the batch split over dp; FSDP reduces each stage's gradients once, at the step's last
    microbatch. Every gradient equals one device's on the whole batch."""
    from dtensor import Replicate
    from dtensor.fsdp import fully_shard

    model = _model(2)
    torch.manual_seed(1)
    x, y = torch.randn(2 * BATCH, DIM), torch.randn(2 * BATCH, DIM)
    _, want_grads = _reference(model, x, y)

    def fn(rank):
        shape, names = ((2, 2, 2), ("pp", "dp", "tp")) if tp == 2 else ((2, 2), ("pp", "dp"))
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        pp, dp = mesh.get_coordinate()[:2]
        block = copy.deepcopy(model[pp])
        if tp == 2:
            block = _tp_stage(block, mesh["tp"])
        fully_shard(block, mesh=mesh["dp"])
        stage = PipelineStage(block, pp, 2, group=mesh.get_group("pp"))
        xs, ys = x.chunk(2)[dp], y.chunk(2)[dp]
        if tp == 2:
            xs = dtensor.distribute_tensor(xs, mesh["tp"], [Replicate()], src_data_rank=None)

        def loss_fn(out, target):
            return nn.functional.mse_loss(out.full_tensor() if hasattr(out, "placements")
                                          else out, target)

        Schedule1F1B(stage, 2, loss_fn=loss_fn).step(
            *((xs,) if pp == 0 else ()), target=ys if pp == 1 else None)
        return {f"{pp}.{n}": p.grad.full_tensor() for n, p in block.named_parameters()}

    for grads in dtensor.run_threads(4 * tp, fn):
        for name, g in grads.items():
            torch.testing.assert_close(g, want_grads[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reshard_after_forward", [True, False])
@pytest.mark.parametrize("schedule", MULTI, ids=lambda s: s.__name__)
def test_fully_sharded_stages_with_every_multi_stage_schedule(schedule, reshard_after_forward):
    """pp=2 x dp=2, two fully_shard'ed stages per rank: zero bubble's weight pass (deferred,
    after other microbatches' forwards resharded the parameters) gives FSDP's unsharded
    parameters their gradients, reduced once at the step's last weight pass. Every gradient
    equals one device's on the whole batch."""
    from dtensor.fsdp import fully_shard

    model = _model(4)
    torch.manual_seed(1)
    x, y = torch.randn(2 * BATCH, DIM), torch.randn(2 * BATCH, DIM)
    _, want_grads = _reference(model, x, y)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
        pp, dp = mesh.get_coordinate()
        mine = copy.deepcopy(model)
        stages = []
        for k in (pp, pp + 2):
            fully_shard(mine[k], mesh=mesh["dp"], reshard_after_forward=reshard_after_forward)
            stages.append(PipelineStage(mine[k], k, 4, group=mesh.get_group("pp")))
        xs, ys = x.chunk(2)[dp], y.chunk(2)[dp]
        schedule(stages, MICRO, loss_fn=nn.functional.mse_loss).step(
            *((xs,) if pp == 0 else ()), target=ys if pp == 1 else None)
        return {f"{k}.{n}": p.grad.full_tensor() for k in (pp, pp + 2)
                for n, p in mine[k].named_parameters()}

    for grads in dtensor.run_threads(4, fn):
        assert len(grads) == 8
        for name, g in grads.items():
            torch.testing.assert_close(g, want_grads[name], rtol=1e-5, atol=1e-6)


WORKER = r'''
import copy, os, torch
from torch import nn
import dtensor
from dtensor.pipelining import PipelineStage, Schedule1F1B
rank = int(os.environ["RANK"])
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(4)])
x, y = torch.randn(8, 8), torch.randn(8, 8)
ref = copy.deepcopy(model)
want = nn.functional.mse_loss(ref(x), y)
want.backward()
dtensor.init_device_mesh("cpu", (4,))
stage = PipelineStage(model[rank], rank, 4)
losses = []
Schedule1F1B(stage, 4, loss_fn=nn.functional.mse_loss).step(
    *((x,) if rank == 0 else ()), target=y if rank == 3 else None, losses=losses)
if rank == 3:
    assert torch.allclose(torch.stack(losses).mean(), want, rtol=1e-5), (losses, want)
for p, q in zip(model[rank].parameters(), ref[rank].parameters()):
    assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6), rank
print("ok")
'''


def test_processes_on_shm(tmp_path):
    run_on_ranks(WORKER, 4, tmp_path)
