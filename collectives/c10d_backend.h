#pragma once
// The "c10d" backend: collectives over a libtorch c10d::ProcessGroup. By default each group gets
// a ProcessGroupGloo rendezvousing through the job's TCPStore (under a per-group prefix, so every
// sub-group reuses the one store); a user may hand in any other ProcessGroup for a group name.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <string>

namespace dtensor::collectives {

// Makes the c10d backend use `pg` for the group named `group_name` (its rank and size must match
// the group's) instead of creating a Gloo group. Call before the group's first collective.
void use_process_group(const std::string& group_name, c10::intrusive_ptr<c10d::ProcessGroup> pg);

}  // namespace dtensor::collectives
