// Helpers shared by the pybind11 module's translation units
// (pybind_module.cc: workers and AllReduce; py_servers.cc: servers and
// replicas): C API status codes as Python exceptions, and the Python
// spelling of the Table 1 bounds.
#ifndef MLFABRIC_PYTHON_SRC_PY_COMMON_H_
#define MLFABRIC_PYTHON_SRC_PY_COMMON_H_

#include <pybind11/pybind11.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace mlfabric::python {

namespace py = pybind11;

inline constexpr size_t kErrBytes = 2048;

// absl::StatusCode -> the Python exception a user expects.
[[noreturn]] inline void Raise(int code, const std::string& message) {
  switch (code) {
    case 3: throw py::value_error(message);            // kInvalidArgument
    case 7:                                            // kPermissionDenied
      PyErr_SetString(PyExc_PermissionError, message.c_str());
      throw py::error_already_set();
    case 4: throw std::runtime_error("deadline exceeded: " + message);
    default: throw std::runtime_error(message);
  }
}

// Python's None = the job's bound (-1 in the C++ API); negative values are
// refused here with the Python name of the argument.
inline int64_t DelayBound(const std::optional<int64_t>& bound) {
  if (!bound.has_value()) return -1;
  if (*bound < 0) {
    throw py::value_error("delay_bound " + std::to_string(*bound) +
                          " is negative: give a number of model versions >= 0, or None for "
                          "the job's bound");
  }
  return *bound;
}

inline double DivergenceBound(const std::optional<double>& bound) {
  if (!bound.has_value()) return -1;
  if (!(*bound > 0) || std::isinf(*bound)) {
    throw py::value_error("divergence_bound " + py::str(py::float_(*bound)).cast<std::string>() +
                          " must be a positive finite L2 distance, or None for the job's bound");
  }
  return *bound;
}

// Binds Update, Promotion, Server, Replica and SumServer (py_servers.cc).
void BindServers(py::module_& m);

}  // namespace mlfabric::python

#endif  // MLFABRIC_PYTHON_SRC_PY_COMMON_H_
