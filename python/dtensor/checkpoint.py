"""dtensor.checkpoint: torch.distributed.checkpoint's save and load over the C++ checkpoints
(checkpoint/checkpoint.h, NOTE [checkpoint format]).

    state = {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": 3}
    dtensor.checkpoint.save(state, checkpoint_id="/ckpt/step3")   # every rank calls it
    dtensor.checkpoint.load(state, checkpoint_id="/ckpt/step3")   # fills `state` in place
    model.load_state_dict(state["model"])                         # as with DCP (a no-op copy)

The checkpoint is a directory of safetensors files plus `model.safetensors.index.json`; it loads
into distributed tensors of any other mesh, placements or number of ranks, or into plain tensors
in one process.

NOTE [state dict flattening] (as DCP's flatten_state_dict): nested dicts are flattened to dotted
keys, `{"model": {"w1.weight": t}, "optim": {"state": {0: {"exp_avg": t}}}}` to `model.w1.weight`
and `optim.state.0.exp_avg` (keys are joined with str(), so int keys become digits). A list or
tuple that holds a tensor (at any depth) is flattened too, by index (`lst.0`, `lst.1`); one that
holds none is a single value saved as JSON (`optim.param_groups` of an optimizer is one JSON
value). Leaves: tensors (distributed or plain), ints, floats and strs map to the C++ value kinds;
every other leaf (bool, None, a list of numbers, a dict inside such a list) goes as JSON and must
be JSON-serializable. On load, JSON values take back the tuples and int dict keys of the value
they replace (JSON has neither). Two paths flattening to the same key are an error.

NOTE [optimizer state]: an optimizer's state is empty until its first step, so a fresh optimizer
has no tensors for load to fill: create them first (a step with zero gradients leaves Adam's
parameters unchanged; load overwrites the state). Load fills the optimizer's own state tensors
(optimizer.state_dict() hands out the same tensors), but `param_groups` (learning rates) is
replaced only in the given dict: call optimizer.load_state_dict(state["optim"]) afterwards, as
with DCP (it deep-copies the distributed state: Tensor.__deepcopy__, dtensor/__init__.py).
"""

import json
import math
import os

import torch

from dtensor import _C

__all__ = ["load", "save"]


def save(state_dict, *, checkpoint_id):
    """Saves ``state_dict`` (nested, NOTE [state dict flattening]) into directory
    ``checkpoint_id``, replacing a previous checkpoint there atomically. Every rank calls it with
    the same keys, kinds and layouts; plain tensors are taken from rank 0."""
    flat = {key: value for key, (value, _, _, _) in _flatten(state_dict).items()}
    _C.checkpoint_save(flat, os.fspath(checkpoint_id))


def load(state_dict, *, checkpoint_id, verify_checksums=True):
    """Loads the checkpoint in directory ``checkpoint_id`` into ``state_dict`` in place, as
    torch.distributed.checkpoint.load does: each tensor is copied into (a distributed tensor
    receives its local piece, so module parameters keep their identity), each non-tensor leaf is
    replaced in its container. Keys must match the checkpoint's exactly; a missing or unexpected
    key, or a shape or dtype mismatch, raises RuntimeError naming the key."""
    leaves = _flatten(state_dict)
    flat = {key: value for key, (value, _, _, _) in leaves.items()}
    values = _C.checkpoint_load(flat, os.fspath(checkpoint_id), verify_checksums)
    for key, new in values.items():
        _, old, container, slot = leaves[key]
        if isinstance(new, _C.CheckpointJson):
            new = _like(old, json.loads(new.text))
        if isinstance(container, tuple):
            # NOTE [tuples on load]: a tuple cannot be written into; its non-tensor members are
            # kept (they must equal the saved ones, or the load would silently differ).
            if new != old:
                raise RuntimeError(f"checkpoint.load: key '{key}' lies in a tuple, which cannot "
                                   f"be replaced in place ({old!r} saved as {new!r})")
            continue
        container[slot] = new


def _holds_tensor(obj):
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, dict):
        return any(_holds_tensor(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_holds_tensor(v) for v in obj)
    return False


def _flatten(state_dict):
    """{dotted key: (leaf for _C, value, container, slot)}: the leaf as the C++ value kinds take
    it, the value itself, and where it lives, so load can replace it."""
    out = {}

    def leaf(key, value):
        if isinstance(value, torch.Tensor):
            return value
        # bool is an int in Python: JSON keeps it a bool. Non-finite floats are not JSON (and the
        # C++ side refuses them as doubles): they are an error there, naming the key.
        if isinstance(value, (int, str)) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and math.isfinite(value):
            return value
        try:
            return _C.CheckpointJson(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError) as e:
            raise TypeError(f"checkpoint: value of key '{key}' ({type(value).__name__}) is not a "
                            f"tensor, int, float, str or JSON-serializable: {e}") from None

    def walk(prefix, container, slot, value):
        if isinstance(value, dict) or (isinstance(value, (list, tuple)) and _holds_tensor(value)):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for k, v in items:
                walk(f"{prefix}.{k}" if prefix else str(k), value, k, v)
            return
        if prefix in out:
            raise ValueError(f"checkpoint: two entries of the state dict flatten to key '{prefix}'")
        out[prefix] = (leaf(prefix, value), value, container, slot)

    if not isinstance(state_dict, dict):
        raise TypeError(
            f"checkpoint: the state dict must be a dict, not {type(state_dict).__name__}")
    walk("", None, None, state_dict)
    return out


def _like(old, new):
    """The JSON-decoded ``new`` with the tuples and non-str dict keys of ``old``, the value it
    replaces (where the structures agree)."""
    if isinstance(old, (list, tuple)) and isinstance(new, list) and len(old) == len(new):
        items = [_like(o, n) for o, n in zip(old, new)]
        return tuple(items) if isinstance(old, tuple) else items
    if isinstance(old, dict) and isinstance(new, dict):
        keys = {str(k): k for k in old}
        return {keys.get(k, k): _like(old.get(keys.get(k, k)), v) for k, v in new.items()}
    return new
