// mlfabric._mlfabric: the pybind11 binding of MLfabric's C++ API, over the C
// interface api/c_api.h (so the module shares one
// client core, python/libmlfabric_pycore.so, with the TensorFlow op library
// in the same process). Blocking calls release the GIL; server and replica
// callbacks take it back while Python code runs, and a Python exception in a
// callback fails that push (or get) with the exception's text, never the
// process (a replica's promotion callback fails nothing: its exception is
// reported).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <climits>
#include <cstdio>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "api/c_api.h"
#include "python/src/py_common.h"

namespace py = pybind11;

namespace mlfabric::python {
namespace {


// float16 and the 8- and 16-bit integers are collective types only; bool
// is for broadcasts only (as Horovod); pushes to servers carry float32,
// float64, int32 or int64.
int DtypeCode(const py::dtype& dtype, bool collective = false, bool broadcast = false) {
  if (dtype.is(py::dtype::of<float>())) return MLF_FLOAT32;
  if (dtype.is(py::dtype::of<double>())) return MLF_FLOAT64;
  if (dtype.is(py::dtype::of<int32_t>())) return MLF_INT32;
  if (dtype.is(py::dtype::of<int64_t>())) return MLF_INT64;
  if (collective) {
    if (dtype.is(py::dtype("float16"))) return MLF_FLOAT16;
    if (dtype.is(py::dtype::of<int8_t>())) return MLF_INT8;
    if (dtype.is(py::dtype::of<uint8_t>())) return MLF_UINT8;
    if (dtype.is(py::dtype::of<int16_t>())) return MLF_INT16;
    if (dtype.is(py::dtype::of<uint16_t>())) return MLF_UINT16;
    if (broadcast && dtype.is(py::dtype::of<bool>())) return MLF_BOOL;
  }
  throw py::type_error("unsupported dtype " + py::str(py::handle(dtype)).cast<std::string>() +
                       (collective ? ": AllReduce supports float16, float32, float64, int8, uint8, "
                                     "int16, uint16, int32 and int64 (broadcast also bool)"
                                   : ": MLfabric supports float32, float64, int32 and int64"));
}

// Horovod's op names (mlfabric.Sum, ...: "sum", "min", "max", "product").
int OpCode(const std::string& op) {
  if (op == "sum") return MLF_SUM;
  if (op == "min") return MLF_MIN;
  if (op == "max") return MLF_MAX;
  if (op == "product") return MLF_PRODUCT;
  throw py::value_error("unknown reduce op '" + op + "': use \"sum\", \"min\", \"max\" or "
                        "\"product\" (mlfabric.Sum, Min, Max, Product)");
}

// Inputs that differ across ranks (FailedPrecondition) are the caller's
// bad input: ValueError, as for other bad arguments.
[[noreturn]] void RaiseCollective(int code, const std::string& message) {
  Raise(code == 9 ? 3 : code, message);
}

class AllReducer {
 public:
  AllReducer(const std::string& backend, const std::string& socket, const std::string& job,
             const std::string& token, double timeout_s, const std::string& root_server,
             int backup_workers, int rank, int size) {
    char err[kErrBytes] = {0};
    int code = 0;
    {
      py::gil_scoped_release release;
      handle_ = mlf_ext_allreducer_create(backend.c_str(), socket.c_str(), job.c_str(),
                                          token.c_str(), timeout_s, root_server.c_str(),
                                          backup_workers, rank, size, &code, err, sizeof err);
    }
    if (handle_ == 0) Raise(code, err);
  }
  ~AllReducer() { Close(); }
  void Close() {
    if (handle_ != 0) {
      py::gil_scoped_release release;
      mlf_ext_allreducer_destroy(handle_);
      handle_ = 0;
    }
  }
  int64_t handle() const { return handle_; }
  int rank() const { return mlf_ext_allreducer_rank(handle_); }
  int size() const { return mlf_ext_allreducer_size(handle_); }
  int summed() const { return mlf_ext_allreducer_summed(handle_); }
  int local_size() const { return mlf_ext_allreducer_local_size(handle_); }
  std::string backend() const { return mlf_ext_allreducer_backend(handle_); }

  // Returns a new array holding the reduction by `op` over ranks (the input
  // is untouched).
  py::array AllReduce(py::array input, const std::string& op_name) {
    const int dtype = DtypeCode(input.dtype(), /*collective=*/true);
    const int op = OpCode(op_name);
    py::array out = py::array(input.dtype(), std::vector<py::ssize_t>(input.shape(),
                                                                       input.shape() + input.ndim()));
    out = py::array::ensure(out, py::array::c_style);
    py::array contiguous = py::array::ensure(input, py::array::c_style);
    std::memcpy(out.mutable_data(), contiguous.data(), contiguous.nbytes());
    // The array's shape goes with it: ranks whose shapes differ at equal
    // length fail with FailedPrecondition naming both (CallOptions::shape).
    const std::vector<int64_t> dims(input.shape(), input.shape() + input.ndim());
    char err[kErrBytes] = {0};
    int code;
    {
      py::gil_scoped_release release;
      code = Wait(err, sizeof err, [&](mlf_done_fn done, void* waiter) {
        mlf_ext_allreduce_shaped_async(handle_, out.mutable_data(), out.size(), dtype, op,
                                       dims.data(), static_cast<int>(dims.size()), done, waiter);
      });
    }
    if (code != 0) RaiseCollective(code, err);
    return out;
  }

  py::array Broadcast(py::array input, int root) {
    const int dtype = DtypeCode(input.dtype(), /*collective=*/true, /*broadcast=*/true);
    py::array out = py::array::ensure(input, py::array::c_style | py::array::forcecast);
    out = py::array(out.dtype(), std::vector<py::ssize_t>(out.shape(), out.shape() + out.ndim()),
                    out.data());  // a copy
    char err[kErrBytes] = {0};
    int code;
    {
      py::gil_scoped_release release;
      code = Wait(err, sizeof err, [&](mlf_done_fn done, void* waiter) {
        mlf_ext_broadcast_async(handle_, out.mutable_data(), out.size(), dtype, root, done, waiter);
      });
    }
    if (code != 0) RaiseCollective(code, err);
    return out;
  }

  // Alltoall (AllReducer::Alltoall): send_rows[d] rows (first dimension)
  // of `input` to rank d; returns (the rows every rank sent this one, in
  // rank order, as one array; the row counts received from each rank).
  // The send counts are checked by the C++ layer, which still joins the
  // ranks' agreement step so that the other ranks fail too (ValueError).
  py::tuple Alltoall(py::array input, const std::vector<int64_t>& send_rows) {
    int dtype = 0;
    try {
      dtype = DtypeCode(input.dtype(), /*collective=*/true, /*broadcast=*/true);
    } catch (...) {
      Refuse("alltoall");
      throw;
    }
    if (input.ndim() < 1) {
      Refuse("alltoall");
      throw py::value_error("alltoall: a scalar cannot be split by rows");
    }
    py::array send = py::array::ensure(input, py::array::c_style);
    std::vector<py::ssize_t> shape(send.shape(), send.shape() + send.ndim());
    const int64_t rows = shape[0];
    int64_t row_elements = 1;
    for (size_t d = 1; d < shape.size(); ++d) row_elements *= shape[d];
    struct Received {
      size_t element_bytes;
      int64_t row_elements;
      std::vector<int64_t> rows;
      std::unique_ptr<char[]> data;
      int64_t total = 0;
    } received{static_cast<size_t>(send.itemsize()), row_elements, {}, nullptr};
    auto alloc = [](void* ctx, const int64_t* recv_rows, int n, void** buffer, char*,
                    size_t) -> int {
      auto* r = static_cast<Received*>(static_cast<Waiter*>(ctx)->extra);
      r->rows.assign(recv_rows, recv_rows + n);
      for (int i = 0; i < n; ++i) r->total += recv_rows[i];
      const size_t bytes = static_cast<size_t>(r->total * r->row_elements) * r->element_bytes;
      r->data.reset(new char[bytes > 0 ? bytes : 1]);
      *buffer = r->data.get();
      return 0;
    };
    char err[kErrBytes] = {0};
    int code;
    {
      py::gil_scoped_release release;
      code = Wait(err, sizeof err, [&](mlf_done_fn done, void* waiter) {
        mlf_ext_alltoall_async(handle_, send.data(), rows, row_elements, send_rows.data(),
                               static_cast<int>(send_rows.size()), dtype, alloc, done, waiter);
      }, &received);
    }
    if (code != 0) RaiseCollective(code, err);
    shape[0] = static_cast<py::ssize_t>(received.total);
    py::array out(send.dtype(), shape);
    if (out.nbytes() > 0) std::memcpy(out.mutable_data(), received.data.get(), out.nbytes());
    py::array_t<int32_t> counts(static_cast<py::ssize_t>(received.rows.size()));
    for (size_t i = 0; i < received.rows.size(); ++i) {
      counts.mutable_at(i) = static_cast<int32_t>(received.rows[i]);
    }
    return py::make_tuple(out, counts);
  }

  // Takes part in the next "alltoall" or "reducescatter" as a rank whose
  // arguments are invalid, so that every other rank fails with ValueError
  // naming this one instead of waiting for it; the caller then raises its
  // own error. (A backend without an agreement step returns at once.)
  void Refuse(const std::string& what) {
    if (what != "alltoall" && what != "reducescatter") {
      throw py::value_error("refuse: expected \"alltoall\" or \"reducescatter\", got '" +
                            what + "'");
    }
    char err[kErrBytes] = {0};
    py::gil_scoped_release release;
    Wait(err, sizeof err, [&](mlf_done_fn done, void* waiter) {
      if (what == "alltoall") {  // no send counts for `size` ranks: refused
        mlf_ext_alltoall_async(
            handle_, nullptr, 0, 0, nullptr, 0, MLF_UINT8,
            [](void*, const int64_t*, int, void**, char*, size_t) { return 0; }, done, waiter);
      } else {  // a negative row count: refused
        mlf_ext_reducescatter_async(handle_, nullptr, -1, 0, MLF_FLOAT32, MLF_SUM, nullptr,
                                    nullptr, -1, done, waiter);
      }
    });
  }

  // ReduceScatter (AllReducer::ReduceScatter): this rank's rows of the
  // reduction by `op` of every rank's `input` (same shape everywhere).
  py::array ReduceScatter(py::array input, const std::string& op_name) {
    int dtype = 0, op = 0;
    try {
      dtype = DtypeCode(input.dtype(), /*collective=*/true);
      op = OpCode(op_name);
    } catch (...) {
      Refuse("reducescatter");
      throw;
    }
    if (input.ndim() < 1) {
      Refuse("reducescatter");
      throw py::value_error("reducescatter: a scalar cannot be scattered by rows");
    }
    py::array data = py::array::ensure(input, py::array::c_style);
    std::vector<py::ssize_t> shape(data.shape(), data.shape() + data.ndim());
    const std::vector<int64_t> dims(shape.begin(), shape.end());
    const int64_t rows = shape[0];
    int64_t row_elements = 1;
    for (size_t d = 1; d < shape.size(); ++d) row_elements *= shape[d];
    shape[0] = static_cast<py::ssize_t>(mlf_reducescatter_rows(rows, size(), rank()));
    py::array out(data.dtype(), shape);
    void* out_data = out.mutable_data();
    char err[kErrBytes] = {0};
    int code;
    {
      py::gil_scoped_release release;
      code = Wait(err, sizeof err, [&](mlf_done_fn done, void* waiter) {
        mlf_ext_reducescatter_async(handle_, data.data(), rows, row_elements, dtype, op, out_data,
                                    dims.data(), static_cast<int>(dims.size()), done, waiter);
      });
    }
    if (code != 0) RaiseCollective(code, err);
    return out;
  }

 private:
  // What a blocked call waits on; `extra` is an Alltoall's Received (its
  // allocation callback gets the same context as `done`).
  struct Waiter {
    void* extra = nullptr;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    int code = 0;
    std::string message;
  };

  // Starts a collective with start(done, &waiter) and blocks until `done`
  // ran; returns its code, the message in `err`.
  template <typename Start>
  static int Wait(char* err, size_t err_len, Start start, void* extra = nullptr) {
    Waiter waiter;
    waiter.extra = extra;
    auto done = [](void* ctx, int code, const char* message) {
      auto* w = static_cast<Waiter*>(ctx);
      std::lock_guard<std::mutex> lock(w->mu);
      w->code = code;
      w->message = message;
      w->done = true;
      w->cv.notify_all();
    };
    start(done, &waiter);
    std::unique_lock<std::mutex> lock(waiter.mu);
    waiter.cv.wait(lock, [&] { return waiter.done; });
    if (waiter.code != 0) std::snprintf(err, err_len, "%s", waiter.message.c_str());
    return waiter.code;
  }

  int64_t handle_ = 0;
};

// Raised by push() / PendingPush.wait() when a push ends as failed.
struct PushFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct PushState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int outcome = MLF_FAILED;
  std::string reason;
  int64_t applied_version = 0, delay = 0;
};

const char* OutcomeName(int outcome) {
  return outcome == MLF_APPLIED ? "applied" : outcome == MLF_DROPPED ? "dropped" : "failed";
}

// A push in flight. wait() returns {"outcome": "applied"|"dropped",
// "reason", "applied_version", "delay"}, or raises PushFailedError (with
// the reason) if the push failed and raise_on_failure.
class PendingPush {
 public:
  explicit PendingPush(std::shared_ptr<PushState> state) : state_(std::move(state)) {}
  py::dict Wait(bool raise_on_failure) {
    {
      py::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(state_->mu);
      state_->cv.wait(lock, [&] { return state_->done; });
    }
    if (raise_on_failure && state_->outcome == MLF_FAILED) {
      throw PushFailed("push failed: " + state_->reason);
    }
    py::dict result;
    result["outcome"] = OutcomeName(state_->outcome);
    result["reason"] = state_->reason;
    result["applied_version"] = state_->applied_version;
    result["delay"] = state_->delay;
    return result;
  }
  bool Done() {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->done;
  }

 private:
  std::shared_ptr<PushState> state_;
};

template <typename T>
double SumSquares(const void* data, size_t count) {
  const T* values = static_cast<const T*>(data);
  double sum = 0;
  for (size_t i = 0; i < count; ++i) sum += static_cast<double>(values[i]) * values[i];
  return sum;
}

class Worker {
 public:
  Worker(const std::string& socket, const std::string& job, const std::string& token,
         const std::string& name, std::optional<int64_t> delay_bound,
         std::optional<double> divergence_bound) {
    const int64_t delay = DelayBound(delay_bound);
    const double divergence = DivergenceBound(divergence_bound);
    char err[kErrBytes] = {0};
    int code = 0;
    {
      py::gil_scoped_release release;
      handle_ = mlf_ext_worker_create(socket.c_str(), job.c_str(), token.c_str(), name.c_str(),
                                      delay, divergence, &code, err, sizeof err);
    }
    if (handle_ == 0) Raise(code, err);
  }
  ~Worker() { Close(); }
  void Close() {
    if (handle_ != 0) {
      py::gil_scoped_release release;
      mlf_ext_worker_destroy(handle_);
      handle_ = 0;
    }
  }
  int64_t handle() const { return handle_; }
  int64_t initial_version() const { return mlf_ext_worker_initial_version(handle_); }

  // (generation, [names]): Worker::Membership.
  py::tuple Membership() {
    std::vector<char> names(4096);
    uint64_t generation = 0;
    size_t used = 0;
    char err[kErrBytes] = {0};
    int code = 0;
    for (int attempt = 0; attempt < 3; ++attempt) {
      {
        py::gil_scoped_release release;
        code = mlf_ext_worker_membership(handle_, &generation, names.data(), names.size(), &used,
                                         err, sizeof err);
      }
      if (code != 11 || used <= names.size()) break;  // 11: OutOfRange, room too small
      names.resize(used);  // the members changed between asks at most twice more
    }
    if (code != 0) Raise(code, err);
    py::list members;
    for (size_t at = 0; at < used;) {
      const std::string name(names.data() + at);
      at += name.size() + 1;
      members.append(name);
    }
    return py::make_tuple(generation, members);
  }

  // `update` is one array or a list/tuple of arrays (the model's tensors, in
  // layer order). Tensor i gets priority priorities[i], default i.
  PendingPush PushNowait(const std::string& server, py::object update, int64_t version,
                         std::optional<double> norm, std::optional<std::vector<int64_t>> priorities) {
    if (handle_ == 0) throw std::runtime_error("push on a closed Worker");
    std::vector<py::array> tensors;
    if (py::isinstance<py::list>(update) || py::isinstance<py::tuple>(update)) {
      for (py::handle item : update) tensors.push_back(py::array::ensure(item, py::array::c_style));
    } else {
      tensors.push_back(py::array::ensure(update, py::array::c_style));
    }
    if (tensors.empty()) throw py::value_error("push: no tensors given (an empty list)");
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!tensors[i]) {
        throw py::type_error("push: tensor " + std::to_string(i) +
                             " cannot be converted to a numpy array");
      }
      DtypeCode(tensors[i].dtype());  // TypeError naming an unsupported dtype
    }
    std::vector<int32_t> prio;
    if (priorities.has_value()) {
      if (priorities->size() != tensors.size()) {
        throw py::value_error("push: priorities has " + std::to_string(priorities->size()) +
                              " entries for " + std::to_string(tensors.size()) +
                              " tensors (one per tensor; lower = sent first)");
      }
      for (int64_t p : *priorities) {
        if (p < INT32_MIN || p > INT32_MAX) {
          throw py::value_error("push: priority " + std::to_string(p) + " is not a 32-bit int");
        }
        prio.push_back(static_cast<int32_t>(p));
      }
    }
    if (version < 0) {
      throw py::value_error("push: version " + std::to_string(version) +
                            " is negative (pass the version get() returned)");
    }
    double l2 = 0;
    if (norm.has_value()) {
      l2 = *norm;
      if (!(l2 >= 0) || std::isinf(l2)) {
        throw py::value_error("push: norm " + py::str(py::float_(l2)).cast<std::string>() +
                              " must be finite and >= 0");
      }
    } else {
      for (const py::array& t : tensors) {
        switch (DtypeCode(t.dtype())) {
          case MLF_FLOAT32: l2 += SumSquares<float>(t.data(), t.size()); break;
          case MLF_FLOAT64: l2 += SumSquares<double>(t.data(), t.size()); break;
          case MLF_INT32: l2 += SumSquares<int32_t>(t.data(), t.size()); break;
          default: l2 += SumSquares<int64_t>(t.data(), t.size()); break;
        }
      }
      l2 = std::sqrt(l2);
    }
    std::vector<const void*> data;
    std::vector<uint64_t> bytes;
    for (const py::array& t : tensors) {
      data.push_back(t.data());
      bytes.push_back(static_cast<uint64_t>(t.nbytes()));
    }
    auto state = std::make_shared<PushState>();
    auto* holder = new std::shared_ptr<PushState>(state);
    // The tensors are copied before this returns; the completion may run on
    // another thread and touches no Python object.
    mlf_ext_push_async(
        handle_, server.c_str(), tensors.size(), data.data(), bytes.data(),
        prio.empty() ? nullptr : prio.data(), version, l2,
        [](void* ctx, int outcome, const char* reason, int64_t applied_version, int64_t delay) {
          auto* holder = static_cast<std::shared_ptr<PushState>*>(ctx);
          {
            std::lock_guard<std::mutex> lock((*holder)->mu);
            (*holder)->outcome = outcome;
            (*holder)->reason = reason;
            (*holder)->applied_version = applied_version;
            (*holder)->delay = delay;
            (*holder)->done = true;
          }
          (*holder)->cv.notify_all();
          delete holder;
        },
        holder);
    return PendingPush(state);
  }

  // (version, bytes) of the server's current model.
  py::tuple Get(const std::string& server, int32_t priority) {
    if (handle_ == 0) throw std::runtime_error("get on a closed Worker");
    struct GetState {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      int code = 0;
      std::string message, bytes;
      int64_t version = 0;
    } state;
    {
      py::gil_scoped_release release;
      mlf_ext_get_async(
          handle_, server.c_str(), priority,
          [](void* ctx, int code, const char* message, int64_t version, const void* data,
             uint64_t bytes) {
            auto* s = static_cast<GetState*>(ctx);
            std::lock_guard<std::mutex> lock(s->mu);
            s->code = code;
            s->message = message;
            s->version = version;
            if (data != nullptr) s->bytes.assign(static_cast<const char*>(data), bytes);
            s->done = true;
            s->cv.notify_all();
          },
          &state);
      std::unique_lock<std::mutex> lock(state.mu);
      state.cv.wait(lock, [&] { return state.done; });
    }
    if (state.code != 0) Raise(state.code, state.message);
    return py::make_tuple(state.version, py::bytes(state.bytes));
  }

 private:
  int64_t handle_ = 0;
};

}  // namespace

// Binds AllReducer, PendingPush, PushFailedError and Worker.
void BindClients(py::module_& m) {
  py::class_<AllReducer>(m, "AllReducer")
      .def(py::init<const std::string&, const std::string&, const std::string&,
                    const std::string&, double, const std::string&, int, int, int>(),
           py::arg("backend") = "auto", py::arg("socket") = "", py::arg("job") = "",
           py::arg("token") = "", py::arg("timeout_s") = 300.0, py::arg("root_server") = "",
           py::arg("backup_workers") = 0, py::arg("rank") = -1, py::arg("size") = -1,
           "rank, size: -1 = from MLFABRIC_RANK/MLFABRIC_SIZE (the launcher's)")
      .def_property_readonly("handle", &AllReducer::handle)
      .def_property_readonly("rank", &AllReducer::rank)
      .def_property_readonly("size", &AllReducer::size)
      .def_property_readonly("summed", &AllReducer::summed)
      .def_property_readonly("local_size", &AllReducer::local_size)
      .def_property_readonly("backend", &AllReducer::backend)
      .def("allreduce", &AllReducer::AllReduce, py::arg("array"), py::arg("op") = "sum")
      .def("broadcast", &AllReducer::Broadcast, py::arg("array"), py::arg("root") = 0)
      .def("alltoall", &AllReducer::Alltoall, py::arg("array"), py::arg("send_rows"))
      .def("reducescatter", &AllReducer::ReduceScatter, py::arg("array"), py::arg("op") = "sum")
      .def("refuse", &AllReducer::Refuse, py::arg("collective"))
      .def("close", &AllReducer::Close);
  py::register_exception<PushFailed>(m, "PushFailedError", PyExc_RuntimeError);
  py::class_<PendingPush>(m, "PendingPush")
      .def("wait", &PendingPush::Wait, py::arg("raise_on_failure") = true,
           "Blocks until the push ends; returns {outcome, reason, applied_version, delay}. "
           "A failed push raises PushFailedError unless raise_on_failure=False.")
      .def("done", &PendingPush::Done);
  py::class_<Worker>(m, "Worker")
      .def(py::init<const std::string&, const std::string&, const std::string&,
                    const std::string&, std::optional<int64_t>, std::optional<double>>(),
           py::arg("socket") = "", py::arg("job") = "", py::arg("token") = "",
           py::arg("name") = "", py::arg("delay_bound") = py::none(),
           py::arg("divergence_bound") = py::none())
      .def_property_readonly("handle", &Worker::handle)
      .def_property_readonly("initial_version", &Worker::initial_version)
      .def("push_nowait", &Worker::PushNowait, py::arg("server"), py::arg("update"),
           py::arg("version"), py::arg("norm") = py::none(), py::arg("priorities") = py::none())
      .def(
          "push",
          [](Worker& w, const std::string& server, py::object update, int64_t version,
             std::optional<double> norm, std::optional<std::vector<int64_t>> priorities,
             bool raise_on_failure) {
            return w.PushNowait(server, update, version, norm, priorities).Wait(raise_on_failure);
          },
          py::arg("server"), py::arg("update"), py::arg("version"), py::arg("norm") = py::none(),
          py::arg("priorities") = py::none(), py::arg("raise_on_failure") = true,
          "Pushes one array or a list of arrays (tensors in layer order; tensor i has "
          "priority priorities[i], default i, lower = sent first) computed from model "
          "`version`, with its L2 norm (default: computed). Returns {outcome: applied|dropped, "
          "reason, applied_version, delay}; a failed push raises PushFailedError.")
      .def("get", &Worker::Get, py::arg("server"), py::arg("priority") = 0)
      .def("membership", &Worker::Membership,
           "The job's membership now: (generation, [live workers' names, sorted]), asked of "
           "the scheduler through the daemon.")
      .def("close", &Worker::Close);
}

}  // namespace mlfabric::python

PYBIND11_MODULE(_mlfabric, m) {
  m.doc() = "MLfabric's C++ API (push/get, parameter servers, AllReduce) for Python";
  mlfabric::python::BindClients(m);
  mlfabric::python::BindServers(m);
}
