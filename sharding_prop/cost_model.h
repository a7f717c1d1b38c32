#pragma once
// NOTE [one cost model]
// The one place that prices anything (communication, and compute: NOTE below), used by the
// redistribute planner to choose among plans and by the sharding propagator to choose among
// strategies, so the two never disagree (PyTorch's do: issues 157585, 169439). A step costs
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
//
// NOTE [compute in the cost model]
// Communication is not the only price: a candidate that leaves an op's inputs replicated makes
// every rank compute the whole result, where a sharded candidate computes 1/N of it (the weight
// gradient of a column-parallel nn.Linear whose output gradient arrives replicated: mm of a
// replicated grad_out and input, later chunked by the parameter's hook). So the propagator prices
// each candidate as
//     input redistributes (step_cost, above) + compute_cost(FLOPs of the op on this rank's piece)
// The FLOPs come from the op's table entry (OpEntry::flops, NOTE [one entry per op]) and its
// rule's factors: a factor sharded over k ranks has size ceil(size / k) on the largest piece, a
// contraction (the matmul family) does 2 x the product of all its factors' sizes, an elementwise
// op one per output element; every other family is priced by its communication only. Only global
// metadata enters (shapes, placements, mesh sizes), never a timing at run time, so every rank
// makes the same choice; equal costs still go to the earlier candidate.
//
// NOTE [cost model per device]
// The figures are those of the mesh's device type (cost_model_for(mesh.device_type())), global
// metadata equal on every rank and part of every cache key (specs hold their mesh), so plans and
// strategies cached for a CPU mesh never serve a CUDA one:
//   CPU   the shm backend on this 2-core machine (the defaults above);
//   CUDA  the CUDA backend this project has measured between ranks of one host, cuda_ipc (NOTE
//         [cuda_ipc backend]): bus bandwidth 41.9 GB/s (all_gather, 2 ranks on one H200,
//         docs/benchmarks.md), latency 60 us (three host meetings a call, each near the shm
//         backend's 22 us small-message all_reduce), device copies 1806 GB/s (measured in the
//         same run), compute 50e6 FLOP/us (50 TFLOP/s: an H100's fp32 rate is 67 TFLOP/s dense,
//         by NVIDIA's figures; not measured here). NCCL between GPUs moves data faster; with no
//         figure of ours for it, CUDA meshes take cuda_ipc's.
// So a product a CPU rank is better off splitting (the weight gradient above) stays whole on a
// GPU, where its compute costs a thousandth and a collective several times more.
// The rate is configured, not measured at run time: flops_per_us = 50e3 (50 GFLOP/s) is this
// machine kind's single-thread fp32 GEMM rate, measured once (2026-11-26) with torch.mm of two
// 512x512 float32 matrices under torch.set_num_threads(1): medians of 15 timings of 20 calls
// gave 36, 50, 62, 84 and 160 GFLOP/s over five runs on the 2-core machine shared with a build,
// 50 the typical figure (256x32 @ 32x256, the TP linear step's weight-gradient product, ran at
// about 20). Only its ratio to the communication figures matters, as for them.
// A candidate the propagator adds only for compute (an op whose inputs are all replicated on a
// mesh dim, sharded there so each rank computes a piece: propagator_search.cc) is also charged
// the all_gather that would bring its output back to Replicate, so it wins only where it cannot
// lose even when the result is needed whole. For linear_step's weight gradient (mm of [256,32] and
// [32,256], 4.2 MFLOP) on 2 ranks: whole 83.9 us against 41.9 (half the product) + 0.4 (the
// local chunk) + 23.1 (the all_gather charge) = 65.4 us; it would stay whole at a rate above
// about 89e3 FLOP/us, or for a batch below about 18 rows. Copies, fills and casts count no FLOPs
// (ops/pointwise_ops.cc: moves_data).

#include <c10/core/DeviceType.h>

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
  double flops_per_us = 50e3;   // local compute, FLOP/us (NOTE [compute in the cost model])

  // Cost of one step. `bytes` is the nccl-tests size of the collective as this rank sees it
  // (all_gather: output; reduce_scatter: input; all_reduce, all_to_all: the buffer; all_to_all_v:
  // the bytes received; local ops: bytes written). `group_size` 1 costs nothing for collectives.
  double step_cost(CommKind kind, int64_t group_size, int64_t bytes) const;
  // Cost of computing `flops` floating-point operations on one rank (NOTE [compute in the cost
  // model]).
  double compute_cost(double flops) const;
};

// The CPU model (the shm backend's figures).
const CostModel& default_cost_model();
// The model of a mesh on `device` (NOTE [cost model per device]).
const CostModel& cost_model_for(c10::DeviceType device);

}  // namespace dtensor
