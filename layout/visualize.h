#pragma once
// A text picture of who owns which block of a tensor (PyTorch's visualize_sharding).

#include <string>

#include "layout/dtensor_spec.h"

namespace dtensor {

// For 1-D and 2-D tensors: a grid whose rows and columns are the distinct index ranges of the
// local boxes, each cell listing the global ranks that hold it, e.g.
//
//   Tensor f32[10,7] as [S(0),S(1)] on DeviceMesh((2,2), ranks=[0,1,2,3])
//            cols 0:4   cols 4:7
//   rows 0:5  r0        r1
//   rows 5:10 r2        r3
//
// Ranks holding partial values are marked with '*'. For other ranks of tensor it lists each
// distinct box with its owners. Empty boxes (uneven shards) are listed under the grid.
std::string visualize_sharding(const DTensorSpec& spec);

}  // namespace dtensor
