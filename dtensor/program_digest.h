#pragma once
// NOTE [program digest] (collectives/functional.h), the distributed tensor layer's side: per
// thread and mesh, the count of distributed-tensor ops run and a digest of their names and
// non-tensor arguments. The dispatcher records every op; execute_plan puts the mesh's state on
// the collectives it issues (collectives::ProgramScope), which the backends compare across ranks.

#include <cstdint>

#include "device_mesh/device_mesh.h"

namespace dtensor {

struct ProgramState {
  uint64_t ops = 0;
  uint64_t digest = 0;
};

// False when DTENSOR_PROGRAM_CHECK=0 (read once).
bool program_check_enabled();

// What record_program_op's `op` says: an op ran (its call digest in `args`), or this rank's
// local kernel of an op raised (`args`: the op name's hash; NOTE [local op failures] in
// dispatch_local.cc).
inline constexpr uint64_t kOpRan = 0;
inline constexpr uint64_t kLocalFailure = 1;
// A random op drew from a generator in this state (`args`: its hash; NOTE [rank generators
// agree] in random.h).
inline constexpr uint64_t kRandomState = 2;

// Folds one op into the calling thread's state for `mesh` (nothing on a 1-rank mesh: no peer to
// compare with). `op` and `args` must be equal on every rank for the same call (deterministic
// hashes: no pointers, no per-process seeds).
void record_program_op(const DeviceMesh& mesh, uint64_t op, uint64_t args);

// Forgets the calling thread's state for `mesh`. Called on every rank of the mesh at the same
// collective, when the ranks' calls there disagreed (collectives::CallMismatch): the divergence
// has been reported on every rank, and the check starts over from there, so that ranks whose
// programs agree again (a caught error, the next test case) go on in step instead of failing
// every later collective on the mesh.
void reset_program_state(const DeviceMesh& mesh);

// The calling thread's state for `mesh`, its op count plus one (0: the check is off).
ProgramState program_state(const DeviceMesh& mesh);

}  // namespace dtensor
