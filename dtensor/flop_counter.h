#pragma once
// NOTE [FLOP counter]
// A deterministic count of the floating-point work each rank runs: no timing, only shapes. While
// a FlopCounter is alive on a thread, the dispatch kernel (dispatch.cc) adds, for every op it runs
// on local pieces, the FLOPs of that local call by the op's table entry (OpEntry::flops) and its
// rule built on the local pieces' shapes: the same formula the propagator prices candidates with
// (sharding::rule_flops, NOTE [compute in the cost model]), so a count and a price never
// disagree. op_flops() applies it to plain tensors, so a single-process run counts the same way
// (dtensor.debug.FlopCounterMode does both). Counted: ops with a table entry that counts FLOPs
// (the matmul family: 2 x the product of its factors; elementwise ops: one per output element);
// ops that run by the replicate fallback or a special execution (random draws, masked embedding)
// are not. Nested counters all count; ranks that are threads each count their own (a counter
// belongs to the thread that made it, like collectives::CommCounter).

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "sharding_prop/ops/registry.h"

namespace dtensor {

class FlopCounter {
 public:
  FlopCounter();  // starts counting on this thread
  ~FlopCounter();
  FlopCounter(const FlopCounter&) = delete;
  FlopCounter& operator=(const FlopCounter&) = delete;

  // Stops counting (idempotent; the destructor calls it). Call on the thread that made it.
  void stop();
  double total() const { return total_; }
  // FLOPs per op, by ATen name ("aten::mm").
  const std::map<std::string, double>& by_op() const { return by_op_; }
  void add(const std::string& op, double flops);

 private:
  std::map<std::string, double> by_op_;
  double total_ = 0;
  bool active_ = true;
};

// Whether a FlopCounter is alive on this thread (one thread-local read).
bool flop_counting();
// The FLOPs of one call of `entry` on tensors of `metas` (in the rule's input order) with these
// layout arguments; 0 for entries that count none.
double op_flops(const sharding::OpEntry& entry, const std::vector<TensorMeta>& metas,
                const sharding::LayoutArgs& args = {});
// The same for the op named `op` ("aten::mm") on plain `tensors` (its tensor arguments in order)
// with no layout arguments; 0 for ops with no entry, none counted, or layout arguments.
double op_flops(const std::string& op, const std::vector<at::Tensor>& tensors);
// Adds one local call to every counter alive on this thread.
void count_flops(const sharding::OpEntry& entry, const std::vector<at::Tensor>& locals,
                 const sharding::LayoutArgs& args);

}  // namespace dtensor
