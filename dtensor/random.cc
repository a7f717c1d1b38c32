#include "dtensor/random.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/TensorGeometry.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>

#include "base/error.h"
#include "base/stable_hash.h"
#include "collectives/rank_context.h"
#include "dtensor/program_digest.h"

namespace dtensor {
namespace {
thread_local std::optional<at::Generator> t_generator;
std::mutex g_swap_mu;  // the default generator is shared by every thread rank
}  // namespace

void seed_process_default(uint64_t seed) {
  std::lock_guard<std::mutex> swap_lock(g_swap_mu);  // never while a rank borrows it
  at::manual_seed(seed);
}

void manual_seed(uint64_t seed) {
  if (!t_generator) t_generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::lock_guard<std::mutex> lock(t_generator->mutex());
  t_generator->set_current_seed(seed);
}

at::Generator rank_generator() {
  return t_generator ? *t_generator : at::detail::getDefaultCPUGenerator();
}

at::Generator rank_generator(const c10::Device& device) {
  if (device.is_cpu()) return rank_generator();
  return at::globalContext().defaultGenerator(device);  // NOTE [random on a CUDA mesh]
}

// NOTE [rank generators agree]
void check_generators_agree(const DeviceMesh& mesh, const at::Generator& generator,
                            const std::string& op) {
  if (mesh.size() == 1) return;
  const bool default_cpu = generator.device().is_cpu() &&
                           generator.unsafeGetGeneratorImpl() ==
                               at::detail::getDefaultCPUGenerator().unsafeGetGeneratorImpl();
  if (default_cpu && !t_generator && collectives::has_current_context() &&
      collectives::current_context().backend() == "threads") {
    throw Error(op + " on a distributed tensor over " + mesh.to_string() +
                ": the ranks are threads of one process and share its default generator, so "
                "their draws would differ; call dtensor.manual_seed(seed) with the same seed on "
                "every rank first (NOTE [rank generators agree])");
  }
  if (!program_check_enabled()) return;
  at::Generator g = generator;  // a handle: mutex() is not const
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(g.mutex());
    state = g.get_state();
  }
  state = state.contiguous();
  record_program_op(mesh, kRandomState,
                    fnv1a(state.data_ptr(), static_cast<size_t>(state.nbytes())));
}

void draw_with_rank_generator(const std::function<void()>& draw) {
  if (!t_generator) {
    draw();
    return;
  }
  std::lock_guard<std::mutex> swap_lock(g_swap_mu);
  at::Generator def = at::detail::getDefaultCPUGenerator();
  at::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(def.mutex());
    saved = def.get_state();
    std::lock_guard<std::mutex> mine(t_generator->mutex());
    def.set_state(t_generator->get_state());
  }
  auto hand_back = [&] {
    std::lock_guard<std::mutex> lock(def.mutex());
    {
      std::lock_guard<std::mutex> mine(t_generator->mutex());
      t_generator->set_state(def.get_state());
    }
    def.set_state(saved);
  };
  try {
    draw();
  } catch (...) {
    hand_back();
    throw;
  }
  hand_back();
}

namespace {

constexpr int64_t kDefaultChunk = int64_t{1} << 20;
// ATen's CPU normal_ transforms blocks of this many uniforms (NOTE [DTensor random]).
constexpr int64_t kNormalBlock = 16;
std::atomic<int64_t> g_chunk{0};  // set_random_chunk_elements; 0: env or default

// One rectangular block of a row-major range of global elements: the dims before `dim` fixed at
// `prefix`, dim `dim` over [lo, hi), the dims after it whole.
struct Block {
  std::vector<int64_t> prefix;
  size_t dim;
  int64_t lo, hi;
};

// Splits the global elements [a, b) of the sub-tensor at `prefix` (dims from `m` on; `inner[m]`
// elements per index of dim m) into at most 2 * (ndim - m) blocks, in row-major order.
void split_range(const std::vector<int64_t>& inner, size_t m, int64_t a, int64_t b,
                 std::vector<int64_t>& prefix, std::vector<Block>& out) {
  if (a >= b) return;
  const int64_t in = inner[m];
  int64_t ia = a / in;
  const int64_t ra = a % in, ib = b / in, rb = b % in;
  if (ia == ib) {  // inside one index of dim m
    prefix.push_back(ia);
    split_range(inner, m + 1, ra, rb, prefix, out);
    prefix.pop_back();
    return;
  }
  if (ra != 0) {  // the end of a partial index first
    prefix.push_back(ia);
    split_range(inner, m + 1, ra, in, prefix, out);
    prefix.pop_back();
    ++ia;
  }
  if (ia < ib) out.push_back({prefix, m, ia, ib});
  if (rb != 0) {  // then the start of a partial index
    prefix.push_back(ib);
    split_range(inner, m + 1, 0, rb, prefix, out);
    prefix.pop_back();
  }
}

// Copies the global elements [a, a + drawn.numel()) that `drawn` holds into `piece` where they
// fall inside the box (offset `off`, shape `size`) of a global tensor of `shape`.
class BoxCopier {
 public:
  BoxCopier(std::vector<int64_t> shape, std::vector<int64_t> off, std::vector<int64_t> size,
            at::Tensor piece)
      : shape_(std::move(shape)),
        off_(std::move(off)),
        size_(std::move(size)),
        piece_(std::move(piece)),
        inner_(shape_.size(), 1) {
    for (size_t d = shape_.size() - 1; d > 0; --d) inner_[d - 1] = inner_[d] * shape_[d];
  }

  // The blocks of [a, b) that meet the box (empty when the chunk misses it).
  const std::vector<Block>& blocks_in_box(int64_t a, int64_t b) {
    blocks_.clear();
    if (piece_.numel() == 0) return blocks_;
    std::vector<int64_t> prefix;
    split_range(inner_, 0, a, b, prefix, blocks_);
    blocks_.erase(std::remove_if(blocks_.begin(), blocks_.end(),
                                 [this](const Block& k) { return !meets_box(k); }),
                  blocks_.end());
    return blocks_;
  }

  // Copies `blocks` (from blocks_in_box(a, ...)) out of `drawn`, which starts at element a.
  void copy(const std::vector<Block>& blocks, const at::Tensor& drawn, int64_t a) const {
    for (const Block& k : blocks) {
      const size_t m = k.dim;
      int64_t start = k.lo * inner_[m];
      for (size_t d = 0; d < m; ++d) start += k.prefix[d] * inner_[d];
      std::vector<int64_t> block_shape = {k.hi - k.lo};
      block_shape.insert(block_shape.end(), shape_.begin() + m + 1, shape_.end());
      const int64_t lo = std::max(k.lo, off_[m]), hi = std::min(k.hi, off_[m] + size_[m]);
      at::Tensor src = drawn.narrow(0, start - a, (k.hi - k.lo) * inner_[m]).view(block_shape);
      src = src.narrow(0, lo - k.lo, hi - lo);
      for (size_t d = m + 1; d < shape_.size(); ++d)
        src = src.narrow(static_cast<int64_t>(d - m), off_[d], size_[d]);
      at::Tensor dst = piece_;
      for (size_t d = 0; d < m; ++d) dst = dst.select(0, k.prefix[d] - off_[d]);
      dst.narrow(0, lo - off_[m], hi - lo).copy_(src);
    }
  }

 private:
  bool meets_box(const Block& k) const {
    for (size_t d = 0; d < k.dim; ++d) {
      if (k.prefix[d] < off_[d] || k.prefix[d] >= off_[d] + size_[d]) return false;
    }
    return std::max(k.lo, off_[k.dim]) < std::min(k.hi, off_[k.dim] + size_[k.dim]);
  }

  std::vector<int64_t> shape_, off_, size_;
  at::Tensor piece_;
  std::vector<int64_t> inner_;
  std::vector<Block> blocks_;
};

}  // namespace

int64_t random_chunk_elements() {
  int64_t n = g_chunk.load(std::memory_order_relaxed);
  if (n <= 0) {
    // Read on every call (cheap next to a draw) so a test or a launcher may set it late.
    const char* env = std::getenv("DTENSOR_RANDOM_CHUNK");
    n = env != nullptr ? std::strtoll(env, nullptr, 10) : 0;
    if (n <= 0) n = kDefaultChunk;
  }
  return std::max(n, kNormalBlock);
}

void set_random_chunk_elements(int64_t n) { g_chunk.store(std::max<int64_t>(n, 0)); }

DrawOrder draw_order_of(const std::string& op) {
  // ATen's CPU kernels (DistributionTemplates.h, DistributionKernels.cpp): one serial pass.
  // bernoulli_(float) and exponential_ draw through MKL's own stream when ATen has MKL.
  // cauchy_, log_normal_, geometric_: cpu_serial_kernel as uniform_ (torch 2.11); log_normal_'s
  // draws per element vary (a cached Box-Muller sample), which the generator carries across chunks.
  static const std::set<std::string> per_element = {
      "aten::uniform_",    "aten::random_",      "aten::random_.from",           "aten::random_.to",
      "aten::rand_like",   "aten::randint_like", "aten::randint_like.low_dtype", "aten::cauchy_",
      "aten::log_normal_", "aten::geometric_"};
  static const std::set<std::string> per_element_without_mkl = {
      "aten::bernoulli_.float", "aten::bernoulli.p", "aten::exponential_"};
  if (per_element.count(op) != 0) return DrawOrder::kPerElement;
  if (per_element_without_mkl.count(op) != 0)
    return at::hasMKL() ? DrawOrder::kWhole : DrawOrder::kPerElement;
  if (op == "aten::normal_" || op == "aten::randn_like") return DrawOrder::kNormalFill;
  return DrawOrder::kWhole;
}

RandomFill like_fill(const std::string& op, const c10::IValue* args,
                     const at::Generator& generator) {
  // ATen's TensorFactories.cpp: rand_like, randn_like, randint_like.
  const at::Generator g = generator;
  if (op == "aten::rand_like") return [g](const at::Tensor& b) { return b.uniform_(0, 1, g); };
  if (op == "aten::randn_like") return [g](const at::Tensor& b) { return b.normal_(0, 1, g); };
  if (op == "aten::randint_like") {
    const int64_t high = args[1].toInt();
    return [g, high](const at::Tensor& b) { return b.random_(0, high, g); };
  }
  if (op == "aten::randint_like.low_dtype") {
    const int64_t low = args[1].toInt(), high = args[2].toInt();
    return [g, low, high](const at::Tensor& b) { return b.random_(low, high, g); };
  }
  return nullptr;
}

// NOTE [random draws in memory order]
DrawLayout draw_layout(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride,
                       const LocalBox& box, const at::Tensor& piece, DrawOrder order,
                       const std::string& op) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  std::vector<int64_t> perm(ndim);
  std::iota(perm.begin(), perm.end(), 0);
  // Dims of size 1 hold no order; the others by decreasing stride (stable: ties keep dim order).
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
    const int64_t sa = shape[a] == 1 ? 0 : stride.at(a), sb = shape[b] == 1 ? 0 : stride.at(b);
    return sa > sb;
  });
  bool row_major = true;
  int64_t last = -1, numel = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    numel *= shape[d];
    if (shape[perm[d]] == 1) continue;
    if (perm[d] < last) row_major = false;
    last = perm[d];
  }
  // A contiguous tensor as ATen sees it (is_contiguous: size-1 dims' strides do not count).
  if (at::geometry_is_contiguous(shape, stride) || numel <= 1) return {shape, box, piece, order};
  static const std::set<std::string> memory_order = {"aten::uniform_",
                                                     "aten::random_",
                                                     "aten::random_.from",
                                                     "aten::random_.to",
                                                     "aten::rand_like",
                                                     "aten::randint_like",
                                                     "aten::randint_like.low_dtype",
                                                     "aten::bernoulli_.float",
                                                     "aten::bernoulli.p",
                                                     "aten::exponential_",
                                                     "aten::cauchy_",
                                                     "aten::log_normal_",
                                                     "aten::geometric_",
                                                     "aten::native_dropout",
                                                     "aten::normal_",
                                                     "aten::randn_like"};
  bool ordered = memory_order.count(op) != 0;
  for (int64_t d = 1; d < ndim && ordered; ++d) {
    if (shape[perm[d - 1]] > 1 && shape[perm[d]] > 1 && stride[perm[d - 1]] == stride[perm[d]])
      ordered = false;
  }
  if (!ordered) {
    throw Error(op + " on a distributed tensor of shape " + c10::str(c10::IntArrayRef(shape)) +
                " whose strides " + c10::str(c10::IntArrayRef(stride)) +
                " are not contiguous: the engine replays one device's draw in memory order only "
                "for the ops whose CPU kernels it checked; call .contiguous() on it first (NOTE "
                "[random draws in memory order])");
  }
  DrawLayout out{{}, {}, row_major ? piece : piece.permute(perm), order};
  for (const int64_t d : perm) {
    out.shape.push_back(shape[d]);
    out.box.shape.push_back(box.shape[d]);
    out.box.offset.push_back(box.offset[d]);
  }
  if (order == DrawOrder::kNormalFill) out.order = DrawOrder::kSerialNormal;
  return out;
}

void draw_box(const std::vector<int64_t>& global_shape, const LocalBox& box, DrawOrder order,
              const at::Generator& generator, const at::Tensor& piece, const RandomFill& fill) {
  TORCH_INTERNAL_ASSERT(piece.sizes().equals(box.shape), "draw_box: a piece of shape ",
                        piece.sizes(), " for a box of shape ", c10::IntArrayRef(box.shape));
  int64_t numel = 1;
  for (const int64_t s : global_shape) numel *= s;
  if (numel == 0) return;  // ATen draws nothing for an empty tensor
  // A counter-based generator (CUDA's Philox) reproduces one device only in one draw of the
  // whole (NOTE [random on a CUDA mesh]).
  if (!generator.device().is_cpu()) order = DrawOrder::kWhole;
  // A 0-dim tensor is one element of a 1-D one.
  BoxCopier box_copier = global_shape.empty()
                             ? BoxCopier({1}, {0}, {1}, piece.unsqueeze(0))
                             : BoxCopier(global_shape, box.offset, box.shape, piece);
  // The elements [0, end) are drawn chunk by chunk; kNormalFill then redraws the last 16.
  const bool normal_blocks = order == DrawOrder::kNormalFill && numel >= kNormalBlock;
  int64_t chunk = random_chunk_elements(), end = numel;
  if (order == DrawOrder::kWhole || (order == DrawOrder::kNormalFill && !normal_blocks)) {
    chunk = numel;
  } else if (normal_blocks) {
    chunk -= chunk % kNormalBlock;
    end -= numel % kNormalBlock;
  }
  chunk = std::min(chunk, end);
  // Chunks are drawn on the generator's device and copied into the piece (a CPU generator on a
  // CUDA mesh: NOTE [random on a CUDA mesh] in random.h).
  const at::TensorOptions drawn_on = piece.options().device(generator.device());
  // kSerialNormal: every other element of a buffer twice the chunk, which is not contiguous, so
  // ATen's normal_ takes its serial path (NOTE [random draws in memory order]).
  const int64_t step = order == DrawOrder::kSerialNormal ? 2 : 1;
  const at::Tensor buffer = at::empty({chunk * step}, drawn_on).slice(0, 0, chunk * step, step);
  for (int64_t a = 0; a < end; a += chunk) {
    const int64_t n = std::min(chunk, end - a);
    const at::Tensor part = n == chunk ? buffer : buffer.narrow(0, 0, n);
    const std::vector<Block>& blocks = box_copier.blocks_in_box(a, a + n);
    if (blocks.empty() && normal_blocks) {
      // Only the uniforms: the same draws as normal_'s first pass, no Box-Muller.
      part.uniform_(0, 1, generator);
      continue;
    }
    const at::Tensor drawn = fill(part);
    box_copier.copy(blocks, drawn, a);
  }
  if (end != numel) {
    // normal_'s tail: the uniforms of [end, numel) are drawn and then replaced by a fresh draw
    // of 16, which gives the last 16 values (overwriting the end of the last full block).
    at::empty({numel - end}, drawn_on).uniform_(0, 1, generator);
    const int64_t a = numel - kNormalBlock;
    const std::vector<Block>& blocks = box_copier.blocks_in_box(a, numel);
    const at::Tensor drawn = fill(buffer.narrow(0, 0, kNormalBlock));
    box_copier.copy(blocks, drawn, a);
  }
}

}  // namespace dtensor
