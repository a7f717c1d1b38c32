"""A local op that raises on some ranks only (NOTE [local op failures] in
dtensor/dispatch_local.cc, NOTE [leaving a group] in collectives/communicator.h).

The case: fft.hfft/irfft mode S0 on torch 2.x, where 5 rows on 4 ranks leave rank 3 an empty
piece and MKL's FFT refuses a 0-row batch; rank 3's peers must not wait out the timeout in the
next collective. So:
- an op whose pieces on a rank are all empty answers with empty pieces (one device's result);
- a rank thread that leaves with an error makes its peers fail at once, naming it;
- a rank that catches its local error and goes on makes the next collective fail on every rank,
  never pairing its calls with the peers' pending ones.
"""

import time

import pytest
import torch

import dtensor
from dtensor import Replicate, Shard, distribute_tensor, init_device_mesh


def test_empty_piece_of_an_fft_equals_one_device():
    x = torch.randn(5, 6, 7, dtype=torch.complex64)

    def body(rank):
        mesh = init_device_mesh("cpu", (4,))
        d = distribute_tensor(x, mesh, [Shard(0)])
        out = torch.fft.hfft(d, n=10, dim=1, norm="ortho")
        return out.full_tensor()

    for got in dtensor.run_threads(4, body):
        torch.testing.assert_close(got, torch.fft.hfft(x, n=10, dim=1, norm="ortho"))


def test_a_rank_that_leaves_with_an_error_fails_its_peers_at_once():
    def body(rank):
        mesh = init_device_mesh("cpu", (4,))
        d = distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)])
        if rank == 3:
            raise ValueError("rank 3 gives up")
        return d.full_tensor()

    start = time.monotonic()
    with pytest.raises(Exception) as info:
        dtensor.run_threads(4, body)
    elapsed = time.monotonic() - start
    # The collective timeout is 300 s unless set; the peers must not wait for it.
    assert elapsed < 10, f"peers waited {elapsed:.1f} s for the rank that left"
    # run_threads raises the lowest rank's error: a peer's, naming the rank and its error.
    message = str(info.value)
    assert "global rank 3 left with an error" in message, message
    assert "rank 3 gives up" in message, message


def _rank_3_fails_then_every_rank_gathers(op):
    """Runs ``op(mesh)`` on 4 rank threads (only rank 3's raises), each rank catching its error
    and then gathering a tensor on the mesh: that next collective must fail on every rank at
    once, naming the program, never pairing rank 3's calls with the peers' pending ones."""
    outcomes = [None] * 4

    def body(rank):
        mesh = init_device_mesh("cpu", (4,))
        d = distribute_tensor(torch.ones(8, 4), mesh, [Replicate()])
        try:
            op(mesh)
            local = "ran"
        except (RuntimeError, IndexError):
            local = "raised"
        try:
            d.redistribute(mesh, [Shard(0)]).full_tensor()
            outcomes[rank] = (local, "gathered")
        except RuntimeError as e:
            outcomes[rank] = (local, str(e))

    start = time.monotonic()
    dtensor.run_threads(4, body)
    assert time.monotonic() - start < 10
    assert [o[0] for o in outcomes] == ["ran", "ran", "ran", "raised"], outcomes
    for rank, (_, result) in enumerate(outcomes):
        assert result != "gathered", f"rank {rank} gathered after rank 3's op failed: {outcomes}"
        assert "program" in result, result


def test_a_caught_local_failure_fails_the_next_collective_on_every_rank():
    # Rank 3's piece of the index holds the one out-of-range entry: only its index_select raises.
    x = torch.randn(5, 4)
    index = torch.tensor([0, 1, 2, 9])
    _rank_3_fails_then_every_rank_gathers(lambda mesh: torch.index_select(
        distribute_tensor(x, mesh, [Replicate()]), 0, distribute_tensor(index, mesh, [Shard(0)])))


_LIB = torch.library.Library("dtensor_local_failure", "DEF")
_LIB.define("quirk(Tensor x) -> Tensor")
# Like ATen's pixel_unshuffle before its rule sharded evenly: an empty input comes back in another
# shape, so only the rank with the empty piece sees a result that does not fit its layout.
_LIB.impl("quirk", lambda x: x.new_empty(0, 1) if x.numel() == 0 else x.clone(), "CPU")
_LIB.impl("quirk", lambda x: torch.empty_like(x), "Meta")


def test_a_local_result_of_the_wrong_shape_fails_the_next_collective_on_every_rank():
    """A wrong rule that shows on one rank only (its local result does not fit the propagated
    piece) raises there ("local result has shape"), and is a local failure (NOTE [local op
    failures]): the peers' next collective fails at once, naming the program. Unmarked, the
    error would let the peers go on: into a collective rank 3 never joins (a hang), or here
    paired with its gather."""
    from dtensor.experimental import register_sharding
    quirk = torch.ops.dtensor_local_failure.quirk

    @register_sharding(quirk)
    def strategies(x):
        return [([Replicate()], [Replicate()])] + [([Shard(d)], [Shard(d)]) for d in range(x.ndim)]

    def op(mesh):
        d = distribute_tensor(torch.ones(3, 4), mesh, [Shard(0)])  # rank 3's piece is empty
        try:
            quirk(d)
        except RuntimeError as e:
            assert "local result has shape" in str(e), e
            raise

    _rank_3_fails_then_every_rank_gathers(op)


def test_a_failure_every_rank_sees_is_raised_on_every_rank():
    # linalg.cholesky of a batch sharded by matrices, one not positive-definite: the info check
    # gathers the whole info (_linalg_check_errors), so every rank raises, as one device does.
    # An op with no outputs must never be answered with empty pieces (NOTE [local op failures]).
    a = torch.randn(4, 3, 3)
    spd = a @ a.transpose(1, 2) + 3 * torch.eye(3)
    spd[3] = -torch.eye(3)
    with pytest.raises(RuntimeError, match="positive-definite"):
        torch.linalg.cholesky(spd)

    def body(rank):
        mesh = init_device_mesh("cpu", (4,))
        d = distribute_tensor(spd, mesh, [Shard(0)])
        try:
            torch.linalg.cholesky(d)
            return "ran"
        except RuntimeError as e:
            return str(e)

    for rank, got in enumerate(dtensor.run_threads(4, body)):
        assert "positive-definite" in got, f"rank {rank}: {got}"


PROCESS_WORKER = r'''
import os, sys, torch
from dtensor import Shard, distribute_tensor, init_device_mesh
rank = int(os.environ["RANK"])
mesh = init_device_mesh("cpu", (4,))
d = distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)])
if rank == 3:
    raise ValueError("rank 3 gives up")
try:
    d.full_tensor()
except RuntimeError as e:
    print(f"peer {rank} failed: {str(e).splitlines()[0]}", flush=True)
    sys.exit(0)
print(f"peer {rank} gathered", flush=True)
'''


def test_a_rank_process_that_dies_with_an_error_fails_its_peers_at_once(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "worker.py"
    script.write_text(PROCESS_WORKER)
    env = dict(os.environ, PYTHONSAFEPATH="1", DTENSOR_BACKEND="shm",
               DTENSOR_COLLECTIVE_TIMEOUT_MS="120000",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    start = time.monotonic()
    out = subprocess.run([sys.executable, os.environ["LAUNCH_PY"], "-n", "4", "--",
                          sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=240)
    elapsed = time.monotonic() - start
    text = out.stdout + out.stderr
    assert out.returncode != 0, text  # rank 3's error is the job's
    # The launcher kills the ranks still running 30 s after one failed; the peers must not wait.
    assert elapsed < 25, f"{elapsed:.1f} s\n{text}"
    for rank in range(3):
        assert f"peer {rank} failed" in text, text
    assert "global rank 3 left with an error: ValueError: rank 3 gives up" in text, text
