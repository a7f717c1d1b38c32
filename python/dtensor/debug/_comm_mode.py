"""CommDebugMode: PyTorch's collective counter, with its per-module view and tracing tables.

NOTE [comm debug mode]: the engine counts every collective it issues on this rank
(``collectives::CommCounter``, with the ATen op that caused it). This class adds PyTorch's
module view on top, without seeing each collective from Python: a global forward pre-hook, a
forward hook on each module seen (after its parallel style's hooks) and, for backward, a gradient hook on each module's outputs mark where a module's
work starts; at every such mark the collectives counted since the previous mark are charged to
the module running then (forward: the innermost module; backward: the module whose output
gradient arrived last) and to its parents, "Global" included. Operations on distributed tensors
are recorded at the torch-function level (``torch.mm``, ``torch.Tensor.add``; forward only:
backward runs in C++), with their inputs' shapes, placements and mesh.
"""

import contextlib
import copy
import json
import re
import threading
import weakref

import torch
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode, resolve_name
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dtensor import _C

# The engine's collective kinds under the names PyTorch's CommDebugMode reports.
_NAMES = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter_tensor",
    "all_to_all": "all_to_all_single",
    "broadcast": "broadcast",
    "barrier": "barrier",
    "scatter": "scatter",  # distribute_tensor's (an all_to_all_single from the source rank)
}

# Ops that only change a tensor's view or dtype, or read its metadata (PyTorch's "trivial ops",
# at this level): listed at noise level 3 only.
_TRIVIAL = {
    "torch.Tensor.detach", "torch.Tensor.t", "torch.Tensor.view", "torch.Tensor.to",
    "torch.Tensor.transpose", "torch.t", "torch.transpose", "torch.Tensor.contiguous",
    "torch.Tensor.dim", "torch.Tensor.size", "torch.Tensor.stride", "torch.Tensor.numel",
    "torch.Tensor.requires_grad_", "torch.Tensor.register_hook",
}


# NOTE [collective count keys]: PyTorch's CommDebugMode keys its counts by the functional
# collective ops (torch.ops.c10d_functional.all_reduce and friends; tests also look up the
# _c10d_functional and c10d ops, and the Python functions of
# torch.distributed._functional_collectives). The engine's counts are keyed by name; a
# _CommCounts answers a lookup by any of those keys through the op's name, and, like PyTorch's
# defaultdict, gives 0 for a collective that did not run. Iteration and equality with a dict of
# names stay as before.
_OP_NAMESPACES = ("c10d_functional", "_c10d_functional", "c10d")
_C10D_NAMES = {"allreduce_": "all_reduce", "_allgather_base_": "all_gather_into_tensor",
               "allgather_into_tensor_coalesced_": "all_gather_into_tensor",
               "_reduce_scatter_base_": "reduce_scatter_tensor", "alltoall_base_":
               "all_to_all_single"}
_PY_MODULES = ("torch.distributed._functional_collectives", "dtensor._functional_collectives")


def _key_name(key):
    """The collective name a count key stands for (None when it names no collective)."""
    if isinstance(key, str):
        return key
    packet = getattr(key, "overloadpacket", None) or key  # an OpOverload's packet
    qualified = getattr(packet, "_qualified_op_name", None)
    if isinstance(qualified, str) and "::" in qualified:
        namespace, name = qualified.split("::", 1)
        if namespace == "c10d":  # the in-place c10d ops (c10d.scatter_, c10d.allreduce_, ...)
            return _C10D_NAMES.get(name, name.rstrip("_"))
        return name if namespace in _OP_NAMESPACES else None
    if callable(key) and getattr(key, "__module__", None) in _PY_MODULES:
        return getattr(key, "__name__", None)
    return None


class _CommCounts(dict):
    """Collective counts by name, looked up by name or by the op PyTorch keys them by."""

    def __getitem__(self, key):
        name = _key_name(key)
        if name is None:
            raise KeyError(key)
        return dict.get(self, name, 0)

    def get(self, key, default=None):
        name = _key_name(key)
        return default if name is None else dict.get(self, name, default)

    def __contains__(self, key):
        name = _key_name(key)
        return name is not None and dict.__contains__(self, name)

    def __eq__(self, other):
        if isinstance(other, dict) and not isinstance(other, _CommCounts):
            normalized = {}
            for k, v in other.items():
                name = _key_name(k)
                if name is None:
                    return False
                normalized[name] = normalized.get(name, 0) + v
            other = normalized
        return dict.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = None


def _phases():
    """One module's counts: {"forward": counts, "backward": counts}, each looked up and compared
    as get_comm_counts() is (PyTorch's tests compare them with dicts keyed by its ops)."""
    return {"forward": _CommCounts(), "backward": _CommCounts()}


def _is_dtensor(t):
    return isinstance(t, torch.Tensor) and _C.is_dtensor(t)


class _OpRecorder(TorchFunctionMode):
    def __init__(self, owner):
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.owner._record_op(func, args, kwargs)
        return func(*args, **kwargs)


# NOTE [torch's own collectives in CommDebugMode]: PyTorch's CommDebugMode also counts the
# collectives torch.distributed and its functional collectives issue on plain tensors. Those on
# a mesh's group run on the engine (NOTE [mesh groups as torch process groups]) and its counter
# records them; those on a group of another backend (Gloo, NCCL from init_process_group or
# new_group) never reach the engine, so a dispatch mode sees their ops and records them in the
# same counter, under the kind the engine would have given them.
_TORCH_OP_KINDS = {
    "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce", "all_reduce_coalesced_": "all_reduce",
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor_out": "all_gather", "allgather_": "all_gather",
    "_allgather_base_": "all_gather", "allgather_coalesced_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "all_to_all_single": "all_to_all", "alltoall_base_": "all_to_all", "alltoall_": "all_to_all",
    "broadcast": "broadcast", "broadcast_": "broadcast", "scatter_": "scatter",
}
_TORCH_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd")


def _torch_op_group(args):
    """The group name of a torch collective op's arguments: a functional op's last string, or
    a c10d op's ProcessGroup's name ("" when neither is there)."""
    for a in reversed(args):
        if isinstance(a, str):
            return a
        if isinstance(a, torch.ScriptObject):
            try:
                return torch._C._distributed_c10d.ProcessGroup.unbox(a).group_name
            except (RuntimeError, AttributeError):
                continue
    return ""


class _TorchCollectives(TorchDispatchMode):
    """Records torch's own collective ops on non-engine groups into the owner's counter."""

    def __init__(self, owner):
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        namespace = getattr(func, "namespace", None)
        if namespace in _TORCH_NAMESPACES:
            kind = _TORCH_OP_KINDS.get(func.overloadpacket.__name__)
            counter = self.owner._counter
            group = _torch_op_group(list(args) + list(kwargs.values()))
            if kind is not None and counter is not None and not group.startswith("dtensor:"):
                label = "scatter" if kind == "scatter" else _NAMES.get(kind, kind)
                counter.record("all_to_all" if kind == "scatter" else kind, label, group,
                               torch._C._current_graph_task_id() != -1)
        return func(*args, **kwargs)


class _ModuleTracker:
    """What PyTorch's ``CommDebugMode.advanced_module_tracker`` exposes, read live from its
    CommDebugMode: per-module dicts keyed by fully-qualified name ("Global" included)."""

    def __init__(self, owner):
        self._owner = owner

    @property
    def module_helper_dict(self):
        """{fqn: {"module_type", "depth", "parameters"}} of the modules seen."""
        return self._owner._info

    @property
    def module_parameters_dict(self):
        return self._owner._params

    @property
    def sharding_dict(self):
        return self._owner._sharding

    @property
    def parent_dict(self):
        """{fqn: its innermost running parent's fqn} ("Global" for a root)."""
        return {fqn: parents[-1] for fqn, parents in self._owner._parents.items() if parents}

    @property
    def name(self):
        return self._owner._current()[0]


class CommDebugMode:
    """Counts the collectives this rank issues inside ``with CommDebugMode() as m:``.

    PyTorch's API: ``get_total_counts()``; ``get_comm_counts()`` (and ``comm_counts``) keyed by
    collective name (``"all_reduce"``, ``"all_gather_into_tensor"``, ``"reduce_scatter_tensor"``,
    ``"all_to_all_single"``), also looked up by PyTorch's keys
    (``torch.ops.c10d_functional.all_reduce``, NOTE [collective count keys]);
    ``comm_module_counts`` (``{fqn: {"forward": {name: n},
    "backward": {...}}}``, "Global" and every parent included); ``get_parameter_info()``
    (``{module fqn: {param name: tensor}}``); ``get_sharding_info()`` (``{"fqn.param":
    placements}``); ``generate_comm_debug_tracing_table(noise_level=3)``,
    ``log_comm_debug_tracing_table_to_file(file_name, noise_level)`` and
    ``generate_json_dump(file_name, noise_level)``. Extension: ``get_comm_counts_by_op()``, keyed
    by (ATen op that caused it, name). See NOTE [comm debug mode].
    """

    def __init__(self):
        self._counter = None
        self._result = None
        self.comm_module_counts = {}
        self._reset_tracking()

    # ---- counting ---------------------------------------------------------------------------

    def __enter__(self):
        self._counter = _C.CommCounter()
        self._result = None
        self._reset_tracking()
        self._thread = threading.get_ident()
        self._handles = [register_module_forward_pre_hook(self._pre_hook)]
        self._recorder = _OpRecorder(self)
        self._recorder.__enter__()
        self._torch_collectives = _TorchCollectives(self)
        self._torch_collectives.__enter__()
        return self

    def __exit__(self, *exc):
        self._torch_collectives.__exit__(*exc)
        self._recorder.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._flush()
        # Stop counting: later collectives belong to no block.
        self._result = self._snapshot()
        self._counter = None
        return False

    def _snapshot(self):
        c = self._counter
        if c is None:
            if self._result is None:
                raise RuntimeError("CommDebugMode: use it as a context manager first")
            return self._result
        return {
            "total": c.total(),
            "kinds": self._kinds(),
            "by_op": dict(c.counts_by_cause()),
            "text": str(c),
        }

    def _kinds(self):
        return {_NAMES.get(k, k): n for k, n in self._counter.kinds().items()}

    def get_total_counts(self):
        return self._snapshot()["total"]

    def get_comm_counts(self):
        """Counts by collective name; also looked up by PyTorch's keys
        (``torch.ops.c10d_functional.all_reduce``, ``funcol.all_reduce``): NOTE [collective
        count keys]."""
        return _CommCounts(self._snapshot()["kinds"])

    @property
    def comm_counts(self):
        """PyTorch's attribute: the counts so far, as ``get_comm_counts()`` (empty before the
        first ``with``)."""
        if self._counter is None and self._result is None:
            return _CommCounts()
        return self.get_comm_counts()

    def get_comm_counts_by_op(self):
        return dict(self._snapshot()["by_op"])

    def __str__(self):
        return self._snapshot()["text"]

    # ---- modules ----------------------------------------------------------------------------

    @property
    def advanced_module_tracker(self):
        """PyTorch's module tracker attribute (``module_helper_dict``, ``module_parameters_dict``,
        ``sharding_dict``, ``parent_dict``, ``name``), a live view of this mode's tables."""
        return _ModuleTracker(self)

    def _reset_tracking(self):
        self.comm_module_counts.clear()
        self.comm_module_counts["Global"] = _phases()
        self._last_kinds = {}
        self._last_total = 0
        self._stack = ["Global"]
        self._parents = {"Global": []}
        self._children = {}
        self._info = {"Global": {"depth": 0}}
        self._params = {}
        self._sharding = {}
        self._operations = {}
        self._names = weakref.WeakKeyDictionary()
        self._modules = {}
        self._busy = False
        self._post_hooked = weakref.WeakSet()
        self._backward_module = None

    def _current(self):
        if self._backward_module is not None:
            return self._backward_module, "backward"
        return self._stack[-1], "forward"

    def _flush(self):
        """Charges the collectives counted since the last mark to the running module and its
        parents: those issued inside autograd's backward to the module whose backward runs (the
        root, "Global", when no module's output hook told which), the others to the module
        whose forward runs."""
        if self._counter is None or self._counter.total() == self._last_total:
            return  # nothing new: skip the per-kind count, which walks every record
        self._last_total = self._counter.total()
        for backward in (False, True):
            kinds = {_NAMES.get(k, k): n for k, n in self._counter.kinds(backward).items()}
            last = self._last_kinds.get(backward, {})
            delta = {k: n - last.get(k, 0) for k, n in kinds.items() if n != last.get(k, 0)}
            self._last_kinds[backward] = kinds
            if not delta:
                continue
            if backward:
                fqn, phase = self._backward_module or self._stack[-1], "backward"
            else:
                fqn, phase = self._stack[-1], "forward"
            for owner in [fqn] + [p for p in self._parents.get(fqn, []) if p != fqn]:
                counts = self.comm_module_counts.setdefault(owner, _phases())
                for k, n in delta.items():
                    counts[phase][k] = counts[phase].get(k, 0) + n

    def _name_of(self, mod):
        """PyTorch's fully-qualified names: a root module by its class name, a descendant of the
        running module as ``parent.path`` (its path through containers that never run forward
        themselves, such as an ``nn.ModuleList``: ``MLPStacked.layers.0``)."""
        name = self._names.get(mod)
        if name is None:
            parent = self._stack[-1]
            name = type(mod).__name__
            owner = self._modules.get(parent)
            owner = owner() if owner is not None else None
            for path, child in (owner.named_modules() if owner is not None else ()):
                if child is mod and path:
                    name = parent + "." + path
                    break
            self._names[mod] = name
            self._modules[name] = weakref.ref(mod)
        return name

    def _pre_hook(self, mod, inputs):
        if threading.get_ident() != self._thread:
            return  # module hooks are global: another rank's thread (simulation mode)
        with self._own_work():
            self._enter_module(mod)

    def _enter_module(self, mod):
        self._flush()
        self._backward_module = None
        fqn = self._name_of(mod)
        info = self._info.setdefault(fqn, {})
        info["module_type"] = str(type(mod)).replace("<", "").replace(">", "")
        info["depth"] = len(self._stack)
        for pname, p in mod.named_parameters(recurse=False):
            self._params.setdefault(fqn, {})[pname] = p.data
            if _is_dtensor(p):
                self._sharding[fqn + "." + pname] = p.placements
                info.setdefault("parameters", {})[pname] = str(p.placements)
        if mod not in self._post_hooked:
            # A module's own forward hook, added after those of its parallel style, so the
            # collectives of the style's output layout count for the module (PyTorch's rule).
            self._post_hooked.add(mod)
            self._handles.append(mod.register_forward_hook(self._post_hook))
        self._parents.setdefault(fqn, list(self._stack))
        siblings = self._children.setdefault(self._stack[-1], [])
        if fqn not in siblings:
            siblings.append(fqn)
        self._stack.append(fqn)

    def _post_hook(self, mod, inputs, output):
        if threading.get_ident() != self._thread:
            return
        with self._own_work():
            self._leave_module(mod, output)

    def _leave_module(self, mod, output):
        self._flush()
        fqn = self._names.get(mod)
        if self._stack[-1] == fqn:
            self._stack.pop()
        outs, _ = tree_flatten(output)
        for t in outs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(lambda g, fqn=fqn: self._backward_mark(fqn))

    def _backward_mark(self, fqn):
        self._flush()
        self._backward_module = fqn

    @contextlib.contextmanager
    def _own_work(self):
        """Tensor calls of the hooks themselves (parameters, grad hooks) are not recorded."""
        busy, self._busy = self._busy, True
        try:
            yield
        finally:
            self._busy = busy

    def _record_op(self, func, args, kwargs):
        if self._busy:
            return
        fqn, phase = self._current()
        flat, _ = tree_flatten((args, kwargs))
        dts = [a for a in flat if _is_dtensor(a)]
        try:
            name = resolve_name(func) or getattr(func, "__name__", str(func))
        except Exception:  # noqa: BLE001 - a name is only for display
            name = str(func)
        self._operations.setdefault(fqn, []).append({
            "name": name,
            "input_shape": [tuple(t.shape) for t in dts],
            "input_sharding": [tuple(t.placements) for t in dts],
            "device_mesh": str(dts[0].device_mesh) if dts else "",
            "is_bw": phase == "backward",
            "is_activation_checkpointing": False,
        })

    def get_parameter_info(self):
        return self._params

    def get_sharding_info(self):
        return self._sharding

    # ---- tables -----------------------------------------------------------------------------

    @staticmethod
    def _noise(noise_level):
        """(distributed ops and module data, all ops but trivial ones, trivial ones too)."""
        return noise_level > 0, noise_level > 1, noise_level > 2

    def _ops(self, fqn, noise_level, backward):
        dtensor_ops, all_ops, trivial = self._noise(noise_level)
        if not dtensor_ops:
            return []
        out = []
        for op in self._operations.get(fqn, []):
            if op["is_bw"] != backward:
                continue
            if not trivial and (op["name"] in _TRIVIAL or op["name"].endswith("__get__")):
                continue
            if not all_ops and not op["input_shape"]:
                continue
            out.append(op)
        return out

    def _order(self):
        """Modules depth-first from Global, in the order they first ran."""
        order = []

        def visit(fqn):
            order.append(fqn)
            for child in self._children.get(fqn, []):
                visit(child)

        visit("Global")
        return order

    def generate_comm_debug_tracing_table(self, noise_level=3):
        """Per module (indented by depth): module type and parameter placements (noise >= 1),
        forward and backward collective counts, and the operations on distributed tensors
        (noise >= 1), every other op (noise >= 2) and view/dtype ops (noise 3)."""
        module_data = self._noise(noise_level)[0]
        table = ""
        for fqn in self._order():
            info = self._info.get(fqn, {"depth": 0})
            indent = "  " * (2 * info["depth"])
            table += f"{indent}{fqn}\n"
            if module_data and "module_type" in info:
                table += f"{indent}*module type: {info['module_type']}\n"
                if "parameters" in info:
                    table += f"{indent}*Parameter List\n"
                    for pname, placement in info["parameters"].items():
                        table += f"{indent} *{pname}: {placement}\n"
            inner = indent + "  "
            c_indent = "  " * (2 * info["depth"] + 2)
            o_indent = "  " * (2 * info["depth"] + 3)
            counts = self.comm_module_counts.get(fqn, {"forward": {}, "backward": {}})
            for phase, backward in (("FORWARD PASS", False), ("BACKWARD PASS", True)):
                colls = counts["backward" if backward else "forward"]
                ops = self._ops(fqn, noise_level, backward)
                if not colls and not ops:
                    continue
                table += f"{inner}{phase}\n"
                for name, n in colls.items():
                    table += f"\033[1;33m{c_indent}*{name}: {n}\033[0m\n"
                for op in ops:
                    table += f"\033[1;33m{c_indent}**{op['name']}\033[0m\n"
                    if op["input_shape"]:
                        table += f"\033[1;31m{o_indent}shape: {op['input_shape']}\033[0m\n"
                        table += f"\033[1;31m{o_indent}sharding: {op['input_sharding']}\033[0m\n"
                        table += f"\033[1;31m{o_indent}device mesh: {op['device_mesh']}\033[0m\n"
        return table

    def log_comm_debug_tracing_table_to_file(self, file_name="comm_mode_log.txt", noise_level=3):
        """The tracing table without colour codes, written to ``file_name``."""
        table = re.sub(r"\x1B\[[0-?]*[ -/]*[@-~]", "",
                       self.generate_comm_debug_tracing_table(noise_level))
        with open(file_name, "w") as f:
            f.write(table)

    def generate_json_dump(self, file_name="comm_mode_log.json", noise_level=3):
        """The module tree as JSON (PyTorch's keys: fqn, module_type, parameters, children,
        collectives_forward/backward, operations_forward/backward/checkpointing)."""
        module_data = self._noise(noise_level)[0]

        def as_json(ops):
            ops = copy.deepcopy(ops)
            for op in ops:
                op["input_sharding"] = [str(s) for s in op["input_sharding"]]
                op["input_shape"] = [str(s) for s in op["input_shape"]]
            return ops

        def node(fqn):
            info = self._info.get(fqn, {})
            counts = self.comm_module_counts.get(fqn, {"forward": {}, "backward": {}})
            return {
                "fqn": fqn,
                "module_type": info.get("module_type", "") if module_data else "",
                "parameters": list(info.get("parameters", {}).items()) if module_data else [],
                "children": [node(c) for c in self._children.get(fqn, [])],
                "collectives_forward": list(counts["forward"].items()),
                "collectives_backward": list(counts["backward"].items()),
                "operations_forward": as_json(self._ops(fqn, noise_level, False)),
                "operations_backward": as_json(self._ops(fqn, noise_level, True)),
                "operations_checkpointing": [],
            }

        with open(file_name, "w") as f:
            json.dump(node("Global"), f, indent=4)
