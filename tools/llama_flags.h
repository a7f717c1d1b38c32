#pragma once
// What every tool that builds the serving Llama shares: the model-size flags (--vocab --dim
// --heads --hidden, the demo's sizes by default), --device (cpu or cuda), and joining the
// launched ranks on that device: ./x serve (serve.cc) and llama_generate.

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/declare.h"
#include "collectives/rank_context.h"
#include "device_mesh/device_mesh.h"
#include "serving/llama.h"

ABSL_DECLARE_FLAG(std::string, device);

namespace dtensor::tools {

// LlamaConfig from the flags, with `max_seq` positions of KV cache per slot.
serving::LlamaConfig llama_config_from_flags(int64_t max_seq);

// The --device flag's device type; throws dtensor::Error naming the value when it is neither
// cpu nor cuda.
c10::DeviceType device_type_from_flags();

// This process's ranks on `type`: its device of that type selected (LOCAL_RANK % devices,
// collectives::select_local_device); when launched (./x launch, torchrun) the job joined on
// collectives::default_backend(type) and, for several ranks, a 1-D mesh over them; `device`
// is where the model's tensors live. Throws (naming the missing device) where there is none.
struct LaunchedRanks {
  std::shared_ptr<collectives::RankContext> ctx;  // null when not launched
  std::optional<DeviceMesh> mesh;                 // several launched ranks
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  int64_t world() const { return ctx ? ctx->world_size() : 1; }
  int64_t rank() const { return ctx ? ctx->rank() : 0; }
};
LaunchedRanks join_launched_ranks(c10::DeviceType type);

}  // namespace dtensor::tools
