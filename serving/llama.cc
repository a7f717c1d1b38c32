#include "serving/llama.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "dtensor/api.h"

namespace dtensor::serving {

std::map<std::string, std::vector<int64_t>> llama_shapes(const LlamaConfig& c) {
  return {{"tok_embeddings.weight", {c.vocab, c.dim}},
          {"attention_norm.weight", {c.dim}},
          {"attention.wq.weight", {c.dim, c.dim}},
          {"attention.wk.weight", {c.dim, c.dim}},
          {"attention.wv.weight", {c.dim, c.dim}},
          {"attention.wo.weight", {c.dim, c.dim}},
          {"ffn_norm.weight", {c.dim}},
          {"feed_forward.w1.weight", {c.hidden, c.dim}},
          {"feed_forward.w2.weight", {c.dim, c.hidden}},
          {"feed_forward.w3.weight", {c.hidden, c.dim}},
          {"norm.weight", {c.dim}},
          {"output.weight", {c.vocab, c.dim}}};
}

std::map<std::string, Placement> llama_placements() {
  std::map<std::string, Placement> out;
  for (const char* k : {"attention_norm.weight", "ffn_norm.weight", "norm.weight"}) {
    out.emplace(k, Replicate());
  }
  for (const char* k : {"tok_embeddings.weight", "attention.wq.weight", "attention.wk.weight",
                        "attention.wv.weight", "feed_forward.w1.weight", "feed_forward.w3.weight",
                        "output.weight"}) {
    out.emplace(k, Shard(0));
  }
  for (const char* k : {"attention.wo.weight", "feed_forward.w2.weight"}) {
    out.emplace(k, Shard(1));
  }
  return out;
}

namespace {

using Pieces = std::vector<at::Tensor>;

// NOTE [local chains]: the elementwise chains of a step (RMS norm on replicated activations,
// RoPE on head-sharded q/k) run as one local computation each (api::local_map): every rank
// computes exactly its piece, with one engine entry per tensor instead of propagation and
// dispatch for each of the chain's ~8 ops (the decode step's engine time was ~100 such ops).
// Inputs not yet in the given placements are moved to them first. Plain tensors (no mesh) run
// the same function directly.
at::Tensor on_pieces(const std::function<at::Tensor(const Pieces&)>& fn, const Pieces& inputs,
                     const std::vector<Placements>& in, const Placements& out) {
  if (!api::is_dtensor(inputs.at(0))) return fn(inputs);
  return api::local_map([&](const Pieces& p) { return Pieces{fn(p)}; }, inputs, {out}, in,
                        /*redistribute_inputs=*/true)
      .at(0);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& g, double eps) {
  return on_pieces(
      [eps](const Pieces& p) {
        return p[0] * at::rsqrt(p[0].pow(2).mean({-1}, true) + eps) * p[1];
      },
      {x, g}, {{Replicate()}, {Replicate()}}, {Replicate()});
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({at::neg(x.narrow(-1, half, half)), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

Llama::Llama(const LlamaConfig& config, std::optional<DeviceMesh> mesh, int64_t max_batch,
             std::optional<c10::Device> device)
    : config_(config),
      mesh_(std::move(mesh)),
      device_(mesh_ ? mesh_->local_device() : device.value_or(c10::Device(at::kCPU))),
      max_batch_(max_batch),
      used_(max_batch, false) {
  DTENSOR_CHECK(!mesh_ || !device || device->type() == device_.type(), "Llama: device ",
                device->str(), " differs from the mesh's device type ", device_.str());
  DTENSOR_CHECK(config_.dim % config_.heads == 0, "Llama: dim ", config_.dim,
                " is not a multiple of heads ", config_.heads);
  DTENSOR_CHECK(max_batch_ > 0, "Llama: max_batch must be positive, got ", max_batch_);
  if (mesh_) {
    DTENSOR_CHECK(mesh_->ndim() == 1, "Llama: the tensor-parallel mesh must be 1-D");
    const int64_t n = mesh_->size();
    DTENSOR_CHECK(config_.heads % n == 0 && config_.hidden % n == 0 && config_.vocab % n == 0,
                  "Llama: heads ", config_.heads, ", hidden ", config_.hidden, " and vocab ",
                  config_.vocab, " must divide by the ", n, " ranks");
  }
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device_);
  const auto placements = llama_placements();
  for (const auto& [key, shape] : llama_shapes(config_)) {
    weights_[key] =
        mesh_ ? api::zeros(shape, *mesh_, {placements.at(key)}, opts) : at::zeros(shape, opts);
  }
  const std::vector<int64_t> cache = {config_.heads, max_batch_, config_.max_seq,
                                      config_.dim / config_.heads};
  for (at::Tensor* c : {&k_cache_, &v_cache_}) {
    *c = mesh_ ? api::zeros(cache, *mesh_, {Shard(0)}, opts) : at::zeros(cache, opts);
  }
  // NOTE [rotary tables]
  const int64_t hd = config_.dim / config_.heads;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor inv_freq =
      at::pow(at::Scalar(config_.rope_theta), at::arange(0, hd, 2, f64) / hd).reciprocal();
  const at::Tensor angles = at::outer(at::arange(config_.max_seq, f64), inv_freq);
  const at::Tensor emb = at::cat({angles, angles}, -1);
  rope_cos_ = replicated(emb.cos().to(at::kFloat));  // computed on the CPU, then moved
  rope_sin_ = replicated(emb.sin().to(at::kFloat));
}

void Llama::load(const std::string& dir) {
  std::map<std::string, checkpoint::Value> state(weights_.begin(), weights_.end());
  checkpoint::load(state, dir);  // fills the tensors of weights_ in place
}

int Llama::alloc_slot() {
  for (int64_t s = 0; s < max_batch_; ++s) {
    if (!used_[s]) {
      used_[s] = true;
      return static_cast<int>(s);
    }
  }
  fail("Llama: all ", max_batch_, " cache slots are in use");
}

void Llama::free_slot(int slot) {
  DTENSOR_CHECK(slot >= 0 && slot < max_batch_ && used_[slot], "Llama: slot ", slot,
                " is not allocated");
  used_[slot] = false;
}

MemoryUse Llama::memory() const {
  const auto local_bytes = [](const at::Tensor& t) {
    const at::Tensor l = api::is_dtensor(t) ? api::local(t) : t;
    return l.numel() * static_cast<int64_t>(l.element_size());
  };
  MemoryUse m;
  for (const auto& [key, w] : weights_) {
    m.weights_local += local_bytes(w);
    m.weights_total += w.numel() * static_cast<int64_t>(w.element_size());
  }
  m.kv_cache_local = local_bytes(k_cache_) + local_bytes(v_cache_);
  return m;
}

at::Tensor Llama::k_cache(int slot) const { return k_cache_.select(1, slot); }
at::Tensor Llama::v_cache(int slot) const { return v_cache_.select(1, slot); }

at::Tensor Llama::replicated(const at::Tensor& plain) const {
  // No source rank: every rank holds the same values, nothing is communicated.
  const at::Tensor here = on_device(plain);
  return mesh_ ? api::distribute_tensor(here, *mesh_, {Replicate()}) : here;
}

// NOTE [rotary tables]
// cos/sin are computed in float64 and rounded to float32, here and in examples/llama_model.py:
// float32 transcendental kernels may differ by an ulp between their vectorized body and scalar
// tail, so the same position could get different values in tables of different lengths; in
// float64 such a difference vanishes in the rounding, and both sides get identical tables.
// The tables cover every position once, at construction; a step selects its positions' rows.
at::Tensor Llama::rope(const at::Tensor& x, const std::vector<int64_t>& positions,
                       bool per_batch) const {
  const int64_t hd = x.size(-1), m = static_cast<int64_t>(positions.size());
  // prefill: [S, hd] against [H, 1, S, hd]; batched decode: [n, 1, hd] against [H, n, 1, hd].
  const std::vector<int64_t> shape =
      per_batch ? std::vector<int64_t>{m, 1, hd} : std::vector<int64_t>{m, hd};
  // x's heads are sharded, the tables replicated, the positions a plain tensor (NOTE [local
  // chains]).
  return on_pieces(
      [&](const Pieces& p) {
        const at::Tensor cos = p[1].index_select(0, p[3]).view(shape);
        const at::Tensor sin = p[2].index_select(0, p[3]).view(shape);
        return p[0] * cos + rotate_half(p[0]) * sin;
      },
      {x, rope_cos_, rope_sin_, on_device(at::tensor(positions, at::kLong))},
      {{Shard(0)}, {Replicate()}, {Replicate()}, {Replicate()}}, {Shard(0)});
}

// h: the block's input [n, S, D] (replicated); ctx: attention's output before wo [n, S, D].
// Returns the last position's logits [n, vocab] as a plain tensor.
at::Tensor Llama::block_to_logits(const at::Tensor& h, const at::Tensor& ctx) const {
  const auto& w = weights_;
  const at::Tensor h1 = h + at::linear(ctx, w.at("attention.wo.weight"));
  const at::Tensor n2 = rms_norm(h1, w.at("ffn_norm.weight"), config_.eps);
  const at::Tensor ffn = at::linear(at::silu(at::linear(n2, w.at("feed_forward.w1.weight"))) *
                                        at::linear(n2, w.at("feed_forward.w3.weight")),
                                    w.at("feed_forward.w2.weight"));
  const at::Tensor h2 = h1 + ffn;
  const at::Tensor last = h2.select(1, h2.size(1) - 1);  // [n, D]
  const at::Tensor logits =
      at::linear(rms_norm(last, w.at("norm.weight"), config_.eps), w.at("output.weight"));
  return (mesh_ ? api::full_tensor(logits) : logits).to(at::kCPU).contiguous();
}

at::Tensor Llama::prefill(const Sequence& seq) {
  const auto& w = weights_;
  const int64_t S = static_cast<int64_t>(seq.tokens.size()), P = seq.start, L = P + S;
  const int64_t H = config_.heads, D = config_.dim, hd = D / H;
  DTENSOR_CHECK(S > 0, "Llama: a sequence brings no token");
  DTENSOR_CHECK(P >= 0 && L <= config_.max_seq, "Llama: positions ", P, "..", L - 1,
                " exceed max_seq ", config_.max_seq);
  const at::Tensor tokens = replicated(at::tensor(seq.tokens, at::kLong).view({1, S}));
  at::Tensor h = at::embedding(w.at("tok_embeddings.weight"), tokens);
  if (mesh_) h = api::redistribute(h, {Replicate()});  // vocab-sharded rows: a Partial sum
  const at::Tensor x = rms_norm(h, w.at("attention_norm.weight"), config_.eps);
  auto heads = [&](const char* key) {  // [H, 1, S, hd], heads sharded
    return at::linear(x, w.at(key)).view({1, S, H, hd}).permute({2, 0, 1, 3});
  };
  std::vector<int64_t> positions(S);
  for (int64_t i = 0; i < S; ++i) positions[i] = P + i;
  const at::Tensor q = rope(heads("attention.wq.weight"), positions, false);
  const at::Tensor k = rope(heads("attention.wk.weight"), positions, false);
  const at::Tensor v = heads("attention.wv.weight");
  k_cache(seq.slot).narrow(1, P, S).copy_(k.select(1, 0));
  v_cache(seq.slot).narrow(1, P, S).copy_(v.select(1, 0));
  const at::Tensor keys = k_cache(seq.slot).narrow(1, 0, L).unsqueeze(1);  // [H, 1, L, hd]
  const at::Tensor vals = v_cache(seq.slot).narrow(1, 0, L).unsqueeze(1);
  // Query i (position P + i) sees keys 0..P + i.
  const at::Tensor mask =
      replicated(at::arange(L, at::kLong).view({1, L}) > at::arange(P, L, at::kLong).view({S, 1}));
  const at::Tensor scores =
      at::matmul(q, keys.transpose(-2, -1)).div(std::sqrt(static_cast<double>(hd)));
  const at::Tensor attn = at::softmax(scores.masked_fill(mask, -1e9), -1);
  const at::Tensor ctx = at::matmul(attn, vals).permute({1, 2, 0, 3}).reshape({1, S, D});
  return block_to_logits(h, ctx);
}

// NOTE [batched decode]
// n sequences with one new token each run as one batch: the tokens are [n, 1], each writes its
// k/v at its own position of its own slot (one index_copy_ per cache), and attention reads the
// slots' caches padded to a length bucket ([H, n, L, hd], gathered by index_select on the slot
// dim) with a length mask, so a position beyond a sequence's length gets exp(-1e9 - max) = 0
// weight exactly. Heads stay first and sharded: every op of attention is local to the rank.
// NOTE [decode length buckets]: L is the longest sequence rounded up to kDecodeBucket positions
// (at most max_seq), not the longest itself: attention's shapes then repeat for kDecodeBucket
// steps, so its ~8 distributed ops hit the propagation cache instead of missing it at every step
// (a miss propagates and runs meta kernels: most of the engine's time in a decode step, as
// vLLM and TGI pad to buckets for their CUDA graphs). The padded positions hold finite values
// (zeros, or an earlier sequence's keys) and get weight 0.
constexpr int64_t kDecodeBucket = 64;
at::Tensor Llama::decode(const std::vector<Sequence>& batch) {
  const auto& w = weights_;
  const int64_t n = static_cast<int64_t>(batch.size());
  const int64_t H = config_.heads, D = config_.dim, hd = D / H;
  std::vector<int64_t> tokens, positions, slots;
  int64_t L = 0;
  for (const Sequence& s : batch) {
    DTENSOR_CHECK(s.start >= 0 && s.start < config_.max_seq, "Llama: position ", s.start,
                  " exceeds max_seq ", config_.max_seq);
    DTENSOR_CHECK(s.slot >= 0 && s.slot < max_batch_ && used_[s.slot], "Llama: slot ", s.slot,
                  " is not allocated");
    tokens.push_back(s.tokens[0]);
    positions.push_back(s.start);
    slots.push_back(s.slot);
    L = std::max(L, s.start + 1);
  }
  L = std::min(config_.max_seq, (L + kDecodeBucket - 1) / kDecodeBucket * kDecodeBucket);
  const at::Tensor tok = replicated(at::tensor(tokens, at::kLong).view({n, 1}));
  at::Tensor h = at::embedding(w.at("tok_embeddings.weight"), tok);
  if (mesh_) h = api::redistribute(h, {Replicate()});
  const at::Tensor x = rms_norm(h, w.at("attention_norm.weight"), config_.eps);
  auto heads = [&](const char* key) {  // [H, n, 1, hd]
    return at::linear(x, w.at(key)).view({n, 1, H, hd}).permute({2, 0, 1, 3});
  };
  const at::Tensor q = rope(heads("attention.wq.weight"), positions, true);
  const at::Tensor k = rope(heads("attention.wk.weight"), positions, true);
  const at::Tensor v = heads("attention.wv.weight");
  // Every sequence's new k/v into its slot at its position: one index_copy_ per cache over the
  // flattened (slot, position) dim, not two copies per sequence.
  std::vector<int64_t> flat;
  for (int64_t i = 0; i < n; ++i) flat.push_back(slots[i] * config_.max_seq + positions[i]);
  // The batch's caches are a view when the slots are 0..n-1 in order (the scheduler hands out
  // the lowest free slots), else gathered.
  bool leading = true;
  for (int64_t i = 0; i < n; ++i) leading = leading && slots[i] == i;
  const at::Tensor mask = on_device(at::arange(L, at::kLong).view({1, 1, L}) >
                                    at::tensor(positions, at::kLong).view({n, 1, 1}));
  // Attention reads and writes only this rank's heads (q, k, v and both caches are sharded on
  // heads), so it runs as one local computation (NOTE [local chains]); its output [n, 1, D] is
  // sharded on D, head-major. Prefill keeps attention as distributed ops.
  const int64_t rows = max_batch_ * config_.max_seq;
  const at::Tensor ctx = on_pieces(
      [&](const Pieces& p) {
        const at::Tensor &q = p[0], &k = p[1], &v = p[2], &kc = p[3], &vc = p[4];
        const int64_t h = q.size(0);  // this rank's heads
        kc.view({h, rows, hd}).index_copy_(1, p[5], k.squeeze(2));
        vc.view({h, rows, hd}).index_copy_(1, p[5], v.squeeze(2));
        // [h, n, L, hd]
        const at::Tensor keys =
            (leading ? kc.narrow(1, 0, n) : kc.index_select(1, p[6])).narrow(2, 0, L);
        const at::Tensor vals =
            (leading ? vc.narrow(1, 0, n) : vc.index_select(1, p[6])).narrow(2, 0, L);
        const at::Tensor scores =
            at::matmul(q, keys.transpose(-2, -1)).div(std::sqrt(static_cast<double>(hd)));
        const at::Tensor attn = at::softmax(scores.masked_fill(p[7], -1e9), -1);  // [h, n, 1, L]
        return at::matmul(attn, vals).permute({1, 2, 0, 3}).reshape({n, 1, h * hd});
      },
      {q, k, v, k_cache_, v_cache_, on_device(at::tensor(flat, at::kLong)),
       on_device(at::tensor(slots, at::kLong)), mask},
      {{Shard(0)},
       {Shard(0)},
       {Shard(0)},
       {Shard(0)},
       {Shard(0)},
       {Replicate()},
       {Replicate()},
       {Replicate()}},
      {Shard(2)});
  return block_to_logits(h, ctx);
}

at::Tensor Llama::forward(const std::vector<Sequence>& batch) {
  DTENSOR_CHECK(!batch.empty(), "Llama::forward: empty batch");
  c10::InferenceMode inference;  // no autograd or view tracking: fewer dispatch steps per op
  for (const Sequence& s : batch) {
    DTENSOR_CHECK(s.slot >= 0 && s.slot < max_batch_ && used_[s.slot], "Llama: slot ", s.slot,
                  " is not allocated");
    for (int64_t t : s.tokens) {
      DTENSOR_CHECK(t >= 0 && t < config_.vocab, "Llama: token ", t, " is outside the vocab ",
                    config_.vocab);
    }
  }
  const bool all_one = std::all_of(batch.begin(), batch.end(),
                                   [](const Sequence& s) { return s.tokens.size() == 1; });
  if (all_one) return decode(batch);
  std::vector<at::Tensor> rows;
  for (const Sequence& s : batch) rows.push_back(prefill(s));
  return at::cat(rows, 0);
}

int64_t greedy_token(const at::Tensor& logits) {
  const at::Tensor l = logits.to(at::kFloat).contiguous();
  DTENSOR_CHECK(l.dim() == 1 && l.numel() > 0, "greedy_token: expected non-empty 1-D logits");
  const float* p = l.data_ptr<float>();
  int64_t best = 0;
  for (int64_t i = 1; i < l.numel(); ++i) {
    if (p[i] > p[best]) best = i;  // strict: an exact tie keeps the lowest id
  }
  return best;
}

std::vector<int64_t> greedy_generate(Llama& model, const std::vector<int64_t>& prompt,
                                     int64_t max_new_tokens, bool recompute) {
  std::vector<int64_t> seq = prompt, out;
  if (max_new_tokens <= 0) return out;
  if (recompute) {
    for (int64_t step = 0; step < max_new_tokens; ++step) {
      const int slot = model.alloc_slot();
      const at::Tensor logits = model.forward({{slot, seq, 0}});
      model.free_slot(slot);
      out.push_back(greedy_token(logits[0]));
      seq.push_back(out.back());
    }
    return out;
  }
  const int slot = model.alloc_slot();
  try {
    at::Tensor logits = model.forward({{slot, prompt, 0}});
    for (int64_t step = 0;; ++step) {
      out.push_back(greedy_token(logits[0]));
      if (static_cast<int64_t>(out.size()) == max_new_tokens) break;
      const int64_t pos = static_cast<int64_t>(prompt.size()) + step;
      logits = model.forward({{slot, {out.back()}, pos}});
    }
  } catch (...) {
    model.free_slot(slot);
    throw;
  }
  model.free_slot(slot);
  return out;
}

}  // namespace dtensor::serving
