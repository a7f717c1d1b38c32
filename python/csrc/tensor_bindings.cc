// Distributed tensors for Python (part of module dtensor._C): they cross into Python as plain
// torch.Tensor objects whose TensorImpl is a DTensorImpl, so torch's own Python bindings send
// every op straight into the C++ dispatch kernel (dtensor/dispatch.h) with no Python on the
// path. These functions are the DTensor-specific entry points; python/dtensor/ wraps them with
// torch.distributed.tensor's names.

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <unistd.h>

#include <atomic>
#include <memory>
#include <optional>

#include "base/error.h"
#include "collectives/c10d_backend.h"
#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "collectives/torch_process_group.h"
#include "dtensor/api.h"
#include "dtensor/dispatch.h"
#include "dtensor/flop_counter.h"
#include "dtensor/random.h"
#include "layout/visualize.h"
#include "sharding_prop/propagator.h"

namespace py = pybind11;
using namespace dtensor;

namespace {

using Release = py::call_guard<py::gil_scoped_release>;

// A rank context installed on the calling thread while alive (simulation mode: ranks are
// Python threads of one process).
class ThreadRank {
 public:
  explicit ThreadRank(std::shared_ptr<collectives::RankContext> ctx)
      : scope_(std::make_unique<collectives::RankScope>(std::move(ctx))) {}

 private:
  std::unique_ptr<collectives::RankScope> scope_;
};

std::optional<std::vector<int64_t>> opt_ints(const py::object& o) {
  if (o.is_none()) return std::nullopt;
  return o.cast<std::vector<int64_t>>();
}

// The argument kinds explain() needs: tensors, None, bools, ints, floats, strings, int lists.
c10::IValue to_ivalue(const py::handle& a) {
  if (a.is_none()) return c10::IValue();
  if (THPVariable_Check(a.ptr())) return THPVariable_Unpack(a.ptr());
  if (py::isinstance<py::bool_>(a)) return a.cast<bool>();
  if (py::isinstance<py::int_>(a)) return a.cast<int64_t>();
  if (py::isinstance<py::float_>(a)) return a.cast<double>();
  if (py::isinstance<py::str>(a)) return a.cast<std::string>();
  if (py::isinstance<py::list>(a) || py::isinstance<py::tuple>(a)) {
    const py::sequence seq = a.cast<py::sequence>();
    if (seq.size() > 0 && THPVariable_Check(seq[0].ptr())) {
      return c10::List<at::Tensor>(a.cast<std::vector<at::Tensor>>());
    }
    return a.cast<std::vector<int64_t>>();
  }
  throw Error("explain: unsupported argument " + py::repr(a).cast<std::string>());
}

// TensorOptions from Python's dtype (None: the default dtype) and requires_grad.
at::TensorOptions options_for(const py::object& dtype, bool requires_grad) {
  return at::TensorOptions()
      .requires_grad(requires_grad)
      .dtype(dtype.is_none() ? at::get_default_dtype()
                             : caffe2::TypeMeta::fromScalarType(
                                   reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type));
}

// A Python number as an at::Scalar of its own kind: an int stays an int64 (exact past 2**53,
// where a double is not), a float a double, a bool a bool, a complex a complex<double>.
at::Scalar scalar_from_python(const py::handle& v) {
  if (py::isinstance<py::bool_>(v)) return at::Scalar(v.cast<bool>());
  if (py::isinstance<py::int_>(v)) return at::Scalar(v.cast<int64_t>());
  if (py::isinstance<py::float_>(v)) return at::Scalar(v.cast<double>());
  if (PyComplex_Check(v.ptr())) {
    return at::Scalar(
        c10::complex<double>(PyComplex_RealAsDouble(v.ptr()), PyComplex_ImagAsDouble(v.ptr())));
  }
  throw Error("full: fill_value must be a bool, int, float or complex, got " +
              py::repr(v).cast<std::string>());
}

// The calling thread's open CommPurpose scopes (pushed and popped from Python).
std::vector<std::unique_ptr<collectives::CommPurpose>>& comm_purposes() {
  thread_local std::vector<std::unique_ptr<collectives::CommPurpose>> scopes;
  return scopes;
}

// NOTE [caller locks and thread ranks] (dispatch.h): ops on distributed tensors never block in a
// collective holding the GIL (torch's property getters such as .mT call ops with it held).
void release_gil_if_held(void (*body)(void*), void* ctx) {
  if (PyGILState_Check() == 0) return body(ctx);
  py::gil_scoped_release no_gil;
  body(ctx);
}

}  // namespace

// One statement per Python name; a long list of bindings by nature (splitting it would scatter the
// Python surface over several places).
void bind_tensors(py::module& m) {
  set_caller_lock_release(&release_gil_if_held);
  m.def("is_dtensor", [](const at::Tensor& t) { return is_dtensor(t); });
  m.def("placements", [](const at::Tensor& t) { return api::spec(t).placements(); });
  // As PyTorch writes them: a non-default shard order as _StridedShard (NOTE [strided shards]).
  m.def("torch_placements", [](const at::Tensor& t) { return torch_placements(api::spec(t)); });
  m.def("mesh", [](const at::Tensor& t) { return api::spec(t).mesh(); });
  // Empty for the default (ascending) order; else per tensor dim the mesh dims in split order.
  m.def("shard_order", [](const at::Tensor& t) {
    const DTensorSpec& s = api::spec(t);
    return s.has_default_shard_order() ? ShardOrder{} : s.shard_order();
  });
  m.def("to_string", [](const at::Tensor& t) { return api::to_string(t); });
  m.def("visualize", [](const at::Tensor& t) { return visualize_sharding(api::spec(t)); });

  m.def("distribute_tensor", &api::distribute_tensor, py::arg("tensor"), py::arg("mesh"),
        py::arg("placements"), py::arg("src_rank") = std::nullopt, Release());
  m.def(
      "from_local",
      [](const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements,
         bool run_check, const py::object& shape, const py::object& stride,
         const ShardOrder& shard_order) {
        auto sh = opt_ints(shape);
        auto st = opt_ints(stride);
        py::gil_scoped_release release;
        return api::from_local(local, mesh, placements, run_check, sh, st, shard_order);
      },
      py::arg("local"), py::arg("mesh"), py::arg("placements"), py::arg("run_check") = false,
      py::arg("shape") = py::none(), py::arg("stride") = py::none(),
      py::arg("shard_order") = ShardOrder{});
  m.def("to_local", &api::to_local, py::arg("dtensor"), py::arg("grad_placements") = std::nullopt,
        Release());
  m.def("keep_grad_layout", [](at::Tensor t) { api::keep_grad_layout(t); });
  m.def("full_tensor", &api::full_tensor, py::arg("dtensor"), Release());
  m.def("redistribute",
        static_cast<at::Tensor (*)(const at::Tensor&, const Placements&, bool)>(&api::redistribute),
        py::arg("dtensor"), py::arg("placements"), py::arg("async_op") = false, Release());
  m.def("redistribute_to_mesh",
        static_cast<at::Tensor (*)(const at::Tensor&, const DeviceMesh&, const Placements&, bool,
                                   const std::string&)>(&api::redistribute),
        py::arg("dtensor"), py::arg("mesh"), py::arg("placements"), py::arg("async_op") = false,
        py::arg("channel") = "", Release());

  using Factory = at::Tensor (*)(const std::vector<int64_t>&, const DeviceMesh&, const Placements&,
                                 at::TensorOptions);
  auto factory = [&m](const char* name, Factory f) {
    m.def(
        name,
        [f](const std::vector<int64_t>& size, const DeviceMesh& mesh, const Placements& pl,
            py::object dtype, bool requires_grad) {
          const at::TensorOptions o = options_for(dtype, requires_grad);
          py::gil_scoped_release release;
          return f(size, mesh, pl, o);
        },
        py::arg("size"), py::arg("mesh"), py::arg("placements"), py::arg("dtype") = py::none(),
        py::arg("requires_grad") = false);
  };
  factory("empty", &api::empty);
  factory("zeros", &api::zeros);
  factory("ones", &api::ones);
  factory("rand", &api::rand);
  factory("randn", &api::randn);
  m.def(
      "full",
      [](const std::vector<int64_t>& size, const py::object& fill_value, const DeviceMesh& mesh,
         const Placements& pl, py::object dtype, bool requires_grad) {
        const at::Scalar value = scalar_from_python(fill_value);
        const at::TensorOptions o = options_for(dtype, requires_grad);
        py::gil_scoped_release release;
        return api::full(size, value, mesh, pl, o);
      },
      py::arg("size"), py::arg("fill_value"), py::arg("mesh"), py::arg("placements"),
      py::arg("dtype") = py::none(), py::arg("requires_grad") = false);
  m.def("manual_seed", &api::manual_seed, py::arg("seed"));
  m.def("seed_process_default", &seed_process_default, py::arg("seed"));

  m.def(
      "init_device_mesh",
      [](const std::vector<int64_t>& shape, const std::vector<std::string>& dim_names,
         const std::string& device_type) {
        const c10::DeviceType type = parse_device_type(device_type);
        py::gil_scoped_release release;
        return api::init_device_mesh(shape, dim_names, type);
      },
      py::arg("shape"), py::arg("dim_names") = std::vector<std::string>{},
      py::arg("device_type") = "cpu");
  m.def("has_context", &collectives::has_current_context);
  m.def("barrier", &collectives::barrier, py::arg("group"), Release());
  m.def(
      "all_reduce_into",
      [](const at::Tensor& input, const at::Tensor& output, const std::string& op,
         const std::string& group) {
        collectives::all_reduce_into(input, output, dtensor::parse_reduce_op(op), group);
      },
      py::call_guard<py::gil_scoped_release>(),
      "all_reduce into a preallocated output (collectives::all_reduce_into).");
  m.def(
      "context_register_mesh",
      [](const DeviceMesh& mesh) {
        const auto& ctx = collectives::current_context();
        for (int64_t r : mesh.ranks()) {
          if (r >= ctx.world_size()) {
            throw Error("DeviceMesh " + mesh.to_string() + " names rank " + std::to_string(r) +
                        " but the world has " + std::to_string(ctx.world_size()) + " ranks");
          }
        }
        if (mesh.contains(ctx.rank())) collectives::current_context().register_mesh(mesh);
      },
      Release());
  // NOTE [collective purpose]: Python's `with funcol._purpose(name):` pushes and pops a scope.
  m.def("push_comm_purpose", [](std::string purpose) {
    comm_purposes().push_back(std::make_unique<collectives::CommPurpose>(std::move(purpose)));
  });
  m.def("pop_comm_purpose", [] {
    if (!comm_purposes().empty()) comm_purposes().pop_back();
  });
  m.def("comm_purpose", [] { return collectives::current_purpose(); });
  m.def("group_size", [](const std::string& name) {
    return static_cast<int64_t>(collectives::current_context().group(name).ranks.size());
  });
  m.def("group_ranks",
        [](const std::string& name) { return collectives::current_context().group(name).ranks; });
  m.def(
      "new_group",
      [](const std::vector<int64_t>& ranks) {
        return collectives::current_context().new_group(ranks);
      },
      Release());
  m.def("mesh_group_name", [](const DeviceMesh& mesh, int64_t dim) {
    auto& ctx = collectives::current_context();
    ctx.register_mesh(mesh);
    return mesh.group_name(dim, ctx.rank());
  });
  // The c10d ProcessGroup of engine group `group`, registered under torch_group_name(group) for
  // torch's collectives (NOTE [mesh groups as torch process groups]).
  m.def("torch_process_group", &collectives::torch_process_group, py::arg("group"), Release());
  m.def("torch_group_name", &collectives::torch_group_name, py::arg("group"));
  m.def("rank", []() { return collectives::current_context().rank(); });
  m.def("world_size", []() { return collectives::current_context().world_size(); });

  // Modes.
  m.def("set_strict", [](bool on) { return std::make_unique<api::StrictModeGuard>(on); });
  py::class_<api::StrictModeGuard>(m, "StrictModeGuard");
  py::class_<api::ReplicatePlainTensorsGuard>(m, "ReplicatePlainTensorsGuard");
  m.def("replicate_plain_tensors",
        [](bool on) { return std::make_unique<api::ReplicatePlainTensorsGuard>(on); });
  m.def("strict_mode_enabled", &strict_mode_enabled);

  // Debug.
  py::class_<collectives::CommCounter>(m, "CommCounter")
      .def(py::init<>())
      .def("total", &collectives::CommCounter::total)
      .def("counts_by_cause", &collectives::CommCounter::counts_by_cause)
      // Counts by collective name; `backward`: only those issued in (true) or outside (false)
      // autograd's backward.
      .def(
          "kinds",
          [](const collectives::CommCounter& c, std::optional<bool> backward) {
            std::map<std::string, int64_t> out;
            for (const auto& r : c.records()) {
              if (backward && r.backward != *backward) continue;
              const bool scatter = r.label == collectives::kScatterLabel;
              ++out[scatter ? r.label : collectives::collective_name(r.kind)];
            }
            return out;
          },
          py::arg("backward") = py::none())
      // A collective the engine did not issue (torch's own, on a group of another backend):
      // `kind` is a collective_name ("all_reduce", ...), `label` the name it is counted under.
      .def(
          "record",
          [](collectives::CommCounter& c, const std::string& kind, const std::string& label,
             const std::string& group, bool backward) {
            for (auto k :
                 {collectives::CollectiveKind::kAllReduce, collectives::CollectiveKind::kAllGather,
                  collectives::CollectiveKind::kReduceScatter,
                  collectives::CollectiveKind::kAllToAll, collectives::CollectiveKind::kBroadcast,
                  collectives::CollectiveKind::kBarrier}) {
              if (kind != collectives::collective_name(k)) continue;
              collectives::CommRecord r{k, label, group};
              r.backward = backward;
              c.record(std::move(r));
              return;
            }
            throw Error("CommCounter.record: unknown collective kind '" + kind + "'");
          },
          py::arg("kind"), py::arg("label"), py::arg("group"), py::arg("backward"))
      .def("__str__", &collectives::CommCounter::to_string);
  // NOTE [FLOP counter]: per-thread, so stop() on the thread that made it (FlopCounterMode).
  py::class_<FlopCounter>(m, "FlopCounter")
      .def(py::init<>())
      .def("stop", &FlopCounter::stop)
      .def("total", &FlopCounter::total)
      .def("by_op", &FlopCounter::by_op);
  m.def("op_flops", [](const std::string& op, const std::vector<at::Tensor>& tensors) {
    return op_flops(op, tensors);
  });
  // The engine's kernels registered now (they are at the first distributed tensor otherwise):
  // a Python kernel for the same op and key registered after them wins over them.
  m.def("ensure_dispatch_installed", &ensure_dispatch_installed);
  m.def("explain", [](const std::string& op, const std::vector<py::object>& args) {
    std::vector<c10::IValue> ivalues;
    for (const py::object& a : args) ivalues.push_back(to_ivalue(a));
    return explain(op, std::move(ivalues));
  });
  m.def("propagation_cache_stats", []() {
    const auto s = sharding::propagation_cache_stats();
    return std::map<std::string, int64_t>{{"hits", s.hits},
                                          {"misses", s.misses},
                                          {"size", s.size},
                                          {"capacity", s.capacity},
                                          {"evictions", s.evictions}};
  });
  m.def("set_propagation_cache_capacity", &sharding::set_propagation_cache_capacity);
  m.def("fallback_counts", &fallback_counts);
  m.def("reset_fallback_counts", &reset_fallback_counts);

  // DeviceMesh.from_group: a 1-D mesh over an existing torch.distributed process group, whose
  // collectives run through that group (backend c10d).
  m.def(
      "mesh_from_process_groups",
      [](const std::vector<std::pair<std::vector<int64_t>, py::object>>& groups, int64_t rank,
         int64_t world_size, const std::vector<int64_t>& shape, const std::vector<int64_t>& ranks,
         const std::vector<std::string>& dim_names, const std::string& device_type) {
        const c10::DeviceType type = parse_device_type(device_type);
        std::vector<std::pair<std::vector<int64_t>, c10::intrusive_ptr<c10d::ProcessGroup>>> pgs;
        for (const auto& [members, g] : groups) {
          pgs.emplace_back(members, g.cast<c10::intrusive_ptr<c10d::ProcessGroup>>());
        }
        py::gil_scoped_release release;
        if (!collectives::has_current_context()) {
          collectives::set_process_context(std::make_shared<collectives::RankContext>(
              rank, world_size, "c10d", "torch-process-group"));
        }
        auto& ctx = collectives::current_context();
        if (ctx.rank() != rank || ctx.world_size() != world_size) {
          throw Error("DeviceMesh.from_group: this process already joined a job as rank " +
                      std::to_string(ctx.rank()) + " of " + std::to_string(ctx.world_size()) +
                      ", but torch.distributed says rank " + std::to_string(rank) + " of " +
                      std::to_string(world_size));
        }
        // Each of this rank's groups (over one mesh dim, or several) runs through its
        // ProcessGroup: the engine names a group by its ranks (group_name_for_ranks).
        for (const auto& [members, pg] : pgs) {
          const std::string name = group_name_for_ranks(members);
          collectives::use_process_group(name, pg);
          ctx.register_group(name, members, "c10d");
        }
        return DeviceMesh(shape, ranks, dim_names, type);
      },
      py::arg("groups"), py::arg("rank"), py::arg("world_size"), py::arg("shape"), py::arg("ranks"),
      py::arg("dim_names"), py::arg("device_type") = "cpu");

  // Simulation mode: N ranks as threads of this process.
  m.def(
      "thread_contexts",
      [](int64_t world_size, const std::string& backend) {
        collectives::check_ranks_as_threads(world_size, "dtensor.run_threads");
        static std::atomic<int64_t> jobs{0};
        const std::string job =
            "py-threads-" + std::to_string(::getpid()) + "-" + std::to_string(jobs++);
        std::vector<std::shared_ptr<collectives::RankContext>> out;
        for (int64_t r = 0; r < world_size; ++r) {
          out.push_back(std::make_shared<collectives::RankContext>(r, world_size, backend, job));
        }
        return out;
      },
      py::arg("world_size"), py::arg("backend") = "threads");
  py::class_<ThreadRank>(m, "ThreadRank")
      .def(py::init<std::shared_ptr<collectives::RankContext>>());
}
