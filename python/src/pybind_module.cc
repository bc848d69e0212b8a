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

namespace py = pybind11;

namespace {

constexpr size_t kErrBytes = 2048;

// absl::StatusCode -> the Python exception a user expects.
[[noreturn]] void Raise(int code, const std::string& message) {
  switch (code) {
    case 3: throw py::value_error(message);            // kInvalidArgument
    case 7:                                            // kPermissionDenied
      PyErr_SetString(PyExc_PermissionError, message.c_str());
      throw py::error_already_set();
    case 4: throw std::runtime_error("deadline exceeded: " + message);
    default: throw std::runtime_error(message);
  }
}

// float16 is a collective type only (the fp16 AllReduce); pushes to
// servers carry float32, float64, int32 or int64.
int DtypeCode(const py::dtype& dtype, bool collective = false) {
  if (dtype.is(py::dtype::of<float>())) return MLF_FLOAT32;
  if (dtype.is(py::dtype::of<double>())) return MLF_FLOAT64;
  if (dtype.is(py::dtype::of<int32_t>())) return MLF_INT32;
  if (dtype.is(py::dtype::of<int64_t>())) return MLF_INT64;
  if (collective && dtype.is(py::dtype("float16"))) return MLF_FLOAT16;
  throw py::type_error("unsupported dtype " + py::str(py::handle(dtype)).cast<std::string>() +
                       (collective ? ": AllReduce supports float16, float32, float64, int32 and int64"
                                   : ": MLfabric supports float32, float64, int32 and int64"));
}

class AllReducer {
 public:
  AllReducer(const std::string& backend, const std::string& socket, const std::string& job,
             const std::string& token, double timeout_s, const std::string& root_server,
             int backup_workers) {
    char err[kErrBytes] = {0};
    int code = 0;
    {
      py::gil_scoped_release release;
      handle_ = mlf_ext_allreducer_create(backend.c_str(), socket.c_str(), job.c_str(),
                                          token.c_str(), timeout_s, root_server.c_str(),
                                          backup_workers, &code, err, sizeof err);
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

  // Returns a new array holding the sum over ranks (the input is untouched).
  py::array AllReduce(py::array input) {
    const int dtype = DtypeCode(input.dtype(), /*collective=*/true);
    py::array out = py::array(input.dtype(), std::vector<py::ssize_t>(input.shape(),
                                                                       input.shape() + input.ndim()));
    out = py::array::ensure(out, py::array::c_style);
    py::array contiguous = py::array::ensure(input, py::array::c_style);
    std::memcpy(out.mutable_data(), contiguous.data(), contiguous.nbytes());
    char err[kErrBytes] = {0};
    int code;
    {
      py::gil_scoped_release release;
      code = Collective(false, out.mutable_data(), out.size(), dtype, 0, err, sizeof err);
    }
    if (code != 0) Raise(code, err);
    return out;
  }

  py::array Broadcast(py::array input, int root) {
    const int dtype = DtypeCode(input.dtype(), /*collective=*/true);
    py::array out = py::array::ensure(input, py::array::c_style | py::array::forcecast);
    out = py::array(out.dtype(), std::vector<py::ssize_t>(out.shape(), out.shape() + out.ndim()),
                    out.data());  // a copy
    char err[kErrBytes] = {0};
    int code;
    {
      py::gil_scoped_release release;
      code = Collective(true, out.mutable_data(), out.size(), dtype, root, err, sizeof err);
    }
    if (code != 0) Raise(code, err);
    return out;
  }

 private:
  // Blocks (without the GIL) until this rank's part of the collective ends.
  int Collective(bool broadcast, void* data, uint64_t count, int dtype, int root, char* err,
                 size_t err_len) {
    struct Waiter {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      int code = 0;
      std::string message;
    } waiter;
    auto done = [](void* ctx, int code, const char* message) {
      auto* w = static_cast<Waiter*>(ctx);
      std::lock_guard<std::mutex> lock(w->mu);
      w->code = code;
      w->message = message;
      w->done = true;
      w->cv.notify_all();
    };
    if (broadcast) {
      mlf_ext_broadcast_async(handle_, data, count, dtype, root, done, &waiter);
    } else {
      mlf_ext_allreduce_async(handle_, data, count, dtype, done, &waiter);
    }
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

// Python's None = the job's bound (-1 in the C++ API); negative values are
// refused here with the Python name of the argument.
int64_t DelayBound(const std::optional<int64_t>& bound) {
  if (!bound.has_value()) return -1;
  if (*bound < 0) {
    throw py::value_error("delay_bound " + std::to_string(*bound) +
                          " is negative: give a number of model versions >= 0, or None for "
                          "the job's bound");
  }
  return *bound;
}

double DivergenceBound(const std::optional<double>& bound) {
  if (!bound.has_value()) return -1;
  if (!(*bound > 0) || std::isinf(*bound)) {
    throw py::value_error("divergence_bound " + py::str(py::float_(*bound)).cast<std::string>() +
                          " must be a positive finite L2 distance, or None for the job's bound");
  }
  return *bound;
}

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

// What an update callback receives. The memory behind `data` / `array()` is
// the daemon's shared buffer: valid only until the callback returns (copy
// it, e.g. np.array(u.array()), to keep it); after that they raise.
class Update {
 public:
  explicit Update(const mlf_update_view* view)
      : view_(view),
        transfer_id_(view->transfer_id),
        sequence_(view->sequence),
        count_(view->count),
        worker_(view->worker != nullptr ? view->worker : ""),
        version_(view->version),
        norm_(view->norm),
        bytes_(view->bytes) {}
  void Expire() { view_ = nullptr; }
  py::array Array(py::object dtype_like) {
    if (view_ == nullptr) {
      throw std::runtime_error(
          "this Update's data was used after its callback returned; copy it inside the callback");
    }
    py::dtype dtype = py::dtype::from_args(dtype_like);
    const size_t item = static_cast<size_t>(dtype.itemsize());
    if (item == 0 || bytes_ % item != 0) {
      throw py::value_error("the update's " + std::to_string(bytes_) +
                            " bytes are not a whole number of " +
                            py::str(py::handle(dtype)).cast<std::string>() + " elements");
    }
    // A read-only view: base = a capsule that owns nothing.
    py::capsule base(view_->data, [](void*) {});
    py::array out(dtype, {static_cast<py::ssize_t>(bytes_ / item)}, {static_cast<py::ssize_t>(item)},
                  view_->data, base);
    out.attr("setflags")(py::arg("write") = false);
    return out;
  }
  uint64_t transfer_id() const { return transfer_id_; }
  uint64_t sequence() const { return sequence_; }
  int64_t count() const { return count_; }
  const std::string& worker() const { return worker_; }
  int64_t version() const { return version_; }
  double norm() const { return norm_; }
  uint64_t bytes() const { return bytes_; }

 private:
  const mlf_update_view* view_;
  uint64_t transfer_id_, sequence_;
  int64_t count_;
  std::string worker_;
  int64_t version_;
  double norm_;
  uint64_t bytes_;
};

constexpr int kInternal = 13;  // absl::StatusCode::kInternal

// "the update callback raised ValueError: <message>" (no traceback: it
// travels to the worker as the push's failure reason).
std::string PythonError(py::error_already_set& e, const char* where) {
  std::string type = "exception";
  std::string text;
  try {
    type = py::str(e.type().attr("__name__")).cast<std::string>();
    text = py::str(e.value()).cast<std::string>();
  } catch (...) {
    text = e.what();
  }
  return std::string("the ") + where + " raised " + type + (text.empty() ? "" : ": " + text);
}

// What a replica's promotion callback receives (api/replica.h
// Replica::Promotion), copied out of the C view.
struct Promotion {
  std::string server;
  std::string old_host;  // where the server was
  std::string reason;    // why it failed over
  int64_t model_version = 0;  // the old server's: continue version numbers from here
};

// State shared with the C trampolines of a server or replica; its Python
// callables are only touched with the GIL held.
struct Handlers {
  py::object on_update = py::none();
  py::object on_request = py::none();
  py::object on_promotion = py::none();  // replicas only

  static int Update(void* ctx, const mlf_update_view* view, int64_t* new_version, char* err,
                    size_t err_len) {
    auto* self = static_cast<Handlers*>(ctx);
    py::gil_scoped_acquire acquire;
    std::string message;
    int code = 0;
    auto update = std::make_shared<::Update>(view);
    try {
      if (self->on_update.is_none()) {
        code = 9;  // kFailedPrecondition
        message = "no update callback is registered at this server";
      } else {
        py::object result = self->on_update(py::cast(update));
        if (!py::isinstance<py::int_>(result) || py::isinstance<py::bool_>(result)) {
          code = 3;
          message = "the update callback must return the new model version (an int), not " +
                    py::str(py::type::of(result)).cast<std::string>();
        } else {
          *new_version = result.cast<int64_t>();
        }
      }
    } catch (py::error_already_set& e) {
      code = kInternal;
      message = PythonError(e, "update callback");
    } catch (const std::exception& e) {
      code = kInternal;
      message = std::string("the update callback failed: ") + e.what();
    }
    update->Expire();
    if (code != 0) std::snprintf(err, err_len, "%s", message.c_str());
    return code;
  }

  static int Request(void* ctx, void* snapshot, char* err, size_t err_len) {
    auto* self = static_cast<Handlers*>(ctx);
    py::gil_scoped_acquire acquire;
    std::string message;
    int code = 0;
    try {
      if (self->on_request.is_none()) {
        code = 9;
        message = "no request callback is registered at this server";
      } else {
        py::object result = self->on_request();
        if (!py::isinstance<py::tuple>(result) || py::len(result) != 2 ||
            !py::isinstance<py::int_>(result[py::int_(0)])) {
          code = 3;
          message = "the request callback must return (version, bytes-like), not " +
                    py::repr(result).cast<std::string>().substr(0, 200);
        } else {
          const int64_t version = result[py::int_(0)].cast<int64_t>();
          py::object data = result[py::int_(1)];
          Py_buffer buffer;
          if (PyObject_GetBuffer(data.ptr(), &buffer, PyBUF_C_CONTIGUOUS) != 0) {
            PyErr_Clear();
            code = 3;
            message = "the request callback's model must be a C-contiguous bytes-like object "
                      "(bytes, bytearray, memoryview, numpy array), not " +
                      py::str(py::type::of(data)).cast<std::string>();
          } else {
            mlf_ext_snapshot_set(snapshot, version, buffer.buf, static_cast<uint64_t>(buffer.len));
            PyBuffer_Release(&buffer);
          }
        }
      }
    } catch (py::error_already_set& e) {
      code = kInternal;
      message = PythonError(e, "request callback");
    } catch (const std::exception& e) {
      code = kInternal;
      message = std::string("the request callback failed: ") + e.what();
    }
    if (code != 0) std::snprintf(err, err_len, "%s", message.c_str());
    return code;
  }

  // The promotion has happened when this runs, and the replica must serve
  // on as the server: an exception fails nothing, it is reported through
  // sys.unraisablehook (with its traceback).
  static void Promotion(void* ctx, const mlf_promotion_view* view) {
    auto* self = static_cast<Handlers*>(ctx);
    py::gil_scoped_acquire acquire;
    if (self->on_promotion.is_none()) return;
    ::Promotion promotion;
    promotion.server = view->server != nullptr ? view->server : "";
    promotion.old_host = view->old_host != nullptr ? view->old_host : "";
    promotion.reason = view->reason != nullptr ? view->reason : "";
    promotion.model_version = view->model_version;
    try {
      self->on_promotion(py::cast(std::move(promotion)));
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable(self->on_promotion);
    } catch (const std::exception& e) {
      PySys_WriteStderr("mlfabric: the promotion callback failed: %.500s\n", e.what());
    }
  }
};

// A server's `shard` argument: None, or (group, index, count, begin, end)
// with byte offsets (mlfabric.Shard), as the C API's mlf_shard.
class ShardArg {
 public:
  explicit ShardArg(const py::object& shard) {
    if (shard.is_none()) return;
    auto fields = shard.cast<std::tuple<std::string, int32_t, int32_t, int64_t, int64_t>>();
    group_ = std::get<0>(fields);
    if (group_.empty()) throw py::value_error("shard: the group name must not be empty");
    spec_ = {group_.c_str(), std::get<1>(fields), std::get<2>(fields), std::get<3>(fields),
             std::get<4>(fields)};
    set_ = true;
  }
  const mlf_shard* get() const { return set_ ? &spec_ : nullptr; }

 private:
  std::string group_;
  mlf_shard spec_{};
  bool set_ = false;
};

// A parameter server whose model lives in Python: the update callback gets
// an Update and returns the new model version; the request callback returns
// (version, bytes-like). serve() blocks (GIL released) until stop().
class PyServer {
 public:
  PyServer(const std::string& name, const std::string& socket, const std::string& job,
           const std::string& token, std::optional<int64_t> delay_bound,
           std::optional<double> divergence_bound, const py::object& shard) {
    const int64_t delay = DelayBound(delay_bound);
    const double divergence = DivergenceBound(divergence_bound);
    const ShardArg spec(shard);
    char err[kErrBytes] = {0};
    int code = 0;
    {
      py::gil_scoped_release release;
      handle_ = mlf_ext_server_create(socket.c_str(), job.c_str(), token.c_str(), name.c_str(),
                                      delay, divergence, spec.get(), &code, err, sizeof err);
    }
    if (handle_ == 0) Raise(code, err);
    name_ = name;
    mlf_ext_server_set_callbacks(handle_, &Handlers::Update, &Handlers::Request, &handlers_);
  }
  ~PyServer() { Close(); }
  void SetUpdate(py::object fn) {
    if (!fn.is_none() && !PyCallable_Check(fn.ptr())) throw py::type_error("the update callback must be callable");
    handlers_.on_update = std::move(fn);
  }
  void SetRequest(py::object fn) {
    if (!fn.is_none() && !PyCallable_Check(fn.ptr())) throw py::type_error("the request callback must be callable");
    handlers_.on_request = std::move(fn);
  }
  void Serve() {
    if (handle_ == 0) throw std::runtime_error("serve on a closed Server");
    if (handlers_.on_update.is_none() || handlers_.on_request.is_none()) {
      throw std::runtime_error("server '" + name_ +
                               "': register an update callback and a request callback before "
                               "serve()");
    }
    char err[kErrBytes] = {0};
    int code;
    {
      py::gil_scoped_release release;
      code = mlf_ext_server_serve(handle_, err, sizeof err);
    }
    if (code != 0) Raise(code, err);
  }
  void Stop() {
    if (handle_ != 0) mlf_ext_server_stop(handle_);
  }
  void Close() {
    if (handle_ != 0) {
      py::gil_scoped_release release;
      mlf_ext_server_destroy(handle_);
      handle_ = 0;
    }
  }
  int64_t initial_version() const { return mlf_ext_server_initial_version(handle_); }
  const std::string& name() const { return name_; }

 private:
  int64_t handle_ = 0;
  std::string name_;
  Handlers handlers_;
};

// A replica of a server (mlfabric.md §5.3): applies the updates its daemon
// delivers, in the scheduled order, with the same Update callback. When the
// scheduler promotes it (failover), the promotion callback runs once and the
// request callback answers the workers' gets from then on, as a server's.
class PyReplica {
 public:
  PyReplica(const std::string& server, const std::string& name, const std::string& socket,
            const std::string& job, const std::string& token, std::optional<int64_t> delay_bound,
            std::optional<double> divergence_bound) {
    const int64_t delay = DelayBound(delay_bound);
    const double divergence = DivergenceBound(divergence_bound);
    char err[kErrBytes] = {0};
    int code = 0;
    {
      py::gil_scoped_release release;
      handle_ = mlf_ext_replica_create(server.c_str(), socket.c_str(), job.c_str(), token.c_str(),
                                       name.c_str(), delay, divergence, &code, err, sizeof err);
    }
    if (handle_ == 0) Raise(code, err);
    server_ = server;
    // All three trampolines, once: the Python callables may be (re)set any
    // time, while serving too, since the trampolines read them under the GIL.
    mlf_ext_replica_set_callbacks(handle_, &Handlers::Update, &Handlers::Request,
                                  &Handlers::Promotion, &handlers_);
  }
  ~PyReplica() { Close(); }
  void SetUpdate(py::object fn) {
    if (!fn.is_none() && !PyCallable_Check(fn.ptr())) throw py::type_error("the update callback must be callable");
    handlers_.on_update = std::move(fn);
  }
  void SetRequest(py::object fn) {
    if (!fn.is_none() && !PyCallable_Check(fn.ptr())) throw py::type_error("the request callback must be callable");
    handlers_.on_request = std::move(fn);
  }
  void SetPromotion(py::object fn) {
    if (!fn.is_none() && !PyCallable_Check(fn.ptr())) throw py::type_error("the promotion callback must be callable");
    handlers_.on_promotion = std::move(fn);
  }
  // Readable from any thread while serve() runs (an atomic in the C API);
  // after close(), what it was then.
  bool promoted() const { return handle_ != 0 ? mlf_ext_replica_promoted(handle_) == 1 : promoted_; }
  void Serve() {
    if (handle_ == 0) throw std::runtime_error("serve on a closed Replica");
    if (handlers_.on_update.is_none()) {
      throw std::runtime_error("replica of '" + server_ +
                               "': register an update callback before serve()");
    }
    char err[kErrBytes] = {0};
    int code;
    {
      py::gil_scoped_release release;
      code = mlf_ext_replica_serve(handle_, err, sizeof err);
    }
    if (code != 0) Raise(code, err);
  }
  void Stop() {
    if (handle_ != 0) mlf_ext_replica_stop(handle_);
  }
  void Close() {
    if (handle_ != 0) {
      promoted_ = promoted();
      py::gil_scoped_release release;
      mlf_ext_replica_destroy(handle_);
      handle_ = 0;
    }
  }
  const std::string& server() const { return server_; }

 private:
  int64_t handle_ = 0;
  std::string server_;
  bool promoted_ = false;  // as it was at close()
  Handlers handlers_;
};

class SumServer {
 public:
  SumServer(const std::string& name, py::array_t<float, py::array::c_style | py::array::forcecast>
                                         initial,
            const std::string& socket, const std::string& job, const std::string& token,
            const py::object& shard) {
    const ShardArg spec(shard);
    char err[kErrBytes] = {0};
    {
      py::gil_scoped_release release;
      handle_ = mlf_sum_server_start_shard(socket.c_str(), job.c_str(), token.c_str(),
                                           name.c_str(), spec.get(), initial.data(),
                                           initial.size(), err, sizeof err);
    }
    if (handle_ == 0) throw std::runtime_error(err);
  }
  ~SumServer() { Stop(); }
  void Stop() {
    if (handle_ != 0) {
      py::gil_scoped_release release;
      mlf_sum_server_stop(handle_);
      handle_ = 0;
    }
  }
  int64_t applied() const { return mlf_sum_server_applied(handle_); }

 private:
  int64_t handle_ = 0;
};

}  // namespace

PYBIND11_MODULE(_mlfabric, m) {
  m.doc() = "MLfabric's C++ API (push/get, parameter servers, AllReduce) for Python";
  py::class_<AllReducer>(m, "AllReducer")
      .def(py::init<const std::string&, const std::string&, const std::string&,
                    const std::string&, double, const std::string&, int>(),
           py::arg("backend") = "auto", py::arg("socket") = "", py::arg("job") = "",
           py::arg("token") = "", py::arg("timeout_s") = 300.0, py::arg("root_server") = "",
           py::arg("backup_workers") = 0)
      .def_property_readonly("handle", &AllReducer::handle)
      .def_property_readonly("rank", &AllReducer::rank)
      .def_property_readonly("size", &AllReducer::size)
      .def_property_readonly("summed", &AllReducer::summed)
      .def_property_readonly("local_size", &AllReducer::local_size)
      .def_property_readonly("backend", &AllReducer::backend)
      .def("allreduce", &AllReducer::AllReduce, py::arg("array"))
      .def("broadcast", &AllReducer::Broadcast, py::arg("array"), py::arg("root") = 0)
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
      .def("close", &Worker::Close);
  py::class_<Update, std::shared_ptr<Update>>(m, "Update")
      .def_property_readonly("transfer_id", &Update::transfer_id)
      .def_property_readonly("sequence", &Update::sequence)
      .def_property_readonly("count", &Update::count)
      .def_property_readonly("worker", &Update::worker)
      .def_property_readonly("version", &Update::version)
      .def_property_readonly("norm", &Update::norm)
      .def_property_readonly("bytes", &Update::bytes)
      .def_property_readonly("data", [](Update& u) { return u.Array(py::dtype("uint8")); })
      .def("array", &Update::Array, py::arg("dtype") = py::dtype::of<float>(),
           "A read-only numpy view of the update as `dtype`, valid only during the callback.")
      .def("__repr__", [](const Update& u) {
        return "<mlfabric.Update seq " + std::to_string(u.sequence()) + " from '" + u.worker() +
               "' v" + std::to_string(u.version()) + " count " + std::to_string(u.count()) + ", " +
               std::to_string(u.bytes()) + " bytes>";
      });
  py::class_<Promotion>(m, "Promotion")
      .def_readonly("server", &Promotion::server)
      .def_readonly("old_host", &Promotion::old_host)
      .def_readonly("reason", &Promotion::reason)
      .def_readonly("model_version", &Promotion::model_version)
      .def("__repr__", [](const Promotion& p) {
        return "<mlfabric.Promotion of '" + p.server + "' from host '" + p.old_host + "' at v" +
               std::to_string(p.model_version) + ": " + p.reason + ">";
      });
  py::class_<PyServer>(m, "Server")
      .def(py::init<const std::string&, const std::string&, const std::string&,
                    const std::string&, std::optional<int64_t>, std::optional<double>,
                    const py::object&>(),
           py::arg("name"), py::arg("socket") = "", py::arg("job") = "", py::arg("token") = "",
           py::arg("delay_bound") = py::none(), py::arg("divergence_bound") = py::none(),
           py::arg("shard") = py::none())
      .def_property_readonly("name", &PyServer::name)
      .def_property_readonly("initial_version", &PyServer::initial_version)
      .def("register_update_callback", &PyServer::SetUpdate, py::arg("callback"))
      .def("register_request_callback", &PyServer::SetRequest, py::arg("callback"))
      .def("serve", &PyServer::Serve)
      .def("stop", &PyServer::Stop)
      .def("close", &PyServer::Close);
  py::class_<PyReplica>(m, "Replica")
      .def(py::init<const std::string&, const std::string&, const std::string&,
                    const std::string&, const std::string&, std::optional<int64_t>,
                    std::optional<double>>(),
           py::arg("server"), py::arg("name") = "", py::arg("socket") = "", py::arg("job") = "",
           py::arg("token") = "", py::arg("delay_bound") = py::none(),
           py::arg("divergence_bound") = py::none())
      .def_property_readonly("server", &PyReplica::server)
      .def_property_readonly("promoted", &PyReplica::promoted,
                             "True once the scheduler made this replica the server.")
      .def("register_update_callback", &PyReplica::SetUpdate, py::arg("callback"))
      .def("register_request_callback", &PyReplica::SetRequest, py::arg("callback"),
           "Once promoted: answers the workers' gets, returning (version, bytes-like).")
      .def("register_promotion_callback", &PyReplica::SetPromotion, py::arg("callback"),
           "Called once with a Promotion when the scheduler makes this replica the server.")
      .def("serve", &PyReplica::Serve)
      .def("stop", &PyReplica::Stop)
      .def("close", &PyReplica::Close);
  py::class_<SumServer>(m, "SumServer")
      .def(py::init<const std::string&, py::array_t<float, py::array::c_style | py::array::forcecast>,
                    const std::string&, const std::string&, const std::string&,
                    const py::object&>(),
           py::arg("name"), py::arg("initial"), py::arg("socket") = "", py::arg("job") = "",
           py::arg("token") = "", py::arg("shard") = py::none())
      .def_property_readonly("applied", &SumServer::applied)
      .def("stop", &SumServer::Stop);
}
