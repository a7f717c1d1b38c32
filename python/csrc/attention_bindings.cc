// dtensor._C's ring attention (dtensor/ring_attention.h), used by
// python/dtensor/experimental/_ring_attention.py, and the process-wide rotate method the C++
// engine's ring attention reads too (NOTE [ring attention in the engine]). The ring's calls
// communicate and release the GIL (other thread ranks run Python meanwhile).

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "dtensor/dispatch.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/ring_attention.h"

namespace py = pybind11;
using namespace dtensor::attention;

namespace {

using Segments = std::vector<std::vector<std::pair<int64_t, int64_t>>>;

RingPlan plan_of(const std::string& group, int64_t rank, int64_t q_len, const Segments& q,
                 int64_t kv_len, const Segments& kv, bool causal, double scale,
                 const std::string& method) {
  RingPlan plan;
  plan.group = group;
  plan.rank = rank;
  plan.q = SeqLayout{q_len, q};
  plan.kv = SeqLayout{kv_len, kv};
  plan.causal = causal;
  plan.scale = scale;
  plan.method = method == "alltoall" ? RotateMethod::kAllToAll : RotateMethod::kAllGather;
  return plan;
}

}  // namespace

void bind_attention(py::module& m) {
  using Release = py::call_guard<py::gil_scoped_release>;
  m.def("set_rotate_method", [](const std::string& method) {
    if (method != "allgather" && method != "alltoall") {
      throw dtensor::Error("set_rotate_method: '" + method +
                           "' is not a rotate method; use 'allgather' or 'alltoall'");
    }
    set_rotate_method(method == "alltoall" ? RotateMethod::kAllToAll : RotateMethod::kAllGather);
  });
  m.def("rotate_method", [] {
    return std::string(rotate_method() == RotateMethod::kAllToAll ? "alltoall" : "allgather");
  });
  // (mesh dim, refusal) of NOTE [ring attention in the engine] for distributed q, k, v.
  m.def(
      "ring_attention_mesh_dim", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
        const dtensor::RingLayout r = dtensor::ring_attention_mesh_dim(
            dtensor::spec_of(q, "query"), dtensor::spec_of(k, "key"), dtensor::spec_of(v, "value"));
        return std::make_pair(r.mesh_dim, r.refusal);
      });
  // A plan as its parts: the group, this rank's index, each sequence's length and per-rank
  // (offset, size) runs, causal, the scale and the method ("allgather" or "alltoall").
  m.def(
      "ring_attention_forward",
      [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::string& group,
         int64_t rank, int64_t q_len, const Segments& q_segs, int64_t kv_len,
         const Segments& kv_segs, bool causal, double scale, const std::string& method) {
        return ring_attention_forward(
            q, k, v, plan_of(group, rank, q_len, q_segs, kv_len, kv_segs, causal, scale, method));
      },
      Release());
  m.def(
      "ring_attention_backward",
      [](const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
         const at::Tensor& out, const at::Tensor& lse, const std::string& group, int64_t rank,
         int64_t q_len, const Segments& q_segs, int64_t kv_len, const Segments& kv_segs,
         bool causal, double scale, const std::string& method) {
        return ring_attention_backward(
            grad_out, q, k, v, out, lse,
            plan_of(group, rank, q_len, q_segs, kv_len, kv_segs, causal, scale, method));
      },
      Release());
}
