#include "tools/llama_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(int64_t, vocab, 512, "model: vocabulary size (the demo's by default)");
ABSL_FLAG(int64_t, dim, 128, "model: dim");
ABSL_FLAG(int64_t, heads, 8, "model: attention heads");
ABSL_FLAG(int64_t, hidden, 384, "model: MLP hidden dim");

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

}  // namespace dtensor::tools
