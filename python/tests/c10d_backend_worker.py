"""One rank of c10d_backend_test: torch.distributed on the engine (backend "dtensor").

Every collective of torch.distributed through the default group (the engine) against the
values computed locally from every rank's deterministic inputs; the same through a subgroup;
then DistributedDataParallel trains one model on the engine's default group, one on a 1-D mesh's
get_group() and one on a Gloo group from the same start, and their losses and parameters must be
equal at every step."""

import sys

import torch
import torch.distributed as dist

import dtensor  # noqa: F401  (registers the "dtensor" backend)


def rank_tensor(r, shape=(4, 3), dtype=torch.float32):
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64) * 0.5 + r * 10 + 1).reshape(shape).to(dtype)


def check_collectives(group, ranks):
    me, n = dist.get_rank(group), len(ranks)
    every = [rank_tensor(r) for r in range(n)]
    t = rank_tensor(me)
    for op, want in [(dist.ReduceOp.SUM, sum(every)), (dist.ReduceOp.MAX, torch.stack(every).amax(0)),
                     (dist.ReduceOp.MIN, torch.stack(every).amin(0)),
                     (dist.ReduceOp.PRODUCT, torch.stack(every).prod(0))]:
        x = t.clone()
        dist.all_reduce(x, op=op, group=group)
        torch.testing.assert_close(x, want, rtol=1e-6, atol=0)
    x = t.clone()
    dist.broadcast(x, src=ranks[n - 1], group=group)
    torch.testing.assert_close(x, every[n - 1], rtol=0, atol=0)
    outs = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(outs, t, group=group)
    for o, e in zip(outs, every):
        torch.testing.assert_close(o, e, rtol=0, atol=0)
    big = torch.empty(n * 4, 3)
    dist.all_gather_into_tensor(big, t, group=group)
    torch.testing.assert_close(big, torch.cat(every), rtol=0, atol=0)
    out = torch.empty(4, 3)
    ins = [rank_tensor(me * n + j) for j in range(n)]
    dist.reduce_scatter(out, ins, group=group)
    torch.testing.assert_close(out, sum(rank_tensor(r * n + me) for r in range(n)), rtol=1e-6,
                               atol=0)
    out = torch.empty(4 // n * 1, 3) if 4 % n == 0 else None
    if out is not None:
        dist.reduce_scatter_tensor(out, t, group=group)
        torch.testing.assert_close(out, sum(every).chunk(n)[me], rtol=1e-6, atol=0)
        a2a = torch.empty(4, 3)
        dist.all_to_all_single(a2a, t, group=group)
        torch.testing.assert_close(a2a, torch.cat([e.chunk(n)[me] for e in every]), rtol=0,
                                   atol=0)
    x = t.clone()
    dist.reduce(x, dst=ranks[0], group=group)
    if me == 0:
        torch.testing.assert_close(x, sum(every), rtol=1e-6, atol=0)
    dist.barrier(group=group)


def check_ddp():
    gloo = dist.new_group(backend="gloo")
    mesh = dtensor.init_device_mesh("cpu", (dist.get_world_size(),))
    losses = {}
    for name, group in (("dtensor", None), ("gloo", gloo), ("mesh", mesh.get_group())):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        torch.manual_seed(100 + dist.get_rank())  # each rank its own batches
        seq = []
        for _ in range(5):
            x, y = torch.randn(8, 6), torch.randn(8, 2)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seq.append(loss.item())
        losses[name] = (seq, [p.detach().clone() for p in model.parameters()])
    for name in ("dtensor", "mesh"):
        torch.testing.assert_close(losses[name][0], losses["gloo"][0], rtol=1e-6, atol=0)
        for a, b in zip(losses[name][1], losses["gloo"][1]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def check_functional_collectives_on_process_groups():
    """PyTorch's functional collectives take a ProcessGroup: the default (dtensor) group, a
    Gloo group and a mesh dim's group; all run on the engine."""
    from dtensor import _functional_collectives as funcol
    world = dist.get_world_size()
    mine = torch.full((3,), float(dist.get_rank() + 1))
    expect = torch.full((3,), float(world * (world + 1) // 2))
    gloo = dist.new_group(backend="gloo")
    mesh = dtensor.init_device_mesh("cpu", (world,))
    for group in (dist.group.WORLD, gloo, mesh.get_group()):
        torch.testing.assert_close(funcol.all_reduce(mine, "sum", group).wait(), expect)
        gathered = funcol.all_gather_tensor(mine, 0, group).wait()
        torch.testing.assert_close(gathered, torch.cat([torch.full((3,), r + 1.0)
                                                        for r in range(world)]))


def main():
    dist.init_process_group(backend="dtensor")
    assert dist.get_backend() == "dtensor", dist.get_backend()
    world = dist.get_world_size()
    check_collectives(None, list(range(world)))
    if world > 2:
        sub = dist.new_group([0, 1], backend="dtensor")
        if dist.get_rank() in (0, 1):
            check_collectives(sub, [0, 1])
    check_ddp()
    check_functional_collectives_on_process_groups()
    try:
        dist.send(torch.zeros(1), dst=(dist.get_rank() + 1) % world)
        raise AssertionError("send should raise")
    except RuntimeError as e:
        assert "not supported" in str(e), e
    rank = dist.get_rank()
    dist.destroy_process_group()
    print(f"rank {rank}/{world}: torch.distributed on the dtensor backend matches", flush=True)


if __name__ == "__main__":
    sys.exit(main())
