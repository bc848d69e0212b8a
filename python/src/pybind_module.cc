// mlfabric._mlfabric: the pybind11 binding of MLfabric's C++ API, over the C
// interface in api/c_api.h (so the module shares one client core with the
// TensorFlow op library in the same process). Blocking calls release the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "api/c_api.h"

namespace py = pybind11;

namespace {

constexpr size_t kErrBytes = 2048;

// absl::StatusCode -> the Python exception a user expects.
[[noreturn]] void Raise(int code, const std::string& message) {
  switch (code) {
    case 3: throw py::value_error(message);            // kInvalidArgument
    case 4: throw std::runtime_error("deadline exceeded: " + message);
    default: throw std::runtime_error(message);
  }
}

int DtypeCode(const py::dtype& dtype) {
  if (dtype.is(py::dtype::of<float>())) return MLF_FLOAT32;
  if (dtype.is(py::dtype::of<double>())) return MLF_FLOAT64;
  if (dtype.is(py::dtype::of<int32_t>())) return MLF_INT32;
  if (dtype.is(py::dtype::of<int64_t>())) return MLF_INT64;
  throw py::type_error("unsupported dtype " + py::str(py::handle(dtype)).cast<std::string>() +
                       ": MLfabric reduces float32, float64, int32 and int64");
}

class AllReducer {
 public:
  AllReducer(const std::string& backend, const std::string& socket, const std::string& job,
             const std::string& token, double timeout_s) {
    char err[kErrBytes] = {0};
    {
      py::gil_scoped_release release;
      handle_ = mlf_allreducer_create(backend.c_str(), socket.c_str(), job.c_str(), token.c_str(),
                                      timeout_s, err, sizeof err);
    }
    if (handle_ == 0) throw std::runtime_error(err);
  }
  ~AllReducer() { Close(); }
  void Close() {
    if (handle_ != 0) {
      py::gil_scoped_release release;
      mlf_allreducer_destroy(handle_);
      handle_ = 0;
    }
  }
  int64_t handle() const { return handle_; }
  int rank() const { return mlf_allreducer_rank(handle_); }
  int size() const { return mlf_allreducer_size(handle_); }
  std::string backend() const { return mlf_allreducer_backend(handle_); }

  // Returns a new array holding the sum over ranks (the input is untouched).
  py::array AllReduce(py::array input) {
    const int dtype = DtypeCode(input.dtype());
    py::array out = py::array(input.dtype(), std::vector<py::ssize_t>(input.shape(),
                                                                       input.shape() + input.ndim()));
    out = py::array::ensure(out, py::array::c_style);
    py::array contiguous = py::array::ensure(input, py::array::c_style);
    std::memcpy(out.mutable_data(), contiguous.data(), contiguous.nbytes());
    char err[kErrBytes] = {0};
    int code;
    {
      py::gil_scoped_release release;
      code = mlf_allreduce(handle_, out.mutable_data(), out.size(), dtype, err, sizeof err);
    }
    if (code != 0) Raise(code, err);
    return out;
  }

  py::array Broadcast(py::array input, int root) {
    const int dtype = DtypeCode(input.dtype());
    py::array out = py::array::ensure(input, py::array::c_style | py::array::forcecast);
    out = py::array(out.dtype(), std::vector<py::ssize_t>(out.shape(), out.shape() + out.ndim()),
                    out.data());  // a copy
    char err[kErrBytes] = {0};
    int code;
    {
      py::gil_scoped_release release;
      code = mlf_broadcast(handle_, out.mutable_data(), out.size(), dtype, root, err, sizeof err);
    }
    if (code != 0) Raise(code, err);
    return out;
  }

 private:
  int64_t handle_ = 0;
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

// A push in flight; wait() returns {"outcome", "reason", "applied_version", "delay"}.
class PendingPush {
 public:
  explicit PendingPush(std::shared_ptr<PushState> state) : state_(std::move(state)) {}
  py::dict Wait() {
    {
      py::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(state_->mu);
      state_->cv.wait(lock, [&] { return state_->done; });
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

class Worker {
 public:
  Worker(const std::string& socket, const std::string& job, const std::string& token,
         const std::string& name, int64_t delay_bound) {
    char err[kErrBytes] = {0};
    {
      py::gil_scoped_release release;
      handle_ = mlf_worker_create(socket.c_str(), job.c_str(), token.c_str(), name.c_str(),
                                  delay_bound, err, sizeof err);
    }
    if (handle_ == 0) throw std::runtime_error(err);
  }
  ~Worker() { Close(); }
  void Close() {
    if (handle_ != 0) {
      py::gil_scoped_release release;
      mlf_worker_destroy(handle_);
      handle_ = 0;
    }
  }
  int64_t handle() const { return handle_; }
  int64_t initial_version() const { return mlf_worker_initial_version(handle_); }

  PendingPush PushNowait(const std::string& server, py::array update, int64_t version,
                         double norm) {
    py::array contiguous = py::array::ensure(update, py::array::c_style);
    auto state = std::make_shared<PushState>();
    auto* holder = new std::shared_ptr<PushState>(state);
    mlf_push_async(
        handle_, server.c_str(), contiguous.data(), contiguous.nbytes(), version, norm,
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
  py::tuple Get(const std::string& server) {
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
      mlf_get_async(
          handle_, server.c_str(),
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

class SumServer {
 public:
  SumServer(const std::string& name, py::array_t<float, py::array::c_style | py::array::forcecast>
                                         initial,
            const std::string& socket, const std::string& job, const std::string& token) {
    char err[kErrBytes] = {0};
    {
      py::gil_scoped_release release;
      handle_ = mlf_sum_server_start(socket.c_str(), job.c_str(), token.c_str(), name.c_str(),
                                     initial.data(), initial.size(), err, sizeof err);
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
                    const std::string&, double>(),
           py::arg("backend") = "auto", py::arg("socket") = "", py::arg("job") = "",
           py::arg("token") = "", py::arg("timeout_s") = 300.0)
      .def_property_readonly("handle", &AllReducer::handle)
      .def_property_readonly("rank", &AllReducer::rank)
      .def_property_readonly("size", &AllReducer::size)
      .def_property_readonly("backend", &AllReducer::backend)
      .def("allreduce", &AllReducer::AllReduce, py::arg("array"))
      .def("broadcast", &AllReducer::Broadcast, py::arg("array"), py::arg("root") = 0)
      .def("close", &AllReducer::Close);
  py::class_<PendingPush>(m, "PendingPush")
      .def("wait", &PendingPush::Wait)
      .def("done", &PendingPush::Done);
  py::class_<Worker>(m, "Worker")
      .def(py::init<const std::string&, const std::string&, const std::string&,
                    const std::string&, int64_t>(),
           py::arg("socket") = "", py::arg("job") = "", py::arg("token") = "",
           py::arg("name") = "", py::arg("delay_bound") = -1)
      .def_property_readonly("handle", &Worker::handle)
      .def_property_readonly("initial_version", &Worker::initial_version)
      .def("push_nowait", &Worker::PushNowait, py::arg("server"), py::arg("update"),
           py::arg("version"), py::arg("norm") = 0.0)
      .def(
          "push",
          [](Worker& w, const std::string& server, py::array update, int64_t version,
             double norm) { return w.PushNowait(server, update, version, norm).Wait(); },
          py::arg("server"), py::arg("update"), py::arg("version"), py::arg("norm") = 0.0)
      .def("get", &Worker::Get, py::arg("server"))
      .def("close", &Worker::Close);
  py::class_<SumServer>(m, "SumServer")
      .def(py::init<const std::string&, py::array_t<float, py::array::c_style | py::array::forcecast>,
                    const std::string&, const std::string&, const std::string&>(),
           py::arg("name"), py::arg("initial"), py::arg("socket") = "", py::arg("job") = "",
           py::arg("token") = "")
      .def_property_readonly("applied", &SumServer::applied)
      .def("stop", &SumServer::Stop);
}
