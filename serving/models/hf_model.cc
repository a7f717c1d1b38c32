#include "serving/models/hf_model.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "base/error.h"
#include "dtensor/api.h"
#include "serving/models/attention.h"
#include "serving/models/hf_weights.h"
#include "serving/models/rope.h"

namespace dtensor::serving {

at::ScalarType dtype_from_name(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  fail("dtype must be float32, bfloat16 or float16, got '", name, "'");
}

namespace {

// The reference's RMS norm on replicated activations (one local computation).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& g, double eps) {
  auto fn = [eps](const std::vector<at::Tensor>& p) {
    const at::Tensor f = p[0].to(at::kFloat);
    return std::vector<at::Tensor>{
        p[1] * (f * at::rsqrt(f.pow(2).mean({-1}, true) + eps)).to(p[0].scalar_type())};
  };
  if (!api::is_dtensor(x)) return fn({x, g}).at(0);
  return api::local_map(fn, {x, g}, {{Replicate()}},
                        std::vector<Placements>{{Replicate()}, {Replicate()}},
                        /*redistribute_inputs=*/true)
      .at(0);
}

HfConfig checked_config(const std::string& dir, const std::optional<DeviceMesh>& mesh) {
  HfConfig c = read_hf_config(dir);
  if (mesh) {
    DTENSOR_CHECK(mesh->ndim() == 1, "HfModel: the tensor-parallel mesh must be 1-D");
    DTENSOR_CHECK(c.heads % mesh->size() == 0, dir, "/config.json: num_attention_heads ", c.heads,
                  " does not divide by the ", mesh->size(), " tensor-parallel ranks");
  }
  return c;
}

// The pool's blocks: the per-rank budget over one block's bytes on this rank (keys and values of
// every layer, this rank's kv heads). Every rank holds the same number of kv heads, so every
// rank gets the same count.
int64_t pool_blocks(const HfConfig& c, int64_t ranks, const HfModelOptions& o,
                    at::ScalarType dtype) {
  DTENSOR_CHECK(o.block_size > 0, "HfModel: block size must be positive, got ", o.block_size);
  const int64_t local_kv = kv_heads_sharded(c, ranks) ? c.kv_heads / ranks : c.kv_heads;
  const int64_t block_bytes = 2 * c.layers * local_kv * o.block_size * c.head_dim *
                              static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t blocks = o.kv_cache_bytes / block_bytes;
  DTENSOR_CHECK(blocks > 0, "HfModel: a KV cache budget of ", o.kv_cache_bytes,
                " bytes holds no block of ", block_bytes, " bytes (", o.block_size,
                " positions); raise --kv-cache-memory");
  return blocks;
}

}  // namespace

HfModel::HfModel(const std::string& dir, std::optional<DeviceMesh> mesh, HfModelOptions options)
    : config_(checked_config(dir, mesh)),
      mesh_(std::move(mesh)),
      device_(mesh_ ? mesh_->local_device() : options.device.value_or(c10::Device(at::kCPU))),
      options_(options),
      dtype_(options.dtype.value_or(dtype_from_name(config_.dtype))),
      max_context_(options.max_context > 0 ? options.max_context : config_.max_context()),
      tables_(pool_blocks(config_, mesh_ ? mesh_->size() : 1, options, dtype_), options.block_size,
              options.max_batch),
      lengths_(static_cast<size_t>(options.max_batch), 0) {
  DTENSOR_CHECK(options_.prefill_chunk > 0, "HfModel: prefill chunk must be positive, got ",
                options_.prefill_chunk);
  DTENSOR_CHECK(
      max_context_ <= config_.max_context(), dir, ": a context of ", max_context_,
      " exceeds the model's ", config_.max_context(),
      config_.sliding_window > 0 ? " (its sliding_window)" : " (max_position_embeddings)");
  weights_ = load_hf_weights(dir, config_, mesh_, dtype_, device_);
  inv_freq_ = rope_inv_freq(config_);
  const bool sharded = kv_heads_sharded(config_, mesh_ ? mesh_->size() : 1);
  const std::vector<int64_t> pool = {config_.kv_heads, tables_.num_blocks() * tables_.block_size(),
                                     config_.head_dim};
  const auto opts = at::TensorOptions().dtype(dtype_).device(device_);
  for (int64_t l = 0; l < config_.layers; ++l) {
    for (auto* pools : {&k_pools_, &v_pools_}) {
      pools->push_back(mesh_ ? api::zeros(pool, *mesh_, {sharded ? Shard(0) : Replicate()}, opts)
                             : at::zeros(pool, opts));
    }
  }
}

at::Tensor HfModel::w(const std::string& key) const {
  const auto it = weights_.find(key);
  return it == weights_.end() ? at::Tensor() : it->second;
}

at::Tensor HfModel::replicated(const at::Tensor& plain) const {
  const at::Tensor here = plain.to(device_);
  return mesh_ ? api::distribute_tensor(here, *mesh_, {Replicate()}) : here;
}

int HfModel::alloc_slot() {
  const int slot = tables_.alloc_slot();
  lengths_[slot] = 0;
  return slot;
}

void HfModel::free_slot(int slot) {
  tables_.free_slot(slot);
  lengths_[slot] = 0;
}

bool HfModel::can_reserve(int64_t tokens) const {
  return tokens <= max_context_ && tables_.can_reserve(tokens);
}

void HfModel::reserve(int slot, int64_t tokens) { tables_.reserve(slot, tokens); }

MemoryUse HfModel::memory() const {
  MemoryUse m;
  const auto local_bytes = [](const at::Tensor& t) {
    const at::Tensor l = api::is_dtensor(t) ? api::local(t) : t;
    return l.numel() * static_cast<int64_t>(l.element_size());
  };
  for (const auto& [key, t] : weights_) {
    m.weights_local += local_bytes(t);
    m.weights_total += t.numel() * static_cast<int64_t>(t.element_size());
  }
  for (const auto* pools : {&k_pools_, &v_pools_}) {
    for (const at::Tensor& p : *pools) m.kv_cache_local += local_bytes(p);
  }
  return m;
}

at::Tensor HfModel::forward(const std::vector<Sequence>& batch) { return run(batch, false); }
at::Tensor HfModel::forward_all(const std::vector<Sequence>& batch) { return run(batch, true); }

// NOTE [chunked prefill]: a sequence's new tokens enter in passes of at most prefill_chunk
// tokens each (every sequence of the batch advancing in the same pass), so a long prompt's
// activations ([chunk, hidden], and the scores [heads, chunk, context]) stay bounded; each
// chunk's keys and values are in the cache before the next chunk attends to them, which gives
// the same logits as one pass.
at::Tensor HfModel::run(const std::vector<Sequence>& batch, bool all_positions) {
  DTENSOR_CHECK(!batch.empty(), "HfModel::forward: empty batch");
  c10::InferenceMode inference;
  for (const Sequence& s : batch) {
    DTENSOR_CHECK(tables_.allocated(s.slot), "HfModel: slot ", s.slot, " is not allocated");
    DTENSOR_CHECK(!s.tokens.empty(), "HfModel: a sequence brings no token");
    DTENSOR_CHECK(s.start >= 0 && s.start <= lengths_[s.slot], "HfModel: slot ", s.slot, " holds ",
                  lengths_[s.slot], " positions; a sequence cannot start at ", s.start);
    const int64_t end = s.start + static_cast<int64_t>(s.tokens.size());
    DTENSOR_CHECK(end <= max_context_, "HfModel: positions ", s.start, "..", end - 1,
                  " exceed the context of ", max_context_, " positions");
    for (int64_t t : s.tokens) {
      DTENSOR_CHECK(t >= 0 && t < config_.vocab, "HfModel: token ", t,
                    " is outside the vocabulary of ", config_.vocab);
    }
  }
  const int64_t chunk = options_.prefill_chunk;
  std::vector<at::Tensor> rows(batch.size());  // per sequence: its logits rows
  std::vector<std::vector<at::Tensor>> pieces(batch.size());
  for (int64_t done = 0;; done += chunk) {
    std::vector<Sequence> part;
    std::vector<size_t> which;
    for (size_t i = 0; i < batch.size(); ++i) {
      const int64_t n = static_cast<int64_t>(batch[i].tokens.size());
      if (done >= n) continue;
      const int64_t take = std::min(chunk, n - done);
      part.push_back({batch[i].slot,
                      std::vector<int64_t>(batch[i].tokens.begin() + done,
                                           batch[i].tokens.begin() + done + take),
                      batch[i].start + done});
      which.push_back(i);
    }
    if (part.empty()) break;
    const at::Tensor logits = pass(part, all_positions);
    int64_t row = 0;
    for (size_t j = 0; j < part.size(); ++j) {
      const int64_t n = all_positions ? static_cast<int64_t>(part[j].tokens.size()) : 1;
      const at::Tensor mine = logits.narrow(0, row, n);
      row += n;
      if (all_positions) {
        pieces[which[j]].push_back(mine);
      } else {
        rows[which[j]] = mine;  // the last chunk's last position wins
      }
    }
  }
  if (all_positions) {
    for (size_t i = 0; i < batch.size(); ++i) rows[i] = at::cat(pieces[i], 0);
  }
  return at::cat(rows, 0);
}

at::Tensor HfModel::pass(const std::vector<Sequence>& batch, bool all_positions) {
  const HfConfig& c = config_;
  PackedBatch b;
  std::vector<int64_t> tokens, positions, write_rows, last;
  for (const Sequence& s : batch) {
    const int64_t n = static_cast<int64_t>(s.tokens.size()), end = s.start + n;
    tables_.grow(s.slot, end);
    b.begin.push_back(static_cast<int64_t>(tokens.size()));
    b.count.push_back(n);
    b.start.push_back(s.start);
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
    for (int64_t p = s.start; p < end; ++p) positions.push_back(p);
    const auto rows = tables_.rows(s.slot, s.start, end);
    write_rows.insert(write_rows.end(), rows.begin(), rows.end());
    b.read_rows.push_back(at::tensor(tables_.rows(s.slot, 0, end), at::kLong).to(device_));
    last.push_back(static_cast<int64_t>(tokens.size()) - 1);
    lengths_[s.slot] = std::max(lengths_[s.slot], end);
  }
  b.write_rows = at::tensor(write_rows, at::kLong).to(device_);
  auto [cos, sin] = rope_cos_sin(inv_freq_, positions, dtype_);
  b.cos = cos.to(device_);
  b.sin = sin.to(device_);
  AttentionShape shape;
  shape.heads = c.heads;
  shape.kv_heads = c.kv_heads;
  shape.head_dim = c.head_dim;
  shape.eps = c.eps;
  shape.kv_sharded = kv_heads_sharded(c, mesh_ ? mesh_->size() : 1);

  const at::Tensor ids = replicated(at::tensor(tokens, at::kLong));
  at::Tensor h = at::embedding(w("model.embed_tokens.weight"), ids);  // [T, D]
  if (mesh_) h = api::redistribute(h, {Replicate()});  // vocab-sharded rows: a Partial sum
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const at::Tensor x = rms_norm(h, w(p + "input_layernorm.weight"), c.eps);
    AttentionInputs in;
    in.q = at::linear(x, w(p + "self_attn.q_proj.weight"));
    in.k = at::linear(x, w(p + "self_attn.k_proj.weight"));
    in.v = at::linear(x, w(p + "self_attn.v_proj.weight"));
    in.q_bias = w(p + "self_attn.q_proj.bias");
    in.k_bias = w(p + "self_attn.k_proj.bias");
    in.v_bias = w(p + "self_attn.v_proj.bias");
    in.q_norm = w(p + "self_attn.q_norm.weight");
    in.k_norm = w(p + "self_attn.k_norm.weight");
    in.k_pool = k_pools_[l];
    in.v_pool = v_pools_[l];
    const at::Tensor ctx = paged_attention(in, b, shape, mesh_);  // [T, H*hd], Shard(1)
    h = h + at::linear(ctx, w(p + "self_attn.o_proj.weight"));
    const at::Tensor y = rms_norm(h, w(p + "post_attention_layernorm.weight"), c.eps);
    const at::Tensor mlp = at::linear(at::silu(at::linear(y, w(p + "mlp.gate_proj.weight"))) *
                                          at::linear(y, w(p + "mlp.up_proj.weight")),
                                      w(p + "mlp.down_proj.weight"));
    h = h + mlp;
  }
  if (!all_positions) {
    // Each sequence's last row, picked locally from the replicated rows.
    const at::Tensor idx = at::tensor(last, at::kLong).to(device_);
    auto pick = [&](const std::vector<at::Tensor>& p) {
      return std::vector<at::Tensor>{p[0].index_select(0, idx)};
    };
    h = mesh_ ? api::local_map(pick, {h}, {{Replicate()}}, std::vector<Placements>{{Replicate()}},
                               /*redistribute_inputs=*/true)
                    .at(0)
              : pick({h}).at(0);
  }
  const at::Tensor head =
      c.tie_word_embeddings ? w("model.embed_tokens.weight") : w("lm_head.weight");
  const at::Tensor logits = at::linear(rms_norm(h, w("model.norm.weight"), c.eps), head);
  return (mesh_ ? api::full_tensor(logits) : logits).to(at::kCPU).to(at::kFloat).contiguous();
}

}  // namespace dtensor::serving
