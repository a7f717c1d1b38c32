#include "sharding_prop/cost_model.h"

namespace dtensor {

std::string_view comm_kind_name(CommKind kind) {
  switch (kind) {
    case CommKind::kAllGather:
      return "all_gather";
    case CommKind::kReduceScatter:
      return "reduce_scatter";
    case CommKind::kAllReduce:
      return "all_reduce";
    case CommKind::kAllToAll:
      return "all_to_all";
    case CommKind::kAllToAllV:
      return "all_to_all_v";
    case CommKind::kLocalChunk:
      return "local_chunk";
    case CommKind::kPartition:
      return "partition";
  }
  return "?";
}

double CostModel::step_cost(CommKind kind, int64_t group_size, int64_t bytes) const {
  const double b = static_cast<double>(bytes);
  const double local = b / (local_gbs * 1e3);  // GB/s = 1e3 bytes/us
  if (kind == CommKind::kLocalChunk || kind == CommKind::kPartition) return local;
  if (group_size <= 1) return 0.0;
  const double n = static_cast<double>(group_size);
  double bus = 0;
  switch (kind) {
    case CommKind::kAllReduce:
      bus = 2 * b * (n - 1) / n;
      break;
    case CommKind::kAllGather:
    case CommKind::kReduceScatter:
    case CommKind::kAllToAll:
      bus = b * (n - 1) / n;
      break;
    case CommKind::kAllToAllV:
      bus = b;
      break;
    default:
      break;
  }
  return latency_us + bus / (bandwidth_gbs * 1e3);
}

double CostModel::compute_cost(double flops) const { return flops / flops_per_us; }

const CostModel& default_cost_model() {
  static const CostModel model;
  return model;
}

const CostModel& cost_model_for(c10::DeviceType device) {
  // NOTE [cost model per device]: cuda_ipc's figures.
  static const CostModel cuda{/*latency_us=*/60.0, /*bandwidth_gbs=*/41.9, /*local_gbs=*/1806.0,
                              /*flops_per_us=*/50e6};
  return device == c10::DeviceType::CUDA ? cuda : default_cost_model();
}

}  // namespace dtensor
