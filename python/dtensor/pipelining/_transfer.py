"""Moving a stage's tensors to another stage: NOTE [pipeline transfers].

NOTE [pipeline transfers]: a value crossing a stage boundary (activations forward, their
gradients backward) is a tuple of tensors, each plain or distributed. A distributed tensor goes as
a cross-mesh redistribute (NOTE [cross-mesh redistribute] in dtensor/redistribute.h) from its mesh
to the same mesh shifted to the other stage, arriving laid out as it left (a Partial reduced on
the way). A plain tensor goes from this rank to its peer in the pipeline group as a bare
all_to_all_single on the pair's group (what the redistribute between two one-rank meshes would
run, without distributed tensors around it: a quarter of a transfer's cost). The receiver must
know the source layout and size, so a fixed-size header (int64: per tensor its kind, dtype,
shape, placements; and which stage sent it, for which microbatch of how many, so a receiving stage
refuses a schedule that does not match its own, naming both stages) goes first, from each rank to
its peer. Every transfer of one boundary and direction runs on its own channel (a group of its
own over the same ranks), so activations and gradients keep their own first-in-first-out order
whatever the schedule interleaves; sends are asynchronous (a stage's ranks only send on a
boundary), so a stage never waits for a peer to reach its receive, which is what keeps 1F1B and
the interleaved schedules free of deadlock. Stages must sit on disjoint ranks, each stage's the
previous one's moved by one offset (the pipeline dim of a mesh built by init_device_mesh).
"""

import torch

from dtensor import _C
from dtensor import _functional_collectives as fc
from dtensor._api import DTensor
from dtensor.device_mesh import DeviceMesh
from dtensor.placement_types import Partial, Replicate, Shard, _StridedShard

_HEADER = 256
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]
_REDUCE_OPS = ["sum", "avg", "min", "max", "product"]
_NONE, _PLAIN, _DTENSOR = 0, 1, 2


def _placement_code(p):
    if isinstance(p, _StridedShard):
        raise NotImplementedError(f"pipeline transfer of a tensor laid out by {p!r}")
    if p.is_shard():
        return p.dim
    if p.is_partial():
        if p.reduce_op not in _REDUCE_OPS or p.norm_order:
            raise NotImplementedError(f"pipeline transfer of a tensor laid out by {p!r}")
        return -2 - _REDUCE_OPS.index(p.reduce_op)
    return -1


def _placement_of(code):
    if code >= 0:
        return Shard(code)
    if code == -1:
        return Replicate()
    return Partial(_REDUCE_OPS[-2 - code])


def _encode(tensors, meta):
    out = [*meta, len(tensors)]
    for t in tensors:
        if t is None:
            out.append(_NONE)
            continue
        if t.dtype not in _DTYPES:
            raise NotImplementedError(f"pipeline transfer of a {t.dtype} tensor")
        is_dt = _C.is_dtensor(t)
        out += [_DTENSOR if is_dt else _PLAIN, _DTYPES.index(t.dtype), int(t.requires_grad),
                t.dim(), *t.shape]
        if is_dt:
            mesh = t.device_mesh
            out += [len(t.placements), *(_placement_code(p) for p in t.placements),
                    *mesh.shape, *mesh.mesh.reshape(-1).tolist()]
    if len(out) > _HEADER:
        raise NotImplementedError(f"pipeline transfer: {len(tensors)} tensors do not fit the "
                                  f"{_HEADER}-int header")
    return torch.tensor(out + [0] * (_HEADER - len(out)), dtype=torch.int64)


def _decode(header):
    """(meta, specs): the sender's (stage, microbatch, microbatch count) and per tensor None or
    (dtype, requires_grad, shape, placements, mesh ranks)."""
    h = header.tolist()
    meta, n, at, out = tuple(h[:3]), h[3], 4, []
    for _ in range(n):
        kind = h[at]
        at += 1
        if kind == _NONE:
            out.append(None)
            continue
        dtype, requires_grad, ndim = _DTYPES[h[at]], bool(h[at + 1]), h[at + 2]
        shape = h[at + 3:at + 3 + ndim]
        at += 3 + ndim
        placements = mesh = None
        if kind == _DTENSOR:
            k = h[at]
            placements = [_placement_of(c) for c in h[at + 1:at + 1 + k]]
            mesh_shape = h[at + 1 + k:at + 1 + 2 * k]
            size = 1
            for m in mesh_shape:
                size *= m
            ranks = h[at + 1 + 2 * k:at + 1 + 2 * k + size]
            mesh = torch.tensor(ranks, dtype=torch.long).reshape(mesh_shape)
            at += 1 + 2 * k + size
        out.append((dtype, requires_grad, shape, placements, mesh))
    return meta, out


def _shifted(mesh, delta, device_type):
    """The mesh of ranks ``mesh`` (a DeviceMesh or a rank tensor) moved by ``delta``: the same
    mesh on another stage (no dim names: they do not change which elements move where)."""
    ranks = mesh.mesh if isinstance(mesh, DeviceMesh) else mesh
    return DeviceMesh(device_type, ranks + delta)


def _contiguous_stride(shape):
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(s, 1)
    return list(reversed(stride))


def _move(x, mesh, placements, async_op, channel):
    return _C.redistribute_to_mesh(x, mesh._mesh, list(placements), async_op, channel)


def send(tensors, peer, device_type, channel, meta):
    """Sends ``tensors`` to the stage of ``peer`` (this rank's counterpart there; the stages'
    ranks differ by the same offset). Returns at once, with the results of the exchanges, which
    complete when the peer receives (their to_local() waits), and the bytes this rank sends
    (its local pieces and the header). ``meta``: (this stage, the microbatch, the microbatch
    count), checked by the receiver."""
    me = _C.rank()
    header = _encode(tensors, meta).to(device_type)  # on the device: NCCL moves no host memory
    pending = [_pair_send(header, me, peer, channel + "/header")]
    nbytes = header.numel() * header.element_size()
    for t in tensors:
        if t is None:
            continue
        t = t.detach()
        local = t.to_local() if _C.is_dtensor(t) else t
        nbytes += local.numel() * local.element_size()
        if _C.is_dtensor(t):
            target = [Replicate() if p.is_partial() else p for p in t.placements]
            pending.append(_move(t, _shifted(t.device_mesh, peer - me, device_type), target, True,
                                 channel))
        else:
            pending.append(_pair_send(t.contiguous().reshape(-1), me, peer, channel))
    return pending, nbytes


def wait(pending):
    """Waits for what send returned (the peers received it)."""
    for t in pending:
        if _C.is_dtensor(t):
            t.to_local()
        else:
            fc.wait_tensor(t)


# A plain tensor (and every header) goes from one rank to its peer as a bare all_to_all_single
# on the pair's group of the channel (registered with this rank's context on first use; later
# calls find it).
def _pair_group(a, b, channel):
    return fc.context().new_group([min(a, b), max(a, b)], channel)


def _pair_send(flat, me, peer, channel):
    sizes = [0, flat.numel()] if me < peer else [flat.numel(), 0]
    return fc.all_to_all_single(flat, [0, 0], sizes, group=_pair_group(me, peer, channel),
                                async_op=True)


def _pair_recv(numel, dtype, device_type, me, peer, channel):
    sizes = [numel, 0] if peer < me else [0, numel]
    out = fc.all_to_all_single(torch.empty(0, dtype=dtype, device=device_type), sizes, [0, 0],
                               group=_pair_group(me, peer, channel))
    return fc.wait_tensor(out)


def recv(peer, meshes_here, device_type, channel):
    """Receives what ``send`` sent from ``peer`` (this rank's counterpart on the sending stage).
    Distributed tensors arrive on the one of ``meshes_here`` (this stage's parameters' meshes,
    with their dim names) that is the sending mesh moved to this stage, else on that moved mesh.
    Returns the sender's meta (see send) and a list of tensors (None where the sender sent None);
    each that required grad on the sender is a leaf that requires grad here."""
    me = _C.rank()
    header = _pair_recv(_HEADER, torch.int64, device_type, me, peer, channel + "/header")
    meta, specs = _decode(header.cpu())
    out = []
    for spec in specs:
        if spec is None:
            out.append(None)
            continue
        dtype, requires_grad, shape, placements, ranks = spec
        stride = tuple(_contiguous_stride(shape))
        if placements is not None:
            there = DeviceMesh(device_type, ranks)
            here = _shifted(ranks, me - peer, device_type)
            for m in meshes_here:
                if m.shape == here.shape and torch.equal(m.mesh, here.mesh):
                    here = m
                    break
            absent = DTensor.from_local(torch.empty(0, dtype=dtype), there, placements,
                                        shape=tuple(shape), stride=stride)
            target = [Replicate() if p.is_partial() else p for p in placements]
            t = _move(absent, here, target, False, channel)
        else:
            numel = 1
            for n in shape:
                numel *= n
            t = _pair_recv(numel, dtype, device_type, me, peer, channel).view(shape)
        out.append(t.requires_grad_() if requires_grad else t)
    return meta, out
