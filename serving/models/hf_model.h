#pragma once
// A Hugging Face decoder (Llama, Mistral, Qwen2, Qwen3; hf_config.h) served on distributed
// tensors: the one-process ATen forward of the reference on weights laid out for tensor
// parallelism (NOTE [HF tensor parallelism] in hf_weights.h), the engine planning every
// collective; a paged KV cache (NOTE [paged KV cache] in kv_cache.h); long prompts prefilled in
// chunks.
//
//   HfModel model("/models/Qwen2.5-0.5B", mesh, HfModelOptions{});  // std::nullopt: one process
//   int slot = model.alloc_slot();
//   at::Tensor logits = model.forward({{slot, prompt, 0}});           // [1, vocab]
//   logits = model.forward({{slot, {next}, (int64_t)prompt.size()}});

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "device_mesh/device_mesh.h"
#include "serving/models/hf_config.h"
#include "serving/models/kv_cache.h"
#include "serving/models/model.h"

namespace dtensor::serving {

struct HfModelOptions {
  // The weights' and activations' dtype; default: the dtype config.json names.
  std::optional<at::ScalarType> dtype;
  int64_t max_batch = 8;  // sequences at once (cache slots)
  // Bytes of KV cache per rank (keys and values of every layer); the pool's block count follows.
  int64_t kv_cache_bytes = int64_t{256} << 20;
  int64_t block_size = 16;  // positions per cache block
  // Longest sequence; 0: the config's (max_position_embeddings, capped at a sliding window).
  int64_t max_context = 0;
  // A sequence's new tokens run through the model in pieces of at most this many.
  int64_t prefill_chunk = 512;
  // Without a mesh: where the model lives (the CPU by default).
  std::optional<c10::Device> device;
};

class HfModel : public Model {
 public:
  // Reads `dir`/config.json and the weights. `mesh`: a 1-D tensor-parallel mesh over the current
  // world (the attention heads must divide by its size), or std::nullopt for one process.
  HfModel(const std::string& dir, std::optional<DeviceMesh> mesh, HfModelOptions options);

  int alloc_slot() override;
  void free_slot(int slot) override;
  at::Tensor forward(const std::vector<Sequence>& batch) override;
  // The logits of every new position of every sequence, in batch order: [sum of tokens, vocab].
  at::Tensor forward_all(const std::vector<Sequence>& batch);
  bool can_reserve(int64_t tokens) const override;
  void reserve(int slot, int64_t tokens) override;

  int64_t vocab() const override { return config_.vocab; }
  int64_t max_context() const override { return max_context_; }
  c10::Device device() const override { return device_; }
  MemoryUse memory() const override;

  const HfConfig& config() const { return config_; }
  at::ScalarType dtype() const { return dtype_; }
  const std::map<std::string, at::Tensor>& weights() const { return weights_; }
  const BlockTables& block_tables() const { return tables_; }

 private:
  at::Tensor run(const std::vector<Sequence>& batch, bool all_positions);
  // One pass of every sequence's tokens (each at most prefill_chunk); [rows, vocab] logits.
  at::Tensor pass(const std::vector<Sequence>& batch, bool all_positions);
  at::Tensor replicated(const at::Tensor& plain) const;
  at::Tensor w(const std::string& key) const;

  HfConfig config_;
  std::optional<DeviceMesh> mesh_;
  c10::Device device_;
  HfModelOptions options_;
  at::ScalarType dtype_;
  int64_t max_context_;
  std::map<std::string, at::Tensor> weights_;
  at::Tensor inv_freq_;
  BlockTables tables_;
  std::vector<at::Tensor> k_pools_, v_pools_;  // per layer [kv_heads, blocks * block_size, hd]
  std::vector<int64_t> lengths_;               // positions cached per slot
};

// "float32" / "bfloat16" / "float16" (config.json's and --dtype's spellings).
at::ScalarType dtype_from_name(const std::string& name);

}  // namespace dtensor::serving
