"""dtensor.pipelining's schedules, as PyTorch's own pipelining tests check them: loss and every
gradient equal the un-pipelined model's (fp32) for every schedule on 2 and 4 stages, 1 to 8
microbatches and uneven layer counts per stage; each rank's actions (NOTE [pipeline schedules])
run every microbatch's forward and backward once per stage, and 1F1B holds at most as many
microbatches' activations as there are stages after it; a stage that raises, and stages whose
schedules or declared shapes disagree, fail every rank at once with an error naming the stages."""

import copy
import time

import pytest
import torch
from torch import nn

import dtensor
from dtensor.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble,
                                ScheduleLoopedBFS)

DIM, ROWS = 6, 24
SINGLE = [ScheduleGPipe, Schedule1F1B]
MULTI = [ScheduleInterleaved1F1B, ScheduleLoopedBFS, ScheduleInterleavedZeroBubble]
# Layers per stage: uneven, so stages differ in depth (and the last has the most).
LAYERS = {2: [1, 2], 4: [2, 1, 1, 3]}


def _stages_model(n_stages):
    torch.manual_seed(0)
    return nn.ModuleList(
        nn.Sequential(*[nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(k)])
        for k in LAYERS[n_stages])


def _run(schedule, n_stages, n_micro, world):
    """Runs one training step on `world` rank threads; returns (the loss and gradients of one
    device, each rank's (losses, grads by name, timeline))."""
    model = _stages_model(n_stages)
    torch.manual_seed(1)
    x, y = torch.randn(ROWS, DIM), torch.randn(ROWS, DIM)
    ref = copy.deepcopy(model)
    h = x
    for part in ref:
        h = part(h)
    want_loss = nn.functional.mse_loss(h, y)
    want_loss.backward()
    want = {f"{k}.{n}": p.grad for k, part in enumerate(ref) for n, p in part.named_parameters()}

    def fn(rank):
        mine = copy.deepcopy(model)
        ks = list(range(rank, n_stages, world))
        stages = [PipelineStage(mine[k], k, n_stages) for k in ks]
        arg = stages if schedule in MULTI else stages[0]
        sched = schedule(arg, n_micro, loss_fn=nn.functional.mse_loss)
        losses = []
        sched.step(*((x,) if 0 in ks else ()), target=y if n_stages - 1 in ks else None,
                   losses=losses)
        grads = {f"{k}.{n}": p.grad for k in ks for n, p in mine[k].named_parameters()}
        return losses, grads, [(s, kind, mb) for s, kind, mb, _, _ in sched.timeline]

    return want_loss.detach(), want, dtensor.run_threads(world, fn)


CASES = ([(s, n, m) for s in SINGLE for n in (2, 4) for m in (1, 3, 8)] +
         # Several stages per rank: 2 stages on 1 rank, 4 on 2 (the interleaved orders take
         # microbatches in rounds of the group size).
         [(s, 2, m) for s in MULTI for m in (1, 3, 8)] +
         [(s, 4, m) for s in MULTI for m in (2, 8)])


@pytest.mark.parametrize("schedule,n_stages,n_micro", CASES,
                         ids=lambda v: v.__name__ if isinstance(v, type) else str(v))
def test_every_schedule_equals_one_device(schedule, n_stages, n_micro):
    world = n_stages if schedule in SINGLE else n_stages // 2
    want_loss, want, got = _run(schedule, n_stages, n_micro, world)
    last = got[(n_stages - 1) % world]
    assert len(last[0]) == n_micro
    torch.testing.assert_close(torch.stack(last[0]).mean(), want_loss, rtol=1e-5, atol=1e-6)
    seen = set()
    for _, grads, timeline in got:
        for name, g in grads.items():
            torch.testing.assert_close(g, want[name], rtol=1e-5, atol=1e-6, msg=name)
            seen.add(name)
        # Every microbatch's forward and backward (or its two halves) once per stage.
        kinds = {"B"} if not any(k == "I" for _, k, _ in timeline) else {"I", "W"}
        stages = {s for s, _, _ in timeline}
        for s in stages:
            for kind in {"F"} | kinds:
                mbs = sorted(mb for st, k, mb in timeline if st == s and k == kind)
                assert mbs == list(range(n_micro)), (s, kind, mbs)
    assert seen == set(want)


@pytest.mark.parametrize("n_stages", [2, 4])
def test_1f1b_holds_fewer_activations_than_gpipe(n_stages):
    """In flight (forward done, backward not) on stage s: at most n_stages - s microbatches under
    1F1B (its memory bound), all of them under GPipe."""
    n_micro = 8

    def in_flight(timeline):
        live = peak = 0
        for _, kind, _ in timeline:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        return peak

    for schedule, bound in ((Schedule1F1B, lambda s: n_stages - s), (ScheduleGPipe,
                                                                     lambda s: n_micro)):
        _, _, got = _run(schedule, n_stages, n_micro, n_stages)
        for stage, (_, _, timeline) in enumerate(got):
            assert in_flight(timeline) == min(n_micro, bound(stage)), (schedule, stage)


def _two_stages(fn_for_rank, n_micro=(4, 4), input_args=None):
    def fn(rank):
        torch.manual_seed(0)
        stage = PipelineStage(fn_for_rank(rank), rank, 2,
                              input_args=input_args if rank == 1 else None)
        sched = Schedule1F1B(stage, n_micro[rank], loss_fn=nn.functional.mse_loss)
        x = torch.randn(8, DIM)
        sched.step(*((x,) if rank == 0 else ()), target=x if rank == 1 else None)

    start = time.monotonic()
    with pytest.raises(Exception) as info:
        dtensor.run_threads(2, fn)
    elapsed = time.monotonic() - start
    assert elapsed < 10, f"the ranks waited {elapsed:.1f} s"  # the collective timeout is 300 s
    return str(info.value)


def test_a_stage_raising_mid_schedule_fails_every_rank():
    class FailsAtThirdCall(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls, self.lin = 0, nn.Linear(DIM, DIM)

        def forward(self, x):
            self.calls += 1
            if self.calls == 3:
                raise ValueError("bad activations")
            return self.lin(x)

    text = _two_stages(lambda rank: FailsAtThirdCall() if rank == 1 else nn.Linear(DIM, DIM))
    # run_threads raises rank 0's error: its wait for stage 1 fails, naming stage 1's error.
    assert "global rank 1 left with an error" in text, text
    assert "PipelineStage 1 (rank 1): the forward of microbatch 2 raised ValueError: bad " \
           "activations" in text, text


def test_stages_with_different_microbatch_counts_are_refused():
    text = _two_stages(lambda rank: nn.Linear(DIM, DIM), n_micro=(4, 2))
    assert "PipelineStage 1 (rank 1) runs 2 microbatches a step, stage 0 runs 4" in text, text


def test_declared_input_shapes_are_checked_naming_both_stages():
    text = _two_stages(lambda rank: nn.Linear(DIM, DIM), input_args=torch.empty(2, DIM + 1))
    assert ("PipelineStage 1 (rank 1) declared its microbatch inputs as [2, 7] float32 "
            "(input_args); for microbatch 0 stage 0 sent [2, 6] float32") in text, text


WORKER_3D = r'''
import copy, os, torch
from torch import nn
import dtensor
from dtensor import Replicate, init_device_mesh
from dtensor.fsdp import fully_shard
from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from dtensor.pipelining import PipelineStage, Schedule1F1B
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8))
                        for _ in range(2)])
x, y = torch.randn(16, 8), torch.randn(16, 8)
ref = copy.deepcopy(model)
nn.functional.mse_loss(ref(x), y).backward()
mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
pp, dp = mesh.get_coordinate()[:2]
block = parallelize_module(model[pp], mesh["tp"], {"0": ColwiseParallel(),
                                                   "2": RowwiseParallel(use_local_output=False)})
fully_shard(block, mesh=mesh["dp"])
stage = PipelineStage(block, pp, 2, group=mesh.get_group("pp"))
xs = dtensor.distribute_tensor(x.chunk(2)[dp], mesh["tp"], [Replicate()], src_data_rank=None)
loss_fn = lambda out, t: nn.functional.mse_loss(out.full_tensor(), t)
Schedule1F1B(stage, 4, loss_fn=loss_fn).step(*((xs,) if pp == 0 else ()),
                                             target=y.chunk(2)[dp] if pp == 1 else None)
for p, q in zip(block.parameters(), ref[pp].parameters()):
    torch.testing.assert_close(p.grad.full_tensor(), q.grad, rtol=1e-5, atol=1e-6)
print("ok")
'''


def test_pp_dp_tp_on_8_processes(tmp_path):
    """torchtitan's 3-D recipe as processes on shm: pp=2 x dp=2 x tp=2, each stage tensor
    parallel and fully_shard'ed; every gradient equals one device's on the whole batch."""
    from launch_ranks import run_on_ranks
    run_on_ranks(WORKER_3D, 8, tmp_path)
