// NOTE [DTensor random] (random.h): random ops on distributed tensors drawn in chunks. Every op,
// layout and shape (not multiples of 16, larger than the chunk, uneven, 2-D meshes) equals one
// device's draw of the global tensor bit for bit and leaves the rank's generator in one device's
// state; a counting CPU allocator checks that a rank allocates its piece and chunk buffers, never
// the global tensor. Ranks are threads.

#include "dtensor/random.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <vector>

#include "base/torch_compat.h"
#include "collectives/rank_context.h"
#include "dtensor/api.h"

namespace dtensor {
namespace {

using collectives::run_threads;
namespace api = dtensor::api;

// Sets the chunk for the test's scope (process-wide, as every rank thread reads it).
class ChunkGuard {
 public:
  explicit ChunkGuard(int64_t n) { set_random_chunk_elements(n); }
  ~ChunkGuard() { set_random_chunk_elements(0); }
};

// The random ops of NOTE [DTensor random] in one order: make(normal) is rand (false) or randn
// (true) of x's shape; x is an input (plain on one device, distributed on the ranks).
std::vector<at::Tensor> draw_sequence(const std::function<at::Tensor(bool normal)>& make,
                                      const at::Tensor& x) {
  std::vector<at::Tensor> out;
  out.push_back(make(false));
  out.push_back(make(true));
  out.push_back(at::zeros_like(x).uniform_(-1, 2));
  out.push_back(at::zeros_like(x).normal_(0.5, 2));
  out.push_back(at::zeros_like(x).bernoulli_(0.3));
  out.push_back(at::zeros_like(x).random_(-5, 7));
  out.push_back(at::zeros_like(x).random_());
  out.push_back(at::zeros_like(x).exponential_(1.5));
  out.push_back(at::rand_like(x));
  out.push_back(at::randn_like(x));
  out.push_back(at::randint_like(x, 3, 9));
  out.push_back(at::bernoulli(x, 0.3));
  out.push_back(at::dropout(x, 0.4, true));
  auto [result, mask] = at::native_dropout(x, 0.3, true);
  out.push_back(result);
  out.push_back(mask);
  return out;
}

struct Layout {
  std::vector<int64_t> shape;
  std::vector<int64_t> mesh;
  Placements placements;
};

int64_t world_of(const std::vector<int64_t>& mesh) {
  int64_t n = 1;
  for (const int64_t s : mesh) n *= s;
  return n;
}

// One device's sequence from `seed`, then every rank's, compared exactly, generator state too.
void expect_sequence_matches(const Layout& l, at::ScalarType dtype, uint64_t seed) {
  const auto opts = at::TensorOptions().dtype(dtype);
  const at::Tensor x = at::rand(l.shape, at::make_generator<at::CPUGeneratorImpl>(seed + 1), opts);
  at::manual_seed(seed);  // the ops with no generator argument draw from the default
  const std::vector<at::Tensor> want = draw_sequence(
      [&](bool normal) { return normal ? at::randn(l.shape, opts) : at::rand(l.shape, opts); }, x);
  const at::Tensor want_state = at::detail::getDefaultCPUGenerator().get_state();
  run_threads(world_of(l.mesh), [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh(l.mesh);
    const at::Tensor dx = api::distribute_tensor(x, mesh, l.placements);
    api::manual_seed(seed);
    const std::vector<at::Tensor> got = draw_sequence(
        [&](bool normal) {
          return normal ? api::randn(l.shape, mesh, l.placements, opts)
                        : api::rand(l.shape, mesh, l.placements, opts);
        },
        dx);
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_TRUE(api::is_dtensor(got[k])) << "op " << k;
      const at::Tensor whole = api::full_tensor(got[k]);
      EXPECT_TRUE(at::equal(whole, want[k]))
          << "op " << k << " (draw_sequence order) on " << api::spec(got[k]).to_string() << " "
          << dtype << ":\n"
          << whole << "\nvs one device\n"
          << want[k];
    }
    EXPECT_TRUE(at::equal(rank_generator().get_state(), want_state))
        << "the rank's generator is not where one device's is";
  });
}

TEST(Random, ChunkedDrawsMatchOneDevice) {
  const ChunkGuard chunk(64);  // far below the shapes: many chunks, tails, partial rows
  const std::vector<Layout> layouts = {
      {{37, 29}, {2}, {Shard(0)}},
      {{37, 29}, {2}, {Shard(1)}},
      {{37, 29}, {2}, {Replicate()}},
      {{37, 29}, {3}, {Shard(0)}},  // uneven: 13, 13, 11
      {{37, 29}, {3}, {Shard(1)}},  // uneven: 10, 10, 9
      {{37, 29}, {2, 2}, {Shard(0), Shard(1)}},
      {{37, 29}, {2, 2}, {Shard(1), Shard(0)}},
      {{37, 29}, {2, 2}, {Replicate(), Shard(1)}},
      {{37, 29}, {2, 2}, {Shard(1), Shard(1)}},  // two mesh dims split one tensor dim
      {{5, 7, 11}, {2, 2}, {Shard(2), Shard(0)}},
      {{5, 7, 11}, {3}, {Shard(1)}},
      {{1001}, {4}, {Shard(0)}},   // 1001 % 16 == 9
      {{3, 1}, {4}, {Shard(0)}},   // an empty piece
      {{13}, {2}, {Shard(0)}},     // fewer than 16: normal_'s serial kernel
      {{8, 10}, {2}, {Shard(1)}},  // a multiple of 16: no tail
  };
  for (const Layout& l : layouts) {
    for (const at::ScalarType dtype : {at::kFloat, at::kDouble}) {
      SCOPED_TRACE(::testing::Message() << "shape " << c10::IntArrayRef(l.shape) << " mesh "
                                        << c10::IntArrayRef(l.mesh) << " " << dtype);
      expect_sequence_matches(l, dtype, 1234);
    }
  }
}

TEST(Random, ChunkSizesGiveTheSameValues) {
  // Chunk boundaries everywhere relative to rows and normal_'s blocks of 16.
  for (const int64_t c : {16, 17, 48, 100, 1072, 1073, 5000}) {
    const ChunkGuard chunk(c);
    SCOPED_TRACE(::testing::Message() << "chunk " << c);
    expect_sequence_matches({{37, 29}, {2, 2}, {Shard(1), Shard(0)}}, at::kFloat, 99);
  }
}

TEST(Random, ChunkElements) {
  EXPECT_EQ(random_chunk_elements(), int64_t{1} << 20);
  set_random_chunk_elements(3);
  EXPECT_EQ(random_chunk_elements(), 16);  // normal_'s block is the floor
  set_random_chunk_elements(1000);
  EXPECT_EQ(random_chunk_elements(), 1000);
  set_random_chunk_elements(0);
  setenv("DTENSOR_RANDOM_CHUNK", "4096", 1);
  EXPECT_EQ(random_chunk_elements(), 4096);
  unsetenv("DTENSOR_RANDOM_CHUNK");
  EXPECT_EQ(random_chunk_elements(), int64_t{1} << 20);
  EXPECT_EQ(draw_order_of("aten::normal_"), DrawOrder::kNormalFill);
  EXPECT_EQ(draw_order_of("aten::uniform_"), DrawOrder::kPerElement);
  EXPECT_EQ(draw_order_of("aten::multinomial"), DrawOrder::kWhole);
}

// A CPU allocator that counts, per rank thread, the bytes live and their peak.
struct Slot {
  std::atomic<int64_t> live{0}, peak{0};
};
Slot g_slots[8];
thread_local int t_slot = -1;

struct Allocation {
  c10::DataPtr inner;
  Slot* slot;
  int64_t bytes;
  static void release(void* p) {
    auto* a = static_cast<Allocation*>(p);
    if (a->slot != nullptr) a->slot->live -= a->bytes;
    delete a;
  }
};

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  DTENSOR_ALLOCATOR_COPY_DATA
  DTENSOR_ALLOCATOR_ALLOCATE(n) {
    auto* a = new Allocation{base_->allocate(n), t_slot >= 0 ? &g_slots[t_slot] : nullptr,
                             static_cast<int64_t>(n)};
    if (a->slot != nullptr) {
      const int64_t now = a->slot->live += a->bytes;
      if (now > a->slot->peak) a->slot->peak = now;  // only the owning thread raises it
    }
    void* data = a->inner.get();
    const c10::Device device = a->inner.device();
    return {data, a, &Allocation::release, device};
  }

 private:
  c10::Allocator* base_;
};

class AllocatorGuard {
 public:
  AllocatorGuard() : previous_(c10::GetCPUAllocator()), counting_(previous_) {
    c10::SetCPUAllocator(&counting_, kPriority);
  }
  ~AllocatorGuard() { c10::SetCPUAllocator(previous_, kPriority); }

 private:
  static constexpr uint8_t kPriority = 100;
  c10::Allocator* previous_;
  CountingAllocator counting_;
};

// The bound of NOTE [DTensor random]: a rank allocates at most its pieces and two chunks (plus a
// few small tensors: the generator state swapped for ops without a generator argument). Today's
// whole draw allocated the global tensor, which fails every check below.
TEST(Random, ChunkedDrawsNeverAllocateTheGlobalTensor) {
  const std::vector<int64_t> shape = {301, 257};
  const int64_t chunk = 4096, element = 8, global = 301 * 257 * element, slack = 16 << 10;
  const ChunkGuard chunk_guard(chunk);
  const AllocatorGuard allocator;
  for (const Layout& l :
       {Layout{shape, {4}, {Shard(0)}}, Layout{shape, {2, 2}, {Shard(1), Shard(0)}}}) {
    run_threads(4, [&](int64_t rank) {
      t_slot = static_cast<int>(rank);
      const DeviceMesh mesh = api::init_device_mesh(l.mesh);
      const auto opts = at::TensorOptions().dtype(at::kDouble);
      api::manual_seed(5);
      const at::Tensor x = api::zeros(shape, mesh, l.placements, opts);
      const int64_t piece = api::local(x).numel() * element;
      ASSERT_LT(4 * piece + 2 * chunk * element + slack, 2 * global);
      // `pieces`: the op's own piece-sized results and temporaries.
      // `draws`: the ATen fill that makes the values. Where it is kWhole in this ATen (bernoulli_
      // and exponential_ draw through MKL's stream when ATen has MKL, as PyPI's torch does),
      // the documented price is one global draw, so only the other ops are held to the bound.
      auto expect_bounded = [&](const char* what, int64_t pieces, const std::function<void()>& op,
                                const char* draws = nullptr) {
        if (draws != nullptr && draw_order_of(draws) == DrawOrder::kWhole) return;
        Slot& s = g_slots[rank];
        const int64_t base = s.live.load();
        s.peak = base;
        op();
        const int64_t transient = s.peak.load() - base;
        EXPECT_LE(transient, pieces * piece + 2 * chunk * element + slack)
            << what << " on " << api::spec(x).to_string() << ": piece " << piece << " B, chunk "
            << chunk * element << " B, global " << global << " B";
        EXPECT_LT(transient, global) << what << " allocated the global tensor";
      };
      expect_bounded("rand", 1, [&] { (void)api::rand(shape, mesh, l.placements, opts); });
      expect_bounded("randn", 1, [&] { (void)api::randn(shape, mesh, l.placements, opts); });
      expect_bounded("uniform_", 0, [&] { x.uniform_(); });
      expect_bounded("normal_", 0, [&] { x.normal_(); });
      expect_bounded(
          "bernoulli_", 0, [&] { x.bernoulli_(0.5); }, "aten::bernoulli_.float");
      expect_bounded("random_", 0, [&] { x.random_(0, 10); });
      expect_bounded(
          "exponential_", 0, [&] { x.exponential_(); }, "aten::exponential_");
      expect_bounded("rand_like", 1, [&] { (void)at::rand_like(x); });
      expect_bounded("randn_like", 1, [&] { (void)at::randn_like(x); });
      expect_bounded(
          "dropout", 2, [&] { (void)at::dropout(x, 0.5, true); }, "aten::bernoulli_.float");
      expect_bounded(
          "native_dropout", 3, [&] { (void)at::native_dropout(x, 0.5, true); },
          "aten::bernoulli_.float");
      // The counter sees the allocations (a vacuous pass is a failure).
      Slot& s = g_slots[rank];
      const int64_t base = s.live.load();
      const at::Tensor r = api::rand(shape, mesh, l.placements, opts);
      EXPECT_GE(s.live.load() - base, piece);
    });
  }
}

}  // namespace
}  // namespace dtensor
