#pragma once
// NOTE [cross-mesh redistribute]
// A distributed tensor moves from one mesh to another (other ranks, another shape; disjoint,
// overlapping or equal rank sets) in one exchange over the ranks of both meshes. Every rank of
// the destination mesh receives exactly the boxes of its piece it does not hold, each from one
// rank of the source mesh that holds it, and copies the ones it holds itself: no gather to one
// rank, no replicated intermediate, no byte sent twice. Among replicas of a source box the
// destination rank r takes it from replica (r mod count), spreading the load. A Partial source is
// first reduced on the source mesh (a redistribute there to the same placements with Replicate
// for Partial), so values arrive reduced, and a Partial destination is refused (as a
// redistribute never creates one). Ranks outside both meshes take no part. A rank in one of the
// meshes only calls it with what it has there: a source rank outside the destination mesh gets
// the destination's absent piece, a destination rank outside the source mesh passes the source's
// absent piece (NOTE [ranks outside the mesh]). The exchange is one all_to_all over both meshes'
// ranks of each rank's boxes as views (NOTE [boxed all_to_all]), so it runs on every backend and
// packs nothing where ranks share memory; a pure sender (a rank that receives nothing) may
// issue it asynchronously (a pipeline stage sending activations on). PyTorch refuses a move
// between meshes ("Cross device mesh comm not supported yet!").

#include <memory>
#include <string>
#include <vector>

#include "layout/dtensor_spec.h"
#include "layout/shard_layout.h"

namespace dtensor {

struct CrossMeshPlan {
  DTensorSpec src;             // as given, on the source mesh
  DTensorSpec src_reduced;     // src with Partial read as Replicate: the layout that is sent
  DTensorSpec dst;             // on the destination mesh
  std::vector<int64_t> ranks;  // both meshes' ranks, ascending: the exchange's group
  // One box of the global tensor going from a rank to another (`from == to`: a local copy), in an
  // order both sides read alike (by destination, then by source box in row-major order).
  struct Move {
    int64_t from;
    int64_t to;
    LocalBox box;
  };
  std::vector<Move> moves;
  int64_t max_bytes = 0;  // the most bytes a rank receives from others (the cost model's size)
  double cost = 0;        // the source-side reduction plus the exchange, by the cost model
  bool is_noop() const { return moves.empty(); }
  // Multi-line: the specs, the reduction if any, and per destination rank its sources and bytes.
  std::string to_string() const;
};

// The plan for moving `src` to `dst` (same global shape and dtype; different meshes, or the same
// mesh as a special case). Cached; every rank computes the same plan. Throws dtensor::Error when
// the tensors differ or `dst` has a Partial.
std::shared_ptr<const CrossMeshPlan> plan_cross_mesh(const DTensorSpec& src,
                                                     const DTensorSpec& dst);

}  // namespace dtensor
