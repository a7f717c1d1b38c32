"""DeviceMesh and init_device_mesh (torch.distributed.device_mesh's names)."""

import os
import sys
import threading
import warnings

import torch

from dtensor import _C

__all__ = ["DeviceMesh", "default_backend", "init_device_mesh"]


def default_backend(device_type="cpu"):
    """The collectives backend a launched job uses: $DTENSOR_BACKEND when set; else for CUDA
    ``nccl``, or ``cuda_ipc`` when this host's ranks outnumber its GPUs (LOCAL_WORLD_SIZE >
    device count: ranks share a GPU, which NCCL refuses; NOTE [cuda_ipc backend]); ``c10d``
    (Gloo) when the ranks span hosts (WORLD_SIZE > LOCAL_WORLD_SIZE), and ``shm`` (shared
    memory) for CPU ranks on one host. The choice is C++'s (collectives/launch_env.h), which
    the server (tools/serve.cc) makes too, given torch.cuda's device count."""
    if device_type == "cuda":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return _C.default_backend(device_type, gpus)
    return _C.default_backend(device_type)


# The device types this engine runs meshes on (CPU collectives: threads, shm, Gloo; CUDA: NCCL,
# cuda_ipc).
_DEVICE_TYPES = ("cpu", "cuda")


def _check_device_type(device_type):
    if device_type not in _DEVICE_TYPES:
        raise RuntimeError(
            f"dtensor: device_type {device_type!r} is not one this engine runs meshes on; use one of "
            f"{', '.join(repr(t) for t in _DEVICE_TYPES)}")


def _select_cuda_device(device_type):
    """PyTorch's init_device_mesh on CUDA: the calling process's current device becomes
    ``LOCAL_RANK % device_count`` (``RANK % device_count`` without LOCAL_RANK), before any
    communicator is made on it (C++'s select_local_device). NOTE [mesh device]: the C++ mesh's
    local tensors live on the current device."""
    if device_type != "cuda" or not torch.cuda.is_available():
        return
    _C.select_local_device(device_type)


def _ensure_context(device_type="cpu"):
    """Joins a job when this thread has no rank context: the one of torch.distributed's default
    process group when one is initialized (NOTE [joining torch's default group]), else the one
    torchrun's variables describe."""
    if _C.has_context():
        return
    # torch.distributed first: its env:// rendezvous may already host a store at MASTER_PORT.
    if _join_default_group(device_type):
        return
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        from dtensor import _functional_collectives as funcol

        funcol.init_from_env(default_backend(device_type))
        return
    raise RuntimeError(
        "dtensor: no ranks to place a mesh on; start N ranks with `./x run -n N script.py` or "
        "`python3 -m torch.distributed.run --nproc_per_node N script.py`, or run ranks as "
        "threads with dtensor.run_threads(N, fn)"
    )


# NOTE [joining torch's default group]: PyTorch's init_device_mesh works after any
# init_process_group (env://, file://, tcp://, a store, or the "threaded" test backend), and code
# written for it (PyTorch's own test harness among it) starts ranks without torchrun's variables;
# with them, env:// has rank 0 host torch's store at MASTER_PORT, where the engine's rendezvous
# could not host its own (EADDRINUSE: Hugging Face's from_pretrained(tp_plan="auto") calls
# init_process_group first). So a rank that has called init_process_group joins the engine's job
# through the default group's store: the rank and world size are torch.distributed's; global rank 0 picks a
# free port for the engine's rendezvous store and a job token, and publishes both in the default
# store; every rank then joins as torchrun's variables would have it (MASTER_ADDR, when set, is
# where rank 0's store is reached; otherwise 127.0.0.1: one host). Nothing of torch's groups is
# used afterwards. With the "threaded" backend (ranks as threads of one process), the first
# thread makes the contexts of all ranks (dtensor.run_threads' kind) and each thread binds its
# own for its lifetime; the thread is renamed "dtensor-rank", as run_threads names its threads.
_JOIN_KEY = "dtensor/engine_job"
_thread_jobs = {}  # threaded backend: job key -> the contexts of its ranks
_thread_jobs_lock = threading.Lock()
_thread_rank = threading.local()  # threaded backend: this thread's ThreadRank scope


def _join_default_group(device_type):
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    rank, world = dist.get_rank(), dist.get_world_size()
    if dist.get_backend() == "fake":
        # PyTorch's fake process group (FakeStore: no real peers, nothing to rendezvous with):
        # this process is that rank of a job on the engine's fake backend (NOTE [fake backend]).
        _C.join_fake_job(rank, world)
        return True
    store = dist.distributed_c10d._get_default_store()
    if dist.get_backend() == "threaded":
        if store.add(_JOIN_KEY + "/threads", 1) == 1:
            import uuid

            job = uuid.uuid4().hex
            with _thread_jobs_lock:
                _thread_jobs[job] = _C.thread_contexts(world, "threads")
            store.set(_JOIN_KEY + "/threads_job", job)
        job = store.get(_JOIN_KEY + "/threads_job").decode()
        with _thread_jobs_lock:
            contexts = _thread_jobs[job]
        _thread_rank.scope = _C.ThreadRank(contexts[rank])
        # One name for every rank's thread, as dtensor.run_threads gives them: the engine's
        # collectives compare the issuing thread's name across ranks (NOTE [issuing thread]).
        threading.current_thread().name = "dtensor-rank"
        return True
    if rank == 0:
        import socket
        import uuid

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        store.set(_JOIN_KEY, f"{addr}:{port}:{uuid.uuid4().hex[:16]}")
    addr, port, token = store.get(_JOIN_KEY).decode().rsplit(":", 2)
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": addr, "MASTER_PORT": port,
           "DTENSOR_JOB_TOKEN": os.environ.get("DTENSOR_JOB_TOKEN") or token,
           "TORCHELASTIC_USE_AGENT_STORE": None}
    saved = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        from dtensor import _functional_collectives as funcol

        funcol.init_from_env(default_backend(device_type))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return True


class _MeshResources(threading.local):
    """The stack of current meshes (``with mesh:``), one per thread: ranks may be threads of one
    process (``dtensor.run_threads``), each with its own current mesh. PyTorch keeps the same
    stack in ``torch.distributed.device_mesh._mesh_resources``."""

    def __init__(self):
        self.mesh_stack = []
        self.groups = {}  # (C++ mesh, dim) -> its ProcessGroup (DeviceMesh.get_group)
        # (C++ mesh, dim) -> the torch.distributed group DeviceMesh.from_group was given.
        self.given_groups = {}
        # C++ sub-mesh -> the Python mesh it was last sliced from (its root), as PyTorch's
        # _mesh_resources.get_root_mesh; per thread, so a rank never reaches another rank's (or
        # an earlier job's) mesh objects.
        self.roots = {}
        # Root C++ mesh -> {flattened dim name: (the root's dim names it merges, its mesh)}, as
        # PyTorch's root_mesh._flatten_mapping (NOTE [flattened dims]).
        self.flattened = {}

    def get_current_mesh(self):
        if not self.mesh_stack:
            raise RuntimeError("No device mesh is currently active!")
        return self.mesh_stack[-1]


_mesh_resources = _MeshResources()


def _root_mesh(mesh):
    """The mesh ``mesh`` was sliced from (``mesh`` itself when it was not sliced)."""
    return _mesh_resources.roots.get(mesh._mesh, mesh)


def _current_mesh_or(device_mesh, what):
    """``device_mesh``, or the innermost ``with mesh:`` of this thread when it is None."""
    if device_mesh is not None:
        return device_mesh
    if _mesh_resources.mesh_stack:
        return _mesh_resources.mesh_stack[-1]
    raise ValueError(f"{what}: device_mesh must be given: pass device_mesh, or call it inside "
                     f"`with mesh:` to use that mesh as the default")


def _torch_group(group):
    """The c10d ProcessGroup of engine group ``group`` (C++: NOTE [mesh groups as torch process
    groups]), entered in torch.distributed's tables of groups so that ``get_rank(group)``,
    ``get_process_group_ranks(group)`` and collectives given global ranks work on it."""
    import torch.distributed as dist
    c10d = dist.distributed_c10d
    pg = _C.torch_process_group(group)
    if pg not in c10d._pg_group_ranks:
        ranks = _C.group_ranks(group)
        c10d._pg_map[pg] = ("dtensor", None)
        c10d._pg_names[pg] = pg.group_name
        c10d._pg_group_ranks[pg] = {g: i for i, g in enumerate(ranks)}
        c10d._pg_backend_config[pg] = "cpu:dtensor,cuda:dtensor"
    return pg


def _torch_device_mesh_class():
    """PyTorch's DeviceMesh class (NOTE [a torch DeviceMesh]); ``object`` when this torch has
    none."""
    mod = sys.modules.get("torch.distributed.device_mesh")
    if mod is not None and mod.__name__ == "torch.distributed.device_mesh":
        return getattr(mod, "DeviceMesh", object)
    try:  # the module name is already this package's (the opt-in): take torch's own binding
        import torch.distributed._functional_collectives as funcol
        return getattr(funcol, "DeviceMesh", object)
    except ImportError:
        return object


# NOTE [a torch DeviceMesh]: torch's own code accepts a mesh by isinstance against its
# DeviceMesh class (the functional collectives' ``(mesh, dim)`` groups, distributed_c10d, FSDP
# and DCP helpers, Dynamo). The engine's mesh subclasses it so that it is accepted there, and
# overrides what those callers read (the public methods, ``_dim_group_names``); it never runs
# torch's constructor, so torch's private state is absent and a torch helper that needs it
# fails with AttributeError instead of using a mesh it does not know.
class DeviceMesh(_torch_device_mesh_class()):
    """An N-D array of ranks. ``mesh`` is a nested list / tensor of global ranks.

    ``with mesh:`` makes it this thread's current mesh: APIs given ``device_mesh=None``
    (distribute_tensor, DTensor.from_local, the factories, parallelize_module) use it."""

    def __init__(self, device_type, mesh, *, mesh_dim_names=None, _c_mesh=None):
        _check_device_type(device_type)
        if _c_mesh is None:
            ranks = torch.as_tensor(mesh, dtype=torch.long)
            names = list(mesh_dim_names or [])
            _c_mesh = _C.DeviceMesh(list(ranks.shape), ranks.flatten().tolist(), names,
                                    device_type)
            if not _C.has_context():
                _select_cuda_device(device_type)
            _ensure_context(device_type)
            _C.context_register_mesh(_c_mesh)
        elif _c_mesh.device_type != device_type:
            # NOTE [mesh device]: the C++ mesh carries the device type; both sides agree.
            _c_mesh = _c_mesh.with_device_type(device_type)
        self._mesh = _c_mesh

    @property
    def device_type(self):
        """``"cpu"`` or ``"cuda"``: where the mesh's local tensors live (the C++ mesh's)."""
        return self._mesh.device_type

    @staticmethod
    def from_group(group, device_type="cpu", mesh=None, *, mesh_dim_names=None):
        """A mesh over existing ``torch.distributed`` process groups (Gloo), as PyTorch's: one
        group gives a 1-D mesh (``mesh``, when given, lists the group's ranks in order); a list
        of N groups gives an N-D mesh, with ``mesh`` (required) the global ranks' layout and
        the k-th group this rank's group along mesh dim k. The engine's collectives on mesh dim
        k run through the k-th group, and ``get_group(k)`` gives it back.

        NOTE [from_group groups]: the engine also communicates over several mesh dims at once
        (a redistribute that moves a tensor dim between mesh dims); for those groups an N-D
        ``from_group`` calls ``torch.distributed.new_group``, so on N-D meshes it is
        collective: every rank of the default group calls it."""
        _check_device_type(device_type)
        import itertools

        import torch.distributed as dist

        groups = list(group) if isinstance(group, (list, tuple)) else [group]
        if not groups:
            raise ValueError("DeviceMesh.from_group: no group given")
        if mesh is None:
            if len(groups) != 1:
                raise ValueError(f"DeviceMesh.from_group: {len(groups)} groups make an "
                                 f"{len(groups)}-D mesh; pass `mesh`, the ranks' layout")
            mesh = dist.get_process_group_ranks(groups[0])
        layout = torch.as_tensor(mesh, dtype=torch.int64)
        ndim = layout.dim()
        if ndim != len(groups):
            raise ValueError(f"DeviceMesh.from_group: mesh {layout.tolist()} has {ndim} dims "
                             f"but {len(groups)} groups were given")
        rank = dist.get_rank()
        where = (layout == rank).nonzero().tolist()
        coord = where[0] if where else None

        def members(dims, at):
            return layout[tuple(slice(None) if d in dims else at[d]
                                for d in range(ndim))].flatten().tolist()

        # Groups over several mesh dims: every rank creates every one (new_group's rule).
        mine = []
        for k in range(2, ndim + 1):
            for dims in itertools.combinations(range(ndim), k):
                rest = [range(layout.shape[d]) if d not in dims else [0] for d in range(ndim)]
                for at in itertools.product(*rest):
                    ranks = members(dims, at)
                    pg = dist.new_group(ranks)
                    if rank in ranks:
                        mine.append((ranks, pg))
        if coord is None:
            raise ValueError(f"DeviceMesh.from_group: rank {rank} is not in mesh "
                             f"{layout.tolist()}")
        for d, g in enumerate(groups):
            along = members((d,), coord)
            ranks = list(dist.get_process_group_ranks(g))
            if ranks != along:
                raise ValueError(f"DeviceMesh.from_group: group {d} has ranks {ranks}, but "
                                 f"rank {rank}'s group along mesh dim {d} of "
                                 f"{layout.tolist()} is {along}")
            mine.append((along, g))
        c_mesh = _C.mesh_from_process_groups(mine, rank, dist.get_world_size(),
                                             list(layout.shape), layout.flatten().tolist(),
                                             list(mesh_dim_names or []), device_type)
        for d, g in enumerate(groups):
            _mesh_resources.given_groups[(c_mesh, d)] = g
        return DeviceMesh._wrap(c_mesh, device_type)

    @classmethod
    def _wrap(cls, c_mesh, device_type=None):
        """The Python mesh of a C++ one, on ``device_type`` (None: the C++ mesh's own)."""
        return cls(device_type or c_mesh.device_type, None, _c_mesh=c_mesh)

    @property
    def mesh(self):
        return torch.tensor(self._mesh.ranks, dtype=torch.long).reshape(self._mesh.shape)

    @property
    def shape(self):
        return tuple(self._mesh.shape)

    @property
    def ndim(self):
        return self._mesh.ndim

    @property
    def mesh_dim_names(self):
        names = self._mesh.dim_names
        return tuple(names) if names else None

    def size(self, mesh_dim=None):
        if mesh_dim is None:
            return len(self._mesh.ranks)
        return self._mesh.shape[mesh_dim]

    def __getitem__(self, names):
        """The sub-mesh over the named dim(s) that holds this rank (``mesh["tp"]``,
        ``mesh["dp", "tp"]``), as PyTorch's DeviceMesh slicing; a name made by ``_flatten`` on
        a slice of this mesh's root reaches the flattened dim (``mesh["dp_tp"]``)."""
        if isinstance(names, str):
            names = (names,)
        if not self.mesh_dim_names:
            raise KeyError("DeviceMesh: this mesh has no dim names; pass mesh_dim_names")
        root = _root_mesh(self)
        flat = _mesh_resources.flattened.get(root._mesh, {})
        c_mesh, merged = self._mesh, []
        for n in names:
            if n in self.mesh_dim_names:
                merged.append(n)
                continue
            if n not in flat or not set(flat[n][0]) <= set(self.mesh_dim_names):
                raise KeyError(f"DeviceMesh: no dim named {n!r} in {self.mesh_dim_names}")
            # NOTE [flattened dims]: the flattened dim is made again from this mesh's own dims
            # (the same ranks as _flatten gave); PyTorch 2.11 warns on this path.
            warnings.warn("Slicing a flattened dim from root mesh will be deprecated in PT 2.11. "
                          "Users need to bookkeep the flattened mesh directly. ", stacklevel=2)
            merged.extend(flat[n][0])
            c_mesh = c_mesh.flatten(list(flat[n][0]), n)
        if len(set(merged)) != len(merged):
            raise RuntimeError(f"Slicing overlapping dim_names {tuple(names)} is not allowed.")
        sub = c_mesh.submesh(list(names), _C.rank())
        _C.context_register_mesh(sub)
        # The mesh a slice came from, as PyTorch's _mesh_resources.get_root_mesh (FSDP over TP
        # lays its parameters out on the root's (dp, tp) dims).
        _mesh_resources.roots[sub] = root
        return DeviceMesh._wrap(sub, self.device_type)

    def _flatten(self, mesh_dim_name=None, backend_override=None):
        """PyTorch's: the 1-D mesh over this mesh's ranks (dims merged major to minor) named
        ``mesh_dim_name`` (default: the dim names joined by "_"); afterwards the root mesh this
        one was sliced from reaches it by that name (``root["dp_tp"]``).

        NOTE [flattened dims]: the engine's C++ mesh does the merge (``DeviceMesh.flatten``);
        the name is kept per thread for the root (``_mesh_resources.flattened``), as PyTorch's
        root_mesh._flatten_mapping: a name may be made again only over the same dims. Groups are
        named by their ranks, so the flattened dim shares the communicator of any group over
        the same ranks and nothing collective happens here."""
        if not self.mesh_dim_names:
            raise RuntimeError("Cannot flatten a DeviceMesh without mesh_dim_names!")
        if backend_override is not None:
            raise NotImplementedError("DeviceMesh._flatten: backend_override is not supported; the "
                                      "flattened dim runs on the mesh's own backend")
        name = mesh_dim_name or "_".join(self.mesh_dim_names)
        if self.ndim == 1 and name in self.mesh_dim_names:
            return self
        root = _root_mesh(self)
        if name in (root.mesh_dim_names or ()):
            raise ValueError(f"{name} already exists for submesh of the {root}. The "
                             f"mesh_dim_names of submesh and flattened mesh are "
                             f"{root.mesh_dim_names}. Please specify another valid "
                             f"mesh_dim_name.")
        flat = _mesh_resources.flattened.setdefault(root._mesh, {})
        dims = tuple(d for n in self.mesh_dim_names for d in (flat[n][0] if n in flat else (n,)))
        if name in flat:
            if flat[name][0] != dims:
                raise ValueError(f"Flatten mesh with mesh_dim_name {name} has been created "
                                 f"before, Please specify another valid mesh_dim_name.")
            return flat[name][1]
        c_mesh = self._mesh.flatten(list(self.mesh_dim_names), name)
        _C.context_register_mesh(c_mesh)
        _mesh_resources.roots[c_mesh] = root
        flat[name] = (dims, DeviceMesh._wrap(c_mesh, self.device_type))
        return flat[name][1]

    def get_rank(self):
        return _C.rank()

    def get_coordinate(self):
        """This rank's index along every mesh dim, a tuple (None when the rank is not in the
        mesh), as PyTorch's."""
        coordinate = self._mesh.coordinate(_C.rank())
        return None if coordinate is None else tuple(coordinate)

    def get_group(self, mesh_dim=None):
        """The ``torch.distributed.ProcessGroup`` of ``mesh_dim`` (an int or a dim name; may be
        omitted on a 1-D mesh) holding this rank, as PyTorch's: a c10d group registered under
        its name (``group.group_name``, also ``mesh._dim_group_names[dim]``) whose collectives
        run on the engine's group of that mesh dim, so torch.distributed's collectives, the
        functional collectives (by group, name or ``(mesh, dim)``) and DDP all work on it (NOTE
        [mesh groups as torch process groups]). A mesh made by ``from_group`` gives back the
        groups it was made from."""
        dim = self._dim_index(mesh_dim, "get_group")
        given = _mesh_resources.given_groups.get((self._mesh, dim))
        if given is not None:
            return given
        self._my_coordinate("get_group")
        cache = _mesh_resources.groups
        key = (self._mesh, dim)
        pg = cache.get(key)
        if pg is None:
            pg = cache[key] = _torch_group(_C.mesh_group_name(self._mesh, dim))
        return pg

    @property
    def _dim_group_names(self):
        """The registered name of each mesh dim's group (PyTorch's attribute, which torch's
        functional collectives read for ``(mesh, dim)``); empty on a rank outside the mesh."""
        if self.get_coordinate() is None:
            return []
        return [self.get_group(d).group_name for d in range(self.ndim)]

    def get_all_groups(self):
        """``get_group(d)`` for every mesh dim, as PyTorch."""
        return [self.get_group(d) for d in range(self.ndim)]

    def _dim_index(self, mesh_dim, what):
        """A mesh dim given as an int or a name (None: the only dim of a 1-D mesh)."""
        if mesh_dim is None:
            if self.ndim > 1:
                raise RuntimeError(f"{what}: mesh_dim must be given for a {self.ndim}-D mesh "
                                   f"{self}")
            return 0
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"{what}: no dim named {mesh_dim!r} in {self.mesh_dim_names}")
            return self.mesh_dim_names.index(mesh_dim)
        if not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"{what}: mesh dim {mesh_dim} of a {self.ndim}-D mesh")
        return mesh_dim % self.ndim

    def get_local_rank(self, mesh_dim=None):
        """This rank's index along ``mesh_dim`` (an int or a dim name; may be omitted on a 1-D
        mesh), as PyTorch's ``DeviceMesh.get_local_rank``."""
        return self._my_coordinate("get_local_rank")[self._dim_index(mesh_dim, "get_local_rank")]

    def _my_coordinate(self, what):
        coordinate = self.get_coordinate()
        if coordinate is None:
            raise RuntimeError(f"{what}: rank {self.get_rank()} is not in {self}")
        return coordinate

    def __eq__(self, other):
        return isinstance(other, DeviceMesh) and self._mesh == other._mesh

    # NOTE [pickling meshes]: as PyTorch's, a mesh pickles its device type, rank layout and dim
    # names (and the root it was sliced from); unpickling builds it again on the calling rank of
    # the same job (registering its groups is local: nothing collective). Groups are named by
    # their ranks, so it finds the groups already registered (a from_group mesh's too).
    def __getstate__(self):
        root = _root_mesh(self)
        return {"device_type": self.device_type, "mesh": self.mesh,
                "mesh_dim_names": self.mesh_dim_names,
                "root": None if root._mesh == self._mesh else root}

    def __setstate__(self, state):
        self.__init__(state["device_type"], state["mesh"], mesh_dim_names=state["mesh_dim_names"])
        if state.get("root") is not None:
            _mesh_resources.roots[self._mesh] = state["root"]

    def __hash__(self):
        return hash(self._mesh)

    def __enter__(self):
        _mesh_resources.mesh_stack.append(self)
        return self

    def __exit__(self, exc_type, exc_value, exc_traceback):
        _mesh_resources.mesh_stack.pop()
        return False

    def __repr__(self):
        if not self.mesh_dim_names:
            return f"DeviceMesh('{self.device_type}', {self.mesh.tolist()})"
        return (f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}, "
                f"mesh_dim_names={self.mesh_dim_names})")


def init_device_mesh(device_type, mesh_shape, *, mesh_dim_names=None):
    """A mesh of ``mesh_shape`` over ranks 0..N-1 of the job (N must be the world size)."""
    _check_device_type(device_type)
    if not _C.has_context():
        _select_cuda_device(device_type)
    _ensure_context(device_type)
    c_mesh = _C.init_device_mesh(list(mesh_shape), list(mesh_dim_names or []), device_type)
    return DeviceMesh._wrap(c_mesh)
