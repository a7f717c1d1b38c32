// dtensor._C's FSDP runtime (fsdp/flat_params.h, NOTE [FSDP runtime in C++]), used by
// python/dtensor/fsdp/_param_group.py. Every call that copies or communicates releases the GIL.

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <tuple>

#include "fsdp/flat_params.h"

namespace py = pybind11;
using namespace dtensor::fsdp;

void bind_fsdp(py::module& m) {
  using Release = py::call_guard<py::gil_scoped_release>;
  py::class_<FlatParams, std::shared_ptr<FlatParams>>(m, "FsdpFlatParams")
      .def(py::init([](const std::vector<std::tuple<std::vector<int64_t>, int64_t, bool>>& params,
                       int64_t shard_size) {
             std::vector<FlatParam> ps;
             for (const auto& [shape, dim, replicated] : params)
               ps.push_back({shape, dim, replicated});
             return std::make_shared<FlatParams>(std::move(ps), shard_size);
           }),
           py::arg("params"), py::arg("shard_size"))
      .def_property_readonly("per_rank_numel", &FlatParams::per_rank_numel)
      .def("padded_numel", &FlatParams::padded_numel, py::arg("index"))
      .def("chunk", &FlatParams::chunk, py::arg("index"))
      .def("local_slices", &FlatParams::local_slices, py::arg("index"), py::arg("shard_rank"))
      // The unsharded parameters' storage is refilled in place: autograd saved them (or views)
      // in an earlier forward, so the copy must neither be recorded nor bump their version
      // counters (PyTorch's FSDP refills under _unsafe_preserve_version_counter).
      .def(
          "copy_out",
          [](const FlatParams& layout, const at::Tensor& gathered,
             const std::vector<at::Tensor>& dsts) {
            at::AutoDispatchBelowADInplaceOrView below_autograd;
            layout.copy_out(gathered, dsts);
          },
          py::arg("gathered"), py::arg("dsts"), Release())
      .def("pieces_of", &FlatParams::pieces_of, py::arg("reduced"), py::arg("shard_rank"),
           Release())
      .def(
          "copy_rows",
          [](const FlatParams& layout, const std::vector<at::Tensor>& fulls, const at::Tensor& flat,
             int64_t first_row, int64_t rows) {
            at::NoGradGuard no_grad;
            layout.copy_rows(fulls, flat, first_row, rows, "post-forward copy-in");
          },
          py::arg("fulls"), py::arg("flat"), py::arg("first_row"), py::arg("rows"), Release());
  m.def("fsdp_all_gather", &all_gather, py::arg("layout"), py::arg("pieces"), py::arg("flat"),
        py::arg("group"), py::arg("async_op"), Release());
  m.def("fsdp_reduce_scatter", &reduce_scatter, py::arg("layout"), py::arg("grads"),
        py::arg("flat"), py::arg("group"), py::arg("async_op"), Release());
}
