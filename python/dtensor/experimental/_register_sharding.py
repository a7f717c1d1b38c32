"""``register_sharding``: PyTorch's strategy lists for an op, turned into the engine's rule.

NOTE [register_sharding]: PyTorch's ``@register_sharding(op)`` function receives the op's
arguments (distributed tensors as specs with ``shape``, ``ndim``, ``dtype``) and returns the
acceptable shardings, each ``(output placements, input placements)`` with one placement per
tensor (``None`` for a non-tensor argument); on an N-D mesh each mesh dim picks one of them, and
the choice minimises the cost of redistributing the inputs (the engine adds the op's compute on
each rank's piece, NOTE [compute in the cost model]). The engine's rules say the same in
factors (NOTE [sharding rules as factors]): each strategy that shards something becomes one
factor carried by the dims it shards (a Partial output makes it a contraction with that reduce
op); a dim no strategy shards gets a factor that is never sharded. The engine's one cost model
then chooses per mesh dim among "replicate" and these factors, as for any op. The function runs
on a propagation cache miss (never per call), with the op's int and bool arguments (other
non-tensor arguments arrive as their defaults, or None); the outputs' shapes and dtypes come
from the op's Meta kernel. Not expressible, and refused with an error naming the op: a Partial
input, two strategies sharding one dim, inputs sharded into a replicated output, outputs
sharded (or Partial) from replicated inputs. Ops with a built-in rule keep it (register_sharding
refuses them); custom ops (``torch.library``) and ATen ops that run by the replicate fallback
can be registered.
"""

import torch

from dtensor import _C
from dtensor.placement_types import Partial, Replicate, Shard


class _Spec:
    """A distributed tensor argument as the function sees it (PyTorch passes a DTensorSpec)."""

    def __init__(self, shape, dtype):
        self.shape = torch.Size(shape)
        self.ndim = len(shape)
        self.dtype = dtype

    def dim(self):
        return self.ndim

    def __repr__(self):
        return f"_Spec(shape={list(self.shape)}, dtype={self.dtype})"


def _op_name(op):
    schema = op._schema
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


def _is_int_like(t):
    return isinstance(t, (torch.IntType, torch.BoolType))


def _overloads(op):
    if isinstance(op, torch._ops.OpOverload):
        return [op]
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    raise TypeError(f"register_sharding: expected an op (torch.ops.ns.name[.overload]), got "
                    f"{op!r}")


def _normalize(placements, count, what, name):
    if placements is None or isinstance(placements, (Shard, Replicate, Partial)):
        placements = [placements]
    placements = list(placements)
    if len(placements) != count:
        raise ValueError(f"register_sharding: {name}: a strategy gives {len(placements)} {what} "
                         f"placements, the op has {count}")
    return placements


class _Translator:
    """Builds (factors, inputs, outputs, out_dtypes) for one call's metadata."""

    def __init__(self, name, op, fn, schema):
        self.name, self.op, self.fn, self.schema = name, op, fn, schema

    def __call__(self, shapes, dtypes, ints):
        args, metas, tensor_args = self._arguments(shapes, dtypes, ints)
        # The Meta kernel alone (custom ops may have no autograd kernel for the Meta key).
        below_autograd = torch._C._AutoDispatchBelowAutograd()
        try:
            outs = self.op(*metas)
        finally:
            del below_autograd
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        strategies = self.fn(*args)
        factors = []
        inputs = [[None] * len(s) for s in shapes]
        outputs = [[None] * o.dim() for o in outs]
        n_args = len(self.schema.arguments)
        for out_pl, in_pl in strategies:
            out_pl = _normalize(out_pl, len(outs), "output", self.name)
            in_pl = _normalize(in_pl, n_args, "input", self.name)
            in_pl = [in_pl[i] for i in tensor_args]
            self._add_strategy(factors, inputs, outputs, shapes, outs, out_pl, in_pl)
        for tensor, shape in list(zip(inputs, shapes)) + list(zip(outputs,
                                                                   [o.shape for o in outs])):
            for d, f in enumerate(tensor):
                if f is None and shape[d] != 1:
                    tensor[d] = len(factors)
                    factors.append((shape[d], "replicate", "sum"))
        as_lists = [[[] if f is None else [f] for f in t] for t in inputs]
        out_lists = [[[] if f is None else [f] for f in t] for t in outputs]
        return factors, as_lists, out_lists, [o.dtype for o in outs]

    def _arguments(self, shapes, dtypes, ints):
        args, metas, tensor_args = [], [], []
        shapes, dtypes, ints = list(shapes), list(dtypes), list(ints)
        for i, a in enumerate(self.schema.arguments):
            if isinstance(a.type, torch.TensorType):
                shape, dtype = shapes.pop(0), dtypes.pop(0)
                tensor_args.append(i)
                args.append(_Spec(shape, dtype))
                metas.append(torch.empty(shape, dtype=dtype, device="meta"))
            elif _is_int_like(a.type):
                v = ints.pop(0)
                v = bool(v) if isinstance(a.type, torch.BoolType) else v
                args.append(v)
                metas.append(v)
            else:
                v = a.default_value if a.has_default_value() else None
                args.append(v)
                metas.append(v)
        return args, metas, tensor_args

    def _add_strategy(self, factors, inputs, outputs, shapes, outs, out_pl, in_pl):
        if all(p is None or isinstance(p, Replicate) for p in out_pl + in_pl):
            return  # all-replicate: always a candidate
        if any(isinstance(p, Partial) for p in in_pl):
            raise NotImplementedError(f"register_sharding: {self.name}: a strategy with a "
                                      f"Partial input ({in_pl}) is not supported")
        f = len(factors)
        size, kind, reduce = None, "pass", "sum"
        sharded_input = False

        def claim(tensor, dims, d, what):
            nonlocal size
            d = d % len(dims)
            if dims[d] is not None:
                raise NotImplementedError(
                    f"register_sharding: {self.name}: two strategies shard {what} dim {d}; the "
                    f"engine's rules shard a dim one way")
            dims[d] = f
            size = tensor[d] if size is None else size
            if tensor[d] != size:
                raise ValueError(f"register_sharding: {self.name}: a strategy shards dims of "
                                 f"sizes {size} and {tensor[d]} together")

        for j, p in enumerate(in_pl):
            if isinstance(p, Shard):
                claim(shapes[j], inputs[j], p.dim, f"input {j}'s")
                sharded_input = True
        if not sharded_input:
            raise NotImplementedError(
                f"register_sharding: {self.name}: a strategy ({out_pl}, {in_pl}) shards outputs "
                f"of replicated inputs; the op run on whole inputs gives whole outputs")
        for k, p in enumerate(out_pl):
            if isinstance(p, Shard):
                claim(list(outs[k].shape), outputs[k], p.dim, f"output {k}'s")
            elif isinstance(p, Partial):
                kind, reduce = "contract", p.reduce_op
            elif sharded_input:
                raise NotImplementedError(
                    f"register_sharding: {self.name}: a strategy shards inputs ({in_pl}) into a "
                    f"replicated output; only Shard or Partial outputs follow sharded inputs")
        factors.append((size, kind, reduce))


def register_sharding(op):
    """PyTorch's ``torch.distributed.tensor.experimental.register_sharding``: decorates a
    function that returns the acceptable shardings of ``op`` (NOTE [register_sharding])."""

    def decorate(fn):
        for ov in _overloads(op):
            schema = ov._schema
            for a in schema.arguments:
                t = a.type
                if isinstance(t, torch.TensorType) or _is_int_like(t) or not _tensorish(t):
                    continue
                raise NotImplementedError(f"register_sharding: {_op_name(ov)}: argument "
                                          f"{a.name} of type {t} (tensor lists or optional "
                                          f"tensors) is not supported")
            int_args = [a.name for a in schema.arguments if _is_int_like(a.type)]
            name = _op_name(ov)
            _C.register_sharding(name, int_args, _Translator(name, ov, fn, schema))
        return fn

    return decorate


def _tensorish(t):
    return "Tensor" in str(t)
