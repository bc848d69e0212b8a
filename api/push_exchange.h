// Alltoall by pushes (MLfabric §6, mlfabric.md Table 1: push to a server):
// the mlfabric AllReduce backend's exchange of blocks between ranks, each
// block moved once, from its source's host to its destination's.
//
// Every rank runs an exchange server ("<root>-x<rank>", an ordinary
// asynchronous server, started at the rank's first Alltoall). Rank s sends
// its rows for rank d as one push of opaque bytes (never summed in the
// network) to d's server; the scheduler plans those pushes like any other
// (shortest transfer first, Alg. 2), and d's server application copies each
// into its place in d's receive buffer when the push is delivered, which is
// when it ends applied. One call:
//   1. every rank's row counts, its server's model version and its worker's
//      name (hashed) in one small sum (`sum`: the backend's own rounds, or
//      MPI under mpirun), so every rank knows every block's size and each
//      server knows whose push it is delivered;
//   2. the receive buffer is asked for; the blocks are pushed;
//   3. every rank says in one more small sum whether all its pushes were
//      applied and it had a buffer: a block that could not move fails the
//      call on every rank, with the rank that failed named; no rank waits
//      for a block that will never come.
// A push carries v(g) = its server's version plus the blocks that server
// receives in the call, less one: its planner deadline (deadline = v(g) +
// tau_max - v_init, scheduler/core/prepared_batch.cc) then covers every
// position of the call, so no block is dropped as stale under any tau_max.
#ifndef MLFABRIC_API_PUSH_EXCHANGE_H_
#define MLFABRIC_API_PUSH_EXCHANGE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "aggregator/packet_pool.h"
#include "api/allreduce.h"
#include "api/mlfabric.h"

namespace mlfabric::internal {

// Element-wise int64 sum of `words` over every rank, in place (the same
// length on every rank).
using SumWords = std::function<absl::Status(std::vector<int64_t>& words)>;

class PushExchange {
 public:
  // `client`: how this rank reaches its daemon (its job and token); the
  // servers are named `prefix` + "-x" + rank. Nothing connects until the
  // first Alltoall.
  PushExchange(ClientOptions client, std::string prefix, int rank, int size, double timeout_s);
  ~PushExchange();

  // One Alltoall (AllReducer::Alltoall's contract) once the ranks agree on
  // dtype and row_elements. `worker` pushes (the reducer's own; its name is
  // `worker_name`). Collective: every rank calls it.
  absl::Status Alltoall(Worker& worker, const std::string& worker_name, const SumWords& sum,
                        const void* send, int64_t row_elements,
                        const std::vector<int64_t>& send_rows, DataType dtype,
                        const AlltoallRecvBuffer& recv_buffer, std::vector<int64_t>* recv_rows);

  // One Allgather (AllReducer::Allgather's contract) once the ranks agree:
  // this rank's rows pushed to every other rank's server.
  absl::Status Allgather(Worker& worker, const std::string& worker_name, const SumWords& sum,
                         const void* send, int64_t rows, int64_t row_elements, DataType dtype,
                         const AlltoallRecvBuffer& recv_buffer, std::vector<int64_t>* recv_rows);

  // A reduce-scatter under `op` once the ranks agree on length, dtype and
  // op (Horovod's reducescatter with min, max or product, and the first
  // half of AllReduce below): rank r gets split[r] elements, the reduction
  // of every rank's elements at their place (the slices in rank order).
  // Rank s pushes its slice for rank d to d's server; d reduces the slices
  // it received in pairs in rank order, ((r0 op r1) op (r2 op r3)), the
  // order of Open MPI's recursive doubling, and writes split[rank] elements
  // to `out` (which may lie inside `data`: the pushes have all been applied
  // when the reduction starts). A rank that left the job (its words missing
  // from a shrunk sum) owns a slice no one reduces: every rank fails the
  // call in the rounds' wording (MembersLeft).
  absl::Status ReduceScatter(const char* what, Worker& worker, const std::string& worker_name,
                             const SumWords& sum, const void* data,
                             const std::vector<int64_t>& split, DataType dtype, ReduceOp op,
                             void* out);
  // AllReduce under `op` (the daemons' rounds only sum: this is the mlfabric
  // backend's min, max and product): ReduceScatter of ReduceScatterRows(
  // count, size) elements per rank, then every rank's reduced slice pushed
  // to every other rank, into `data` at its place. Each element is reduced
  // once, by one rank, so every rank gets the same bits. Between them the
  // two exchanges move 2 (size - 1) / size of the buffer out of and into
  // each rank, as a ring's reduce-scatter and allgather do.
  absl::Status AllReduce(Worker& worker, const std::string& worker_name, const SumWords& sum,
                         void* data, size_t count, DataType dtype, ReduceOp op);

  // The receive buffer of an Exchange: given the bytes each rank sends this
  // one (in rank order), room for their sum, or an error that fails the
  // call on every rank (this one with it).
  using ExchangeRecvBuffer =
      std::function<absl::StatusOr<uint8_t*>(const std::vector<int64_t>& recv_bytes)>;
  // The general form, under Alltoall, Allgather and Broadcast: this rank
  // sends send_bytes[d] bytes at send[d] to rank d (its own block, d ==
  // rank, is copied, unless it is already in place) and receives every
  // rank's block for it, in rank order, in the buffer `recv_buffer` gives;
  // *recv_bytes the sizes. The same pointer may go to several ranks.
  // `what` names the collective in errors. `absent` (optional): the ranks
  // whose words the first sum lacked (they left a job whose rounds shrink
  // to the members left, and took no part); the same on every rank.
  absl::Status Exchange(const char* what, Worker& worker, const std::string& worker_name,
                        const SumWords& sum,
                        const std::vector<const uint8_t*>& send,
                        const std::vector<int64_t>& send_bytes,
                        const ExchangeRecvBuffer& recv_buffer, std::vector<int64_t>* recv_bytes,
                        std::vector<int>* absent = nullptr);

  // Unavailable in the rounds' wording ("... left the job ... membership
  // generation G ..."), naming `ranks`, which elastic training takes as a
  // membership change (api/elastic.h, mlfabric.elastic).
  absl::Status MembersLeft(const char* what, Worker& worker, const std::vector<int>& ranks) const;

  // Bytes this rank's server received from other ranks' pushes, and the
  // pushes it sent (each block crossed from its source to its destination
  // once; tests read these).
  int64_t bytes_received() const;
  int64_t pushes_sent() const { return pushes_sent_; }

 private:
  // What this rank's server expects in the current call.
  struct Expected {
    int64_t version = -1;        // v(g) every block of the call carries; -1: no call
    std::string refused;         // non-empty: fail every block with this
    std::map<uint64_t, int> rank_of;  // worker name hash -> rank
    std::vector<uint8_t*> into;       // by source rank
    std::vector<size_t> bytes;        // by source rank
    std::vector<bool> got;            // by source rank
  };

  // Exchange in rows of `row_bytes` bytes: send_rows[d] rows at send[d]
  // to rank d, the receive buffer asked for in rows.
  absl::Status ExchangeRows(const char* what, Worker& worker, const std::string& worker_name,
                            const SumWords& sum, const std::vector<const uint8_t*>& send,
                            const std::vector<int64_t>& send_rows, int64_t row_bytes,
                            const AlltoallRecvBuffer& recv_buffer,
                            std::vector<int64_t>* recv_rows);
  // After a failed call: Unavailable in the rounds' wording (MembersLeft)
  // when a rank of `rank_of` (worker name key -> rank) is no member of the
  // job any more, or the job's membership generation is not the one this
  // exchange began in (a rank died and came back under its name); OK when
  // neither, or the membership is unknown.
  absl::Status MembershipChanged(const char* what, Worker& worker,
                                 const std::map<uint64_t, int>& rank_of) const;
  absl::Status EnsureServer();
  absl::StatusOr<int64_t> OnUpdate(const Server::Update& update);
  std::string ServerName(int rank) const;

  const ClientOptions client_;
  const std::string prefix_;
  const int rank_;
  const int size_;
  const double timeout_s_;
  std::unique_ptr<Server> server_;
  absl::Status server_status_;  // why there is no server (after a failed start)
  std::thread serve_thread_;
  int64_t pushes_sent_ = 0;
  int64_t first_generation_ = -1;  // the job's membership generation at the first call

  mutable std::mutex mu_;
  std::condition_variable cv_;  // expected_ changed
  Expected expected_;           // guarded by mu_
  int64_t version_ = 0;         // the server's model version, guarded by mu_
  int64_t bytes_received_ = 0;  // guarded by mu_
};

// FNV-1a of a worker name, never 0 (0 is "no rank" in the sums).
uint64_t WorkerNameKey(const std::string& name);

// The aggregator's names for a reduce op and a dtype (kBool as its bytes).
aggregator::ReduceOp PoolOp(ReduceOp op);
aggregator::DType PoolDType(DataType dtype);

}  // namespace mlfabric::internal

#endif  // MLFABRIC_API_PUSH_EXCHANGE_H_
