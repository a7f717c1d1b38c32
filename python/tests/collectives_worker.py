"""One rank of a collectives job (started by torchrun_test.py under torchrun or ./x launch).

Runs every functional collective on rank-dependent inputs and compares each result with the
single-device computation over all ranks' inputs (which every rank can rebuild). Exits non-zero
with a message on the first difference. Argument: the backend name.
"""

import sys

import torch

from dtensor import _functional_collectives as F


def input_for(rank, shape, dtype):
    n = 1
    for s in shape:
        n *= s
    t = torch.arange(n, dtype=torch.float64).reshape(shape) * (rank + 1) + 3 * rank
    return t.to(dtype)


def expect_equal(what, got, want):
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise SystemExit(f"{what}: got {got} want {want}")


def main():
    ctx = F.init_from_env(sys.argv[1], timeout_ms=60000)
    r, n = ctx.rank, ctx.world_size
    for dtype in (torch.float32, torch.float64, torch.int64, torch.bfloat16):
        shape = (2 * n, 3)
        xs = [input_for(k, shape, dtype) for k in range(n)]
        mine = xs[r].clone()
        expect_equal("all_reduce sum", F.all_reduce(mine, "sum"), sum(xs[1:], xs[0].clone()))
        expect_equal("all_reduce max", F.all_reduce(mine, "max"), torch.stack(xs).amax(0))
        expect_equal("all_gather dim 1", F.all_gather_into_tensor(mine, 1), torch.cat(xs, 1))
        total = sum(xs[1:], xs[0].clone())
        expect_equal("reduce_scatter dim 0", F.reduce_scatter_tensor(mine, "sum", 0),
                     total.chunk(n, 0)[r])
        expect_equal("broadcast", F.broadcast(mine, n - 1), xs[n - 1])
        pending = F.all_reduce(mine, "min", async_op=True)
        expect_equal("async all_reduce min", F.wait_tensor(pending), torch.stack(xs).amin(0))
        expect_equal("input untouched", mine, xs[r])
    # Uneven all_to_all_single: rank s sends s + d + 1 rows to rank d.
    rows = lambda s: [s + d + 1 for d in range(n)]  # noqa: E731
    xs = [input_for(s, (sum(rows(s)), 2), torch.float32) for s in range(n)]
    got = F.all_to_all_single(xs[r], [s + r + 1 for s in range(n)], rows(r))
    want = torch.cat([xs[s].split(rows(s))[r] for s in range(n)])
    expect_equal("all_to_all_single", got, want)
    # A tagged sub-group of the even ranks.
    evens = list(range(0, n, 2))
    group = F.new_group(evens, tag="evens") if r in evens else None
    if group is not None:
        x = input_for(r, (4,), torch.float32)
        expect_equal("sub-group all_reduce", F.all_reduce(x, "sum", group),
                     sum(input_for(k, (4,), torch.float32) for k in evens))
    print(f"rank {r}/{n} on {ctx.backend}: every collective matches the single-device result")


if __name__ == "__main__":
    main()
