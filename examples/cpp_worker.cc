// A complete MLfabric program in C++ (docs/user-guide/cpp.md): asynchronous
// parameter-server training of a linear model, launched with
//
//   bazel build //examples:cpp_worker //tools/run:mlfabric-run
//   bazel-bin/tools/run/mlfabric-run -np 4 bazel-bin/examples/cpp_worker
//
// Rank 0 also runs the parameter server "ps0" on a thread (Server API: an
// update callback applying model += update in commit order, a request
// callback returning the model). Every rank registers as a worker (Table 1
// parameters: the job's delay bound), then repeats: get the model, compute
// the gradient of the squared loss on its own data shard, push -lr * grad as
// two tensors ("w" then "b", priorities 0 and 1: front layers first) with
// the gradient's L2 norm. Each push ends applied (with the version it was
// applied at and its delay), dropped (the scheduler's delay bound) or failed.
// AllReduce (backend "auto": MPI under mlfabric-run) sums the outcomes and
// serves as a barrier. Exit code 0 only if the server applied exactly the
// pushes the workers saw applied, none failed, and the loss fell 10x.
// tests/examples_test.sh runs it.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/allreduce.h"
#include "api/mlfabric.h"
#include "api/registration.h"

namespace {

constexpr int kDim = 16;          // features
constexpr int kRows = 64;         // rows per rank
constexpr int kSteps = 30;        // pushes per rank
constexpr float kLearningRate = 0.1f;

// y = x . w_true + b_true, the same w_true on every rank, rank-specific x.
void MakeShard(int rank, std::vector<float>* x, std::vector<float>* y) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> w_true(kDim);
  for (float& w : w_true) w = normal(rng);
  rng.seed(100 + rank);
  x->resize(kRows * kDim);
  y->resize(kRows);
  for (int r = 0; r < kRows; ++r) {
    float dot = 0.5f;  // b_true
    for (int d = 0; d < kDim; ++d) {
      (*x)[r * kDim + d] = normal(rng);
      dot += (*x)[r * kDim + d] * w_true[d];
    }
    (*y)[r] = dot;
  }
}

// Mean squared error of model [w..., b] on the shard, and its gradient.
double LossAndGradient(const float* model, const std::vector<float>& x,
                       const std::vector<float>& y, std::vector<float>* grad) {
  grad->assign(kDim + 1, 0.0f);
  double loss = 0;
  for (int r = 0; r < kRows; ++r) {
    float err = model[kDim] - y[r];
    for (int d = 0; d < kDim; ++d) err += model[d] * x[r * kDim + d];
    loss += err * err / kRows;
    for (int d = 0; d < kDim; ++d) (*grad)[d] += 2 * err * x[r * kDim + d] / kRows;
    (*grad)[kDim] += 2 * err / kRows;
  }
  return loss;
}

// The parameter server: model += update, one version per pushed update
// (an in-network aggregate of `count` pushes advances it by `count`).
class ParameterServer {
 public:
  explicit ParameterServer(std::unique_ptr<mlfabric::Server> server)
      : server_(std::move(server)), model_(kDim + 1, 0.0f) {
    version_ = server_->initial_version();
    server_->RegisterUpdateCallback(
        [this](const mlfabric::Server::Update& u) -> absl::StatusOr<int64_t> {
          std::lock_guard<std::mutex> lock(mu_);
          if (u.bytes != model_.size() * sizeof(float)) {
            return absl::InvalidArgumentError("update of " + std::to_string(u.bytes) +
                                              " bytes; the model has " +
                                              std::to_string(model_.size() * sizeof(float)));
          }
          const float* delta = reinterpret_cast<const float*>(u.data);
          for (size_t i = 0; i < model_.size(); ++i) model_[i] += delta[i];
          applied_ += u.count;
          return version_ += u.count;
        });
    server_->RegisterRequestCallback([this]() -> absl::StatusOr<mlfabric::Server::Snapshot> {
      std::lock_guard<std::mutex> lock(mu_);
      mlfabric::Server::Snapshot snapshot;
      snapshot.version = version_;
      snapshot.bytes.resize(model_.size() * sizeof(float));
      std::memcpy(snapshot.bytes.data(), model_.data(), snapshot.bytes.size());
      return snapshot;
    });
    thread_ = std::thread([this] {
      absl::Status status = server_->Serve();
      if (!status.ok()) std::fprintf(stderr, "ps0: %s\n", std::string(status.message()).c_str());
    });
  }
  ~ParameterServer() {
    server_->Stop();
    thread_.join();
  }
  int64_t applied() {
    std::lock_guard<std::mutex> lock(mu_);
    return applied_;
  }

 private:
  std::unique_ptr<mlfabric::Server> server_;
  std::mutex mu_;
  std::vector<float> model_;
  int64_t version_ = 0;
  int64_t applied_ = 0;
  std::thread thread_;
};

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "cpp_worker: %s: %s\n", what.c_str(), std::string(status.message()).c_str());
  return 1;
}

// Rank 0 also hosts the parameter server "ps0" (registered as a server).
absl::StatusOr<std::unique_ptr<ParameterServer>> ConnectParameterServer(
    mlfabric::RegistrationParams params) {
  params.client.name = "ps0";
  auto server = mlfabric::RegisterAsServer(params);
  if (!server.ok()) return server.status();
  return std::make_unique<ParameterServer>(std::move(*server));
}

// One step of training: get the model, compute the gradient on this rank's
// shard (`*loss`: the loss of the model it got), push -lr * grad. An error
// is the get's; how the push ended is in the result.
absl::StatusOr<mlfabric::PushResult> TrainOneStep(mlfabric::Worker& worker,
                                                  const std::vector<float>& x,
                                                  const std::vector<float>& y, double* loss) {
  std::vector<float> grad;
  auto model = worker.Get("ps0");
  if (!model.ok()) return model.status();
  *loss = LossAndGradient(reinterpret_cast<const float*>(model->data()), x, y, &grad);
  double norm = 0;
  for (float g : grad) norm += double{g} * g;
  std::vector<float> update(grad.size());
  for (size_t i = 0; i < grad.size(); ++i) update[i] = -kLearningRate * grad[i];
  // Two tensors, consecutive in the buffer: "w" (kDim floats) then "b".
  const std::vector<mlfabric::TensorSpec> tensors = {
      {/*id=*/0, /*bytes=*/kDim * sizeof(float), /*priority=*/0},
      {/*id=*/1, /*bytes=*/sizeof(float), /*priority=*/1}};
  return worker
      .Push("ps0", update.data(), update.size() * sizeof(float), model->version,
            std::sqrt(norm), tensors)
      .get();
}

// Counts how a push ended into `outcomes` (see main).
void CountOutcome(const mlfabric::PushResult& result, int rank, std::vector<int64_t>* outcomes) {
  switch (result.outcome) {
    case mlfabric::PushOutcome::kApplied:
      ++(*outcomes)[0];
      (*outcomes)[3] += result.delay;
      break;
    case mlfabric::PushOutcome::kDropped:
      ++(*outcomes)[1];  // result.reason says why (e.g. "stale")
      break;
    case mlfabric::PushOutcome::kFailed:
      ++(*outcomes)[2];
      std::fprintf(stderr, "rank %d: push failed: %s\n", rank, result.reason.c_str());
      break;
  }
}

// Rank 0, once every rank's `outcomes` are summed: prints the run's
// summary and returns the exit code (an error is the get's).
absl::StatusOr<int> CheckTraining(mlfabric::Worker& worker, ParameterServer& ps,
                                  const std::vector<int64_t>& outcomes, int size,
                                  double first_loss, const std::vector<float>& x,
                                  const std::vector<float>& y) {
  std::vector<float> grad;
  auto model = worker.Get("ps0");
  if (!model.ok()) return model.status();
  const double final_loss =
      LossAndGradient(reinterpret_cast<const float*>(model->data()), x, y, &grad);
  std::printf(
      "cpp_worker: %d workers x %d pushes: applied %lld, dropped %lld, failed %lld, mean delay "
      "%.2f; server applied %lld; model v%lld; loss %.4f -> %.6f\n",
      size, kSteps, static_cast<long long>(outcomes[0]), static_cast<long long>(outcomes[1]),
      static_cast<long long>(outcomes[2]),
      outcomes[0] > 0 ? static_cast<double>(outcomes[3]) / outcomes[0] : 0.0,
      static_cast<long long>(ps.applied()), static_cast<long long>(model->version), first_loss,
      final_loss);
  if (ps.applied() != outcomes[0] || outcomes[2] != 0 ||
      outcomes[0] + outcomes[1] != int64_t{size} * kSteps || !(final_loss < first_loss / 10)) {
    std::fprintf(stderr, "cpp_worker: FAILED (see the line above)\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main() {
  // Rank and size come from mlfabric-run (MLFABRIC_RANK/SIZE), the daemon
  // socket, job and token from MLFABRIC_DAEMON_SOCKET/JOB/JOB_TOKEN.
  mlfabric::AllReduceOptions reduce_options;
  reduce_options.backend = "auto";
  auto reducer_or = mlfabric::MakeAllReducer(reduce_options);
  if (!reducer_or.ok()) return Fail("AllReducer", reducer_or.status());
  mlfabric::AllReducer& reducer = **reducer_or;
  const int rank = reducer.rank(), size = reducer.size();
  auto barrier = [&] {
    int32_t token = 0;
    return reducer.AllReduce(&token, 1, mlfabric::DataType::kInt32);
  };

  mlfabric::RegistrationParams params;  // delay_bound -1: the job's (mlfabric-run --delay_bound)
  const char* job = std::getenv("MLFABRIC_JOB");
  const char* token = std::getenv("MLFABRIC_JOB_TOKEN");
  if (job != nullptr) params.client.job = job;
  if (token != nullptr) params.client.job_token = token;

  std::unique_ptr<ParameterServer> ps;
  if (rank == 0) {
    auto server = ConnectParameterServer(params);
    if (!server.ok()) return Fail("RegisterAsServer", server.status());
    ps = std::move(*server);
  }
  if (auto status = barrier(); !status.ok()) return Fail("barrier", status);  // ps0 is up

  params.client.name = "worker" + std::to_string(rank);
  auto worker_or = mlfabric::RegisterAsWorker(params);
  if (!worker_or.ok()) return Fail("RegisterAsWorker", worker_or.status());
  mlfabric::Worker& worker = **worker_or;

  std::vector<float> x, y;
  MakeShard(rank, &x, &y);
  // outcomes[0..2] = applied, dropped, failed; outcomes[3] = sum of delays.
  std::vector<int64_t> outcomes(4, 0);
  double first_loss = -1;
  for (int step = 0; step < kSteps; ++step) {
    double loss = 0;
    auto result = TrainOneStep(worker, x, y, &loss);
    if (!result.ok()) return Fail("Get", result.status());
    if (first_loss < 0) first_loss = loss;
    CountOutcome(*result, rank, &outcomes);
  }
  if (auto status = reducer.AllReduce(outcomes.data(), outcomes.size(),
                                      mlfabric::DataType::kInt64);
      !status.ok()) {
    return Fail("AllReduce", status);
  }
  int exit_code = 0;
  if (rank == 0) {
    auto checked = CheckTraining(worker, *ps, outcomes, size, first_loss, x, y);
    if (!checked.ok()) return Fail("Get", checked.status());
    exit_code = *checked;
  }
  // Broadcast rank 0's verdict, and keep ps0 up until every rank is done.
  int32_t verdict = exit_code;
  if (auto status = reducer.AllReduce(&verdict, 1, mlfabric::DataType::kInt32); !status.ok()) {
    return Fail("AllReduce", status);
  }
  ps.reset();
  if (verdict == 0) std::printf("cpp_worker rank %d: OK\n", rank);
  return verdict == 0 ? 0 : 1;
}
