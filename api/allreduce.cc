// The AllReduce factory and the `mlfabric` backend (sync mode over push/get).
#include "api/allreduce.h"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mlfabric {

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
  }
  return "unknown";
}

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
  }
  return 0;
}

absl::StatusOr<DataType> ParseDataType(const std::string& name) {
  for (DataType t : {DataType::kFloat32, DataType::kFloat64, DataType::kInt32, DataType::kInt64}) {
    if (name == DataTypeName(t)) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported dtype '", name, "': AllReduce supports float32, float64, int32 and int64"));
}

namespace {

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  return std::atoi(value);
}

}  // namespace

int EnvRank() { return EnvInt("MLFABRIC_RANK", EnvInt("OMPI_COMM_WORLD_RANK", 0)); }
int EnvSize() { return EnvInt("MLFABRIC_SIZE", EnvInt("OMPI_COMM_WORLD_SIZE", 1)); }

namespace internal {
bool LaunchedByMpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }
}  // namespace internal

absl::Status AllReducer::Broadcast(void* data, size_t count, DataType dtype, int root) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is not a rank (size ", size_, ")"));
  }
  // A sum where every rank but the root contributes zeros is exact.
  if (rank_ != root) std::memset(data, 0, count * DataTypeSize(dtype));
  return AllReduce(data, count, dtype);
}

std::vector<std::string> AvailableAllReduceBackends() {
  std::vector<std::string> names = {"mlfabric", "mpi"};
  std::string why_not;
  if (internal::NcclUsable(&why_not)) names.push_back("nccl");
  return names;
}

absl::StatusOr<std::unique_ptr<AllReducer>> MakeAllReducer(const AllReduceOptions& options) {
  const int rank = options.rank >= 0 ? options.rank : EnvRank();
  const int size = options.size >= 0 ? options.size : EnvSize();
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " / size ", size,
                     " is not valid: set AllReduceOptions::rank/size or launch with mlfabric-run"));
  }
  std::string backend = options.backend.empty() ? "auto" : options.backend;
  if (backend == "auto") {
    std::string why_not;
    backend = internal::NcclUsable(&why_not) ? "nccl"
              : internal::LaunchedByMpirun() ? "mpi"
                                             : "mlfabric";
  }
  if (backend == "mlfabric") return internal::MakeMlfabricAllReducer(options, rank, size);
  if (backend == "mpi") return internal::MakeMpiAllReducer(options);
  if (backend == "nccl") return internal::MakeNcclAllReducer(options);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown AllReduce backend '", backend, "': use mlfabric, mpi, nccl or auto"));
}

// ------------------------------------------------------- mlfabric backend

namespace internal {
namespace {

constexpr uint32_t kContributionMagic = 0x4d4c4152;  // "MLAR"
constexpr uint32_t kResultMagic = 0x4d4c5253;        // "MLRS"
constexpr int64_t kGoodbyeRound = -2;

struct ContributionHeader {
  uint32_t magic = kContributionMagic;
  int32_t dtype = 0;
  uint64_t count = 0;
  int64_t round = 0;
  int32_t rank = 0;
  int32_t reserved = 0;
};

struct ResultHeader {
  uint32_t magic = kResultMagic;
  int32_t dtype = 0;
  uint64_t count = 0;
  int64_t round = -1;
  uint64_t error_bytes = 0;  // a UTF-8 error follows the header, then the sum
};

template <typename T>
void AddInto(uint8_t* sum, const uint8_t* values, size_t count) {
  T* out = reinterpret_cast<T*>(sum);
  const T* in = reinterpret_cast<const T*>(values);
  for (size_t i = 0; i < count; ++i) out[i] += in[i];
}

void AddBuffers(DataType dtype, uint8_t* sum, const uint8_t* values, size_t count) {
  switch (dtype) {
    case DataType::kFloat32: AddInto<float>(sum, values, count); break;
    case DataType::kFloat64: AddInto<double>(sum, values, count); break;
    case DataType::kInt32: AddInto<int32_t>(sum, values, count); break;
    case DataType::kInt64: AddInto<int64_t>(sum, values, count); break;
  }
}

// The root: sums one round's contributions and publishes the result, which
// every rank then fetches with Get. Callbacks run on the serving thread.
class RootServer {
 public:
  RootServer(std::unique_ptr<Server> server, int size) : server_(std::move(server)), size_(size) {
    version_ = server_->initial_version();
    server_->RegisterUpdateCallback([this](const Server::Update& u) { return OnUpdate(u); });
    server_->RegisterRequestCallback([this]() { return OnRequest(); });
    thread_ = std::thread([this] { serve_status_ = server_->Serve(); });
  }

  ~RootServer() {
    server_->Stop();
    if (thread_.joinable()) thread_.join();
  }

  // Waits until every other rank said goodbye (it has fetched its last result).
  void AwaitGoodbyes(double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                 [&] { return goodbyes_ >= size_ - 1; });
  }

 private:
  absl::StatusOr<int64_t> OnUpdate(const Server::Update& u) {
    std::lock_guard<std::mutex> lock(mu_);
    ContributionHeader h;
    if (u.bytes < sizeof(h)) return absl::InvalidArgumentError("AllReduce contribution too short");
    std::memcpy(&h, u.data, sizeof(h));
    if (h.magic != kContributionMagic) {
      return absl::InvalidArgumentError(
          "not an AllReduce contribution: push to the AllReduce root only through AllReduce");
    }
    if (h.round == kGoodbyeRound) {
      ++goodbyes_;
      cv_.notify_all();
      return ++version_;
    }
    const DataType dtype = static_cast<DataType>(h.dtype);
    const uint8_t* values = u.data + sizeof(h);
    const size_t value_bytes = u.bytes - sizeof(h);
    if (value_bytes != h.count * DataTypeSize(dtype)) {
      return absl::InvalidArgumentError("AllReduce contribution length does not match its header");
    }
    if (contributions_ == 0) {
      round_ = h.round;
      first_ = h;
      error_.clear();
      sum_.assign(values, values + value_bytes);
    } else if (h.round != round_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", h.rank, " sent AllReduce round ", h.round, " while round ", round_,
          " is in progress: every rank must make the same sequence of AllReduce calls"));
    } else if (h.dtype != first_.dtype || h.count != first_.count) {
      if (error_.empty()) {
        error_ = absl::StrCat("AllReduce inputs differ across ranks: rank ", first_.rank,
                              " passed ", first_.count, " x ",
                              DataTypeName(static_cast<DataType>(first_.dtype)), ", rank ",
                              h.rank, " passed ", h.count, " x ", DataTypeName(dtype));
      }
    } else {
      AddBuffers(dtype, sum_.data(), values, h.count);
    }
    if (++contributions_ == size_) {
      ResultHeader r;
      r.dtype = first_.dtype;
      r.count = error_.empty() ? first_.count : 0;
      r.round = round_;
      r.error_bytes = error_.size();
      result_.resize(sizeof(r) + error_.size() + (error_.empty() ? sum_.size() : 0));
      std::memcpy(result_.data(), &r, sizeof(r));
      std::memcpy(result_.data() + sizeof(r), error_.data(), error_.size());
      if (error_.empty() && !sum_.empty()) {
        std::memcpy(result_.data() + sizeof(r), sum_.data(), sum_.size());
      }
      contributions_ = 0;
    }
    return ++version_;
  }

  absl::StatusOr<Server::Snapshot> OnRequest() {
    std::lock_guard<std::mutex> lock(mu_);
    Server::Snapshot snapshot;
    snapshot.version = version_;
    if (result_.empty()) {
      ResultHeader none;
      snapshot.bytes.resize(sizeof(none));
      std::memcpy(snapshot.bytes.data(), &none, sizeof(none));
    } else {
      snapshot.bytes = result_;
    }
    return snapshot;
  }

  std::unique_ptr<Server> server_;
  const int size_;
  std::thread thread_;
  absl::Status serve_status_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t version_ = 0;
  int64_t round_ = -1;
  int contributions_ = 0;
  int goodbyes_ = 0;
  ContributionHeader first_;
  std::string error_;
  std::vector<uint8_t> sum_;
  std::vector<uint8_t> result_;
};

class MlfabricAllReducer : public AllReducer {
 public:
  MlfabricAllReducer(int rank, int size, std::string root, double timeout_s,
                     std::unique_ptr<Worker> worker, std::unique_ptr<RootServer> root_server)
      : AllReducer(rank, size),
        root_(std::move(root)),
        timeout_s_(timeout_s),
        worker_(std::move(worker)),
        root_server_(std::move(root_server)) {}

  ~MlfabricAllReducer() override {
    if (root_server_ == nullptr) {
      ContributionHeader goodbye;
      goodbye.round = kGoodbyeRound;
      goodbye.rank = rank();
      // Retried when the scheduler drops it (deadline rule), so the root does
      // not wait out its timeout.
      for (int attempt = 0; attempt < 50; ++attempt) {
        auto done = worker_->Push(root_, &goodbye, sizeof(goodbye), version_, 0.0);
        if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready) break;
        if (done.get().outcome != PushOutcome::kDropped) break;
        if (auto model = worker_->Get(root_); model.ok()) version_ = model->version;
      }
    } else {
      root_server_->AwaitGoodbyes(std::min(timeout_s_, 30.0));
    }
    worker_.reset();
    root_server_.reset();
  }

  const char* backend() const override { return "mlfabric"; }

  // Waits until the root answers a get (it registered), up to `timeout_s`.
  absl::Status AwaitRoot(double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    absl::Status last;
    while (Clock::now() < deadline) {
      auto model = worker_->Get(root_);
      if (model.ok()) {
        version_ = model->version;
        return absl::OkStatus();
      }
      last = model.status();
      if (absl::IsUnavailable(last) && last.message().find("lost the connection") !=
                                           absl::string_view::npos) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return absl::UnavailableError(absl::StrCat(
        "AllReduce root server '", root_, "' is not registered (rank ", rank(),
        " waited ", timeout_s, " s; rank 0 runs it): ", last.message()));
  }

  absl::Status AllReduce(void* data, size_t count, DataType dtype) override {
    if (DataTypeSize(dtype) == 0) {
      return absl::InvalidArgumentError("unsupported dtype for AllReduce");
    }
    const int64_t round = next_round_++;
    ContributionHeader h;
    h.dtype = static_cast<int32_t>(dtype);
    h.count = count;
    h.round = round;
    h.rank = rank();
    const size_t value_bytes = count * DataTypeSize(dtype);
    std::vector<uint8_t> payload(sizeof(h) + value_bytes);
    std::memcpy(payload.data(), &h, sizeof(h));
    if (value_bytes > 0) std::memcpy(payload.data() + sizeof(h), data, value_bytes);
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
    // Sync mode never loses a contribution: a push the scheduler dropped
    // (its deadline rule applies to every server of the job) is pushed again
    // with the root's current version, until the collective's deadline.
    int drops = 0;
    std::string last_drop;
    while (true) {
      auto future = worker_->Push(root_, payload.data(), payload.size(), version_, 0.0,
                                  {TensorSpec{0, payload.size(), 0}});
      if (future.wait_until(deadline) != std::future_status::ready) {
        return absl::DeadlineExceededError(absl::StrCat(
            "AllReduce round ", round, ": the push from rank ", rank(), " did not complete in ",
            timeout_s_, " s (", drops, " drops, last: ", last_drop, ")"));
      }
      PushResult result = future.get();
      if (result.outcome == PushOutcome::kApplied) {
        version_ = std::max(version_, result.applied_version);
        break;
      }
      if (result.outcome == PushOutcome::kFailed || Clock::now() > deadline) {
        return absl::UnavailableError(absl::StrCat("AllReduce round ", round, ": rank ", rank(),
                                                   "'s push ", PushOutcomeName(result.outcome),
                                                   ": ", result.reason));
      }
      ++drops;
      last_drop = result.reason;
      if (auto model = worker_->Get(root_); model.ok()) {
        version_ = std::max(version_, model->version);
      }
    }
    dropped_pushes_ += drops;
    auto sleep = std::chrono::microseconds(200);
    while (true) {
      auto model = worker_->Get(root_);
      if (!model.ok()) {
        // Today's daemon fails every pending get when any server application
        // on its host disconnects: retry until the deadline unless the daemon
        // itself is gone.
        if (model.status().message().find("lost the connection") == absl::string_view::npos &&
            Clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          continue;
        }
        return absl::UnavailableError(absl::StrCat("AllReduce round ", round,
                                                   ": cannot get the sum from '", root_,
                                                   "': ", model.status().message()));
      }
      version_ = std::max(version_, model->version);
      ResultHeader r;
      if (model->size() < sizeof(r)) return absl::InternalError("short AllReduce result");
      std::memcpy(&r, model->data(), sizeof(r));
      if (r.magic != kResultMagic) return absl::InternalError("malformed AllReduce result");
      if (r.round == round) {
        if (r.error_bytes > 0) {
          return absl::InvalidArgumentError(std::string(
              reinterpret_cast<const char*>(model->data() + sizeof(r)), r.error_bytes));
        }
        if (model->size() != sizeof(r) + value_bytes) {
          return absl::InternalError("AllReduce result has the wrong length");
        }
        if (value_bytes > 0) std::memcpy(data, model->data() + sizeof(r), value_bytes);
        return absl::OkStatus();
      }
      if (Clock::now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "AllReduce round ", round, " did not complete in ", timeout_s_,
            " s: some rank did not call AllReduce (the root has round ", r.round, ")"));
      }
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(5000));
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  const std::string root_;
  const double timeout_s_;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<RootServer> root_server_;
  int64_t next_round_ = 0;
  int64_t version_ = 0;
  int64_t dropped_pushes_ = 0;  // contributions the scheduler dropped and we re-pushed
};

}  // namespace

absl::StatusOr<std::unique_ptr<AllReducer>> MakeMlfabricAllReducer(const AllReduceOptions& options,
                                                                  int rank, int size) {
  if (options.root_rank < 0 || options.root_rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("root_rank ", options.root_rank, " is not a rank (size ", size, ")"));
  }
  const std::string root = options.root_server.empty()
                               ? absl::StrCat(options.client.job, "-allreduce-root")
                               : options.root_server;
  std::unique_ptr<RootServer> root_server;
  if (rank == options.root_rank) {
    ClientOptions server_options = options.client;
    server_options.name = root;
    auto server = Server::Connect(server_options);
    if (!server.ok()) {
      return absl::Status(server.status().code(),
                          absl::StrCat("rank ", rank, " cannot start the AllReduce root '", root,
                                       "': ", server.status().message()));
    }
    root_server = std::make_unique<RootServer>(std::move(*server), size);
  }
  ClientOptions worker_options = options.client;
  if (worker_options.name.empty()) worker_options.name = absl::StrCat("rank", rank);
  auto worker = Worker::Connect(worker_options);
  if (!worker.ok()) {
    return absl::Status(worker.status().code(),
                        absl::StrCat("rank ", rank, " cannot connect to its MLfabric daemon: ",
                                     worker.status().message()));
  }
  auto reducer = std::make_unique<MlfabricAllReducer>(rank, size, root, options.timeout_s,
                                                      std::move(*worker), std::move(root_server));
  if (auto status = reducer->AwaitRoot(options.client.connect_timeout_s); !status.ok()) {
    return status;
  }
  return reducer;
}

}  // namespace internal
}  // namespace mlfabric
