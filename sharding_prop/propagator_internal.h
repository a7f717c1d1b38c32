#pragma once
// Internal to the propagator: the candidate search (propagator_search.cc) that the entry points
// and their cache (propagator.cc) run on a miss. Not an API: propagator.h is.

#include <memory>
#include <string>
#include <vector>

#include "sharding_prop/propagator.h"

namespace dtensor::sharding::detail {

// "[S(0)] Float[8,4], [R] Float[4]": input specs in messages.
std::string specs_text(const std::vector<DTensorSpec>& specs);

// The best sharding of `entry` on `inputs` (uncached); throws dtensor::Error when none exists.
std::shared_ptr<const OpSharding> compute(const OpEntry& entry,
                                          const std::vector<DTensorSpec>& inputs,
                                          const LayoutArgs& args, const PropagateOptions& opt,
                                          const OutputMetas* aten_metas);

}  // namespace dtensor::sharding::detail
