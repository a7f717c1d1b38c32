// What the dispatch kernel knows of an operator before its first call: its table entry and what
// its schema says about its arguments (OpInfo), made once per operator.

#include <absl/container/flat_hash_map.h>
#include <absl/synchronization/mutex.h>

#include <memory>
#include <string>

#include "base/stable_hash.h"
#include "dtensor/dispatch_internal.h"

namespace dtensor::dispatch_detail {
namespace {

// Arguments torch 1.13's schemas do not mark as written although the kernels write them:
// rrelu_with_noise's noise, and the running statistics of the batch norm kernels (annotated
// only from torch 2.0's _native_batch_norm_legit). Without this the replicate fallback would
// update a gathered copy and drop it.
bool writes_unannotated(const std::string& op, const std::string& arg) {
  if (op == "aten::rrelu_with_noise") return arg == "noise";
  const bool batch_norm = op == "aten::native_batch_norm" || op == "aten::cudnn_batch_norm" ||
                          op == "aten::miopen_batch_norm" || op == "aten::native_batch_norm.out";
  return batch_norm && (arg == "running_mean" || arg == "running_var");
}

std::unique_ptr<OpInfo> make_info(const c10::OperatorHandle& op) {
  auto info = std::make_unique<OpInfo>();
  const c10::FunctionSchema& schema = op.schema();
  info->name = op_name(schema.operator_name());
  info->name_hash = fnv1a(info->name);
  const sharding::OpEntry* entry = sharding::find_op(info->name);
  info->entry.store(entry, std::memory_order_release);
  info->args = OpArgs(entry, schema);
  if (entry != nullptr) info->execution = entry->execution;
  info->per_element = entry == nullptr && info->name.rfind("aten::_foreach_", 0) == 0;
  info->amp_unscale = info->name == "aten::_amp_foreach_non_finite_check_and_unscale_";
  info->same_size = info->name == "aten::is_same_size";
  const auto& args = schema.arguments();
  info->is_out.assign(args.size(), false);
  info->is_scalar.assign(args.size(), false);
  for (size_t i = 0; i < args.size(); ++i) {
    info->is_scalar[i] = args[i].type()->kind() == c10::TypeKind::NumberType;
    const c10::AliasInfo* a = args[i].alias_info();
    info->is_out[i] = a != nullptr && a->isWrite() && args[i].kwarg_only();
    if (args[i].name() == "generator") info->generator_arg = static_cast<int>(i);
    if (args[i].name() == "pin_memory") info->pin_memory_arg = static_cast<int>(i);
  }
  for (const c10::Argument& r : schema.returns()) {
    int writes = -1;
    const c10::AliasInfo* ra = r.alias_info();
    if (ra != nullptr && ra->isWrite()) {
      for (size_t i = 0; i < args.size(); ++i) {
        const c10::AliasInfo* a = args[i].alias_info();
        if (a != nullptr && a->isWrite() && a->beforeSets() == ra->beforeSets()) {
          writes = static_cast<int>(i);
        }
      }
    }
    info->return_alias.push_back(writes);
    info->returns_view.push_back(ra != nullptr && !ra->isWrite());
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* a = args[i].alias_info();
    if ((a != nullptr && a->isWrite()) || writes_unannotated(info->name, args[i].name())) {
      info->written.push_back(static_cast<int>(i));
    }
  }
  return info;
}

}  // namespace

std::string op_name(const c10::OperatorName& n) {
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

// Per-operator information, interned by schema for the process (an interning table, not a cache:
// NOTE [caches]; one entry per operator ever called), with a per-thread front map that takes no
// lock.
const OpInfo& info_for(const c10::OperatorHandle& op) {
  thread_local absl::flat_hash_map<const void*, const OpInfo*> local_cache;
  const void* key = &op.schema();
  const auto hit = local_cache.find(key);
  if (hit != local_cache.end()) return *hit->second;
  static absl::Mutex mu;
  static auto* shared = new absl::flat_hash_map<const void*, std::unique_ptr<OpInfo>>();
  absl::MutexLock lock(&mu);
  auto& slot = (*shared)[key];
  if (!slot) slot = make_info(op);
  local_cache.emplace(key, slot.get());
  return *slot;
}

}  // namespace dtensor::dispatch_detail
