#include "dtensor/program_digest.h"

#include <cstdlib>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "base/stable_hash.h"

namespace dtensor {
namespace {

thread_local absl::flat_hash_map<DeviceMesh, ProgramState> t_states;

}  // namespace

bool program_check_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DTENSOR_PROGRAM_CHECK");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

void record_program_op(const DeviceMesh& mesh, uint64_t op, uint64_t args) {
  ProgramState& s = t_states[mesh];
  ++s.ops;
  const uint64_t words[3] = {s.digest, op, args};
  s.digest = fnv1a(words, sizeof(words));
}

ProgramState program_state(const DeviceMesh& mesh) {
  if (!program_check_enabled()) return {};
  // Counted from 1 when checked: a rank that ran nothing on the mesh must still be compared.
  const auto it = t_states.find(mesh);
  if (it == t_states.end()) return {1, 0};
  return {it->second.ops + 1, it->second.digest};
}

}  // namespace dtensor
