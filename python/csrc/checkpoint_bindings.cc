// Checkpoints for Python (part of module dtensor._C): checkpoint/checkpoint.h's save and load over
// a flat dict of names to values. python/dtensor/checkpoint.py gives them DCP's names and
// flattens nested state dicts; these entry points see only the flat form.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <string>

#include "base/error.h"
#include "checkpoint/checkpoint.h"

namespace py = pybind11;
using namespace dtensor;

namespace {

namespace ckpt = dtensor::checkpoint;

// NOTE [checkpoint value kinds from Python]: a tensor, an int, a float, a str, or a
// CheckpointJson. A bool is refused here (bool is an int in Python, and saving it as an int would
// load back 1): checkpoint.py sends bools, None, lists and dicts of non-tensors as JSON.
ckpt::Value to_value(const std::string& key, const py::handle& v) {
  if (THPVariable_Check(v.ptr())) return THPVariable_Unpack(v.ptr());
  if (py::isinstance<ckpt::Json>(v)) return v.cast<ckpt::Json>();
  if (py::isinstance<py::bool_>(v)) {
    throw Error("checkpoint: value of key '" + key + "' is a bool: send it as CheckpointJson");
  }
  if (py::isinstance<py::int_>(v)) return v.cast<int64_t>();
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  throw Error("checkpoint: value of key '" + key + "' has unsupported type " +
              py::str(py::type::of(v)).cast<std::string>() +
              " (tensor, int, float, str or CheckpointJson)");
}

std::map<std::string, ckpt::Value> to_state(const py::dict& flat) {
  std::map<std::string, ckpt::Value> state;
  for (const auto& [k, v] : flat) {
    const std::string key = k.cast<std::string>();
    state.emplace(key, to_value(key, v));
  }
  return state;
}

}  // namespace

void bind_checkpoint(py::module& m) {
  py::class_<ckpt::Json>(m, "CheckpointJson")
      .def(py::init([](std::string text) { return ckpt::Json{std::move(text)}; }), py::arg("text"))
      .def_readonly("text", &ckpt::Json::text)
      .def("__eq__", [](const ckpt::Json& a, const ckpt::Json& b) { return a == b; })
      .def("__repr__", [](const ckpt::Json& j) { return "CheckpointJson(" + j.text + ")"; });

  // Both run with the GIL released: every rank (a thread, in simulation mode) must reach the
  // collectives inside save/load while the others hold no lock they need.
  m.def(
      "checkpoint_save",
      [](const py::dict& flat, const std::string& dir) {
        const auto state = to_state(flat);
        py::gil_scoped_release release;
        ckpt::save(state, dir);
      },
      py::arg("flat_state"), py::arg("dir"),
      "Saves a flat dict of names to tensors, ints, floats, strs and CheckpointJson "
      "(checkpoint.h).");
  m.def(
      "checkpoint_load",
      [](const py::dict& flat, const std::string& dir, bool verify_checksums) {
        auto state = to_state(flat);
        {
          py::gil_scoped_release release;
          ckpt::LoadOptions options;
          options.verify_checksums = verify_checksums;
          ckpt::load(state, dir, options);
        }
        // Tensors were filled in place (they share their TensorImpl with the caller's objects);
        // only the non-tensor values come back.
        py::dict values;
        for (const auto& [key, value] : state) {
          if (std::holds_alternative<at::Tensor>(value)) continue;
          std::visit(
              [&](const auto& v) {
                if constexpr (!std::is_same_v<std::decay_t<decltype(v)>, at::Tensor>) {
                  values[py::str(key)] = py::cast(v);
                }
              },
              value);
        }
        return values;
      },
      py::arg("flat_state"), py::arg("dir"), py::arg("verify_checksums") = true,
      "Loads a checkpoint into a flat dict in place (tensors); returns the non-tensor values.");
}
