// dtensor._C's symmetric memory (collectives/symmetric_memory.h, NOTE [symmetric memory]); the
// Python names are dtensor.symmetric_memory's (PyTorch's torch.distributed._symmetric_memory).

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/utils/pybind.h>

#include "base/error.h"
#include "collectives/functional.h"
#include "collectives/symmetric_memory.h"

namespace py = pybind11;
using namespace dtensor::collectives;

namespace {
c10::ScalarType dtype_of(const py::object& d) {
  if (!THPDtype_Check(d.ptr()))
    throw dtensor::Error("symmetric memory: dtype is not a torch.dtype");
  return reinterpret_cast<THPDtype*>(d.ptr())->scalar_type;
}
}  // namespace

void bind_symmetric_memory(py::module& m) {
  using Release = py::call_guard<py::gil_scoped_release>;
  py::class_<SymmetricMemory, std::shared_ptr<SymmetricMemory>>(m, "SymmetricMemory")
      .def_property_readonly("rank", &SymmetricMemory::rank)
      .def_property_readonly("world_size", &SymmetricMemory::world_size)
      .def_property_readonly("group_name", &SymmetricMemory::group)
      .def_property_readonly("buffer_size", &SymmetricMemory::buffer_bytes)
      .def_property_readonly("buffer_ptrs",
                             [](const SymmetricMemory& s) {
                               std::vector<uintptr_t> ptrs;
                               for (int64_t r = 0; r < s.world_size(); ++r) {
                                 ptrs.push_back(reinterpret_cast<uintptr_t>(s.buffer_ptr(r)));
                               }
                               return ptrs;
                             })
      .def(
          "get_buffer",
          [](const SymmetricMemory& s, int64_t rank, std::vector<int64_t> sizes, py::object dtype,
             int64_t storage_offset) {
            return s.buffer_of(rank, sizes, dtype_of(dtype), storage_offset);
          },
          py::arg("rank"), py::arg("sizes"), py::arg("dtype"), py::arg("storage_offset") = 0)
      .def("barrier", &SymmetricMemory::barrier, py::arg("channel") = 0, Release())
      .def("put_signal", &SymmetricMemory::put_signal, py::arg("dst_rank"), py::arg("channel") = 0,
           Release())
      .def("wait_signal", &SymmetricMemory::wait_signal, py::arg("src_rank"),
           py::arg("channel") = 0, Release());
  m.def(
      "symmetric_empty",
      [](std::vector<int64_t> sizes, py::object dtype) {
        return symmetric_empty(sizes, dtype_of(dtype));
      },
      py::arg("sizes"), py::arg("dtype"));
  m.def("is_symmetric", &is_symmetric, py::arg("tensor"));
  m.def("symmetric_rendezvous", &rendezvous, py::arg("tensor"), py::arg("group"), Release());
  m.def("symmetric_collectives_run", &symmetric_collectives_run);
  m.def("all_gather_into", &all_gather_into, py::arg("input"), py::arg("output"), py::arg("group"),
        Release(),
        "all_gather along dim 0 into a preallocated output (collectives::all_gather_into).");
}
