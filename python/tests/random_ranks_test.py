"""NOTE [rank generators agree] (dtensor/random.h): random ops on distributed tensors give one
device's values, and equal Replicate replicas, only when every rank draws from a generator in the
same state. Ranks whose generators differ fail instead of returning replicas that differ: ranks
as threads without dtensor.manual_seed raise at the op; processes seeded differently fail at the
next collective on the mesh, on every rank. Both returned differing "replicas" silently before."""

import pytest
import torch
import torch.nn.functional as F

import dtensor
from dtensor import Replicate, Shard, distribute_tensor
from launch_ranks import run_on_ranks


@pytest.mark.parametrize("op", ["randn", "dropout"])
def test_thread_ranks_without_their_own_generator_raise(op):
    def fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        with pytest.raises(RuntimeError, match="dtensor.manual_seed"):
            if op == "randn":
                dtensor.randn(4, device_mesh=mesh, placements=[Replicate()])
            else:
                F.dropout(distribute_tensor(torch.ones(8), mesh, [Replicate()]), 0.5)
        return True

    assert all(dtensor.run_threads(2, fn))


def test_thread_ranks_seeded_alike_draw_equal_replicas():
    def fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        dtensor.manual_seed(7)
        a = dtensor.randn(4, device_mesh=mesh, placements=[Replicate()])
        b = F.dropout(distribute_tensor(torch.ones(8), mesh, [Replicate()]), 0.5)
        return a.to_local(), b.to_local()

    (a0, b0), (a1, b1) = dtensor.run_threads(2, fn)
    assert torch.equal(a0, a1) and torch.equal(b0, b1)


_WORKER = r'''
import os
import torch
import dtensor
from dtensor import Replicate, Shard
rank = int(os.environ["RANK"])
torch.manual_seed(SEED_OF_RANK)
mesh = dtensor.init_device_mesh("cpu", (2,))
a = dtensor.randn(4, 3, device_mesh=mesh, placements=[Replicate()])
try:
    whole = dtensor.randn(4, 3, device_mesh=mesh, placements=[Shard(0)]).full_tensor()
except RuntimeError as e:
    assert "program differs" in str(e), e
    print("raised")
else:
    torch.manual_seed(SEED_OF_RANK)
    torch.testing.assert_close(a.to_local(), torch.randn(4, 3))
    torch.testing.assert_close(whole, torch.randn(4, 3))
print("ok")
'''


@pytest.mark.parametrize("seeds", ["alike", "per_rank"])
def test_processes_seeded_differently_fail_at_the_next_collective(seeds, tmp_path):
    seed = "0" if seeds == "alike" else "rank"
    out = run_on_ranks(_WORKER.replace("SEED_OF_RANK", seed), 2, tmp_path)
    assert out.count("raised") == (0 if seeds == "alike" else 2), out


_MEMORY_ORDER_OPS = {
    "uniform_": lambda t: t.uniform_(-1, 2),
    "normal_": lambda t: t.normal_(0.5, 2.0),
    "bernoulli_": lambda t: t.bernoulli_(0.3),
    "exponential_": lambda t: t.exponential_(),
    "cauchy_": lambda t: t.cauchy_(),
    "log_normal_": lambda t: t.log_normal_(0.5, 0.25),
    "geometric_": lambda t: t.geometric_(0.3),
    "random_": lambda t: t.random_(0, 50),
    "rand_like": lambda t: torch.rand_like(t),
    "randn_like": lambda t: torch.randn_like(t),
    "bernoulli.p": lambda t: torch.bernoulli(t, 0.4),
    "dropout": lambda t: F.dropout(t.fill_(1.0), 0.5),
}


@pytest.mark.parametrize("chunk", ["1M", "7"])
@pytest.mark.parametrize("op", sorted(_MEMORY_ORDER_OPS))
def test_random_op_on_a_non_contiguous_tensor_matches_one_device(op, chunk, monkeypatch):
    """NOTE [random draws in memory order]: one device fills a transposed tensor in memory order
    (normal_ by its serial path); the replay draws in that order too, so dropout of a transposed
    distributed tensor neither raises nor gives other values than one device's."""
    if chunk != "1M":
        monkeypatch.setenv("DTENSOR_RANDOM_CHUNK", chunk)  # many chunks, odd boundaries
    f = _MEMORY_ORDER_OPS[op]
    # (global shape, permutation giving the non-contiguous view, placements on a 2x2 mesh)
    cases = [((5, 7), (1, 0), [Shard(0), Shard(1)]), ((5, 7), (1, 0), [Replicate(), Shard(0)]),
             ((3, 4, 6), (2, 0, 1), [Shard(1), Shard(2)]), ((3, 4, 6), (0, 2, 1), [Shard(0), Replicate()]),
             ((4, 1, 9), (2, 1, 0), [Shard(2), Shard(0)])]
    refs = []
    for shape, perm, _ in cases:
        torch.manual_seed(11)
        base = torch.zeros([shape[p] for p in perm]).permute(sorted(range(len(perm)), key=lambda d: perm[d]))
        assert not base.is_contiguous() and list(base.shape) == list(shape)
        refs.append(f(base))

    def fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2, 2))
        out = []
        for shape, perm, placements in cases:
            inv = sorted(range(len(perm)), key=lambda d: perm[d])
            x = distribute_tensor(torch.zeros([shape[p] for p in perm]), mesh, placements).permute(inv)
            assert not x.is_contiguous() and list(x.shape) == list(shape)
            dtensor.manual_seed(11)
            out.append(f(x).full_tensor())
        return out

    for got in dtensor.run_threads(4, fn):
        for g, want in zip(got, refs):
            assert torch.equal(g, want), (op, g, want)


def test_the_gpu_checks_random_script_on_cpu_ranks():
    """tools/gpu/random_ranks.py (the GPU check's stage random: 2 processes on one GPU) on 2 CPU
    processes (shm): rand, randn, uniform_, normal_, bernoulli_, rand_like, randn_like and
    dropout (of transposed and strided tensors too) on uneven shapes, Shard on either dim and
    Replicate, equal one device's draw bit for bit, the generator ending where one device's does.
    Here so the script cannot rot between GPU runs."""
    import os
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(os.environ["LAUNCH_PY"]), "gpu", "random_ranks.py")
    env = dict(os.environ, PYTHONSAFEPATH="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, os.environ["LAUNCH_PY"], "-n", "2", "--",
                          sys.executable, script, "cpu"], env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "90 of 90 cases equal one device's" in out.stdout, out.stdout


_LIKE_WORKER = r'''
import itertools
import os
import torch
import dtensor
from dtensor import Replicate, Shard, distribute_tensor
rank = int(os.environ["RANK"])
mesh = dtensor.init_device_mesh("cpu", (4,))
ops = {
    "rand_like": lambda t, **kw: torch.rand_like(t, **kw),
    "randn_like": lambda t, **kw: torch.randn_like(t, **kw),
    "randint_like": lambda t, **kw: torch.randint_like(t, 50, **kw),
    "randint_like.low": lambda t, **kw: torch.randint_like(t, -3, 9, **kw),
}
keywords = {
    "dtype": [None, torch.float64],
    "device": [None, "cpu"],
    "layout": [None, torch.strided],
    "memory_format": [None, torch.preserve_format, torch.contiguous_format],
    "requires_grad": [None, True],
    "generator": [None, "own"],
}
base = torch.zeros(5, 6).t()  # (6, 5), not contiguous: memory formats differ
checked = 0
for placements in ([Replicate()], [Shard(0)], [Shard(1)]):
    x = distribute_tensor(base.t().contiguous(), mesh, placements).t()  # laid out as base
    for name, op in ops.items():
        for values in itertools.product(*keywords.values()):
            kw = {k: v for k, v in zip(keywords, values) if v is not None}
            gens = []
            for _ in range(2):
                g = torch.Generator().manual_seed(5)
                gens.append(g)
            results = []
            for i, t in enumerate((x, base)):
                torch.manual_seed(42)
                call = dict(kw)
                if "generator" in call:
                    call["generator"] = gens[i]
                got = op(t, **call)
                # what one device's generators hold after the call: the next draws must agree
                after = [torch.rand(3)] + ([torch.rand(3, generator=gens[i])] if "generator" in call else [])
                results.append((got, after))
            (got, after), (want, want_after) = results
            whole = got.full_tensor()
            assert whole.dtype == want.dtype and whole.requires_grad == want.requires_grad, (name, kw)
            assert torch.equal(whole, want), (name, placements, kw, whole, want)
            assert all(torch.equal(a, b) for a, b in zip(after, want_after)), ("generator state", name, placements, kw)
            assert tuple(got.stride()) == tuple(want.stride()), (name, placements, kw, got.stride(), want.stride())
            checked += 1
print(f"checked {checked}")
print("ok")
'''


def test_random_like_ops_with_every_keyword_match_one_device(tmp_path):
    """Random *_like ops with any of dtype, device, layout, memory_format, requires_grad and
    generator, on Replicate, Shard(0) and Shard(1) of a transposed tensor on 4 processes: values,
    strides and the generators' next draws equal one device's. Guards against `device=` making
    the engine run the op once for real while asking ATen for the output's metadata, which draws
    randn_like twice and makes every later draw differ from one device's."""
    out = run_on_ranks(_LIKE_WORKER, 4, tmp_path)
    assert out.count("checked 1152") == 4, out
