// profile_worker: a training worker with a real network's tensor profile
// (workload (b) of the testbed). It does no arithmetic: it "computes" by sleeping
// each layer's scaled forward/backward time (profile_models.h) and moves the
// layers' real (scaled) gradient sizes through MLfabric.
//
// --layout=per_layer (Mercury ablation, mercury.md §II-B, §IV): one server
// per layer (<server_prefix>L<i>). Each iteration runs the forward pass
// layer by layer, each layer waiting until its parameters from the previous
// iteration have come back (the DAG of mercury.md Fig. 1: fp_i needs
// pull_i); then the backward pass from the last layer to the first, pushing
// each layer's gradient as soon as it is produced and getting that layer's
// model back as soon as its push is applied. --variant:
//   prio   the push carries tensor priority = layer index (front layers
//          first): a later-produced front layer overtakes the packets of
//          back layers still queued in the daemon (packet-level priority);
//   fifo   every push has priority 0: packets leave in arrival order;
//   whole  whole-tensor transfers: one push at a time, the next only after
//          the previous one is applied (no packet interleaving at all).
// Pulls go one layer at a time (--max_pulls=1, see RunPerLayer): most
// urgent first for prio, in push-completion order otherwise. --rounds: the
// layer servers run synchronous rounds of all workers (profile_server
// --round_size) and each layer's get is issued right after its push; the
// server's daemon streams the round's sum back as packets complete, so push
// and pull of a layer overlap (mercury.md §IV Key idea 3).
// Iteration time = time between consecutive forward-pass starts.
//
// --layout=single (TensorLights co-located jobs, tensorlights.md §II-III):
// one server (<server_prefix>model), synchronous training: compute the
// whole iteration, push the whole gradient (tensors in layer order,
// priority = layer index for prio, 0 otherwise), then wait at the barrier
// (--barrier=HOST:PORT, served by profile_server) until every worker of the
// job has pushed, then get the model. Barrier wait = from handing the
// gradient over to having the new model (§III "elapsed time between a
// worker entering the barrier and exiting the barrier").
//
// Writes one JSON document to --out (per-iteration timings, push outcomes)
// and exits 0 if no push or get failed, 3 otherwise (2: bad flags).
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "api/mlfabric.h"
#include "common/config.h"
#include "eval/testbed/apps/profile_models.h"
#include "nlohmann/json.hpp"

namespace mlfabric::eval {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  ClientOptions client;
  std::string model = "vgg16";
  double byte_scale = 50;
  double compute_scale = 1;
  double compute_total_s = 0;  // > 0: overrides compute_scale so fwd+bwd takes this long
  int64_t max_pulls = 1;  // per_layer: gets in flight at once (0 = no limit)
  bool rounds = false;    // per_layer: servers run synchronous rounds (Mercury PS)
  std::string layout = "per_layer";
  std::string variant = "prio";
  std::string server_prefix;
  int64_t iterations = 10;
  std::string barrier;  // HOST:PORT
  double start_at_unix = 0;
  std::string out;
  bool help = false;
};

class Stopwatch {
 public:
  Stopwatch() : t0_(Clock::now()) {}
  double Now() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  // Sleeps until `t` seconds after the start (no-op if already past).
  void SleepUntil(double t) const {
    std::this_thread::sleep_until(t0_ + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(t)));
  }

 private:
  Clock::time_point t0_;
};

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct PushTally {
  std::mutex mu;
  int64_t issued = 0, applied = 0, dropped = 0, failed = 0, gets = 0, get_failures = 0;
  int64_t delay_sum = 0;
  std::vector<std::string> errors;
  void Record(const PushResult& r) {
    std::lock_guard<std::mutex> lock(mu);
    if (r.outcome == PushOutcome::kApplied) {
      ++applied;
      delay_sum += r.delay;
    } else if (r.outcome == PushOutcome::kDropped) {
      ++dropped;
    } else {
      ++failed;
      if (errors.size() < 5) errors.push_back("push failed: " + r.reason);
    }
  }
  void Got(const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu);
    ++gets;
    if (!status.ok()) {
      ++get_failures;
      if (errors.size() < 5) errors.push_back("get failed: " + std::string(status.message()));
    }
  }
};

// A blocking TCP client for profile_server's barrier: sends the iteration
// index, returns when the server answers with the same index.
class BarrierClient {
 public:
  ~BarrierClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  absl::Status Connect(const std::string& address, double timeout_s) {
    std::vector<std::string> parts = absl::StrSplit(address, ':');
    if (parts.size() != 2) return absl::InvalidArgumentError("barrier: expected HOST:PORT");
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (true) {
      addrinfo hints{};
      hints.ai_family = AF_INET;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* found = nullptr;
      if (getaddrinfo(parts[0].c_str(), parts[1].c_str(), &hints, &found) == 0 && found) {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        if (::connect(fd_, found->ai_addr, found->ai_addrlen) == 0) {
          freeaddrinfo(found);
          return absl::OkStatus();
        }
        ::close(fd_);
        fd_ = -1;
        freeaddrinfo(found);
      }
      if (Clock::now() > deadline) {
        return absl::UnavailableError(absl::StrCat("barrier: cannot connect to ", address,
                                                   " within ", timeout_s, " s"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  absl::Status Wait(uint32_t iteration) {
    uint32_t wire = htonl(iteration);
    if (::send(fd_, &wire, sizeof(wire), MSG_NOSIGNAL) != sizeof(wire)) {
      return absl::UnavailableError("barrier: send failed");
    }
    uint32_t reply = 0;
    size_t got = 0;
    while (got < sizeof(reply)) {
      ssize_t n = ::recv(fd_, reinterpret_cast<char*>(&reply) + got, sizeof(reply) - got, 0);
      if (n <= 0) return absl::UnavailableError("barrier: the server closed the connection");
      got += static_cast<size_t>(n);
    }
    if (ntohl(reply) != iteration) {
      return absl::DataLossError(absl::StrCat("barrier: released ", ntohl(reply),
                                              " while waiting for ", iteration));
    }
    return absl::OkStatus();
  }

 private:
  int fd_ = -1;
};

nlohmann::json LayersJson(const std::vector<ScaledLayer>& layers) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& l : layers) {
    out.push_back({{"name", l.name}, {"bytes", l.bytes}, {"forward_s", l.forward_s},
                   {"backward_s", l.backward_s}});
  }
  return out;
}

// ---- --layout=per_layer ----------------------------------------------------
// One run of the per-layer layout: the state its pushes, its puller and (for
// whole) its sender share.
class PerLayerRun {
 public:
  using Done = std::shared_ptr<std::promise<double>>;  // set when the layer's model arrived

  PerLayerRun(Worker& worker, const Flags& flags, const std::vector<ScaledLayer>& layers,
              const Stopwatch& clock, PushTally& tally)
      : worker_(worker),
        flags_(flags),
        layers_(layers),
        clock_(clock),
        tally_(tally),
        n_(layers.size()),
        servers_(n_),
        grads_(n_),
        norms_(n_),
        versions_(n_),
        available_(n_) {
    for (size_t i = 0; i < n_; ++i) {
      servers_[i] = absl::StrCat(flags.server_prefix, "L", i);
      grads_[i].assign(layers[i].bytes / 4, 1e-3f);
      norms_[i] = 1e-3 * std::sqrt(static_cast<double>(grads_[i].size()));
    }
  }

  int Run(nlohmann::json& iterations) {
    puller_ = std::thread([this] { PullLoop(); });
    for (size_t i = 0; i < n_; ++i) {  // the initial model
      auto done = std::make_shared<std::promise<double>>();
      available_[i] = done->get_future().share();
      EnqueuePull(i, done);
    }
    if (flags_.variant == "whole") sender_ = std::thread([this] { SendLoop(); });

    double compute = 0;  // the compute timeline: never sleeps past it twice
    for (int64_t it = 0; it <= flags_.iterations; ++it) {
      nlohmann::json record;
      const double fp_start = clock_.Now();
      const double stall = ForwardPass(fp_start, compute);
      record["iteration"] = it;
      record["fp_start_s"] = fp_start;
      record["fp_stall_s"] = stall;
      if (!iterations.empty()) {
        iterations.back()["iteration_s"] =
            fp_start - iterations.back()["fp_start_s"].get<double>();
        iterations.back()["next_fp_stall_s"] = stall;
      }
      if (it == flags_.iterations) break;  // the last forward pass only closes the last iteration
      BackwardPass(compute);
      record["bp_end_s"] = clock_.Now();
      iterations.push_back(record);
      arrivals_.push_back(available_);
      if (it % 5 == 0) {
        std::cout << "profile_worker " << flags_.client.name << ": iteration " << it << " stall "
                  << stall << " s" << std::endl;
      }
    }
    JoinAll();
    RecordArrivals(iterations);
    return 0;
  }

 private:
  // Pulls: get replies leave the server's daemon as plain TCP streams, with
  // no packet priority, so concurrent gets share the link fairly and a
  // front layer's model waits behind back layers'. With --max_pulls=1 (the
  // default) the worker pulls one layer at a time instead: the most urgent
  // (lowest layer index) of the layers whose push is done for prio, in
  // push-completion order for fifo and whole -- priority (or FIFO) in the
  // pull direction too (mercury.md §IV-A). --max_pulls=0: all at once.
  void EnqueuePull(size_t i, Done done) {
    std::lock_guard<std::mutex> lock(pull_mu_);
    const int64_t key = flags_.variant == "prio" ? static_cast<int64_t>(i) : 0;
    pulls_[{key, pull_sequence_++}] = {i, std::move(done)};
    pull_cv_.notify_all();
  }

  // The puller thread: starts each queued pull once --max_pulls allows.
  void PullLoop() {
    std::unique_lock<std::mutex> lock(pull_mu_);
    while (true) {
      pull_cv_.wait(lock, [&] {
        return (!pulls_.empty() &&
                (flags_.max_pulls == 0 || pulls_in_flight_ < flags_.max_pulls)) ||
               (pulls_.empty() && pulls_done_);
      });
      if (pulls_.empty()) return;
      auto item = pulls_.begin()->second;
      pulls_.erase(pulls_.begin());
      ++pulls_in_flight_;
      pull_threads_.emplace_back([this, item] {
        auto model = worker_.Get(servers_[item.first]);
        tally_.Got(model.status());
        if (model.ok()) versions_[item.first] = model->version;
        item.second->set_value(clock_.Now());
        std::lock_guard<std::mutex> done(pull_mu_);
        --pulls_in_flight_;
        pull_cv_.notify_all();
      });
    }
  }

  // Waits for layer i's push, then queues its pull.
  void Fetch(size_t i, Done done, std::future<PushResult> push) {
    if (push.valid()) tally_.Record(push.get());
    EnqueuePull(i, std::move(done));
  }

  // whole: one sender pushes the layers one at a time, in production order,
  // each only after the previous one is applied (no packet interleaving).
  void SendLoop() {
    while (true) {
      std::pair<size_t, Done> item;
      {
        std::unique_lock<std::mutex> lock(queue_mu_);
        queue_cv_.wait(lock, [&] { return !queue_.empty(); });
        item = queue_.front();
        queue_.pop_front();
      }
      const size_t i = item.first;
      if (i == n_) return;
      {
        std::lock_guard<std::mutex> lock(tally_.mu);
        ++tally_.issued;
      }
      PushResult r = worker_.Push(servers_[i], grads_[i].data(), layers_[i].bytes, versions_[i],
                                  norms_[i], {{0, layers_[i].bytes, 0}}).get();
      std::promise<PushResult> settled;
      settled.set_value(r);
      std::lock_guard<std::mutex> lock(threads_mu_);
      threads_.emplace_back(&PerLayerRun::Fetch, this, i, item.second, settled.get_future());
    }
  }

  // Front layer first, each once its model is there; returns the time
  // spent waiting for models.
  double ForwardPass(double fp_start, double& compute) {
    double stall = 0;
    compute = std::max(compute, fp_start);
    for (size_t i = 0; i < n_; ++i) {
      const double t = clock_.Now();
      available_[i].wait();
      const double waited = clock_.Now() - t;
      if (waited > 1e-4) {
        stall += waited;
        compute = std::max(compute, clock_.Now());
      }
      compute += layers_[i].forward_s;
      clock_.SleepUntil(compute);
    }
    return stall;
  }

  // Backward pass: last layer first; each gradient goes out when produced.
  void BackwardPass(double& compute) {
    std::vector<Done> done(n_);
    for (size_t i = 0; i < n_; ++i) {
      done[i] = std::make_shared<std::promise<double>>();
      available_[i] = done[i]->get_future().share();
    }
    for (size_t k = 0; k < n_; ++k) {
      const size_t i = n_ - 1 - k;
      compute += layers_[i].backward_s;
      clock_.SleepUntil(compute);
      if (flags_.variant == "whole") {
        std::lock_guard<std::mutex> lock(queue_mu_);
        queue_.push_back({i, done[i]});
        queue_cv_.notify_one();
      } else {
        PushLayer(i, done[i]);
      }
    }
  }

  // prio and fifo: layer i's push now, its pull after it (or right away).
  void PushLayer(size_t i, Done done) {
    const int32_t priority = flags_.variant == "prio" ? static_cast<int32_t>(i) : 0;
    {
      std::lock_guard<std::mutex> lock(tally_.mu);
      ++tally_.issued;
    }
    std::future<PushResult> push = worker_.Push(servers_[i], grads_[i].data(), layers_[i].bytes,
                                                versions_[i], norms_[i],
                                                {{0, layers_[i].bytes, priority}});
    std::lock_guard<std::mutex> lock(threads_mu_);
    if (flags_.rounds) {
      // Mercury PS (mercury.md §IV Key idea 3): the get streams the
      // round's sum back packet by packet while the pushes still
      // arrive, so it is issued right away.
      threads_.emplace_back([this, push = std::move(push)]() mutable {
        tally_.Record(push.get());
      });
      EnqueuePull(i, done);
    } else {
      threads_.emplace_back(&PerLayerRun::Fetch, this, i, done, std::move(push));
    }
  }

  // Stops the sender, then waits for every push and pull.
  void JoinAll() {
    if (sender_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(queue_mu_);
        queue_.push_back({n_, nullptr});  // stop
        queue_cv_.notify_one();
      }
      sender_.join();
    }
    for (auto& t : threads_) t.join();
    {
      std::lock_guard<std::mutex> lock(pull_mu_);
      pulls_done_ = true;
      pull_cv_.notify_all();
    }
    puller_.join();
    for (auto& t : pull_threads_) t.join();
  }

  // When each iteration's models came back, relative to the end of its
  // backward pass: the first layer (what the next forward pass needs
  // first) and all layers.
  void RecordArrivals(nlohmann::json& iterations) {
    for (size_t k = 0; k < arrivals_.size(); ++k) {
      const double bp_end = iterations[k]["bp_end_s"].get<double>();
      double all = 0;
      for (const auto& a : arrivals_[k]) all = std::max(all, a.get());
      iterations[k]["front_ready_s"] = arrivals_[k][0].get() - bp_end;
      iterations[k]["all_ready_s"] = all - bp_end;
    }
  }

  Worker& worker_;
  const Flags& flags_;
  const std::vector<ScaledLayer>& layers_;
  const Stopwatch& clock_;
  PushTally& tally_;
  const size_t n_;
  std::vector<std::string> servers_;
  std::vector<std::vector<float>> grads_;
  std::vector<double> norms_;
  std::vector<std::atomic<int64_t>> versions_;
  std::vector<std::shared_future<double>> available_;  // time the layer's model arrived
  std::vector<std::thread> threads_;  // guarded by threads_mu_ (whole: the sender adds too)
  std::mutex threads_mu_;
  std::mutex queue_mu_;  // whole: the sender's queue
  std::condition_variable queue_cv_;
  std::deque<std::pair<size_t, Done>> queue_;
  std::thread sender_;
  std::vector<std::vector<std::shared_future<double>>> arrivals_;  // per iteration
  std::mutex pull_mu_;
  std::condition_variable pull_cv_;
  std::map<std::pair<int64_t, uint64_t>, std::pair<size_t, Done>>
      pulls_;  // (key, sequence) -> layer; key = layer index (prio) or 0
  uint64_t pull_sequence_ = 0;
  bool pulls_done_ = false;
  int64_t pulls_in_flight_ = 0;
  std::vector<std::thread> pull_threads_;  // guarded by pull_mu_
  std::thread puller_;
};

int RunPerLayer(Worker& worker, const Flags& flags, const std::vector<ScaledLayer>& layers,
                const Stopwatch& clock, PushTally& tally, nlohmann::json& iterations) {
  PerLayerRun run(worker, flags, layers, clock, tally);
  return run.Run(iterations);
}

// ---- --layout=single ---------------------------------------------------------
int RunSingle(Worker& worker, const Flags& flags, const std::vector<ScaledLayer>& layers,
              const Stopwatch& clock, PushTally& tally, nlohmann::json& iterations) {
  const std::string server = flags.server_prefix + "model";
  uint64_t total = 0;
  double compute_s = 0;
  std::vector<TensorSpec> tensors;
  for (size_t i = 0; i < layers.size(); ++i) {
    tensors.push_back({static_cast<uint32_t>(i), layers[i].bytes,
                       flags.variant == "prio" ? static_cast<int32_t>(i) : 0});
    total += layers[i].bytes;
    compute_s += layers[i].forward_s + layers[i].backward_s;
  }
  std::vector<float> grad(total / 4, 1e-3f);
  const double norm = 1e-3 * std::sqrt(static_cast<double>(grad.size()));
  BarrierClient barrier;
  if (!flags.barrier.empty()) {
    if (auto s = barrier.Connect(flags.barrier, 60); !s.ok()) {
      std::cerr << "profile_worker: " << s.message() << "\n";
      return 3;
    }
  }
  auto model = worker.Get(server);
  tally.Got(model.status());
  if (!model.ok()) return 3;
  int64_t version = model->version;
  double compute = clock.Now();
  for (int64_t it = 0; it < flags.iterations; ++it) {
    nlohmann::json record;
    const double start = clock.Now();
    compute = std::max(compute, start) + compute_s;
    clock.SleepUntil(compute);
    const double enter = clock.Now();
    {
      std::lock_guard<std::mutex> lock(tally.mu);
      ++tally.issued;
    }
    PushResult r = worker.Push(server, grad.data(), total, version, norm, tensors).get();
    tally.Record(r);
    const double pushed = clock.Now();
    if (r.outcome == PushOutcome::kFailed) break;
    if (!flags.barrier.empty()) {
      if (auto s = barrier.Wait(static_cast<uint32_t>(it)); !s.ok()) {
        std::lock_guard<std::mutex> lock(tally.mu);
        tally.errors.push_back(std::string(s.message()));
        ++tally.failed;
        break;
      }
    }
    const double released = clock.Now();
    model = worker.Get(server);
    tally.Got(model.status());
    if (!model.ok()) break;
    version = model->version;
    const double exit = clock.Now();
    record["iteration"] = it;
    record["start_s"] = start;
    record["enter_s"] = enter;
    record["push_s"] = pushed - enter;
    record["released_s"] = released;
    record["exit_s"] = exit;
    record["barrier_wait_s"] = exit - enter;
    record["iteration_s"] = exit - start;
    record["outcome"] = PushOutcomeName(r.outcome);
    iterations.push_back(record);
    if (it % 10 == 0 || it + 1 == flags.iterations) {
      std::cout << "profile_worker " << flags.client.name << ": iteration " << it
                << " barrier wait " << exit - enter << " s" << std::endl;
    }
  }
  return 0;
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) return cl.status();
  auto reader = ConfigReader::FromCommandLine(*cl);
  if (!reader.ok()) return reader.status();
  Flags flags;
  flags.client.name = "worker";
  reader->String("socket", &flags.client.daemon_socket);
  reader->String("name", &flags.client.name);
  reader->String("job", &flags.client.job);
  reader->String("token", &flags.client.job_token);
  reader->Enum("model", &flags.model, {"vgg16", "resnet50", "resnet32"});
  reader->Double("byte_scale", &flags.byte_scale, 1, 1e9);
  reader->Double("compute_scale", &flags.compute_scale, 0, 1e6);
  reader->Double("compute_total_s", &flags.compute_total_s, 0, 3600);
  reader->Int("max_pulls", &flags.max_pulls, 0, 1000);
  reader->Bool("rounds", &flags.rounds);
  reader->Enum("layout", &flags.layout, {"per_layer", "single"});
  reader->Enum("variant", &flags.variant, {"prio", "fifo", "whole"});
  reader->String("server_prefix", &flags.server_prefix);
  reader->Int("iterations", &flags.iterations, 1, 1000000);
  reader->String("barrier", &flags.barrier);
  reader->Double("start_at_unix", &flags.start_at_unix, 0, 1e12);
  reader->String("out", &flags.out);
  if (flags.layout == "single" && flags.variant == "whole") {
    reader->AddError("variant", "'whole' needs --layout=per_layer (one push per tensor)");
  }
  if (flags.rounds && (flags.layout != "per_layer" || flags.variant == "whole")) {
    reader->AddError("rounds", "rounds need --layout=per_layer and --variant=prio or fifo");
  }
  if (flags.layout == "per_layer" && !flags.barrier.empty()) {
    reader->AddError("barrier", "the barrier is for --layout=single (synchronous jobs)");
  }
  if (auto status = reader->Finish(); !status.ok()) return status;
  flags.help = cl->help;
  return flags;
}

// The --out document: the run's settings, layers, iterations and pushes.
nlohmann::json Report(const Flags& flags, const std::vector<ScaledLayer>& layers,
                      const nlohmann::json& iterations, const PushTally& tally,
                      double start_unix, double end_unix) {
  return {
      {"worker", flags.client.name},   {"job", flags.client.job},
      {"model", flags.model},          {"layout", flags.layout},
      {"variant", flags.variant},      {"byte_scale", flags.byte_scale},
      {"compute_scale", flags.compute_scale},
      {"start_unix", start_unix},      {"end_unix", end_unix},
      {"layers", LayersJson(layers)},  {"iterations", iterations},
      {"pushes",
       {{"issued", tally.issued},
        {"applied", tally.applied},
        {"dropped", tally.dropped},
        {"failed", tally.failed},
        {"mean_delay", tally.applied ? double(tally.delay_sum) / tally.applied : 0.0}}},
      {"gets", tally.gets},            {"get_failures", tally.get_failures},
      {"errors", tally.errors}};
}

// Writes `report` to `out` whole (a temporary file renamed over it).
void WriteReport(const std::string& out, const nlohmann::json& report) {
  std::ofstream file(out + ".tmp");
  file << report.dump(1) << "\n";
  file.close();
  std::rename((out + ".tmp").c_str(), out.c_str());
}

int Main(int argc, char** argv) {
  absl::StatusOr<Flags> parsed = ParseFlags(argc, argv);
  if (!parsed.ok()) {
    std::cerr << "profile_worker: " << parsed.status().message() << "\n";
    return 2;
  }
  Flags& flags = *parsed;
  if (flags.help) {
    std::cout << "profile_worker --model=vgg16|resnet50|resnet32 --layout=per_layer|single "
                 "--variant=prio|fifo|whole --byte_scale=50 --compute_scale=1 [--compute_total_s=S] "
                 "--iterations=10 "
                 "[--barrier=HOST:PORT] [--server_prefix=P] [--start_at_unix=T] --out=FILE\n";
    return 0;
  }
  const Profile profile = *ProfileByName(flags.model);
  if (flags.compute_total_s > 0) {
    flags.compute_scale = flags.compute_total_s * ReferenceMacsPerSecond() /
                          (3.0 * profile.TotalMacs() * static_cast<double>(profile.batch));
  }
  const std::vector<ScaledLayer> layers = Scale(profile, flags.byte_scale, flags.compute_scale);
  auto worker = Worker::Connect(flags.client);
  if (!worker.ok()) {
    std::cerr << "profile_worker: " << worker.status().message() << "\n";
    return 3;
  }
  if (flags.start_at_unix > 0) {
    const double wait = flags.start_at_unix - UnixNow();
    if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
  PushTally tally;
  nlohmann::json iterations = nlohmann::json::array();
  const double start_unix = UnixNow();
  Stopwatch clock;
  int rc = flags.layout == "per_layer"
               ? RunPerLayer(**worker, flags, layers, clock, tally, iterations)
               : RunSingle(**worker, flags, layers, clock, tally, iterations);
  const double end_unix = UnixNow();
  if (!flags.out.empty()) {
    WriteReport(flags.out, Report(flags, layers, iterations, tally, start_unix, end_unix));
  }
  std::cout << "profile_worker " << flags.client.name << ": done, " << iterations.size()
            << " iterations, pushes issued " << tally.issued << " applied " << tally.applied
            << " dropped " << tally.dropped << " failed " << tally.failed << ", get failures "
            << tally.get_failures << std::endl;
  for (const auto& e : tally.errors) std::cout << "  " << e << std::endl;
  if (rc != 0) return rc;
  const bool accounted = tally.issued == tally.applied + tally.dropped + tally.failed;
  return tally.failed == 0 && tally.get_failures == 0 && accounted ? 0 : 3;
}

}  // namespace
}  // namespace mlfabric::eval

int main(int argc, char** argv) { return mlfabric::eval::Main(argc, argv); }
