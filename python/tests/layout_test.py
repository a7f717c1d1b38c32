"""The layout core against torch itself: torch.chunk on real tensors is the oracle."""

import itertools

import pytest
import torch

from dtensor import _C


@pytest.mark.parametrize("n", range(0, 14))
@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
def test_chunk_sizes_match_torch_chunk(n, k):
    pieces = torch.arange(n).chunk(k) if n > 0 else []
    expected = [p.numel() for p in pieces] + [0] * (k - len(pieces))
    assert _C.chunk_sizes(n, k) == expected


def _torch_local(global_t, mesh_shape, placements, coord):
    """Left-to-right repeated torch.chunk: what PyTorch DTensor gives each rank."""
    t = global_t
    for mesh_dim, p in enumerate(placements):
        if p.is_shard():
            pieces = t.chunk(mesh_shape[mesh_dim], p.dim)
            i = coord[mesh_dim]
            t = pieces[i] if i < len(pieces) else t.narrow(p.dim, t.size(p.dim), 0)
    return t


@pytest.mark.parametrize("mesh_shape", [(4,), (2, 2), (2, 3)])
@pytest.mark.parametrize("shape", [(1,), (5,), (13,), (3, 2), (5, 7)])
def test_local_boxes_match_torch_chunk(mesh_shape, shape):
    mesh = _C.DeviceMesh.arange(list(mesh_shape))
    options = ["R", "P(sum)"] + [f"S({d})" for d in range(len(shape))]
    g = torch.arange(torch.Size(shape).numel()).reshape(shape)
    for combo in itertools.product(options, repeat=len(mesh_shape)):
        text = ",".join(combo)
        placements = _C.parse_placements(text)
        for coord in itertools.product(*[range(s) for s in mesh_shape]):
            box = _C.local_box(mesh, text, list(shape), list(coord))
            got = g
            for d, (o, s) in enumerate(zip(box.offset, box.shape)):
                got = got.narrow(d, o, s)
            expected = _torch_local(g, mesh_shape, placements, coord)
            assert torch.equal(got, expected), (text, shape, coord)


def test_parse_errors_name_the_token():
    with pytest.raises(RuntimeError, match="'Q\\(1\\)'"):
        _C.parse_placements("S(0),Q(1)")


def test_mesh_errors_are_runtime_errors():
    # NOTE [error convention]: engine errors reach Python as RuntimeError.
    with pytest.raises(RuntimeError, match="holds 4 ranks but 3 were given"):
        _C.DeviceMesh([2, 2], [0, 1, 2])
    mesh = _C.DeviceMesh.arange([2, 2], ["dp", "tp"])
    assert mesh.coordinate(3) == [1, 1]
    assert mesh.coordinate(9) is None
    assert mesh.submesh(["tp"], 2).ranks == [2, 3]


def test_owner_ranks_inverts_local_box():
    mesh = _C.DeviceMesh.arange([2, 2])
    assert _C.owner_ranks(mesh, "S(0),R", [4, 4], [3, 0]) == [2, 3]
    assert "r0" in _C.visualize_sharding(mesh, "S(0),S(1)", [10, 7])
