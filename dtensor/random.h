#pragma once
// NOTE [DTensor random]
// A random op on a distributed tensor gives exactly the values the same seed gives on one device
// for the global tensor, whatever the mesh and placements (PyTorch users report mismatches:
// issues 168058, 146190). ATen's CPU generator is a sequential stream (mt19937), so the values
// of an element depend on every element before it: there is no offset to jump to. Every rank
// therefore replays the draw of the whole global tensor from its generator, in the order one
// device would, and keeps its own box. Each rank's generator advances exactly as one device's
// does, so later random ops stay in step too.
//
// The replay is chunked (draw_box below): the global tensor is drawn in row-major chunks of at
// most random_chunk_elements() elements (default 1 M, DTENSOR_RANDOM_CHUNK or
// set_random_chunk_elements), each chunk into a reused 1-D buffer from which the part inside
// this rank's box is copied. Memory bound per rank and op: its own piece plus at most two chunk
// buffers (the filled buffer, and for a functional op called as such, bernoulli.p, the op's
// fresh output of one chunk), so `randn` of a 4 GiB parameter sharded 8 ways allocates 512 MiB plus
// 8 MiB per rank instead of 4 GiB. The price is time: every rank still runs the generator over the
// whole global tensor (a chunk outside the box of a normal_ only advances the generator, skipping
// the Box-Muller transform); a counter-based generator (Philox on CUDA) could draw just the box.
// Chunking is also faster than one whole draw (chunks stay in cache; docs/benchmarks.md,
// "Measurements behind design choices").
//
// A chunk reproduces one device only where ATen's CPU kernel consumes the stream the same way
// for a chunk as for the whole tensor (ATen's kernels, DrawOrder; random_test compares with one
// device):
//  - uniform_, bernoulli_(float), random_ (all overloads), exponential_ and what is built on
//    them (rand, rand_like, randint_like, bernoulli.p, dropout masks): one serial pass, a fixed
//    number of 32-bit draws per element, so any chunk boundary works (kPerElement). An ATen
//    with MKL (Debian's has none) draws bernoulli_ and exponential_ through MKL's own stream
//    from one seed: draw_order_of then gives kWhole for them.
//  - normal_ (randn, randn_like) of >= 16 contiguous elements: ATen draws all N uniforms, then
//    transforms blocks of 16 by Box-Muller, and when N % 16 != 0 draws 16 more uniforms and
//    recomputes the last 16 values from them. Chunks are multiples of 16 up to F = N - N % 16,
//    each a normal_ of its own (same uniforms, same blocks, whichever vector variant ATen
//    picks); the N - F remaining uniforms are drawn and discarded, then a normal_ of 16 elements
//    gives the last 16 values (kNormalFill). Fewer than 16 elements: one whole draw.
//  - anything else (kWhole): one draw of the global tensor.
// Ops without a sharding rule that draw (multinomial, rrelu, poisson, ...) run by the replicate
// fallback, which computes them whole on every rank anyway (NOTE [replicate fallback]).
//
// NOTE [random on a CUDA mesh]: a random op or factory on a CUDA mesh (NOTE [mesh device]) draws
// from that GPU's default (Philox) generator, rank_generator(device), and gives the values one
// CUDA device gives for the same seed and generator state: torch's CUDA kernels draw a tensor's
// elements by linear index with a grid that depends on the element count only, so a draw in
// pieces would not reproduce them, and there is no offset to jump to per piece. Every rank
// therefore draws the whole global tensor on its GPU in one call (DrawOrder kWhole, whatever the
// op's CPU order) and keeps its box, and every rank's generator advances as one device's does.
// The price is a transient buffer of the global tensor per rank and op, on the GPU (no host
// copy); PyTorch's OffsetBasedRNGTracker draws only the piece, with values that differ from one
// device's. Dropout (CUDA's fused kernel draws its own way) takes its mask from native_dropout on
// ones of the global size, read in the kernel's order for the global tensor's strides (see
// run_dropout). An op given a CPU generator on a CUDA mesh draws
// on the CPU and copies its box to the GPU (the CPU generator's values).
//
// Ranks that are threads of one process (the threads backend) cannot share the process's
// default generator, so the generator is per thread: manual_seed() below seeds the calling
// rank's; without one, the process default generator is used (one process per rank, seeded
// with torch::manual_seed as usual).

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "device_mesh/device_mesh.h"
#include "layout/shard_layout.h"

namespace c10 {
struct IValue;
}  // namespace c10

namespace dtensor {

// Seeds the calling thread's (rank's) generator used by random ops on distributed tensors.
void manual_seed(uint64_t seed);
// torch.manual_seed's effect (the process default generators), taken while no thread rank has
// lent itself the CPU default (draw_with_rank_generator): thread ranks that seed it together with
// their own generator must not reseed it in the middle of another rank's draw.
void seed_process_default(uint64_t seed);
// That generator: the thread's after manual_seed, else the process default CPU generator.
at::Generator rank_generator();
// The generator random ops on tensors of `device` draw from: rank_generator() for the CPU, the
// device's default generator otherwise (NOTE [random on a CUDA mesh]).
at::Generator rank_generator(const c10::Device& device);

// NOTE [rank generators agree]
// A random op on a distributed tensor gives one device's values (and equal replicas) only when
// every rank of its mesh draws from a generator in the same state. Two ways that fail
// silently, each Replicate "replica" holding other values: ranks as threads with no
// manual_seed, which all replay the global draw from the one process default generator, each
// from where the previous rank left it; and processes whose generators differ (seeded with
// torch.manual_seed(rank) for their data, or advanced by a plain random call on some ranks
// only). So before drawing on a mesh of several ranks: ranks that are threads without their own
// generator raise, naming the op and the mesh; otherwise the generator's state is folded into
// the program digest (NOTE [program digest]), so the next collective on the mesh fails on every
// rank when the states differ. PyTorch's DTensor (CUDA only) instead copies rank 0's state at
// its first random op and keeps its own state from then on.
void check_generators_agree(const DeviceMesh& mesh, const at::Generator& generator,
                            const std::string& op);

// Runs `draw` (plain-tensor ATen calls only) so that an op with no generator argument
// (rand_like, randn_like, randint_like) draws from rank_generator(): when that is not the process
// default, the default generator takes its state for the call (under a process-wide lock, as
// ranks that are threads share the default) and hands the advanced state back.
void draw_with_rank_generator(const std::function<void()>& draw);

// The most global elements one chunk of a random draw holds (NOTE [DTensor random]): the value
// of set_random_chunk_elements when set, else DTENSOR_RANDOM_CHUNK, else 1 << 20. At least 16.
int64_t random_chunk_elements();
// Sets it for the process (every rank thread); 0 goes back to DTENSOR_RANDOM_CHUNK / default.
void set_random_chunk_elements(int64_t n);

// How an ATen CPU random fill consumes the generator, which decides where a chunk may end.
enum class DrawOrder {
  kPerElement,    // one serial pass, a fixed number of draws per element: any boundary
  kNormalFill,    // ATen's CPU normal_: blocks of 16 and a redrawn tail of 16
  kWhole,         // unknown: the global tensor in one draw
  kSerialNormal,  // ATen's CPU normal_ of a non-contiguous tensor: per element, serially
};
// The order of the ATen op `op` ("aten::normal_", "aten::rand_like", ...) on a contiguous tensor.
DrawOrder draw_order_of(const std::string& op);

// A chunk's fill for a random op given the fill of a 1-D buffer (see draw_box).
using RandomFill = std::function<at::Tensor(const at::Tensor& buffer)>;

// The fill of rand_like, randn_like and randint_like(.low_dtype), which take no generator: ATen
// computes them as empty_like(self) filled by uniform_(0, 1), normal_(0, 1) or random_(low, high)
// from the default generator; here the same fills draw from `generator`. Null for other ops.
// `args` are the op's arguments. (Lending the rank's state to the process default generator for
// the call, as draw_with_rank_generator does, races with anything else that touches the default
// meanwhile, such as torch.manual_seed on another rank thread.)
RandomFill like_fill(const std::string& op, const c10::IValue* args,
                     const at::Generator& generator);

// Fills `piece` (shape box.shape, any strides), this rank's `box` of a contiguous global tensor
// of `global_shape`, with the values one device's draw of the global tensor gives, advancing the
// generator exactly as that draw does. `fill(buffer)` must fill a contiguous 1-D buffer the way
// the op fills a global tensor of that many elements and return the filled tensor (the buffer,
// or a new tensor of its shape); `generator` is the one `fill` draws from (kNormalFill discards
// uniforms from it). At most random_chunk_elements() global elements are drawn at once.
void draw_box(const std::vector<int64_t>& global_shape, const LocalBox& box, DrawOrder order,
              const at::Generator& generator, const at::Tensor& piece, const RandomFill& fill);

// NOTE [random draws in memory order]: ATen fills a tensor in memory order (TensorIterator
// walks dims by decreasing stride: a transposed tensor column by column), and its normal_ takes
// a serial path for a non-contiguous tensor (normal_distribution<double> per element, the second
// Box-Muller value cached in the generator) instead of the blocks of 16. So the replay of a
// random op whose output's global strides are not row-major draws the global tensor in memory
// order: a contiguous tensor of the dims sorted by stride, its box and the piece permuted alike,
// normal_ and randn_like through that serial path (kSerialNormal: each chunk a strided 1-D
// buffer, which ATen fills serially; the cache carries over chunks in the generator). Checked
// against torch 2.11's CPU kernels for uniform_, normal_, bernoulli_, exponential_, random_,
// rand_like, randn_like, dropout (python/random_ranks_test.py). An op of kWhole order that is
// not among them, or strides that do not order the dims (two dims of size > 1 with one
// stride), raises, naming the op and the strides; .contiguous() first gives one device's values.
struct DrawLayout {
  std::vector<int64_t> shape;  // the global shape the replay draws (dims in memory order)
  LocalBox box;                // this rank's box of it
  at::Tensor piece;            // the piece, viewed with its dims in that order
  DrawOrder order;
};
DrawLayout draw_layout(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride,
                       const LocalBox& box, const at::Tensor& piece, DrawOrder order,
                       const std::string& op);

}  // namespace dtensor
