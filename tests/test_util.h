// Small helpers shared by the cross-process tests.
#ifndef MLFABRIC_TESTS_TEST_UTIL_H_
#define MLFABRIC_TESTS_TEST_UTIL_H_

#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "api/registration.h"

namespace mlfabric::testing {

// A vector written one value per line (as sum_server and vector_worker do).
inline std::vector<double> ReadVector(const std::string& path) {
  std::vector<double> values;
  std::ifstream in(path);
  double v;
  while (in >> v) values.push_back(v);
  return values;
}

// How many entries of the model sum_server wrote to `model_path` differ
// from the sum of the vectors the workers wrote to dir/sum<name>.txt
// (vector_worker --out); -1 when a file is missing or has another length.
inline int SumMismatches(const std::string& model_path, const std::string& dir,
                         const std::vector<std::string>& workers, size_t dim) {
  std::vector<double> expected(dim, 0.0);
  for (const std::string& name : workers) {
    const std::vector<double> sum = ReadVector(dir + "/sum" + name + ".txt");
    if (sum.size() != dim) return -1;
    for (size_t i = 0; i < dim; ++i) expected[i] += sum[i];
  }
  const std::vector<double> model = ReadVector(model_path);
  if (model.size() != dim) return -1;
  int mismatches = 0;
  for (size_t i = 0; i < dim; ++i) mismatches += model[i] != expected[i];
  return mismatches;
}

inline int CountOccurrences(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

// A server application in the test's own process, on a daemon's local
// socket, serving on its own thread until destroyed:
//
//   testing::InProcessServer ps(c.Socket("s1"), "ps0", on_update, on_request);
//   REQUIRE(ps.status().ok());
class InProcessServer {
 public:
  InProcessServer(const std::string& daemon_socket, const std::string& name,
                  Server::UpdateCallback on_update, Server::RequestCallback on_request) {
    ClientOptions options;
    options.daemon_socket = daemon_socket;
    options.name = name;
    auto server = Server::Connect(options);
    if (!server.ok()) {
      status_ = server.status();
      return;
    }
    server_ = std::move(*server);
    server_->RegisterUpdateCallback(std::move(on_update));
    server_->RegisterRequestCallback(std::move(on_request));
    thread_ = std::thread([this] { (void)server_->Serve(); });
  }
  ~InProcessServer() { Stop(); }
  InProcessServer(const InProcessServer&) = delete;
  InProcessServer& operator=(const InProcessServer&) = delete;

  const absl::Status& status() const { return status_; }
  void Stop() {
    if (server_ != nullptr) server_->Stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  absl::Status status_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
};

// A server callback that applies nothing and answers gets with a 4-byte
// model of version 0 (for tests about something else).
inline absl::StatusOr<int64_t> NextVersion(const Server::Update& update) {
  return update.version + 1;
}
inline absl::StatusOr<Server::Snapshot> TinyModel() {
  return Server::Snapshot{0, std::vector<uint8_t>(4, 0)};
}

}  // namespace mlfabric::testing

#endif  // MLFABRIC_TESTS_TEST_UTIL_H_
