"""Splitting a batch into microbatches and merging the outputs back (PyTorch's
torch.distributed.pipelining.microbatch names)."""

import torch


def _split(x, chunks, dim=0):
    if isinstance(x, torch.Tensor):
        if x.size(dim) < chunks:
            raise ValueError(f"a batch dim of size {x.size(dim)} cannot make {chunks} microbatches")
        return list(torch.tensor_split(x, chunks, dim))
    return [x] * chunks


def split_args_kwargs_into_chunks(args, kwargs, chunks, args_chunk_spec=None,
                                  kwargs_chunk_spec=None):
    """``args`` and ``kwargs`` cut into ``chunks`` microbatches along dim 0 (tensors; anything
    else is passed to every microbatch as it is): a list of args tuples and a list of kwargs
    dicts, as PyTorch's."""
    if args_chunk_spec is not None or kwargs_chunk_spec is not None:
        raise NotImplementedError("chunk specs other than dim 0")
    kwargs = kwargs or {}
    per_arg = [_split(a, chunks) for a in args]
    per_kw = {k: _split(v, chunks) for k, v in kwargs.items()}
    args_split = [tuple(a[i] for a in per_arg) for i in range(chunks)]
    kwargs_split = [{k: v[i] for k, v in per_kw.items()} for i in range(chunks)]
    return args_split, kwargs_split


def merge_chunks(chunks, chunk_spec=None):
    """The microbatches' outputs concatenated along dim 0 (tuples element by element)."""
    if chunk_spec is not None:
        raise NotImplementedError("chunk specs other than dim 0")
    first = chunks[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(chunks, 0) if first.dim() > 0 else torch.stack(chunks)
    if isinstance(first, (tuple, list)):
        return type(first)(merge_chunks([c[i] for c in chunks]) for i in range(len(first)))
    return first
