// The extension module dtensor._C: the layout core (placements, meshes, specs, shard
// arithmetic), the collectives context, distributed tensors (tensor_bindings.cc) and
// checkpoints (checkpoint_bindings.cc). The Python package python/dtensor/ gives it
// torch.distributed.tensor's names.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "base/cpu_memory.h"
#include "base/error.h"
#include "collectives/launch_env.h"
#include "collectives/rank_context.h"
#include "layout/shard_layout.h"
#include "layout/visualize.h"

namespace py = pybind11;
using namespace dtensor;

void bind_tensors(py::module& m);           // tensor_bindings.cc
void bind_checkpoint(py::module& m);        // checkpoint_bindings.cc
void bind_sharding(py::module& m);          // sharding_bindings.cc
void bind_symmetric_memory(py::module& m);  // symmetric_memory_bindings.cc
void bind_fsdp(py::module& m);              // fsdp_bindings.cc
void bind_attention(py::module& m);         // attention_bindings.cc

namespace {

// The Python subclasses of Placement (NOTE [one Placement type]): constructors only.
struct ShardKind : Placement {
  explicit ShardKind(int32_t dim) : Placement(Placement::shard(dim)) {}
};
struct ReplicateKind : Placement {
  ReplicateKind() : Placement(Placement::replicate()) {}
};
// PyTorch's StridedShard pybind class derives from its Shard one, and so does this.
struct StridedShardKind : ShardKind {
  StridedShardKind(int32_t dim, int64_t split_factor) : ShardKind(dim) {
    static_cast<Placement&>(*this) = Placement::strided_shard(dim, split_factor);
  }
};
struct PartialKind : Placement {
  // "sum", "max", ... or "norm2" (NOTE [p-norm Partial]).
  explicit PartialKind(const std::string& op) : Placement(parse_placement("P(" + op + ")")) {}
};

// Specs from Python: dtype is irrelevant to layout arithmetic, so float32 is used.
DTensorSpec make_spec(const DeviceMesh& mesh, const std::string& placements,
                      const std::vector<int64_t>& shape, const ShardOrder& order) {
  return DTensorSpec::make(mesh, parse_placements(placements), TensorMeta::make(shape), order);
}

}  // namespace

// One statement per Python name (the layout and collectives part of the extension).
PYBIND11_MODULE(_C, m) {
  m.doc() = "Native DTensor sharding engine";
  bind_tensors(m);
  bind_checkpoint(m);
  bind_sharding(m);
  bind_symmetric_memory(m);
  bind_fsdp(m);
  bind_attention(m);
  // NOTE [error convention]: the bad values PyTorch reports as ValueError.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidValue& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  // NOTE [CPU memory meter] (benchmarks: the peak CPU tensor memory of a step).
  m.def("install_cpu_memory_meter", &install_cpu_memory_meter);
  m.def("cpu_live_bytes", &cpu_live_bytes);
  m.def("cpu_peak_bytes", &cpu_peak_bytes);
  m.def("reset_cpu_peak_bytes", &reset_cpu_peak_bytes);

  // NOTE [interrupts]: Ctrl-C reaches a rank blocked in a collective as KeyboardInterrupt within
  // kInterruptPoll. Only the main thread runs Python's signal handlers; threads Python did not
  // start have nothing to check.
  collectives::set_interrupt_hook([] {
    if (!Py_IsInitialized() || _Py_IsFinalizing() || PyGILState_GetThisThreadState() == nullptr) {
      return;
    }
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  });

  // NOTE [issuing thread]: a Python thread is labelled by its name ("MainThread", "Thread-1"),
  // equal across ranks for threads a program starts in the same order. Threads Python did not
  // start (C++ workers, autograd's device threads) have no name of their own: "".
  collectives::set_thread_label_provider([]() -> std::string {
    if (!Py_IsInitialized() || _Py_IsFinalizing() || PyGILState_GetThisThreadState() == nullptr) {
      return "";
    }
    py::gil_scoped_acquire gil;
    try {
      py::module_ threading = py::module_::import("threading");
      py::object current = threading.attr("current_thread")();
      if (py::isinstance(current, threading.attr("_DummyThread"))) return "";
      return current.attr("name").cast<std::string>();
    } catch (py::error_already_set&) {
      return "";
    }
  });

  // NOTE [one Placement type]: layout/placement.h's Placement is the one placement value. Python
  // sees it as the base class `Placement` with a subclass per kind (PyTorch's pybind classes
  // Shard, Replicate, Partial); dtensor.placement_types subclasses those, so a Python
  // placement *is* the C++ value that the bindings take, with no conversion. pybind11 raises
  // TypeError for a subclass whose __init__ skips the base's.
  py::class_<Placement>(m, "Placement",
                        "How a distributed tensor lives on one mesh dim: the base class of "
                        "Shard, Replicate and Partial.")
      .def_static("parse", &parse_placement)
      .def(
          "is_shard",
          [](Placement p, std::optional<int64_t> dim) {
            return dim ? p.is_shard(*dim) : p.is_shard();
          },
          py::arg("dim") = py::none())
      .def("is_replicate", &Placement::is_replicate)
      .def(
          "is_strided_shard",
          [](Placement p, std::optional<int64_t> dim) {
            return dim ? p.is_strided_shard(*dim) : p.is_strided_shard();
          },
          py::arg("dim") = py::none())
      .def_property_readonly("split_factor", &Placement::split_factor)
      .def(
          "is_partial",
          [](Placement p, std::optional<std::string> reduce_op) {
            return p.is_partial() && (!reduce_op || reduce_op_name(p.reduce_op()) == *reduce_op);
          },
          py::arg("reduce_op") = py::none())
      .def_property_readonly("dim", &Placement::dim)
      .def_property_readonly("norm_order", &Placement::norm_order)
      .def_property_readonly("reduce_op",
                             [](Placement p) { return std::string(reduce_op_name(p.reduce_op())); })
      .def("__eq__", [](Placement a, Placement b) { return a == b; })
      .def("__hash__", &Placement::hash)
      .def("__repr__", &Placement::to_string);
  py::class_<ShardKind, Placement>(m, "Shard", "Split along tensor dim `dim` over the mesh dim.")
      .def(py::init<int32_t>(), py::arg("dim"));
  py::class_<StridedShardKind, ShardKind>(m, "StridedShard",
                                          "_StridedShard: NOTE [strided shards] "
                                          "(layout/dtensor_spec.h).")
      .def(py::init<int32_t, int64_t>(), py::arg("dim"), py::kw_only(), py::arg("split_factor"));
  py::class_<ReplicateKind, Placement>(m, "Replicate", "The whole tensor on every rank.")
      .def(py::init<>());
  py::class_<PartialKind, Placement>(m, "Partial", "Shares whose reduction is the value.")
      .def(py::init<const std::string&>(), py::arg("reduce_op") = "sum");
  m.def("parse_placements", &parse_placements);
  m.def("chunk_sizes", &chunk_sizes);
  m.def("chunk_slice", [](int64_t n, int64_t k, int64_t i) {
    const ChunkSlice c = chunk_slice(n, k, i);
    return std::make_pair(c.size, c.offset);
  });

  // NOTE [mesh device]: the device type crosses as PyTorch's name ("cpu", "cuda").
  py::class_<DeviceMesh>(m, "DeviceMesh")
      .def(py::init([](std::vector<int64_t> shape, std::vector<int64_t> ranks,
                       std::vector<std::string> dim_names, const std::string& device_type) {
             return DeviceMesh(std::move(shape), std::move(ranks), std::move(dim_names),
                               parse_device_type(device_type));
           }),
           py::arg("shape"), py::arg("ranks"), py::arg("dim_names") = std::vector<std::string>{},
           py::arg("device_type") = "cpu")
      .def_static(
          "arange",
          [](std::vector<int64_t> shape, std::vector<std::string> dim_names,
             const std::string& device_type) {
            return DeviceMesh::arange(std::move(shape), std::move(dim_names),
                                      parse_device_type(device_type));
          },
          py::arg("shape"), py::arg("dim_names") = std::vector<std::string>{},
          py::arg("device_type") = "cpu")
      .def_property_readonly("device_type",
                             [](const DeviceMesh& m) { return device_type_name(m.device_type()); })
      .def(
          "with_device_type",
          [](const DeviceMesh& m, const std::string& device_type) {
            return m.with_device_type(parse_device_type(device_type));
          },
          py::arg("device_type"))
      .def("local_device", [](const DeviceMesh& m) { return m.local_device().str(); })
      .def_property_readonly("shape", &DeviceMesh::shape)
      .def_property_readonly("ndim", &DeviceMesh::ndim)
      .def_property_readonly("ranks", &DeviceMesh::ranks)
      .def_property_readonly("dim_names", &DeviceMesh::dim_names)
      .def("coordinate", &DeviceMesh::coordinate)
      .def("group_ranks", &DeviceMesh::group_ranks)
      .def("group_name", &DeviceMesh::group_name)
      .def("submesh", &DeviceMesh::submesh)
      .def("flatten", &DeviceMesh::flatten, py::arg("names"), py::arg("name") = "")
      .def("__eq__", [](const DeviceMesh& a, const DeviceMesh& b) { return a == b; })
      .def("__hash__", [](const DeviceMesh& a) { return std::hash<std::string>()(a.to_string()); })
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

  // Collectives: the rendezvous and groups live here; the collectives themselves are the
  // dtensor_c10d operators this library registers (torch.ops.dtensor_c10d.*), wrapped by
  // dtensor._functional_collectives.
  using collectives::RankContext;
  py::class_<RankContext, std::shared_ptr<RankContext>>(m, "RankContext")
      .def_property_readonly("rank", &RankContext::rank)
      .def_property_readonly("world_size", &RankContext::world_size)
      .def_property_readonly("backend", &RankContext::backend)
      .def_property_readonly("job", &RankContext::job)
      .def("new_group", &RankContext::new_group, py::arg("ranks"), py::arg("tag") = "",
           py::call_guard<py::gil_scoped_release>())
      .def("register_mesh", &RankContext::register_mesh, py::arg("mesh"),
           py::call_guard<py::gil_scoped_release>())
      .def("leave", &RankContext::leave, py::arg("why"), py::call_guard<py::gil_scoped_release>(),
           "This rank leaves its groups with the error `why`: peers waiting for it fail at once "
           "(NOTE [leaving a group]).")
      .def(
          "group_ranks",
          [](RankContext& c, const std::string& name) { return c.group(name).ranks; },
          py::arg("name"));
  m.def(
      "current_context", [] { return &collectives::current_context(); },
      py::return_value_policy::reference,
      "The calling thread's collectives context (a thread rank's, else the process's).");
  m.def(
      "init_from_env",
      [](const std::string& backend, int64_t timeout_ms) {
        return collectives::init_from_env(backend, timeout_ms > 0
                                                       ? std::chrono::milliseconds(timeout_ms)
                                                       : collectives::default_timeout());
      },
      py::arg("backend") = "", py::arg("timeout_ms") = 0, py::call_guard<py::gil_scoped_release>(),
      "Rendezvous from torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) through "
      "a TCPStore and install the process's collectives context.");
  m.def(
      "join_fake_job",
      [](int64_t rank, int64_t world_size) {
        static std::atomic<int64_t> jobs{0};
        collectives::set_process_context(std::make_shared<RankContext>(
            rank, world_size, "fake",
            "fake-" + std::to_string(::getpid()) + "-" + std::to_string(jobs++)));
      },
      py::arg("rank"), py::arg("world_size"),
      "Makes this process rank `rank` of `world_size` on the \"fake\" backend, whose other ranks "
      "do not exist (NOTE [fake backend]): torch.distributed's fake process group.");
  m.def(
      "default_backend",
      [](const std::string& device_type, std::optional<int64_t> devices) {
        return collectives::default_backend(parse_device_type(device_type), devices);
      },
      py::arg("device_type") = "cpu", py::arg("devices") = py::none(),
      "The collectives backend a launched job uses for meshes of this device type (`devices`: "
      "how many of them this process sees; default: libtorch's count).");
  m.def(
      "select_local_device",
      [](const std::string& device_type) {
        collectives::select_local_device(parse_device_type(device_type));
      },
      py::arg("device_type"),
      "Makes LOCAL_RANK % device count the current device of this type (PyTorch's "
      "init_device_mesh).");
}
