"""The functional collectives under their first name; see dtensor._functional_collectives."""

from dtensor._functional_collectives import *  # noqa: F401,F403
from dtensor._functional_collectives import init_from_env, new_group  # noqa: F401
