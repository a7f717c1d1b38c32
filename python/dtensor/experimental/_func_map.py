"""torch.distributed.tensor.experimental's ``local_map`` (PyTorch keeps it in
experimental/_func_map.py)."""

import functools

import torch

from dtensor._api import DTensor
from dtensor.device_mesh import _current_mesh_or
from dtensor.placement_types import Placement

__all__ = ["local_map"]


def _is_placements(p):
    return isinstance(p, (tuple, list)) and all(isinstance(x, Placement) for x in p)


def local_map(func=None, out_placements=None, in_placements=None, in_grad_placements=None,
              device_mesh=None, *, redistribute_inputs=False):
    """PyTorch's ``local_map``: returns a function that calls ``func`` on this rank's pieces of
    its distributed arguments (plain arguments pass as they are) and wraps each tensor output
    with ``out_placements`` (one placements tuple per output, ``None`` for a non-tensor output)
    on the arguments' mesh, with no check and no communication: ``func`` must compute exactly
    the piece those placements give this rank. ``in_placements`` (one per positional argument,
    ``None`` for plain ones): a distributed argument in other placements raises ValueError, or
    is redistributed when ``redistribute_inputs``. Without distributed arguments ``func`` runs
    on the plain ones and its result is returned as it is. Differentiable (to_local/from_local):
    ``in_grad_placements`` (one per positional argument, ``None`` for plain ones or to keep the
    argument's placements) gives the placements of each distributed argument's gradient, as
    ``to_local(grad_placements=...)``. Without ``func`` it is a decorator:
    ``@local_map(out_placements=..., ...)``.
    """
    if func is None:
        return functools.partial(local_map, out_placements=out_placements,
                                 in_placements=in_placements,
                                 in_grad_placements=in_grad_placements, device_mesh=device_mesh,
                                 redistribute_inputs=redistribute_inputs)

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        if in_placements is not None and len(in_placements) != len(args):
            raise ValueError(f"local_map: {len(in_placements)} in_placements for "
                             f"{len(args)} arguments")
        if in_grad_placements is not None and len(in_grad_placements) != len(args):
            raise ValueError(f"local_map: {len(in_grad_placements)} in_grad_placements for "
                             f"{len(args)} arguments")
        mesh, local_args, seen = device_mesh, [], False
        for i, arg in enumerate(args):
            if isinstance(arg, DTensor):
                seen = True
                if mesh is None:
                    mesh = arg.device_mesh
                elif arg.device_mesh != mesh:
                    raise ValueError(f"local_map: argument {i} lives on {arg.device_mesh}, "
                                     f"not on {mesh}")
                want = None if in_placements is None else in_placements[i]
                if want is not None and tuple(want) != tuple(arg.placements):
                    if not redistribute_inputs:
                        raise ValueError(
                            f"local_map: argument {i} has placements {tuple(arg.placements)} "
                            f"but in_placements wants {tuple(want)}; set "
                            f"redistribute_inputs=True to move it")
                    arg = arg.redistribute(mesh, want)
                grad = None if in_grad_placements is None else in_grad_placements[i]
                local_args.append(arg.to_local(grad_placements=grad))
            else:
                if in_placements is not None and in_placements[i] is not None and \
                        isinstance(arg, torch.Tensor):
                    raise ValueError(f"local_map: argument {i} is a plain tensor but "
                                     f"in_placements gives it {in_placements[i]}")
                local_args.append(arg)
        out = func(*local_args, **kwargs)
        if not seen:
            return out
        if out_placements is None:  # PyTorch's: the outputs as func returned them
            return out
        mesh = _current_mesh_or(mesh, "local_map")
        single = _is_placements(out_placements)
        outs = (out,) if single else tuple(out) if isinstance(out, (tuple, list)) else (out,)
        specs = (out_placements,) if single else tuple(out_placements)
        if len(specs) != len(outs):
            raise ValueError(f"local_map: {len(specs)} out_placements for {len(outs)} outputs")
        wrapped_outs = []
        for o, spec in zip(outs, specs):
            if isinstance(o, torch.Tensor) and spec is not None:
                wrapped_outs.append(DTensor.from_local(o, mesh, spec, run_check=False))
            elif spec is not None:
                raise ValueError(f"local_map: output {o!r} is not a tensor but has "
                                 f"out_placements {spec}")
            else:
                wrapped_outs.append(o)
        if single:
            return wrapped_outs[0]
        return type(out)(wrapped_outs) if isinstance(out, (tuple, list)) else wrapped_outs[0]

    return wrapped
