#include "tools/llama_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "base/error.h"
#include "collectives/launch_env.h"
#include "dtensor/api.h"

ABSL_FLAG(int64_t, vocab, 512, "model: vocabulary size (the demo's by default)");
ABSL_FLAG(int64_t, dim, 128, "model: dim");
ABSL_FLAG(int64_t, heads, 8, "model: attention heads");
ABSL_FLAG(int64_t, hidden, 384, "model: MLP hidden dim");
ABSL_FLAG(std::string, device, "cpu", "where the model runs: cpu or cuda");

namespace dtensor::tools {

serving::LlamaConfig llama_config_from_flags(int64_t max_seq) {
  serving::LlamaConfig config;
  config.vocab = absl::GetFlag(FLAGS_vocab);
  config.dim = absl::GetFlag(FLAGS_dim);
  config.heads = absl::GetFlag(FLAGS_heads);
  config.hidden = absl::GetFlag(FLAGS_hidden);
  config.max_seq = max_seq;
  return config;
}

c10::DeviceType device_type_from_flags() {
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device == "cpu") return c10::DeviceType::CPU;
  if (device == "cuda") return c10::DeviceType::CUDA;
  throw Error("--device must be cpu or cuda, got '" + device + "'");
}

LaunchedRanks join_launched_ranks(c10::DeviceType type) {
  LaunchedRanks r;
  collectives::select_local_device(type);  // before any communicator is made
  if (collectives::launch_env_from_environ()) {
    r.ctx = api::init_from_env(collectives::default_backend(type));
    if (r.ctx->world_size() > 1) r.mesh = api::init_device_mesh({r.ctx->world_size()}, {}, type);
  }
  r.device = r.mesh ? r.mesh->local_device() : mesh_device(type);
  return r;
}

}  // namespace dtensor::tools
