// The serving model (serving/llama.h) against itself: the KV cache against full recompute, 2 and
// 4 tensor-parallel ranks (threads) against one process, batched decode against sequences run
// alone, the cache's shards, and on a GPU (where there is one) against the CPU. The Python parity
// test is examples/llama_parity_test.py.

#include "serving/llama.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "collectives/launch_env.h"
#include "collectives/rank_context.h"
#include "dtensor/api.h"

namespace dtensor::serving {
namespace {

using collectives::run_threads;
using Tokens = std::vector<int64_t>;

// A checkpoint of random weights (keys as the Python state dict), saved by one process.
class LlamaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/llama_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = std::string(tmpl) + "/ckpt";
    at::manual_seed(7);
    std::map<std::string, checkpoint::Value> state;
    for (const auto& [key, shape] : llama_shapes(LlamaConfig{})) {
      at::Tensor t;
      if (shape.size() == 1) {
        t = 1 + 0.1 * at::randn(shape);  // norms
      } else if (key == "tok_embeddings.weight") {
        t = at::randn(shape);
      } else {  // nn.Linear's init: U(-1/sqrt(in), 1/sqrt(in))
        t = (at::rand(shape) * 2 - 1) / std::sqrt(static_cast<double>(shape[1]));
      }
      // Sharp attention, so that generations depend on positions and on the cache's contents
      // (with nn.Linear's init attention is near uniform).
      if (key == "attention.wq.weight" || key == "attention.wk.weight") t = t * 4;
      state[key] = t;
    }
    checkpoint::save(state, dir_);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(std::filesystem::path(dir_).parent_path());
  }

  static Llama one_process(int64_t max_batch = 4) {
    Llama model(LlamaConfig{}, std::nullopt, max_batch);
    model.load(dir_);
    return model;
  }

  // fn(model, rank) on `ranks` thread ranks, each with its model on a 1-D mesh.
  static void on_ranks(int64_t ranks, int64_t max_batch,
                       const std::function<void(Llama&, int64_t)>& fn) {
    run_threads(ranks, [&](int64_t rank) {
      at::set_num_threads(1);
      Llama model(LlamaConfig{}, api::init_device_mesh({ranks}), max_batch);
      model.load(dir_);
      fn(model, rank);
    });
  }

  static std::string dir_;
};

std::string LlamaTest::dir_;

const Tokens kPrompt = {3, 17, 250, 9, 480, 77, 1};
constexpr int64_t kNew = 12;

TEST_F(LlamaTest, CacheEqualsRecomputeOnOneProcess) {
  Llama model = one_process();
  const Tokens cached = greedy_generate(model, kPrompt, kNew);
  const Tokens recomputed = greedy_generate(model, kPrompt, kNew, /*recompute=*/true);
  ASSERT_EQ(cached.size(), static_cast<size_t>(kNew));
  EXPECT_EQ(cached, recomputed);
  // The logits themselves agree closely (not only their argmax).
  const int a = model.alloc_slot();
  at::Tensor prefix = model.forward({{a, kPrompt, 0}});
  at::Tensor step = model.forward({{a, {cached[0]}, static_cast<int64_t>(kPrompt.size())}});
  model.free_slot(a);
  Tokens longer = kPrompt;
  longer.push_back(cached[0]);
  const int b = model.alloc_slot();
  at::Tensor full = model.forward({{b, longer, 0}});
  model.free_slot(b);
  EXPECT_TRUE(at::allclose(step, full, 1e-5, 1e-5));
  // Not a constant model: the generation is not one token repeated.
  EXPECT_GT(std::set<int64_t>(cached.begin(), cached.end()).size(), 1u);
}

// Decode attends over a length bucket of 64 positions (NOTE [decode length buckets]): a
// generation past the first bucket still equals full recompute, and a slot reused after a longer
// sequence (its padded positions hold that sequence's keys) generates what a fresh model does.
TEST_F(LlamaTest, DecodePastTheLengthBucketAndInAReusedSlot) {
  Llama model = one_process(/*max_batch=*/1);
  const Tokens cached = greedy_generate(model, kPrompt, 70);
  EXPECT_EQ(cached, greedy_generate(model, kPrompt, 70, /*recompute=*/true));
  const Tokens other = {9, 8, 7};
  Llama fresh = one_process(1);
  EXPECT_EQ(greedy_generate(model, other, kNew), greedy_generate(fresh, other, kNew));
}

TEST_F(LlamaTest, RanksEqualOneProcessTokenForToken) {
  Llama model = one_process();
  const Tokens expected = greedy_generate(model, kPrompt, kNew);
  for (int64_t ranks : {2, 4}) {
    std::mutex mu;
    std::map<int64_t, Tokens> got;
    on_ranks(ranks, 1, [&](Llama& m, int64_t rank) {
      Tokens t = greedy_generate(m, kPrompt, kNew);
      std::lock_guard<std::mutex> lock(mu);
      got[rank] = t;
    });
    for (int64_t r = 0; r < ranks; ++r)
      EXPECT_EQ(got[r], expected) << ranks << " ranks, rank " << r;
  }
}

TEST_F(LlamaTest, KvCacheIsShardedByHeads) {
  const LlamaConfig c;
  for (int64_t ranks : {2, 4}) {
    on_ranks(ranks, 3, [&](Llama& m, int64_t) {
      const int slot = m.alloc_slot();
      m.forward({{slot, kPrompt, 0}});
      for (const at::Tensor& cache : {m.k_cache(slot), m.v_cache(slot)}) {
        ASSERT_TRUE(api::is_dtensor(cache));
        EXPECT_EQ(cache.sizes().vec(), (std::vector<int64_t>{c.heads, c.max_seq, c.dim / c.heads}));
        EXPECT_EQ(api::local(cache).sizes().vec(),
                  (std::vector<int64_t>{c.heads / ranks, c.max_seq, c.dim / c.heads}));
      }
      // The prompt's positions are written, the rest still zero.
      const at::Tensor k = api::local(m.k_cache(slot));
      const int64_t n = static_cast<int64_t>(kPrompt.size());
      EXPECT_GT(k.narrow(1, 0, n).abs().sum().item<float>(), 0);
      EXPECT_EQ(k.narrow(1, n, c.max_seq - n).abs().sum().item<float>(), 0);
    });
  }
}

// Three sequences of different prompt lengths: prefilled in one call (each alone), then decoded
// together, one batched forward per step.
void batched_generation(Llama& m, const std::vector<Tokens>& prompts, int64_t steps,
                        std::vector<Tokens>* outs) {
  std::vector<Sequence> batch;
  for (const Tokens& p : prompts) batch.push_back({m.alloc_slot(), p, 0});
  at::Tensor logits = m.forward(batch);
  outs->assign(prompts.size(), {});
  for (int64_t step = 0;; ++step) {
    for (size_t i = 0; i < prompts.size(); ++i) (*outs)[i].push_back(greedy_token(logits[i]));
    if (step + 1 == steps) break;
    std::vector<Sequence> next;
    for (size_t i = 0; i < prompts.size(); ++i) {
      next.push_back(
          {batch[i].slot, {(*outs)[i].back()}, static_cast<int64_t>(prompts[i].size()) + step});
    }
    logits = m.forward(next);
    EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{3, LlamaConfig{}.vocab}));
  }
  for (const Sequence& s : batch) m.free_slot(s.slot);
}

TEST_F(LlamaTest, BatchedDecodeEqualsEachSequenceAlone) {
  const std::vector<Tokens> prompts = {
      {5, 6, 7}, {100, 200, 300, 400, 500, 11, 12}, {42, 43, 44, 45, 46}};
  Llama model = one_process();
  std::vector<Tokens> alone;
  for (const Tokens& p : prompts) alone.push_back(greedy_generate(model, p, kNew));
  std::vector<Tokens> together;
  batched_generation(model, prompts, kNew, &together);
  EXPECT_EQ(together, alone);
  // And on 2 ranks.
  std::mutex mu;
  std::map<int64_t, std::vector<Tokens>> got;
  on_ranks(2, 4, [&](Llama& m, int64_t rank) {
    std::vector<Tokens> mine;
    batched_generation(m, prompts, kNew, &mine);
    std::lock_guard<std::mutex> lock(mu);
    got[rank] = mine;
  });
  EXPECT_EQ(got[0], alone);
  EXPECT_EQ(got[1], alone);
}

TEST(GreedyToken, ExactTieGoesToTheLowestId) {
  EXPECT_EQ(greedy_token(at::tensor({0.5f, 2.0f, -1.0f, 2.0f})), 1);
  EXPECT_EQ(greedy_token(at::tensor({3.0f, 3.0f})), 0);
  EXPECT_EQ(greedy_token(at::tensor({-1.0f, -0.5f, -0.5f})), 1);
}

TEST_F(LlamaTest, SlotsAndBadInput) {
  Llama model(LlamaConfig{}, std::nullopt, 2);
  const int a = model.alloc_slot(), b = model.alloc_slot();
  EXPECT_NE(a, b);
  EXPECT_THROW(model.alloc_slot(), std::exception);
  EXPECT_THROW(model.forward({{a, {512}, 0}}), std::exception);  // outside the vocab
  model.free_slot(a);
  EXPECT_THROW(model.free_slot(a), std::exception);
  EXPECT_THROW(model.forward({{a, {1}, 0}}), std::exception);  // not allocated
  model.free_slot(b);
}

// The inference server's model on a GPU (./x serve --device cuda; runs in tools/gpu/check.sh's
// serve stage, skipped where there is no CUDA device): every tensor on the GPU, the logits back
// on the host, and the same tokens and logits (1e-4) as on the CPU, through the cache and a
// batched decode.
TEST_F(LlamaTest, CudaEqualsCpuTokenForToken) {
  if (collectives::device_count(c10::DeviceType::CUDA) == 0) GTEST_SKIP() << "no CUDA device";
  Llama cpu = one_process();
  Llama gpu(LlamaConfig{}, std::nullopt, 4, c10::Device(c10::DeviceType::CUDA, 0));
  gpu.load(dir_);
  EXPECT_TRUE(gpu.device().is_cuda());
  for (const auto& [key, w] : gpu.weights()) EXPECT_TRUE(w.is_cuda()) << key;
  EXPECT_TRUE(gpu.k_cache(0).is_cuda());
  for (const Tokens& prompt : {Tokens{1, 2, 3}, Tokens{400, 7, 7, 7, 9}, Tokens{42}}) {
    EXPECT_EQ(greedy_generate(gpu, prompt, 12), greedy_generate(cpu, prompt, 12));
  }
  std::vector<Sequence> prefill, decode;
  for (int i = 0; i < 3; ++i) {
    const int slot = cpu.alloc_slot();
    EXPECT_EQ(gpu.alloc_slot(), slot);
    prefill.push_back({slot, {5 + i, 6, 7}, 0});
    decode.push_back({slot, {9 - i}, 3});
  }
  for (const auto* batch : {&prefill, &decode}) {
    const at::Tensor want = cpu.forward(*batch), got = gpu.forward(*batch);
    EXPECT_TRUE(got.is_cpu());
    EXPECT_TRUE(at::allclose(got, want, /*rtol=*/1e-4, /*atol=*/1e-4))
        << (got - want).abs().max().item<float>();
  }
}

// A device that is not the mesh's is refused, naming both.
TEST_F(LlamaTest, DeviceOtherThanTheMeshsIsRefused) {
  run_threads(1, [&](int64_t) {
    try {
      Llama model(LlamaConfig{}, api::init_device_mesh({1}), 2,
                  c10::Device(c10::DeviceType::CUDA, 0));
      ADD_FAILURE() << "a CUDA device on a CPU mesh was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("differs from the mesh's device type cpu"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace dtensor::serving
