// profile_server: the parameter server of the tensor-profile workload
// (workload (b) of the testbed; see profile_worker.cc). It keeps a float32 model
// with the profile's (scaled) layer sizes, adds every delivered update into
// it (model += update, applied in MLfabric's commit order) and answers gets
// with a snapshot.
//
//   --layout=per_layer   one server per layer, <server_prefix>L<i> (Mercury
//                        ablation: each layer is pulled on its own)
//   --layout=single      one server, <server_prefix>model
//   --round_size=W       synchronous rounds of W pushes per server (Mercury
//                        PS: the daemon sums packet by packet and streams
//                        the sum to the gets; api/mlfabric.h round_size)
//   --barrier_port=P --barrier_workers=W
//                        synchronous training (TensorLights jobs): a TCP
//                        barrier on P; a worker sends the iteration index
//                        after its push has completed and gets the same
//                        index back once all W workers have done so.
//
// Runs until SIGTERM/SIGINT, then writes {"applied": N, "per_server": {...}}
// to --out and exits 0 (1 if serving failed, 2 on bad flags).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "api/mlfabric.h"
#include "common/config.h"
#include "eval/testbed/apps/profile_models.h"
#include "nlohmann/json.hpp"

namespace mlfabric::eval {
namespace {

struct Shard {
  std::string name;
  std::vector<float> model;
  int64_t version = 0;
  std::atomic<int64_t> applied{0};
  std::atomic<int64_t> updates{0};  // deliveries (an aggregate counts once)
  std::unique_ptr<Server> server;
  bool rounds = false;
};

// Counts arrivals per iteration; releases all waiters once `workers` arrived.
class Barrier {
 public:
  explicit Barrier(int64_t workers) : workers_(workers) {}
  void Arrive(uint32_t iteration) {
    std::unique_lock<std::mutex> lock(mu_);
    if (++arrived_[iteration] >= workers_) cv_.notify_all();
    cv_.wait(lock, [&] { return arrived_[iteration] >= workers_ || stopping_; });
  }
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  int64_t completed() {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t n = 0;
    for (const auto& [it, count] : arrived_) n += count >= workers_;
    return n;
  }

 private:
  const int64_t workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint32_t, int64_t> arrived_;
  bool stopping_ = false;
};

int ListenOn(const std::string& address, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1 ||
      ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 64) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void ServeBarrierConnection(int fd, Barrier* barrier) {
  while (true) {
    uint32_t wire = 0;
    size_t got = 0;
    while (got < sizeof(wire)) {
      ssize_t n = ::recv(fd, reinterpret_cast<char*>(&wire) + got, sizeof(wire) - got, 0);
      if (n <= 0) {
        ::close(fd);
        return;
      }
      got += static_cast<size_t>(n);
    }
    barrier->Arrive(ntohl(wire));
    if (::send(fd, &wire, sizeof(wire), MSG_NOSIGNAL) != sizeof(wire)) {
      ::close(fd);
      return;
    }
  }
}

struct Flags {
  ClientOptions options;
  std::string model_name = "vgg16", layout = "per_layer", prefix, out;
  std::string barrier_address = "0.0.0.0";
  double byte_scale = 50;
  int64_t barrier_port = 0, barrier_workers = 0, round_size = 0;
  bool help = false;
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) return cl.status();
  auto reader = ConfigReader::FromCommandLine(*cl);
  if (!reader.ok()) return reader.status();
  Flags f;
  reader->String("socket", &f.options.daemon_socket);
  reader->String("job", &f.options.job);
  reader->String("token", &f.options.job_token);
  reader->Enum("model", &f.model_name, {"vgg16", "resnet50", "resnet32"});
  reader->Double("byte_scale", &f.byte_scale, 1, 1e9);
  reader->Enum("layout", &f.layout, {"per_layer", "single"});
  reader->String("server_prefix", &f.prefix);
  reader->String("barrier_address", &f.barrier_address);
  reader->Int("barrier_port", &f.barrier_port, 0, 65535);
  reader->Int("barrier_workers", &f.barrier_workers, 0, 100000);
  reader->Int("round_size", &f.round_size, 0, 100000);
  reader->String("out", &f.out);
  if ((f.barrier_port > 0) != (f.barrier_workers > 0)) {
    reader->AddError("barrier_workers", "--barrier_port and --barrier_workers go together");
  }
  if (auto status = reader->Finish(); !status.ok()) return status;
  f.help = cl->help;
  return f;
}

// Blocks SIGTERM and SIGINT and returns them: signals go to the waiting
// thread (Main's sigwait) only.
sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// The --layout's servers, with zero models of the profile's scaled sizes.
std::vector<std::unique_ptr<Shard>> MakeShards(const Flags& f,
                                               const std::vector<ScaledLayer>& layers) {
  std::vector<std::unique_ptr<Shard>> shards;
  if (f.layout == "per_layer") {
    for (size_t i = 0; i < layers.size(); ++i) {
      auto shard = std::make_unique<Shard>();
      shard->name = absl::StrCat(f.prefix, "L", i);
      shard->model.assign(layers[i].bytes / 4, 0.0f);
      shards.push_back(std::move(shard));
    }
  } else {
    auto shard = std::make_unique<Shard>();
    shard->name = f.prefix + "model";
    uint64_t total = 0;
    for (const auto& l : layers) total += l.bytes;
    shard->model.assign(total / 4, 0.0f);
    shards.push_back(std::move(shard));
  }
  return shards;
}

// Registers `s` as a server with its daemon: model += update, gets
// answered with a snapshot.
absl::Status ConnectShard(const Flags& f, Shard* s) {
  ClientOptions o = f.options;
  o.name = s->name;
  o.round_size = static_cast<int>(f.round_size);
  auto server = Server::Connect(o);
  if (!server.ok()) return server.status();
  s->server = std::move(*server);
  s->version = s->server->initial_version();
  s->rounds = f.round_size > 0;
  s->server->RegisterUpdateCallback([s](const Server::Update& u) -> absl::StatusOr<int64_t> {
    if (u.bytes != s->model.size() * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat(s->name, ": update of ", u.bytes,
                                                     " bytes, the model has ",
                                                     s->model.size() * sizeof(float)));
    }
    const float* values = reinterpret_cast<const float*>(u.data);
    for (size_t i = 0; i < s->model.size(); ++i) s->model[i] += values[i];
    // A synchronous round (count = round size, version = the round)
    // advances the version by one; a plain update by its count.
    s->version = s->rounds ? u.version + 1 : s->version + u.count;
    s->applied += u.count;
    ++s->updates;
    return s->version;
  });
  s->server->RegisterRequestCallback([s]() -> absl::StatusOr<Server::Snapshot> {
    Server::Snapshot snapshot;
    snapshot.version = s->version;
    snapshot.bytes.resize(s->model.size() * sizeof(float));
    std::memcpy(snapshot.bytes.data(), s->model.data(), snapshot.bytes.size());
    return snapshot;
  });
  return absl::OkStatus();
}

// One thread per server, serving until its Stop(); a failure is counted in
// `serve_errors`.
std::vector<std::thread> StartServing(const std::vector<std::unique_ptr<Shard>>& shards,
                                      std::atomic<int>& serve_errors) {
  std::vector<std::thread> serving;
  for (auto& shard : shards) {
    Shard* s = shard.get();
    serving.emplace_back([s, &serve_errors] {
      absl::Status status = s->server->Serve();
      if (!status.ok()) {
        std::cerr << "profile_server: " << s->name << ": " << status.message() << std::endl;
        ++serve_errors;
      }
    });
  }
  return serving;
}

// The TCP barrier of synchronous training and the thread accepting its
// connections (one thread each).
struct BarrierService {
  std::unique_ptr<Barrier> barrier;
  int listen_fd = -1;
  std::thread acceptor;
};

// Starts `service` on --barrier_address:--barrier_port; false (having said
// why) if it cannot listen.
bool StartBarrier(const Flags& f, BarrierService* service) {
  service->barrier = std::make_unique<Barrier>(f.barrier_workers);
  service->listen_fd = ListenOn(f.barrier_address, static_cast<int>(f.barrier_port));
  if (service->listen_fd < 0) {
    std::cerr << "profile_server: cannot listen on " << f.barrier_address << ":"
              << f.barrier_port << ": " << std::strerror(errno) << "\n";
    return false;
  }
  service->acceptor = std::thread([service] {
    while (true) {
      int fd = ::accept(service->listen_fd, nullptr, nullptr);
      if (fd < 0) return;  // closed at shutdown
      std::thread(ServeBarrierConnection, fd, service->barrier.get()).detach();
    }
  });
  return true;
}

void StopBarrier(BarrierService* service) {
  service->barrier->Stop();
  ::shutdown(service->listen_fd, SHUT_RDWR);
  ::close(service->listen_fd);
  service->acceptor.join();
}

// What the servers applied, for --out.
nlohmann::json Summary(const std::vector<std::unique_ptr<Shard>>& shards, Barrier* barrier) {
  nlohmann::json summary = {{"applied", 0}, {"updates", 0}, {"per_server", nlohmann::json::object()}};
  int64_t applied = 0, updates = 0;
  for (auto& shard : shards) {
    applied += shard->applied;
    updates += shard->updates;
    summary["per_server"][shard->name] = {{"applied", shard->applied.load()},
                                          {"version", shard->version}};
  }
  summary["applied"] = applied;
  summary["updates"] = updates;
  if (barrier) summary["barriers_completed"] = barrier->completed();
  return summary;
}

// Writes `summary` to `out` whole (a temporary file renamed over it).
void WriteSummary(const std::string& out, const nlohmann::json& summary) {
  std::ofstream file(out + ".tmp");
  file << summary.dump(1) << "\n";
  file.close();
  std::rename((out + ".tmp").c_str(), out.c_str());
}

int Main(int argc, char** argv) {
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::cerr << "profile_server: " << flags.status().message() << "\n";
    return 2;
  }
  const Flags& f = *flags;
  if (f.help) {
    std::cout << "profile_server --model=vgg16|resnet50|resnet32 --layout=per_layer|single "
                 "--byte_scale=50 [--server_prefix=P] [--barrier_port=N --barrier_workers=W] "
                 "[--out=FILE]\n";
    return 0;
  }
  sigset_t signals = BlockStopSignals();

  const std::vector<ScaledLayer> layers =
      Scale(*ProfileByName(f.model_name), f.byte_scale, /*compute_scale=*/1);
  std::vector<std::unique_ptr<Shard>> shards = MakeShards(f, layers);
  for (auto& shard : shards) {
    if (absl::Status status = ConnectShard(f, shard.get()); !status.ok()) {
      std::cerr << "profile_server: " << shard->name << ": " << status.message() << "\n";
      return 1;
    }
  }
  std::atomic<int> serve_errors{0};
  std::vector<std::thread> serving = StartServing(shards, serve_errors);
  BarrierService barrier;
  if (f.barrier_port > 0 && !StartBarrier(f, &barrier)) return 1;
  std::cout << "profile_server: serving " << shards.size() << " server(s) of " << f.model_name
            << (barrier.barrier ? absl::StrCat(", barrier on port ", f.barrier_port)
                                : std::string())
            << std::endl;
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  for (auto& shard : shards) shard->server->Stop();
  if (barrier.barrier) StopBarrier(&barrier);
  for (auto& t : serving) t.join();
  const nlohmann::json summary = Summary(shards, barrier.barrier.get());
  if (!f.out.empty()) WriteSummary(f.out, summary);
  std::cout << "profile_server: stopped, " << summary["applied"].get<int64_t>()
            << " updates applied" << std::endl;
  return serve_errors.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace mlfabric::eval

int main(int argc, char** argv) { return mlfabric::eval::Main(argc, argv); }
