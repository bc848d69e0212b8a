#include "api/push_exchange.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mlfabric::internal {

namespace {

// Words per rank in the call's first sum: the rows it sends each rank, its
// server's model version, its worker's name key, and 1 when its server runs.
size_t RowWords(int size) { return static_cast<size_t>(size) + 3; }

// The second sum's values: why a rank's part of the call failed.
// 0 is a rank whose words the sum lacks (it left a job whose rounds shrink).
enum Failure : int64_t { kNone = 1, kNoBuffer = 2, kPushFailed = 3 };
// The first sum's last word per rank.
enum Started : int64_t { kStarted = 1, kNotStarted = 2 };

}  // namespace

aggregator::ReduceOp PoolOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return aggregator::ReduceOp::kSum;
    case ReduceOp::kMin: return aggregator::ReduceOp::kMin;
    case ReduceOp::kMax: return aggregator::ReduceOp::kMax;
    case ReduceOp::kProduct: return aggregator::ReduceOp::kProduct;
  }
  return aggregator::ReduceOp::kSum;
}

aggregator::DType PoolDType(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return aggregator::DType::kFloat32;
    case DataType::kFloat64: return aggregator::DType::kFloat64;
    case DataType::kInt32: return aggregator::DType::kInt32;
    case DataType::kInt64: return aggregator::DType::kInt64;
    case DataType::kFloat16: return aggregator::DType::kFloat16;
    case DataType::kInt8: return aggregator::DType::kInt8;
    case DataType::kUint8: return aggregator::DType::kUint8;
    case DataType::kInt16: return aggregator::DType::kInt16;
    case DataType::kUint16: return aggregator::DType::kUint16;
    case DataType::kBool: return aggregator::DType::kUint8;
  }
  return aggregator::DType::kUint8;
}

uint64_t WorkerNameKey(const std::string& name) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) hash = (hash ^ c) * 1099511628211ull;
  return (hash >> 2) | 1;  // positive as an int64, and never 0
}

PushExchange::PushExchange(ClientOptions client, std::string prefix, int rank, int size,
                           double timeout_s)
    : client_(std::move(client)),
      prefix_(std::move(prefix)),
      rank_(rank),
      size_(size),
      timeout_s_(timeout_s) {}

PushExchange::~PushExchange() {
  if (server_ != nullptr) server_->Stop();
  {
    std::lock_guard<std::mutex> lock(mu_);
    expected_.version = -1;
    expected_.refused = "is stopping its exchange server";
  }
  cv_.notify_all();
  if (serve_thread_.joinable()) serve_thread_.join();
}

std::string PushExchange::ServerName(int rank) const { return absl::StrCat(prefix_, "-x", rank); }

int64_t PushExchange::bytes_received() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_received_;
}

absl::Status PushExchange::EnsureServer() {
  if (server_ != nullptr) return absl::OkStatus();
  if (!server_status_.ok()) return server_status_;
  ClientOptions options = client_;
  options.name = ServerName(rank_);
  options.round_size = 0;  // an asynchronous server: each push delivered alone
  options.plan_on_arrival = true;  // every sender waits for its blocks
  options.backup_workers = 0;
  options.shard = {};
  auto server = Server::Connect(options);
  if (!server.ok()) {
    server_status_ = absl::Status(server.status().code(),
                                  absl::StrCat("rank ", rank_, " cannot start its exchange server '",
                                               options.name, "': ", server.status().message()));
    return server_status_;
  }
  server_ = std::move(*server);
  version_ = server_->initial_version();
  server_->RegisterUpdateCallback([this](const Server::Update& u) { return OnUpdate(u); });
  // Nothing gets from an exchange server; a get is answered with its version.
  server_->RegisterRequestCallback([this]() -> absl::StatusOr<Server::Snapshot> {
    std::lock_guard<std::mutex> lock(mu_);
    return Server::Snapshot{version_, {}};
  });
  serve_thread_ = std::thread([this] { (void)server_->Serve(); });
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PushExchange::OnUpdate(const Server::Update& u) {
  std::unique_lock<std::mutex> lock(mu_);
  // A block of a later call may come before this rank has learned that
  // call's counts: it waits for them. A block older than the server's
  // version belongs to a call that is over (it failed elsewhere).
  // A later call's counts (a newer version expected) also end the wait.
  if (u.version >= version_ && expected_.version < u.version && expected_.refused.empty()) {
    cv_.wait_for(lock, std::chrono::duration<double>(timeout_s_), [&] {
      return expected_.version >= u.version || !expected_.refused.empty();
    });
  }
  if (!expected_.refused.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank_, " ",
                                                      expected_.refused));
  }
  if (expected_.version != u.version || u.count != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, "'s exchange server expects no push of version ", u.version, " from '",
        u.worker, "' (push to an exchange server only through a collective)"));
  }
  const auto from = expected_.rank_of.find(WorkerNameKey(u.worker));
  if (from == expected_.rank_of.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", u.worker, "' is not a rank of this exchange"));
  }
  const size_t s = static_cast<size_t>(from->second);
  if (expected_.got[s] || expected_.bytes[s] != u.bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, " expects ", expected_.got[s] ? 0 : expected_.bytes[s],
        " bytes from rank ", s, ", got ", u.bytes));
  }
  if (u.bytes > 0) std::memcpy(expected_.into[s], u.data, u.bytes);
  expected_.got[s] = true;
  bytes_received_ += static_cast<int64_t>(u.bytes);
  return ++version_;
}

absl::Status PushExchange::MembershipChanged(const char* what, Worker& worker,
                                             const std::map<uint64_t, int>& rank_of) const {
  absl::StatusOr<JobMembers> members = worker.Membership();
  if (!members.ok()) return absl::OkStatus();  // unknown: the call's own error stands
  std::map<uint64_t, int> gone = rank_of;
  for (const std::string& name : members->members) gone.erase(WorkerNameKey(name));
  std::vector<int> ranks;
  for (const auto& [key, rank] : gone) ranks.push_back(rank);
  std::sort(ranks.begin(), ranks.end());
  const bool changed =
      first_generation_ >= 0 && static_cast<int64_t>(members->generation) != first_generation_;
  if (ranks.empty() && !changed) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      what, ": ",
      ranks.empty() ? std::string("a rank") : absl::StrCat("rank(s) ", absl::StrJoin(ranks, ", ")),
      " left the job during the call: membership generation ", members->generation,
      changed ? absl::StrCat(" (", first_generation_, " when this exchange began)") : "", ", ",
      members->members.size(), " member(s) (", absl::StrJoin(members->members, ", "), ")"));
}

absl::Status PushExchange::MembersLeft(const char* what, Worker& worker,
                                       const std::vector<int>& ranks) const {
  absl::StatusOr<JobMembers> members = worker.Membership();
  return absl::UnavailableError(absl::StrCat(
      what, ": rank(s) ", absl::StrJoin(ranks, ", "), " left the job during the call: ",
      members.ok() ? absl::StrCat("membership generation ", members->generation, ", ",
                                  members->members.size(), " member(s) (",
                                  absl::StrJoin(members->members, ", "), ")")
                   : absl::StrCat("membership generation unknown (",
                                  members.status().message(), ")")));
}

absl::Status PushExchange::Alltoall(Worker& worker, const std::string& worker_name,
                                    const SumWords& sum, const void* send, int64_t row_elements,
                                    const std::vector<int64_t>& send_rows, DataType dtype,
                                    const AlltoallRecvBuffer& recv_buffer,
                                    std::vector<int64_t>* recv_rows) {
  const int64_t row_bytes = row_elements * static_cast<int64_t>(DataTypeSize(dtype));
  std::vector<const uint8_t*> from(send_rows.size());
  int64_t offset = 0;
  for (size_t d = 0; d < send_rows.size(); ++d) {
    from[d] = static_cast<const uint8_t*>(send) + offset;
    offset += send_rows[d] * row_bytes;
  }
  return ExchangeRows("Alltoall", worker, worker_name, sum, from, send_rows, row_bytes,
                      recv_buffer, recv_rows);
}

absl::Status PushExchange::Allgather(Worker& worker, const std::string& worker_name,
                                     const SumWords& sum, const void* send, int64_t rows,
                                     int64_t row_elements, DataType dtype,
                                     const AlltoallRecvBuffer& recv_buffer,
                                     std::vector<int64_t>* recv_rows) {
  const auto n = static_cast<size_t>(size_);
  return ExchangeRows("Allgather", worker, worker_name, sum,
                      std::vector<const uint8_t*>(n, static_cast<const uint8_t*>(send)),
                      std::vector<int64_t>(n, rows),
                      row_elements * static_cast<int64_t>(DataTypeSize(dtype)), recv_buffer,
                      recv_rows);
}

absl::Status PushExchange::ReduceScatter(const char* what, Worker& worker,
                                         const std::string& worker_name, const SumWords& sum,
                                         const void* data, const std::vector<int64_t>& split,
                                         DataType dtype, ReduceOp op, void* out) {
  const size_t n = static_cast<size_t>(size_);
  const size_t element = DataTypeSize(dtype);
  std::vector<const uint8_t*> send(n);
  std::vector<int64_t> send_bytes(n);
  size_t offset = 0;
  for (size_t d = 0; d < n; ++d) {
    send[d] = static_cast<const uint8_t*>(data) + offset * element;
    send_bytes[d] = split[d] * static_cast<int64_t>(element);
    offset += static_cast<size_t>(split[d]);
  }
  const size_t mine = static_cast<size_t>(send_bytes[static_cast<size_t>(rank_)]);
  // Every rank's slice for this one, in rank order.
  std::vector<uint8_t> slices;
  std::vector<int> absent;
  absl::Status status = Exchange(
      what, worker, worker_name, sum, send, send_bytes,
      [&slices, n, mine](const std::vector<int64_t>&) -> absl::StatusOr<uint8_t*> {
        slices.resize(n * mine);
        return slices.data();
      },
      nullptr, &absent);
  if (!status.ok()) return status;
  if (!absent.empty()) return MembersLeft(what, worker, absent);
  const auto elements = static_cast<size_t>(split[static_cast<size_t>(rank_)]);
  for (size_t step = 1; step < n; step *= 2) {
    for (size_t i = 0; i + step < n; i += 2 * step) {
      aggregator::ReduceInto(PoolOp(op), PoolDType(dtype), &slices[i * mine],
                             &slices[(i + step) * mine], elements);
    }
  }
  if (mine > 0) std::memcpy(out, slices.data(), mine);
  return absl::OkStatus();
}

absl::Status PushExchange::AllReduce(Worker& worker, const std::string& worker_name,
                                     const SumWords& sum, void* data, size_t count,
                                     DataType dtype, ReduceOp op) {
  const size_t n = static_cast<size_t>(size_);
  const size_t element = DataTypeSize(dtype);
  const std::vector<int64_t> split = ReduceScatterRows(static_cast<int64_t>(count), size_);
  size_t before = 0;
  for (int r = 0; r < rank_; ++r) before += static_cast<size_t>(split[static_cast<size_t>(r)]);
  auto* bytes = static_cast<uint8_t*>(data);
  uint8_t* slice = bytes + before * element;
  if (auto status = ReduceScatter("AllReduce", worker, worker_name, sum, data, split, dtype, op,
                                  slice);
      !status.ok()) {
    return status;
  }
  // Every rank's reduced slice lands at its place in `data`; this rank's
  // is there already.
  const int64_t slice_bytes = split[static_cast<size_t>(rank_)] * static_cast<int64_t>(element);
  std::vector<int> absent;
  absl::Status status = Exchange(
      "AllReduce", worker, worker_name, sum, std::vector<const uint8_t*>(n, slice),
      std::vector<int64_t>(n, slice_bytes),
      [bytes](const std::vector<int64_t>&) -> absl::StatusOr<uint8_t*> { return bytes; }, nullptr,
      &absent);
  if (!status.ok()) return status;
  if (!absent.empty()) return MembersLeft("AllReduce", worker, absent);
  return absl::OkStatus();
}

absl::Status PushExchange::ExchangeRows(const char* what, Worker& worker,
                                        const std::string& worker_name, const SumWords& sum,
                                        const std::vector<const uint8_t*>& send,
                                        const std::vector<int64_t>& send_rows, int64_t row_bytes,
                                        const AlltoallRecvBuffer& recv_buffer,
                                        std::vector<int64_t>* recv_rows) {
  std::vector<int64_t> bytes(send_rows.size());
  for (size_t d = 0; d < send_rows.size(); ++d) bytes[d] = send_rows[d] * row_bytes;
  const auto rows_of = [row_bytes](const std::vector<int64_t>& received) {
    std::vector<int64_t> rows(received.size(), 0);
    for (size_t s = 0; s < received.size(); ++s) {
      rows[s] = row_bytes == 0 ? 0 : received[s] / row_bytes;
    }
    return rows;
  };
  std::vector<int64_t> received;
  absl::Status status = Exchange(
      what, worker, worker_name, sum, send, bytes,
      [&](const std::vector<int64_t>& in) -> absl::StatusOr<uint8_t*> {
        absl::StatusOr<void*> buffer = recv_buffer(rows_of(in));
        if (!buffer.ok()) return buffer.status();
        return static_cast<uint8_t*>(*buffer);
      },
      &received);
  if (status.ok() && recv_rows != nullptr) *recv_rows = rows_of(received);
  return status;
}

absl::Status PushExchange::Exchange(const char* what, Worker& worker,
                                    const std::string& worker_name, const SumWords& sum,
                                    const std::vector<const uint8_t*>& send,
                                    const std::vector<int64_t>& send_bytes,
                                    const ExchangeRecvBuffer& recv_buffer,
                                    std::vector<int64_t>* recv_bytes, std::vector<int>* absent) {
  const size_t size = static_cast<size_t>(size_);
  const size_t me = static_cast<size_t>(rank_);
  const size_t width = RowWords(size_);
  // 1. Bytes, versions and names, from every rank (a rank whose server did
  // not start takes part too, saying so).
  const absl::Status started = EnsureServer();
  if (started.ok() && first_generation_ < 0) {
    // The membership this exchange starts in: a failed call after it
    // changed (a rank died, and maybe came back under its name) is a
    // membership change, not a fault of the call.
    if (absl::StatusOr<JobMembers> members = worker.Membership(); members.ok()) {
      first_generation_ = static_cast<int64_t>(members->generation);
    }
  }
  std::vector<int64_t> words(size * width, 0);
  std::copy(send_bytes.begin(), send_bytes.end(),
            words.begin() + static_cast<ptrdiff_t>(me * width));
  {
    std::lock_guard<std::mutex> lock(mu_);
    words[me * width + size] = version_;
  }
  words[me * width + size + 1] = static_cast<int64_t>(WorkerNameKey(worker_name));
  words[me * width + size + 2] = started.ok() ? kStarted : kNotStarted;  // 0: not in the sum
  if (auto status = sum(words); !status.ok()) return status;
  if (!started.ok()) return started;
  // A rank whose words the sum lacks left a job whose rounds shrink to
  // the members left (docs/user-guide/sync-training.md, "Job membership"):
  // it takes no part, as in the shrunk sums.
  std::vector<bool> present(size);
  for (size_t r = 0; r < size; ++r) present[r] = words[r * width + size + 2] != 0;
  for (size_t r = 0; r < size; ++r) {
    if (present[r] && words[r * width + size + 2] != kStarted) {
      return absl::UnavailableError(absl::StrCat(
          what, ": rank ", r, " could not start its exchange server (see its error)"));
    }
  }
  const auto bytes = [&](size_t s, size_t d) { return static_cast<size_t>(words[s * width + d]); };
  std::vector<int64_t> blocks_to(size, 0);  // blocks each rank's server receives this call
  for (size_t d = 0; d < size; ++d) {
    for (size_t s = 0; s < size; ++s) blocks_to[d] += s != d && bytes(s, d) > 0;
  }
  std::vector<int64_t> received(size);
  for (size_t s = 0; s < size; ++s) received[s] = static_cast<int64_t>(bytes(s, me));
  std::map<uint64_t, int> rank_of;  // worker name key -> rank
  size_t ranks_present = 0;
  for (size_t r = 0; r < size; ++r) {
    if (!present[r]) continue;
    rank_of[static_cast<uint64_t>(words[r * width + size + 1])] = static_cast<int>(r);
    ++ranks_present;
  }
  if (rank_of.size() != ranks_present) {
    // Two ranks whose worker names hash alike: their blocks could not be
    // told apart (every rank sees the same names, so every rank stops here).
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": two ranks' worker names hash alike; name the ranks' workers differently"));
  }

  // 2. The receive buffer, then what this rank's server expects.
  const absl::StatusOr<uint8_t*> buffer = recv_buffer(received);
  std::vector<size_t> at(size, 0);  // where the block from each rank goes
  for (size_t s = 1; s < size; ++s) at[s] = at[s - 1] + bytes(s - 1, me);
  {
    std::lock_guard<std::mutex> lock(mu_);
    expected_ = Expected{};
    expected_.version = words[me * width + size] + blocks_to[me] - 1;
    if (!buffer.ok()) {
      expected_.refused = absl::StrCat("has no receive buffer: ", buffer.status().message());
    }
    expected_.rank_of = rank_of;
    expected_.into.assign(size, nullptr);
    expected_.bytes.assign(size, 0);
    expected_.got.assign(size, false);
    for (size_t s = 0; s < size; ++s) {
      if (buffer.ok() && bytes(s, me) > 0) expected_.into[s] = *buffer + at[s];
      expected_.bytes[s] = bytes(s, me);
      expected_.got[s] = s == me || bytes(s, me) == 0;
    }
  }
  cv_.notify_all();

  // This rank's own block, then a push per other rank it sends to.
  if (buffer.ok() && send_bytes[me] > 0 && *buffer + at[me] != send[me]) {
    std::memmove(*buffer + at[me], send[me], static_cast<size_t>(send_bytes[me]));
  }
  std::vector<std::pair<size_t, std::future<PushResult>>> pushes;
  for (size_t d = 0; d < size; ++d) {
    const size_t n = static_cast<size_t>(send_bytes[d]);
    if (d == me || n == 0 || !present[d]) continue;
    const int64_t version = words[d * width + size] + blocks_to[d] - 1;
    pushes.emplace_back(d, worker.Push(ServerName(static_cast<int>(d)), send[d], n, version, 0.0,
                                       {TensorSpec{0, n, 0}}, ElementType::kOpaque));
    ++pushes_sent_;
  }
  absl::Status pushed;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  for (auto& [d, future] : pushes) {
    if (future.wait_until(deadline) != std::future_status::ready) {
      if (pushed.ok()) {
        pushed = absl::DeadlineExceededError(absl::StrCat(
            what, ": rank ", rank_, "'s block for rank ", d, " was not delivered in ", timeout_s_, " s"));
      }
      continue;
    }
    const PushResult result = future.get();
    if (result.outcome != PushOutcome::kApplied && pushed.ok()) {
      pushed = absl::UnavailableError(absl::StrCat(what, ": rank ", rank_, "'s block for rank ", d,
                                                   " was ", PushOutcomeName(result.outcome),
                                                   ": ", result.reason));
    }
  }

  // 3. Whether every rank's part went through.
  std::vector<int64_t> failed(size, 0);
  failed[me] = !buffer.ok() ? kNoBuffer : !pushed.ok() ? kPushFailed : kNone;
  const absl::Status summed = sum(failed);  // 0: a rank whose words the sum lacks
  bool all_received = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t s = 0; s < size; ++s) all_received = all_received && expected_.got[s];
    expected_ = Expected{};  // blocks still on their way are refused now
  }
  if (!buffer.ok()) return buffer.status();
  if (!summed.ok()) return summed;  // a round's error names a member that left
  // (failed[r] == 0: rank r's words are not in the sum; it left the job,
  // and what it owed this rank shows as missing.)
  bool any_failed = !pushed.ok() || !all_received;
  for (size_t r = 0; r < size; ++r) any_failed = any_failed || failed[r] > kNone;
  if (any_failed) {
    // A rank that left the job (its process died) after its part of the
    // sum fails the blocks for it by timeout, not with the rounds' wording;
    // say it as the rounds do, so that elastic training (api/elastic.h,
    // mlfabric.elastic) recovers.
    if (absl::Status left = MembershipChanged(what, worker, rank_of); !left.ok()) return left;
  }
  if (!pushed.ok()) return pushed;
  for (size_t r = 0; r < size; ++r) {
    if (failed[r] == kNoBuffer) {
      return absl::AbortedError(
          absl::StrCat(what, ": rank ", r, " had no receive buffer (see its error)"));
    }
    if (failed[r] > kNone) {
      return absl::AbortedError(
          absl::StrCat(what, ": rank ", r, "'s blocks were not delivered (see its error)"));
    }
  }
  if (!all_received) {
    // Every push was applied, so every block was copied: not reached
    // unless a push was applied without this server's callback.
    return absl::InternalError(
        absl::StrCat(what, ": rank ", rank_, " is missing blocks its senders' pushes delivered"));
  }
  if (recv_bytes != nullptr) *recv_bytes = received;
  if (absent != nullptr) {
    absent->clear();
    for (size_t r = 0; r < size; ++r) {
      if (!present[r]) absent->push_back(static_cast<int>(r));
    }
  }
  return absl::OkStatus();
}

}  // namespace mlfabric::internal
