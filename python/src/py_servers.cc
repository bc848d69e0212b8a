// mlfabric._mlfabric's servers: parameter servers and replicas whose
// update/request (and promotion) callbacks are Python functions, run with
// the GIL taken back while the C API's serving thread waits, and the C++
// SumServer. A Python exception in a callback fails that push (or get) with
// the exception's text (a promotion callback's is only reported).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "api/c_api.h"
#include "python/src/py_common.h"

namespace mlfabric::python {
namespace {

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

// Runs a C API serve loop (mlf_ext_server_serve, mlf_ext_replica_serve) on
// `handle` with the GIL released, so the callbacks can take it, and raises
// the error it ends with.
void ServeWithoutGil(int (*serve)(int64_t handle, char* err, size_t err_len), int64_t handle) {
  char err[kErrBytes] = {0};
  int code;
  {
    py::gil_scoped_release release;
    code = serve(handle, err, sizeof err);
  }
  if (code != 0) Raise(code, err);
}

// State shared with the C trampolines of a server or replica; its Python
// callables are only touched with the GIL held.
struct Handlers {
  py::object on_update = py::none();
  py::object on_request = py::none();
  py::object on_promotion = py::none();  // replicas only
  py::object on_install = py::none();    // replicas that start from a snapshot

  static int Update(void* ctx, const mlf_update_view* view, int64_t* new_version, char* err,
                    size_t err_len) {
    auto* self = static_cast<Handlers*>(ctx);
    py::gil_scoped_acquire acquire;
    std::string message;
    int code = 0;
    auto update = std::make_shared<python::Update>(view);
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

  // A snapshot of the server's model: install(version, data) with `data` a
  // bytes copy (installed once per registration; a copy keeps it safe to
  // hold). An exception fails the install: the scheduler sends another.
  static int Install(void* ctx, int64_t version, const void* data, uint64_t bytes, char* err,
                     size_t err_len) {
    auto* self = static_cast<Handlers*>(ctx);
    py::gil_scoped_acquire acquire;
    std::string message;
    int code = 0;
    try {
      if (self->on_install.is_none()) {
        code = 9;
        message = "no install callback is registered at this replica";
      } else {
        self->on_install(version, py::bytes(static_cast<const char*>(data), bytes));
      }
    } catch (py::error_already_set& e) {
      code = kInternal;
      message = PythonError(e, "install callback");
    } catch (const std::exception& e) {
      code = kInternal;
      message = std::string("the install callback failed: ") + e.what();
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
    python::Promotion promotion;
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
    ServeWithoutGil(&mlf_ext_server_serve, handle_);
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
            std::optional<double> divergence_bound, bool snapshot) {
    const int64_t delay = DelayBound(delay_bound);
    const double divergence = DivergenceBound(divergence_bound);
    char err[kErrBytes] = {0};
    int code = 0;
    {
      py::gil_scoped_release release;
      handle_ = mlf_ext_replica_create(server.c_str(), socket.c_str(), job.c_str(), token.c_str(),
                                       name.c_str(), delay, divergence, snapshot ? 1 : 0,
                                       &code, err, sizeof err);
    }
    if (handle_ == 0) Raise(code, err);
    server_ = server;
    snapshot_ = snapshot;
    // All three trampolines, once: the Python callables may be (re)set any
    // time, while serving too, since the trampolines read them under the GIL.
    mlf_ext_replica_set_callbacks(handle_, &Handlers::Update, &Handlers::Request,
                                  &Handlers::Promotion, &handlers_);
    if (snapshot) mlf_ext_replica_set_install_callback(handle_, &Handlers::Install);
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
  void SetInstall(py::object fn) {
    if (!fn.is_none() && !PyCallable_Check(fn.ptr())) throw py::type_error("the install callback must be callable");
    if (!snapshot_ && !fn.is_none()) {
      throw std::runtime_error("replica of '" + server_ +
                               "' was not created with snapshot=True: no snapshot will come");
    }
    handlers_.on_install = std::move(fn);
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
    if (snapshot_ && handlers_.on_install.is_none()) {
      throw std::runtime_error("replica of '" + server_ +
                               "' starts from a snapshot: register an install callback before "
                               "serve()");
    }
    ServeWithoutGil(&mlf_ext_replica_serve, handle_);
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
  bool snapshot_ = false;  // starts from a snapshot of the server's model
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

void BindServers(py::module_& m) {
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
                    std::optional<double>, bool>(),
           py::arg("server"), py::arg("name") = "", py::arg("socket") = "", py::arg("job") = "",
           py::arg("token") = "", py::arg("delay_bound") = py::none(),
           py::arg("divergence_bound") = py::none(), py::arg("snapshot") = false)
      .def_property_readonly("server", &PyReplica::server)
      .def_property_readonly("promoted", &PyReplica::promoted,
                             "True once the scheduler made this replica the server.")
      .def("register_update_callback", &PyReplica::SetUpdate, py::arg("callback"))
      .def("register_request_callback", &PyReplica::SetRequest, py::arg("callback"),
           "Once promoted: answers the workers' gets, returning (version, bytes-like).")
      .def("register_promotion_callback", &PyReplica::SetPromotion, py::arg("callback"),
           "Called once with a Promotion when the scheduler makes this replica the server.")
      .def("register_install_callback", &PyReplica::SetInstall, py::arg("callback"),
           "snapshot=True: install(version, data) replaces the model with the server's "
           "(data: bytes) before the updates after it arrive.")
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

}  // namespace mlfabric::python
