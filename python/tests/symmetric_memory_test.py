"""dtensor.symmetric_memory (PyTorch's torch.distributed._symmetric_memory API) on real processes:
peers' buffers and signal pads, and that the engine's collectives take symmetric tensors without
staging (functional collectives, torch.distributed on the "dtensor" backend), each against
values computed from every rank's inputs."""

import textwrap

import pytest

from launch_ranks import run_on_ranks

WORKER = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    import dtensor
    from dtensor import symmetric_memory as symm_mem
    from dtensor import _functional_collectives as fc
    from dtensor import _C

    dist.init_process_group("dtensor")
    me, n = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    numel = 1 << 16  # 256 KiB of floats: past the 64 KiB below which calls use the buffers

    def mine(r):
        return torch.arange(numel, dtype=torch.float32) % 7 + r

    t = symm_mem.empty(numel, dtype=torch.float32)
    assert symm_mem.is_symm_mem_tensor(t) and not symm_mem.is_symm_mem_tensor(torch.ones(2))
    t.copy_(mine(me))
    h = symm_mem.rendezvous(t, group)
    assert symm_mem.rendezvous(t, group) is h or symm_mem.rendezvous(t, group).rank == me
    assert (h.rank, h.world_size, len(h.buffer_ptrs)) == (me, n, n)
    h.barrier()
    for p in range(n):
        assert torch.equal(h.get_buffer(p, [numel], torch.float32), mine(p)), p
    h.barrier(1)
    right, left = (me + 1) % n, (me - 1) % n
    h.get_buffer(right, [4], torch.float32, storage_offset=8).fill_(100 + me)
    h.put_signal(right, 2)
    h.wait_signal(left, 2)
    assert torch.equal(t[8:12], torch.full((4,), 100.0 + left))
    h.barrier(1)
    t.copy_(mine(me))
    h.barrier(1)

    total = sum(mine(r) for r in range(n))
    before = _C.symmetric_collectives_run()
    assert torch.equal(fc.all_reduce(t, "sum", group), total)
    assert torch.equal(fc.all_gather_tensor(t, 0, group), torch.cat([mine(r) for r in range(n)]))
    x = symm_mem.empty(numel, dtype=torch.float32)
    symm_mem.rendezvous(x, group)
    x.copy_(mine(me))
    dist.all_reduce(x)  # in place on the "dtensor" backend: two-shot on symmetric memory
    assert torch.equal(x, total)
    out = symm_mem.empty(n * numel, dtype=torch.float32)
    symm_mem.rendezvous(out, group)
    dist.all_gather_into_tensor(out, t)  # push into symmetric outputs
    assert torch.equal(out, torch.cat([mine(r) for r in range(n)]))
    ran = _C.symmetric_collectives_run() - before
    assert ran == 4, ran
    print("ok")
""")


@pytest.mark.parametrize("n", [2, 3])
def test_symmetric_memory_on_processes(tmp_path, n):
    run_on_ranks(WORKER, n, tmp_path)
