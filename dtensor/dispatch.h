#pragma once
// The ATen dispatch kernel of distributed tensors and its thread-local modes.
//
// NOTE [DTensor dispatch]
// Mechanism. A distributed tensor is a DTensorImpl (dtensor_impl.h) whose backend dispatch key
// is PrivateUse1. We chose a C++ backend key over PyTorch's route (the Python key and
// __torch_dispatch__) because the whole point is a per-op cost near a plain ATen call and no
// Python on the path. In libtorch's dispatcher:
//  - one boxed kernel serves every op: it is the PrivateUse1 fallback, and it is also
//    registered by name for the ops that have a CompositeExplicitAutograd(NonFunctional) kernel
//    (about 1245), because those composites would otherwise run ahead of a fallback;
//  - CompositeImplicitAutograd ops (linear, matmul, dropout, layer_norm, ...) decompose above
//    the kernel, so it sees their parts, as PyTorch's DTensor does;
//  - autograd runs on the distributed tensors (AutogradPrivateUse1 comes with the key):
//    gradients are distributed tensors and backward formulas are more dispatched ops;
//  - no ExcludeDispatchKeyGuard: the kernel unwraps its arguments to plain local tensors and
//    calls the op again, which dispatches to the local backend (autograd is already below us).
// Per call: the op's info is looked up once per operator (name, table entry, layout-argument
// extractor, aliasing), the propagator is asked (cached: NOTE [propagation]), inputs that need
// it are redistributed as planned (collectives are attributed to the op: CommCause), the op
// runs on the local pieces with shape arguments made local, and outputs are wrapped with the
// propagated specs. In-place ops return self (its layout never changes); out= ops rewrap their
// out tensor; views wrap the local view, so they alias whenever no redistribute came first.
// Mixing: 0-dim plain tensors and Python scalars pass through as scalars; any other plain
// tensor is an error, unless a ReplicatePlainTensorsGuard is active: then it is read as
// Replicate on the mesh of the distributed operands (every rank must pass the same values).
// Random ops: see NOTE [DTensor random]. Ops with no table entry: NOTE [replicate fallback].

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dtensor {

class DTensorSpec;

// Which mesh dim's groups run ring attention for distributed q, k, v of these specs
// ([..., heads, seq, head size]; NOTE [ring attention in the engine] in dispatch_attention.cc):
// mesh_dim -1 with `refusal` empty when no mesh dim shards the sequence, with `refusal` saying why
// when the sequence is sharded in a layout ring attention does not take (the rules compute it).
struct RingLayout {
  int64_t mesh_dim = -1;
  std::string refusal;
};
RingLayout ring_attention_mesh_dim(const DTensorSpec& q, const DTensorSpec& k,
                                   const DTensorSpec& v);

// Registers the kernel (idempotent, thread-safe). make_dtensor calls it.
void ensure_dispatch_installed();

// Strict mode: an op whose inputs would need an implicit redistribute throws instead, naming the
// redistribute to write (PropagateOptions::strict). Thread-local; nests.
class StrictModeGuard {
 public:
  explicit StrictModeGuard(bool enabled = true);
  ~StrictModeGuard();
  StrictModeGuard(const StrictModeGuard&) = delete;
  StrictModeGuard& operator=(const StrictModeGuard&) = delete;

 private:
  bool previous_;
};

// While alive, plain (non-0-dim) tensors mixed with distributed ones are read as Replicate.
class ReplicatePlainTensorsGuard {
 public:
  explicit ReplicatePlainTensorsGuard(bool enabled = true);
  ~ReplicatePlainTensorsGuard();
  ReplicatePlainTensorsGuard(const ReplicatePlainTensorsGuard&) = delete;
  ReplicatePlainTensorsGuard& operator=(const ReplicatePlainTensorsGuard&) = delete;

 private:
  bool previous_;
};

bool strict_mode_enabled();

// NOTE [caller locks and thread ranks]
// Ranks that are threads of one process wait for each other in collectives, so no rank may block
// in one while holding a lock the others need to reach it. Python's GIL is such a lock: torch's
// method bindings release it before dispatching, but the C++ getters of some Tensor properties
// (.mT, .mH, .T, ...) call the op with the GIL held, and the other ranks' threads then never get
// to the collective. A front end that has such a lock installs a release function: the kernel
// runs every call through it, and it runs `body(ctx)` with the lock released when the calling
// thread holds it (the Python module installs one for the GIL). Null (the default): direct call.
using CallerLockRelease = void (*)(void (*body)(void*), void* ctx);
void set_caller_lock_release(CallerLockRelease release);

// Calls per op that ran by the replicate fallback (NOTE [replicate fallback] in
// dispatch_fallback.cc), over the process, by ATen name.
std::map<std::string, int64_t> fallback_counts();
void reset_fallback_counts();
bool replicate_plain_tensors_enabled();

// What dispatching `op` ("aten::mm", "aten::sum.dim_IntList") on `args` (its arguments in schema
// order; trailing defaults may be left out) would do, without running it: the rule, the chosen
// input and output specs, the cost and each input's redistribute plan. Throws what dispatch
// would throw (unknown op, mismatched meshes, strict mode, ...).
std::string explain(const std::string& op, std::vector<c10::IValue> args);

}  // namespace dtensor
