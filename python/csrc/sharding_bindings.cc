// dtensor._C.register_sharding: a Python function becomes a custom op's rule builder (NOTE
// [register_sharding] in python/dtensor/experimental/_register_sharding.py, which turns PyTorch's
// strategy lists into the factors of a sharding_prop::Rule).

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/utils/pybind.h>

#include "base/error.h"
#include "layout/placement.h"
#include "sharding_prop/ops/registry.h"
#include "sharding_prop/rule.h"

namespace py = pybind11;
using namespace dtensor;

namespace {

sharding::FactorKind factor_kind(const std::string& kind) {
  if (kind == "pass") return sharding::FactorKind::kPass;
  if (kind == "contract") return sharding::FactorKind::kContract;
  if (kind == "replicate") return sharding::FactorKind::kReplicate;
  throw Error("register_sharding: unknown factor kind '" + kind + "'");
}

using TensorsFactors = std::vector<std::vector<std::vector<int>>>;

// The builder's result from the Python function's (factors, inputs, outputs, out_dtypes).
sharding::BuiltRule built_rule(const py::tuple& r) {
  sharding::BuiltRule out;
  for (const py::handle f : r[0].cast<py::list>()) {
    const auto t = f.cast<py::tuple>();
    out.rule.add_factor(t[0].cast<int64_t>(), factor_kind(t[1].cast<std::string>()),
                        parse_reduce_op(t[2].cast<std::string>()));
  }
  out.rule.inputs = r[1].cast<TensorsFactors>();
  out.rule.outputs = r[2].cast<TensorsFactors>();
  out.rule.linearity = sharding::Linearity::kNone;
  for (const py::handle d : r[3].cast<py::list>()) {
    if (!THPDtype_Check(d.ptr())) throw Error("register_sharding: an output dtype is not a dtype");
    out.out_dtypes.push_back(reinterpret_cast<THPDtype*>(d.ptr())->scalar_type);
  }
  return out;
}

}  // namespace

void bind_sharding(py::module& m) {
  m.def(
      "register_sharding",
      [](const std::string& name, const std::vector<std::string>& int_args, py::object fn) {
        // Never destroyed: op entries live for the process, and destroying a Python object needs
        // the GIL, which an exiting thread may not hold.
        auto* callback = new py::object(std::move(fn));
        std::vector<sharding::LayoutArg> layout_args;
        for (const std::string& a : int_args) layout_args.push_back(sharding::int_arg(a));
        sharding::register_custom_op(
            name, std::move(layout_args),
            [callback, name](const std::vector<TensorMeta>& metas, const sharding::LayoutArgs& a) {
              py::gil_scoped_acquire gil;
              py::list shapes, dtypes;
              for (const TensorMeta& t : metas) {
                shapes.append(py::cast(t.shape));
                dtypes.append(py::reinterpret_borrow<py::object>(
                    reinterpret_cast<PyObject*>(torch::getTHPDtype(t.dtype))));
              }
              try {
                return built_rule((*callback)(shapes, dtypes, a.ints).cast<py::tuple>());
              } catch (const py::error_already_set& e) {
                throw Error(name + ": the register_sharding function failed: " + e.what());
              } catch (const py::cast_error& e) {
                throw Error(name + ": the register_sharding function returned a malformed rule: " +
                            e.what());
              }
            });
      },
      py::arg("name"), py::arg("int_args"), py::arg("fn"));
}
