// The Python face of the layout core (module dtensor_engine._C). Later issues grow this into a
// torch.distributed.tensor-compatible package; for now it exposes placements, meshes, specs and
// shard arithmetic so Python tests can check them against torch itself.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "dtensor/shard_layout.h"
#include "dtensor/visualize.h"

namespace py = pybind11;
using namespace dtensor;

namespace {

// Specs from Python: dtype is irrelevant to layout arithmetic, so float32 is used.
DTensorSpec make_spec(const DeviceMesh& mesh, const std::string& placements,
                      const std::vector<int64_t>& shape, const ShardOrder& order) {
  return DTensorSpec::make(mesh, parse_placements(placements), TensorMeta::make(shape), order);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Native DTensor sharding engine: layout core";

  py::class_<Placement>(m, "Placement")
      .def_static("parse", &parse_placement)
      .def("is_shard", py::overload_cast<>(&Placement::is_shard, py::const_))
      .def("is_replicate", &Placement::is_replicate)
      .def("is_partial", &Placement::is_partial)
      .def_property_readonly("dim", &Placement::dim)
      .def_property_readonly("reduce_op",
                             [](Placement p) { return std::string(reduce_op_name(p.reduce_op())); })
      .def("__eq__", [](Placement a, Placement b) { return a == b; })
      .def("__hash__", &Placement::hash)
      .def("__repr__", &Placement::to_string);
  m.def("parse_placements", &parse_placements);
  m.def("chunk_sizes", &chunk_sizes);

  py::class_<DeviceMesh>(m, "DeviceMesh")
      .def(py::init<std::vector<int64_t>, std::vector<int64_t>, std::vector<std::string>>(),
           py::arg("shape"), py::arg("ranks"), py::arg("dim_names") = std::vector<std::string>{})
      .def_static("arange", &DeviceMesh::arange, py::arg("shape"),
                  py::arg("dim_names") = std::vector<std::string>{})
      .def_property_readonly("shape", &DeviceMesh::shape)
      .def_property_readonly("ndim", &DeviceMesh::ndim)
      .def_property_readonly("ranks", &DeviceMesh::ranks)
      .def("coordinate", &DeviceMesh::coordinate)
      .def("group_ranks", &DeviceMesh::group_ranks)
      .def("group_name", &DeviceMesh::group_name)
      .def("submesh", &DeviceMesh::submesh)
      .def("flatten", &DeviceMesh::flatten, py::arg("names"), py::arg("name") = "")
      .def("__repr__", &DeviceMesh::to_string);

  py::class_<LocalBox>(m, "LocalBox")
      .def_readonly("shape", &LocalBox::shape)
      .def_readonly("offset", &LocalBox::offset);

  m.def(
      "local_box",
      [](const DeviceMesh& mesh, const std::string& placements, const std::vector<int64_t>& shape,
         const std::vector<int64_t>& coordinate, const ShardOrder& order) {
        return local_box(make_spec(mesh, placements, shape, order), coordinate);
      },
      py::arg("mesh"), py::arg("placements"), py::arg("shape"), py::arg("coordinate"),
      py::arg("shard_order") = ShardOrder{});
  m.def(
      "owner_ranks",
      [](const DeviceMesh& mesh, const std::string& placements, const std::vector<int64_t>& shape,
         const std::vector<int64_t>& index) {
        return owner_ranks(make_spec(mesh, placements, shape, {}), index);
      },
      py::arg("mesh"), py::arg("placements"), py::arg("shape"), py::arg("index"));
  m.def(
      "visualize_sharding",
      [](const DeviceMesh& mesh, const std::string& placements, const std::vector<int64_t>& shape) {
        return visualize_sharding(make_spec(mesh, placements, shape, {}));
      },
      py::arg("mesh"), py::arg("placements"), py::arg("shape"));
}
