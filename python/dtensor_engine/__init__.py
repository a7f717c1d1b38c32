"""The first name of the package: the layout core and the functional collectives.

New code imports ``dtensor`` (torch.distributed.tensor's API); this alias keeps older imports
working and re-exports the layout core from ``dtensor._C``.
"""

import torch  # noqa: F401  (loads libtorch before the extension)

from dtensor._C import (  # noqa: F401
    DeviceMesh,
    LocalBox,
    Placement,
    chunk_sizes,
    local_box,
    owner_ranks,
    parse_placements,
    visualize_sharding,
)
from dtensor_engine import functional  # noqa: F401,E402
