#pragma once
// The demo's Llama-style model (examples/llama_model.py: embedding, RMS norm, rotary attention,
// SwiGLU MLP, head; one block) for inference, written with plain ATen calls on distributed
// tensors, with a KV cache sharded by heads. Weights load from a sharded checkpoint (any saved
// layout and rank count) onto this model's own mesh.
//
//   Llama model(LlamaConfig{}, mesh, /*max_batch=*/8);   // std::nullopt: one process, plain
//   model.load("/ckpt/llama");
//   int slot = model.alloc_slot();
//   at::Tensor logits = model.forward({{slot, prompt, 0}});          // prefill: [1, vocab]
//   logits = model.forward({{slot, {next}, (int64_t)prompt.size()}}); // decode one token
//
// NOTE [serving tensor parallelism]
// Megatron's layout, as examples/llama_model.py's tp_plan gives it: wq/wk/wv/w1/w3 Shard(0)
// (column-wise: each rank computes its heads and its hidden units), wo/w2 Shard(1) (row-wise:
// partial sums, reduced at the residual add), tok_embeddings Shard(0) (vocab rows: a Partial
// output), output Shard(0) (vocab-sharded logits, gathered at the end), norms replicated. The
// engine plans every collective from those layouts; the code is the one-process code. The KV
// cache is [heads, max_batch, max_seq, head_dim] Shard(0): each rank holds its heads only, for
// every slot, and attention never leaves the rank (heads are independent).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "device_mesh/device_mesh.h"
#include "layout/placement.h"
#include "serving/models/model.h"

namespace dtensor::serving {

struct LlamaConfig {
  int64_t vocab = 512;
  int64_t dim = 128;
  int64_t heads = 8;
  int64_t hidden = 384;
  int64_t max_seq = 256;
  double eps = 1e-6;
  double rope_theta = 10000.0;
};

// The checkpoint keys (the Python state dict's) with their global shapes and their
// tensor-parallel placements on a 1-D mesh (NOTE [serving tensor parallelism]).
std::map<std::string, std::vector<int64_t>> llama_shapes(const LlamaConfig& config);
std::map<std::string, Placement> llama_placements();

class Llama : public Model {
 public:
  // `mesh`: a 1-D tensor-parallel mesh over the current world (heads and hidden must divide
  // evenly by its size), or std::nullopt for one process and plain tensors. The weights, the
  // cache and every step's tensors live on the mesh's device (NOTE [mesh device]), or without
  // a mesh on `device` (the CPU by default). Weights start at zero; load() fills them.
  Llama(const LlamaConfig& config, std::optional<DeviceMesh> mesh, int64_t max_batch,
        std::optional<c10::Device> device = std::nullopt);

  // Loads the weights from a checkpoint directory (every rank of the mesh calls it).
  void load(const std::string& dir);
  // The weights by checkpoint key (distributed when there is a mesh).
  const std::map<std::string, at::Tensor>& weights() const { return weights_; }

  // Cache slots: alloc_slot throws when all max_batch slots are taken.
  int alloc_slot() override;
  void free_slot(int slot) override;

  // Appends each sequence's new positions to its slot's cache and returns the last position's
  // logits of each sequence: a plain float [n, vocab] CPU tensor (sampling reads it there: one
  // device-to-host copy per step on a GPU), equal on every rank. All ranks call
  // it with the same batch. When every sequence brings exactly one token the call is one batched
  // decode (NOTE [batched decode] in llama.cc); otherwise each sequence runs alone.
  at::Tensor forward(const std::vector<Sequence>& batch) override;

  // A slot's cache: [heads, max_seq, head_dim] (distributed Shard(0) when there is a mesh).
  at::Tensor k_cache(int slot) const;
  at::Tensor v_cache(int slot) const;

  const LlamaConfig& config() const { return config_; }
  // Whether the weights are distributed tensors (a mesh was given).
  bool distributed() const { return mesh_.has_value(); }
  c10::Device device() const override { return device_; }
  int64_t vocab() const override { return config_.vocab; }
  int64_t max_context() const override { return config_.max_seq; }
  MemoryUse memory() const override;

 private:
  // A CPU-built tensor (token ids, positions, masks) on the model's device, replicated when
  // there is a mesh.
  at::Tensor replicated(const at::Tensor& plain) const;
  at::Tensor on_device(const at::Tensor& plain) const { return plain.to(device_); }
  at::Tensor rope(const at::Tensor& x, const std::vector<int64_t>& positions, bool per_batch) const;
  at::Tensor block_to_logits(const at::Tensor& h, const at::Tensor& ctx_last) const;
  at::Tensor prefill(const Sequence& seq);
  at::Tensor decode(const std::vector<Sequence>& batch);

  LlamaConfig config_;
  std::optional<DeviceMesh> mesh_;
  c10::Device device_;
  int64_t max_batch_;
  std::map<std::string, at::Tensor> weights_;
  at::Tensor k_cache_, v_cache_;    // [heads, max_batch, max_seq, head_dim]
  at::Tensor rope_cos_, rope_sin_;  // [max_seq, head_dim], replicated (NOTE [rotary tables])
  std::vector<bool> used_;
};

// The greedy choice: the index of the largest logit of a 1-D float tensor; on an exact tie the
// lowest index (torch.argmax's rule), on every rank alike.
int64_t greedy_token(const at::Tensor& logits);

// Greedy generation of max_new_tokens after `prompt` in a fresh slot (freed at the end): one
// prefill, then one decode per token. recompute: instead, every step runs the whole sequence
// through a fresh slot (no cache reuse; the reference the cache is tested against).
std::vector<int64_t> greedy_generate(Llama& model, const std::vector<int64_t>& prompt,
                                     int64_t max_new_tokens, bool recompute = false);

}  // namespace dtensor::serving
