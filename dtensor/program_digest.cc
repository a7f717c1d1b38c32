#include "dtensor/program_digest.h"

#include <cstdlib>
#include <cstring>

#include "absl/container/node_hash_map.h"
#include "base/stable_hash.h"

namespace dtensor {
namespace {

// node_hash_map: a state's address is stable, so the last one used is remembered (most programs
// run every op on one mesh; hashing the mesh per op was 1% of a call).
thread_local absl::node_hash_map<DeviceMesh, ProgramState> t_states;
thread_local const DeviceMesh* t_last_mesh = nullptr;
thread_local ProgramState* t_last_state = nullptr;

}  // namespace

bool program_check_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DTENSOR_PROGRAM_CHECK");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

void record_program_op(const DeviceMesh& mesh, uint64_t op, uint64_t args) {
  // One rank has no peer to disagree with (its collectives compare nothing): nothing to fold,
  // and a 1-rank mesh's ops (a single-device run of distributed code) skip the hashing.
  if (mesh.size() == 1) return;
  if (t_last_mesh == nullptr || !(*t_last_mesh == mesh)) {
    const auto it = t_states.try_emplace(mesh).first;
    t_last_mesh = &it->first;
    t_last_state = &it->second;
  }
  ProgramState& s = *t_last_state;
  ++s.ops;
  const uint64_t words[3] = {s.digest, op, args};
  s.digest = fnv1a(words, sizeof(words));
}

void reset_program_state(const DeviceMesh& mesh) {
  const auto it = t_states.find(mesh);
  if (it != t_states.end()) it->second = ProgramState{};
}

ProgramState program_state(const DeviceMesh& mesh) {
  if (!program_check_enabled()) return {};
  // Counted from 1 when checked: a rank that ran nothing on the mesh must still be compared.
  const auto it = t_states.find(mesh);
  if (it == t_states.end()) return {1, 0};
  return {it->second.ops + 1, it->second.digest};
}

}  // namespace dtensor
