// testbed_app: the training processes of the emulated testbed (workload
// (a)). One binary, three roles:
//
//   --role=server  asynchronous parameter server (MLfabric-A, vanilla async
//                  PS): applies every delivered update in commit order and
//                  samples test accuracy every --eval_interval_s.
//   --role=worker  asynchronous worker: get, compute, push, with at most
//                  --window pushes outstanding (eval/sim/sim_config.h
//                  max_outstanding_pushes). 1 (default): the next get
//                  waits for the push's outcome, so it sees the push;
//                  2: one push in flight while the next is computed.
//   --role=sync    synchronous SGD through api/allreduce.h: each iteration
//                  every rank computes a gradient, AllReduce sums them and
//                  every rank applies the mean. --backend=mlfabric is
//                  MLfabric-S (--backup_workers=b: each sum holds the first
//                  size - b gradients, the mean is over those;
//                  --allreduce_pieces=P: AllReduceOptions::pieces, 0 = one
//                  root per rank); --backend=mpi
//                  is Open MPI's MPI_Allreduce
//                  (RR-Sync / Tr-Sync, the algorithm chosen by mpirun's
//                  --mca flags). Rank 0 samples test accuracy every iteration.
//
// The learning problem is the simulator's (eval/sim/sgd_task.h: softmax
// regression on a seeded Gaussian mixture), so testbed and simulator measure
// the same convergence. Its gradient is carried as float32 at the start of a
// payload of --update_bytes (zero padded; see eval/testbed/README.md "Scaling"): transfer
// sizes follow the scaled ResNet-50 update while the real gradient decides
// accuracy. Compute time per iteration follows the C-setting exactly as the
// simulator draws it (sim::ComputeTimeS: factor s with probability r, seeded
// per worker and iteration); the real gradient time is included in it.
//
// Stopping: the server (async) or rank 0 (sync) ends the run when test
// accuracy first reaches --target_accuracy or after --duration_s. Async
// workers learn it from --stop_file; sync ranks from a flag carried in the
// AllReduce payload itself, so no rank is left inside a collective.
//
// Output: one JSON object per line in --out (events "eval", "push", "iter"
// and a final "summary"); times are Unix epoch seconds (all processes share
// this machine's clock). The orchestrator (mlfabric_testbed.py) reads them.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include "api/allreduce.h"
#include "api/mlfabric.h"
#include "common/config.h"
#include "eval/sim/sgd_task.h"
#include "eval/sim/sim_config.h"
#include "nlohmann/json.hpp"

namespace mlfabric::testbed {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void SleepUntil(double t) {
  const double left = t - Now();
  if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
}

bool FileExists(const std::string& path) { return !path.empty() && ::access(path.c_str(), F_OK) == 0; }

void Touch(const std::string& path) {
  if (!path.empty()) std::ofstream(path) << "stop\n";
}

struct Flags {
  std::string role, backend = "mlfabric", out, stop_file, server = "ps0";
  ClientOptions client;
  sim::SimConfig sim;  // seed, compute setting, compute_s, sgd
  int64_t worker_index = 0, workers = 1, update_bytes = 0, window = 1, backup_workers = 0,
          allreduce_pieces = 1;
  double duration_s = 60, target_accuracy = 0.7, eval_interval_s = 0.1;
  std::string compute = "C0";
};

// Writes JSON lines; thread-safe.
class EventLog {
 public:
  explicit EventLog(const std::string& path) : out_(path) {}
  bool ok() const { return static_cast<bool>(out_); }
  void Write(const nlohmann::json& event) {
    std::lock_guard<std::mutex> lock(mu_);
    out_ << event.dump() << "\n";
    out_.flush();
  }

 private:
  std::mutex mu_;
  std::ofstream out_;
};

size_t PayloadFloats(const Flags& f, size_t model_values) {
  return std::max(model_values, static_cast<size_t>(f.update_bytes / sizeof(float)));
}

// Gradient of the task at `w`, drawn as the simulator draws worker `worker`'s
// `iteration`-th mini-batch; then sleep so the iteration's compute lasts the
// C-setting's time. Returns the compute time spent.
sim::Weights ComputeGradient(const Flags& f, const sim::SgdTask& task, const sim::Weights& w,
                             int worker, int64_t iteration, double* compute_s) {
  const double start = Now();
  sim::Weights g = task.Gradient(w, worker, iteration);
  const double target = sim::ComputeTimeS(f.sim, worker, iteration);
  SleepUntil(start + target);
  *compute_s = Now() - start;
  return g;
}

// The async server's model and counters, shared by the daemon's callbacks
// and the evaluation loop.
struct ServerState {
  std::mutex mu;
  sim::Weights model;
  int64_t version = 0, applied_updates = 0, deliveries = 0;
  std::vector<int64_t> count_hist;  // deliveries by constituent count
};

// Applies delivered updates to `s` and answers gets with its model.
void RegisterServerCallbacks(const Flags& f, Server& server, ServerState& s) {
  const size_t values = s.model.size();
  const double scale = -f.sim.sgd.lr / static_cast<double>(f.workers);
  server.RegisterUpdateCallback([&s, values, scale](
                                    const Server::Update& u) -> absl::StatusOr<int64_t> {
    if (u.bytes < values * sizeof(float)) {
      return absl::InvalidArgumentError("update is shorter than the model's gradient");
    }
    const float* g = reinterpret_cast<const float*>(u.data);
    std::lock_guard<std::mutex> lock(s.mu);
    // Async PS: each constituent gradient applied with lr / N (linear
    // scaling, as the simulator does); an aggregate is their sum.
    for (size_t j = 0; j < values; ++j) s.model[j] += scale * g[j];
    s.applied_updates += u.count;
    s.version += u.count;
    ++s.deliveries;
    if (static_cast<int64_t>(s.count_hist.size()) <= u.count) s.count_hist.resize(u.count + 1, 0);
    ++s.count_hist[u.count];
    return s.version;
  });
  server.RegisterRequestCallback([&f, &s, values]() -> absl::StatusOr<Server::Snapshot> {
    Server::Snapshot snapshot;
    std::lock_guard<std::mutex> lock(s.mu);
    snapshot.version = s.version;
    // The model travels padded to the update size, like the gradient: a
    // get moves as many bytes as a ResNet-50 model would, scaled (README).
    std::vector<float> m(PayloadFloats(f, values), 0.0f);
    std::copy(s.model.begin(), s.model.end(), m.begin());
    snapshot.bytes.resize(m.size() * sizeof(float));
    std::memcpy(snapshot.bytes.data(), m.data(), snapshot.bytes.size());
    return snapshot;
  });
}

// Samples test accuracy every --eval_interval_s from `start` until it
// reaches the target (returns when it did) or --duration_s passed (-1).
double EvaluateUntilDone(const Flags& f, const sim::SgdTask& task, ServerState& s,
                         EventLog& log, double start) {
  double reached_s = -1;
  for (double next = start;; next += f.eval_interval_s) {
    SleepUntil(next);
    sim::Weights snapshot;
    int64_t seen_applied, seen_version;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      snapshot = s.model;
      seen_applied = s.applied_updates;
      seen_version = s.version;
    }
    const double accuracy = task.TestAccuracy(snapshot);
    log.Write({{"event", "eval"}, {"t", Now()}, {"applied", seen_applied},
               {"version", seen_version}, {"accuracy", accuracy}});
    if (reached_s < 0 && accuracy >= f.target_accuracy) reached_s = Now();
    if (reached_s >= 0 || Now() - start >= f.duration_s) break;
  }
  return reached_s;
}

int RunServer(const Flags& f, EventLog& log) {
  const sim::SgdTask task(f.sim.sgd, f.sim.seed);
  ServerState s;
  s.model = task.InitialWeights();
  auto server = Server::Connect(f.client);
  if (!server.ok()) {
    std::cerr << "testbed_app server: " << server.status().message() << "\n";
    return 1;
  }
  s.version = (*server)->initial_version();
  RegisterServerCallbacks(f, **server, s);
  std::thread serving([&] {
    if (auto status = (*server)->Serve(); !status.ok()) {
      std::cerr << "testbed_app server: " << status.message() << "\n";
    }
  });
  const double start = Now();
  // Evaluate until the target or the duration; keep serving until the
  // orchestrator says the workers are done (<stop_file>.done), so their last
  // pushes still end applied or dropped, never failed.
  const double reached_s = EvaluateUntilDone(f, task, s, log, start);
  Touch(f.stop_file);
  const double linger_until = Now() + 120;
  while (!FileExists(f.stop_file + ".done") && Now() < linger_until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  (*server)->Stop();
  serving.join();
  std::lock_guard<std::mutex> lock(s.mu);
  log.Write({{"event", "summary"}, {"role", "server"}, {"t", Now()}, {"start", start},
             {"applied", s.applied_updates}, {"deliveries", s.deliveries},
             {"deliveries_by_count", s.count_hist}, {"version", s.version},
             {"accuracy", task.TestAccuracy(s.model)}, {"reached_t", reached_s}});
  return 0;
}

// A worker's push whose outcome is not in yet.
struct InFlight {
  std::future<PushResult> result;
  int64_t iteration;
  int64_t version;
  double pushed_t;
};

// How a worker's pushes ended, for its summary.
struct PushTally {
  int64_t pushes = 0, applied = 0, dropped = 0, failed = 0;
  std::map<std::string, int64_t> drop_reasons, fail_reasons;
  std::string first_error;
};

// Waits for the oldest push in flight, logs its outcome and counts it.
void SettleOldest(std::deque<InFlight>& in_flight, PushTally& tally, EventLog& log) {
  InFlight p = std::move(in_flight.front());
  in_flight.pop_front();
  PushResult r = p.result.get();
  nlohmann::json e = {{"event", "push"}, {"iter", p.iteration}, {"version", p.version},
                      {"t_push", p.pushed_t}, {"t_done", Now()},
                      {"outcome", PushOutcomeName(r.outcome)}};
  if (r.outcome == PushOutcome::kApplied) {
    ++tally.applied;
    e["delay"] = r.delay;
  } else if (r.outcome == PushOutcome::kDropped) {
    ++tally.dropped;
    ++tally.drop_reasons[r.reason];
    e["reason"] = r.reason;
  } else {
    ++tally.failed;
    ++tally.fail_reasons[r.reason];
    e["reason"] = r.reason;
    if (tally.first_error.empty()) tally.first_error = r.reason;
  }
  log.Write(e);
}

// The server's model for `iteration`.
absl::StatusOr<Model> GetModel(Worker& worker, const std::string& server, int64_t iteration) {
  auto model = worker.Get(server);
  // Workers and the server start together: until the server has
  // registered, a get is refused with NOT_FOUND. Wait for it (only before
  // the first model arrives; pushes already wait server_wait_s). The
  // daemon reports it as "... NOT_FOUND: server 'ps0' ... is not registered".
  for (const double wait_until = Now() + 30;
       iteration == 0 && !model.ok() &&
       model.status().message().find("is not registered") != absl::string_view::npos &&
       Now() < wait_until;
       model = worker.Get(server)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return model;
}

int RunWorker(const Flags& f, EventLog& log) {
  const sim::SgdTask task(f.sim.sgd, f.sim.seed);
  auto worker = Worker::Connect(f.client);
  if (!worker.ok()) {
    std::cerr << "testbed_app worker: " << worker.status().message() << "\n";
    return 1;
  }
  const size_t values = task.InitialWeights().size();
  std::vector<float> payload(PayloadFloats(f, values), 0.0f);
  std::deque<InFlight> in_flight;
  PushTally tally;
  std::string get_error;
  bool get_failed = false;
  const double start = Now();
  const int index = static_cast<int>(f.worker_index);
  double last_iter_end = start;
  // A failed push (an outcome the API defines: the daemon or scheduler could
  // not carry it out) loses that one update, as a crashed transfer would;
  // training goes on and the failure is reported with its reason. A failed
  // get ends the worker: it has no model to compute on.
  for (int64_t iteration = 0;; ++iteration) {
    if (FileExists(f.stop_file) || Now() - start > f.duration_s + 60) break;
    auto model = GetModel(**worker, f.server, iteration);
    if (!model.ok()) {
      get_failed = true;
      get_error = std::string(model.status().message());
      break;
    }
    if (model->size() != PayloadFloats(f, values) * sizeof(float)) {
      get_failed = true;
      get_error = "model from the server has the wrong size";
      break;
    }
    const float* m = reinterpret_cast<const float*>(model->data());
    const sim::Weights w(m, m + values);
    double compute_s = 0;
    const sim::Weights g = ComputeGradient(f, task, w, index, iteration, &compute_s);
    double norm2 = 0;
    for (size_t j = 0; j < values; ++j) {
      payload[j] = static_cast<float>(g[j]);
      norm2 += g[j] * g[j];
    }
    const double now = Now();
    log.Write({{"event", "iter"}, {"iter", iteration}, {"t", now}, {"compute_s", compute_s},
               {"iter_s", now - last_iter_end}});
    last_iter_end = now;
    in_flight.push_back({(*worker)->Push(f.server, payload.data(), payload.size() * sizeof(float),
                                         model->version, std::sqrt(norm2)),
                         iteration, model->version, now});
    ++tally.pushes;
    while (static_cast<int64_t>(in_flight.size()) >= f.window) {
      SettleOldest(in_flight, tally, log);
    }
  }
  while (!in_flight.empty()) SettleOldest(in_flight, tally, log);
  log.Write({{"event", "summary"}, {"role", "worker"}, {"t", Now()}, {"start", start},
             {"pushes", tally.pushes}, {"applied", tally.applied}, {"dropped", tally.dropped},
             {"failed", tally.failed}, {"drop_reasons", tally.drop_reasons},
             {"fail_reasons", tally.fail_reasons}, {"first_error", tally.first_error},
             {"get_error", get_error}});
  return get_failed ? 3 : 0;
}

int RunSync(const Flags& f, EventLog& log) {
  const sim::SgdTask task(f.sim.sgd, f.sim.seed);
  AllReduceOptions options;
  options.backend = f.backend;
  options.client = f.client;
  options.backup_workers = static_cast<int>(f.backup_workers);
  options.pieces = static_cast<int>(f.allreduce_pieces);
  auto reducer_or = MakeAllReducer(options);
  if (!reducer_or.ok()) {
    std::cerr << "testbed_app sync: " << reducer_or.status().message() << "\n";
    return 1;
  }
  AllReducer& reducer = **reducer_or;
  const int rank = reducer.rank(), size = reducer.size();
  sim::Weights w = task.InitialWeights();
  const size_t values = w.size();
  // Payload: gradient, zero padding, then one stop flag (rank 0 sets it).
  std::vector<float> payload(PayloadFloats(f, values + 1), 0.0f);
  const double start = Now();
  double reached_s = -1, last_iter_end = start;
  int64_t iterations = 0;
  bool stop = false;
  absl::Status error;
  for (int64_t iteration = 0; !stop; ++iteration) {
    double compute_s = 0;
    const sim::Weights g = ComputeGradient(f, task, w, rank, iteration, &compute_s);
    std::fill(payload.begin(), payload.end(), 0.0f);
    for (size_t j = 0; j < values; ++j) payload[j] = static_cast<float>(g[j]);
    const bool want_stop = rank == 0 && (reached_s >= 0 || Now() - start >= f.duration_s);
    payload.back() = want_stop ? 1.0f : 0.0f;
    const double t_reduce = Now();
    error = reducer.AllReduce(payload.data(), payload.size(), DataType::kFloat32);
    if (!error.ok()) break;
    const double now = Now();
    stop = payload.back() > 0.5f;
    // The mean gradient, one synchronous step of lr (sim: SyncSystem):
    // over the gradients summed (size - backup workers).
    for (size_t j = 0; j < values; ++j) w[j] += -f.sim.sgd.lr * payload[j] / reducer.summed();
    ++iterations;
    nlohmann::json e = {{"event", "iter"}, {"iter", iteration}, {"t", now},
                        {"compute_s", compute_s}, {"reduce_s", now - t_reduce},
                        {"iter_s", now - last_iter_end}};
    last_iter_end = now;
    if (rank == 0) {
      const double accuracy = task.TestAccuracy(w);
      e["accuracy"] = accuracy;
      if (reached_s < 0 && accuracy >= f.target_accuracy) reached_s = now;
    }
    log.Write(e);
  }
  log.Write({{"event", "summary"}, {"role", "sync"}, {"backend", reducer.backend()},
             {"rank", rank}, {"size", size}, {"t", Now()}, {"start", start},
             {"iterations", iterations}, {"accuracy", task.TestAccuracy(w)},
             {"backup_workers", f.backup_workers}, {"left_out", reducer.left_out()},
             {"reached_t", reached_s},
             {"first_error", error.ok() ? "" : std::string(error.message())}});
  reducer_or->reset();  // the mlfabric backend's root says goodbye here
  if (!error.ok()) std::cerr << "testbed_app sync rank " << rank << ": " << error.message() << "\n";
  return error.ok() ? 0 : 3;
}

}  // namespace
}  // namespace mlfabric::testbed

int main(int argc, char** argv) {
  using namespace mlfabric;
  using testbed::Flags;
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) return 2;
  ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  Flags f;
  int64_t seed = 1, features = f.sim.sgd.features, classes = f.sim.sgd.classes,
          batch = f.sim.sgd.batch;
  double compute_s = f.sim.compute_s, lr = f.sim.sgd.lr;
  reader.Enum("role", &f.role, {"server", "worker", "sync"});
  reader.Enum("backend", &f.backend, {"mlfabric", "mpi"});
  reader.Int("backup_workers", &f.backup_workers, 0, 1024);
  reader.Int("allreduce_pieces", &f.allreduce_pieces, 0, 1024);
  reader.String("out", &f.out);
  reader.String("stop_file", &f.stop_file);
  reader.String("server", &f.server);
  reader.String("socket", &f.client.daemon_socket);
  reader.String("name", &f.client.name);
  reader.String("job", &f.client.job);
  reader.String("job_token", &f.client.job_token);
  reader.Int("worker_index", &f.worker_index, 0, 1 << 20);
  reader.Int("workers", &f.workers, 1, 1 << 20);
  reader.Int("update_bytes", &f.update_bytes, 0, int64_t{1} << 32);
  reader.Int("window", &f.window, 1, 64);
  reader.Int("seed", &seed, 0, int64_t{1} << 40);
  reader.Int("features", &features, 1, 1 << 16);
  reader.Int("classes", &classes, 2, 1 << 10);
  reader.Int("batch", &batch, 1, 1 << 16);
  reader.Double("lr", &lr, 1e-6, 100);
  reader.Double("compute_s", &compute_s, 0, 60);
  reader.String("compute", &f.compute);
  reader.Double("duration_s", &f.duration_s, 0.1, 86400);
  reader.Double("target_accuracy", &f.target_accuracy, 0, 1);
  reader.Double("eval_interval_s", &f.eval_interval_s, 0.005, 60);
  if (auto status = reader.Finish(); !status.ok()) {
    std::cerr << "testbed_app: " << status.message() << "\n";
    return 2;
  }
  if (f.role.empty() || f.out.empty()) {
    std::cerr << "testbed_app: --role (server|worker|sync) and --out are required\n";
    return 2;
  }
  if (f.role != "sync" && f.stop_file.empty()) {
    std::cerr << "testbed_app: --stop_file is required for --role=" << f.role << "\n";
    return 2;
  }
  auto compute = sim::ComputeSettingByName(f.compute);
  if (!compute.ok()) {
    std::cerr << "testbed_app: " << compute.status().message() << "\n";
    return 2;
  }
  f.sim.compute = *compute;
  f.sim.seed = static_cast<uint64_t>(seed);
  f.sim.compute_s = compute_s;
  f.sim.sgd.features = static_cast<int>(features);
  f.sim.sgd.classes = static_cast<int>(classes);
  f.sim.sgd.batch = static_cast<int>(batch);
  f.sim.sgd.lr = lr;
  testbed::EventLog log(f.out);
  if (!log.ok()) {
    std::cerr << "testbed_app: cannot write --out " << f.out << "\n";
    return 2;
  }
  if (f.role == "server") return testbed::RunServer(f, log);
  if (f.role == "worker") return testbed::RunWorker(f, log);
  return testbed::RunSync(f, log);
}
