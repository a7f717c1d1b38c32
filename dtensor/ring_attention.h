#pragma once
// Ring attention on local pieces: scaled dot-product attention whose q, k and v are sharded along
// the sequence over one group, each rank holding some global positions of the query sequence
// and some of the key/value sequence (SeqLayout). The query never moves; k/v move either by
// rotation (RotateMethod::kAllToAll: W-1 all_to_all_single, rank r sends to r+1, O(S/W) memory)
// or by one all_gather (kAllGather: every rank then holds all of k/v, O(S)). Each (q piece, k/v
// block) pair is computed by ATen's fused CPU flash-attention kernel (an explicit fp32 score
// matrix off the CPU) and the blocks' outputs merge through their log-sum-exp in fp32 (or the
// inputs' dtype when wider). Causal masks use global positions (top-left aligned, as SDPA's
// is_causal): query i sees key j iff pos_k[j] <= pos_q[i]; a block nobody sees is skipped. The
// backward is the kernel's per block, given the final output and log-sum-exp, so it is exact.
//
// Both the C++ engine (the fused CPU attention ops on distributed tensors sharded along the
// sequence: NOTE [ring attention in the engine] in dispatch_attention.cc) and Python's
// context_parallel (pieces of head-tail load-balanced buffers) call these functions.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace dtensor::attention {

// The global positions every rank of a ring holds of a sequence of `seq_len`: per rank, its
// (offset, size) runs in the order its piece concatenates them. Positions increase along every
// piece (both layouts below), which the block search relies on.
struct SeqLayout {
  int64_t seq_len = 0;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> segments;  // [rank] -> (offset, size)

  // Rank r holds chunk r of torch.chunk's rule (Shard's arithmetic).
  static SeqLayout natural(int64_t seq_len, int64_t world);
  // PyTorch's head-tail load balance: 2W chunks by the same rule, rank r holds chunks r and
  // 2W-1-r (trailing chunks of uneven lengths may be short or empty).
  static SeqLayout head_tail(int64_t seq_len, int64_t world);

  int64_t world() const { return static_cast<int64_t>(segments.size()); }
  int64_t length(int64_t rank) const;
  bool operator==(const SeqLayout& o) const {
    return seq_len == o.seq_len && segments == o.segments;
  }
};

enum class RotateMethod : uint8_t { kAllGather, kAllToAll };

// The process-wide rotate method (PyTorch's set_rotate_method); kAllGather by default, as
// PyTorch's.
RotateMethod rotate_method();
void set_rotate_method(RotateMethod method);

struct RingPlan {
  std::string group;  // the ring's group (functional collectives' name)
  int64_t rank = 0;   // this rank's index in it
  SeqLayout q, kv;    // the layouts of q and of k/v (same world)
  bool causal = false;
  double scale = 0;  // the softmax scale (SDPA's default: 1/sqrt(q's head size))
  RotateMethod method = RotateMethod::kAllGather;
};

// q [..., Hq, Lq, E], k [..., Hk, Lk, E], v [..., Hk, Lk, Ev] (one rank >= 2; the dims before
// the heads are batch dims, equal on all three): this rank's pieces (Lq, Lk its lengths in the
// plan's layouts; Hq a multiple of Hk: GQA). Returns out [..., Hq, Lq, Ev] in q's dtype and the
// log-sum-exp [..., Hq, Lq] in fp32 (the inputs' dtype when wider), as ATen's fused CPU kernel
// returns them. Rows that see no key get out 0 and lse -inf. Every rank of the group calls it.
std::tuple<at::Tensor, at::Tensor> ring_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                          const at::Tensor& v,
                                                          const RingPlan& plan);

// The gradients (dq, dk, dv), each in its input's dtype and shape, of the forward above given its
// `out` and `lse` and the output's gradient `grad_out` (out's shape). dk/dv are this rank's
// pieces of the gradients summed over every rank's queries.
std::tuple<at::Tensor, at::Tensor, at::Tensor> ring_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const RingPlan& plan);

}  // namespace dtensor::attention
