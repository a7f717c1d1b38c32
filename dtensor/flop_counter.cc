#include "dtensor/flop_counter.h"

#include <algorithm>

namespace dtensor {
namespace {

thread_local std::vector<FlopCounter*> t_counters;

std::vector<TensorMeta> metas_of(const std::vector<at::Tensor>& tensors) {
  std::vector<TensorMeta> metas;
  metas.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    metas.push_back(TensorMeta::make(t.sizes().vec(), t.scalar_type()));
  }
  return metas;
}

}  // namespace

FlopCounter::FlopCounter() { t_counters.push_back(this); }

FlopCounter::~FlopCounter() { stop(); }

void FlopCounter::stop() {
  if (!active_) return;
  active_ = false;
  const auto it = std::find(t_counters.begin(), t_counters.end(), this);
  if (it != t_counters.end()) t_counters.erase(it);
}

void FlopCounter::add(const std::string& op, double flops) {
  by_op_[op] += flops;
  total_ += flops;
}

bool flop_counting() { return !t_counters.empty(); }

double op_flops(const sharding::OpEntry& entry, const std::vector<TensorMeta>& metas,
                const sharding::LayoutArgs& args) {
  if (entry.flops == sharding::Flops::kNone) return 0;
  return sharding::rule_flops(entry.flops, entry.build(metas, args).rule);
}

double op_flops(const std::string& op, const std::vector<at::Tensor>& tensors) {
  const sharding::OpEntry* entry = sharding::find_op(op);
  if (entry == nullptr || !entry->layout_args.empty()) return 0;
  return op_flops(*entry, metas_of(tensors));
}

void count_flops(const sharding::OpEntry& entry, const std::vector<at::Tensor>& locals,
                 const sharding::LayoutArgs& args) {
  if (entry.flops == sharding::Flops::kNone) return;
  const double flops = op_flops(entry, metas_of(locals), args);
  for (FlopCounter* c : t_counters) c->add(entry.name, flops);
}

}  // namespace dtensor
