#pragma once
// NOTE [one cost model]
// The one function that prices communication, used by the redistribute planner to choose among
// plans and by the sharding propagator to choose among strategies, so the two never
// disagree (PyTorch's do: issues 157585, 169439). A step costs
//     latency (once per collective over more than one rank) + bus bytes / bandwidth
// where bus bytes follow nccl-tests' definitions for the data one rank moves:
//     all_gather      output bytes      x (n-1)/n
//     reduce_scatter  input bytes       x (n-1)/n
//     all_reduce      bytes             x 2(n-1)/n
//     all_to_all      bytes             x (n-1)/n
//     all_to_all_v    the most bytes any rank receives from others (exact, from the layouts)
//     local ops       bytes written, at local memory bandwidth, no latency
// Costs are in microseconds. The defaults are this project's measurements of the shm backend on
// one host (README, `./x bench collectives`); only ratios matter for choosing.

#include <cstdint>
#include <string_view>

namespace dtensor {

enum class CommKind : uint8_t {
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kAllToAll,
  kAllToAllV,   // a general exchange over one or more mesh dims (each rank gets exactly its need)
  kLocalChunk,  // Replicate -> Shard: keep this rank's slice
  kPartition,   // Replicate -> Partial (internal only): keep the value on one rank, identities else
};

std::string_view comm_kind_name(CommKind kind);

struct CostModel {
  double latency_us = 10.0;     // per collective
  double bandwidth_gbs = 10.0;  // bus bandwidth of a collective, GB/s
  double local_gbs = 40.0;      // local copies, GB/s

  // Cost of one step. `bytes` is the nccl-tests size of the collective as this rank sees it
  // (all_gather: output; reduce_scatter: input; all_reduce, all_to_all: the buffer; all_to_all_v:
  // the bytes received; local ops: bytes written). `group_size` 1 costs nothing for collectives.
  double step_cost(CommKind kind, int64_t group_size, int64_t bytes) const;
};

// The model every planner uses unless told otherwise.
const CostModel& default_cost_model();

}  // namespace dtensor
