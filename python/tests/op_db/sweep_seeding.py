"""The sweep's seeds (NOTE [sweep seed]: fixed, or one per full run), torch.manual_seed and op_db's
wrapper_set_seed made to seed a rank thread's own generator, and torch's op_db and SampleInput,
imported here with sys.argv set aside."""

import os
import sys
import threading

import torch

# torch's test utilities import PyPI's `expecttest` (tools/requirements.txt; the GPU check carries
# it in .gpu/python).
_argv, sys.argv = sys.argv, sys.argv[:1]  # common_utils parses sys.argv when imported
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402,F401
from torch.testing._internal.opinfo.core import SampleInput  # noqa: E402,F401
sys.argv = _argv

import dtensor  # noqa: E402

# NOTE [sweep seed]: the default tier draws op_db's samples from a fixed seed (a fixed subset);
# the full sweep (`--full`, ./x test --full) varies it per run: $DTENSOR_SWEEP_SEED when set (to
# replay a failure: every failure's detail names its seed), else a fresh one. torch's, Python's
# and numpy's generators are all seeded with it (op_db draws scalars with Python's random).
SEED = 1234


def run_seed():
    """The full sweep's seed for this run: $DTENSOR_SWEEP_SEED, else drawn from the OS."""
    value = os.environ.get("DTENSOR_SWEEP_SEED")
    return int(value) if value else int.from_bytes(os.urandom(4), "little")


def seed_all(seed):
    import random

    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy
        numpy.random.seed(seed % 2**32)
    except ImportError:
        pass

# op_db's random OpInfos seed torch inside the op (wrapper_set_seed calls torch.manual_seed).
# Ranks that are threads draw from their own generators (NOTE [DTensor random]), which only
# dtensor's manual_seed seeds, so the sweep makes torch.manual_seed seed the calling thread's
# generator instead: what one process per rank gets from torch.manual_seed alone. (Reseeding the
# shared default generator from a rank thread would race with the other ranks' draws.)
_torch_manual_seed = torch.manual_seed


def _manual_seed(seed):
    if threading.current_thread() is threading.main_thread():
        return _torch_manual_seed(seed)
    dtensor._C.manual_seed(int(seed))
    return None


torch.manual_seed = _manual_seed
_cmi = sys.modules["torch.testing._internal.common_methods_invocations"]
_wrapper_set_seed = _cmi.wrapper_set_seed


def _rank_wrapper_set_seed(op, *args, **kwargs):
    """op_db's wrapper_set_seed also saves and restores the default generator's state
    (freeze_rng_state), which rank threads share: on a rank thread, only the seed."""
    if threading.current_thread() is threading.main_thread():
        return _wrapper_set_seed(op, *args, **kwargs)
    torch.manual_seed(42)
    return op(*args, **kwargs)


_cmi.wrapper_set_seed = _rank_wrapper_set_seed
for _mod in list(sys.modules.values()):  # newer torch also binds it in opinfo/definitions/*
    if (getattr(_mod, "__name__", "").startswith("torch.testing._internal.opinfo")
            and getattr(_mod, "wrapper_set_seed", None) is _wrapper_set_seed):
        _mod.wrapper_set_seed = _rank_wrapper_set_seed

_op_seed = [SEED]  # the seed ops draw from inside a mode (the run's seed in the full sweep)
