"""Lazy conjugate and negative views through real processes: torch.fft.ifft of a real
input returns a tensor whose conjugation is a pending bit (its memory holds the unconjugated
values), and backends that move raw memory lost it: on 4 processes the gathered result had the
imaginary part's sign flipped (NOTE [lazy conjugate and negative views]). Ranks as threads did
not show it (their backend copies through ATen), so these run on processes, shm backend, with
uneven pieces (5 rows on 4 ranks: 2, 2, 1, 0).
"""

from launch_ranks import run_on_ranks

WORKER = r'''
import torch
from dtensor import Replicate, Shard, distribute_tensor, init_device_mesh

torch.manual_seed(0)
mesh = init_device_mesh("cpu", (4,))
x = torch.randn(5, 6, 7)
z = torch.randn(5, 6, dtype=torch.complex64)
cases = {
    "fft.ifft": (x, lambda t: torch.fft.ifft(t)),
    "fft.ifft norm=ortho": (x, lambda t: torch.fft.ifft(t, norm="ortho")),
    "fft.ifft dim=-2": (x, lambda t: torch.fft.ifft(t, dim=-2)),
    "fft.ihfft": (x, lambda t: torch.fft.ihfft(t)),
    "conj": (z, lambda t: t.conj()),
    "conj then add": (z, lambda t: t.conj() + 1),
    "neg view of a conj (conj_physical then neg)": (z, lambda t: torch.conj_physical(t).neg()),
}
for name, (value, fn) in cases.items():
    want = fn(value)
    for d in range(value.dim()):
        got = fn(distribute_tensor(value, mesh, [Shard(d)]))
        for target in ([Replicate()], [Shard(0)]):
            out = got.redistribute(mesh, target).full_tensor()
            torch.testing.assert_close(out.resolve_conj().resolve_neg(),
                                       want.resolve_conj().resolve_neg(),
                                       msg=lambda m: f"{name} Shard({d}) -> {target}: {m}")
# The functional collectives on a plain tensor with a pending conjugation.
import dtensor._functional_collectives as F
zc = torch.arange(3.0).mul(1 + 2j).conj()
got = F.all_gather_tensor(zc, 0, list(range(4)))
torch.testing.assert_close(got, zc.resolve_conj().repeat(4))
print("ok")
'''


def test_lazy_views_survive_process_collectives(tmp_path):
    run_on_ranks(WORKER, 4, tmp_path, DTENSOR_BACKEND="shm")
