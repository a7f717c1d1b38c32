"""Native DTensor sharding engine (Python face).

For now this re-exports the layout core from the C++ extension; the
torch.distributed.tensor-compatible API arrives with a later issue.
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
