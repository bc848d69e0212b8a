// AllReduce behind one call (docs/architecture.md §3, mlfabric.md §6): every rank hands
// in a buffer of the same dtype and length and gets back the element-wise sum
// (or min, max or product: ReduceOp) over all ranks. Backends are strategies picked in one factory
// (MakeAllReducer), so training code names a backend once and never again:
//
//   AllReduceOptions options;             // rank/size default to the launcher's env
//   options.backend = "mlfabric";         // "mlfabric" | "mpi" | "nccl" | "auto"
//   ASSIGN_OR_RETURN(std::unique_ptr<AllReducer> reducer, MakeAllReducer(options));
//   RETURN_IF_ERROR(reducer->AllReduce(grad.data(), grad.size(), DataType::kFloat32));
//   RETURN_IF_ERROR(reducer->AllReduce(steps.data(), steps.size(), DataType::kInt64,
//                                      ReduceOp::kMax));
//
// Backends:
//   mlfabric  §6: push(root) + get(root) in synchronous mode (under
//             mpirun, calls below mpi_below_bytes go through MPI instead). The root is a
//             synchronous-round server that rank `root_rank` runs in-process
//             ("<job>-allreduce-root" unless named); the scheduler plans each
//             round's pushes over an aggregation tree built from the job's
//             workers (Alg. 3), the root's daemon sums arriving packets and
//             streams each finished packet of the sum back to every rank's
//             get (Mercury PS). Inputs that differ across ranks (length,
//             dtype, and the tensor shape a call names) fail the round on
//             every rank with FailedPrecondition. Without backup
//             workers a call returns once the sum is in; the push's
//             outcome (the root's server application acknowledging the
//             round) is collected during the next call or the destructor,
//             and a round whose sum came but whose push then failed makes
//             that next call return the error (after its own round).
//   mpi       Open MPI's MPI_Allreduce on MPI_COMM_WORLD (MPI is initialised
//             on first use if the program has not done it).
//   nccl      ncclAllReduce; compiled only when NCCL headers were found at
//             build time, usable only on a machine with a GPU. Otherwise
//             MakeAllReducer returns an error naming "mlfabric" and "mpi".
//   auto      nccl when usable, else mpi when launched by mpirun, else mlfabric.
//
// Reduce ops: kSum on every backend. kMin, kMax and kProduct on mpi
// (MPI_MIN/MAX/PROD) and nccl. On mlfabric the daemons' rounds only sum:
// ranks on one host alone reduce the other ops in shared memory
// (api/local_reduce.h); between hosts a call is a reduce-scatter and an
// allgather of blocks by pushes (api/push_exchange.h): rank s pushes its
// slice d of the buffer to rank d's exchange server, d reduces the slices
// in pairs in rank order, ((r0 op r1) op (r2 op r3)), and pushes its
// reduced slice to every rank, after one sum in which the ranks agree on
// length, dtype and op. Under mpirun (mlfabric-run) calls below
// mpi_below_bytes, and every call with all ranks on one host, go through
// MPI_Allreduce instead. With backup workers (a round may leave ranks out)
// they fail on every rank with Unimplemented naming the op.
//
// Every backend first checks that all ranks agree on dtype, length and
// reduce op (and Broadcast on the root) and returns FailedPrecondition on
// every rank when they do not, naming the ranks and the values that
// differ ("Mismatched AllReduce dtype: rank 0 passed float32 while rank 1
// passed float64"), never a hang. Under mpirun that is one small
// MPI_Allgather before any data moves; in the mlfabric backend's own
// rounds the root's scheduler finds the differing push and fails the
// round for every rank. A call that names its tensor's shape
// (CallOptions) is also checked for equal shapes: under mpirun in that
// same MPI_Allgather (a hash of the shape; the shapes themselves are
// gathered only to name them once they differ); in the mlfabric backend's
// own rounds each push names the shape (Worker::Push; every piece the
// whole tensor's) and the root's scheduler fails the round on every rank
// when two differ ("mismatch: push 12 from 'rank1' has shape [17, 23, 57]
// but round 4 sums shape [17, 1311] from 'rank0' ..."), after ranks
// sharing a host compared theirs in shared memory (api/local_reduce.h;
// their leader's push names the shape they agreed on).
// Alltoall and ReduceScatter (Horovod's hvd.alltoall, hvd.reducescatter)
// work on rows: a buffer is `rows` rows of `row_elements` elements each
// (a tensor's first dimension and the product of the others).
//   Alltoall: rank r sends send_rows[d] consecutive rows to rank d (in
//   rank order) and receives, in rank order, the rows every rank sent it.
//   The ranks first exchange their row counts, then the caller's
//   `recv_buffer` is asked for room for the received rows, then the rows
//   move, so a framework allocates its output once it knows its size.
//   ReduceScatter: every rank passes the same `rows` x `row_elements`; the
//   rows are reduced by `op` and rank r receives its slice of the result:
//   ReduceScatterRows(rows, size)[r] rows, the first dimension divided as
//   evenly as possible with the earlier ranks taking one extra row each
//   (Horovod's split), starting after the rows of the ranks before it.
// Backends: mpi (MPI_Alltoallv after an MPI_Alltoall of the counts;
// MPI_Reduce_scatter). The mlfabric backend, after the same agreement
// carried by one small sum (dtype, row length, and for ReduceScatter
// length and op; a difference fails every rank with FailedPrecondition):
//   ReduceScatter under sum is the AllReduce of the whole buffer through
//   its rounds (MLfabric §6: push, then get the sum), of which each rank
//   keeps its rows; under min, max and product each rank's rows for rank d
//   are pushed to d's exchange server, which reduces them (as AllReduce's
//   first half above).
//   Alltoall (and under mpirun Allgather and Broadcast, below) moves each
//   block once, as a push (api/push_exchange.h): every rank runs an
//   exchange server
//   ("<root>-x<rank>", started at its first such call, planned as each
//   push arrives), rank s pushes its rows for rank d (Allgather: its rows
//   for every rank; Broadcast: the root its buffer for every rank) to d's
//   server as opaque bytes, and d's server copies them into d's buffer when
//   they are delivered. One small sum first carries the row counts, one
//   after says whether every rank's part went through (a rank without a
//   receive buffer, or a push that failed, fails every rank's call naming
//   it; none waits; a rank that left the job fails the call in the rounds'
//   wording, "left the job ... membership generation", so elastic training
//   recovers). Launched without mpirun (the rounds' own path, where elastic
//   jobs run), Allgather and Broadcast are sums (each rank's rows at their
//   place, zeros elsewhere; the root's buffer and zeros), which a round that
//   shrank to the members left still completes.
// Under mpirun (mlfabric-run) the agreement and the exchanges' two small
// sums go through MPI; an Alltoall or Allgather whose largest rank's send
// buffer, or a Broadcast or ReduceScatter whose buffer, is at least
// mpi_below_bytes takes the mlfabric path between hosts, the rest
// (smaller calls) MPI; with every rank on one host, Broadcast,
// Alltoall, Allgather and ReduceScatter go through MPI too (no network to
// plan, and MPI moves only the root's bytes or each rank's rows). Not with backup
// workers (a sum may leave ranks out: Unimplemented); nccl: Unimplemented.
//
// Calls are collective: every rank must make the same sequence of calls.
// Thread safety: an AllReducer is not thread-safe; call it from one thread
// (the Python and TensorFlow layers serialise calls for you).
#ifndef MLFABRIC_API_ALLREDUCE_H_
#define MLFABRIC_API_ALLREDUCE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "api/mlfabric.h"

namespace mlfabric {

// kFloat16 is IEEE binary16: summed in float, each addition rounded to half
// (common/half.h), as MPI and NCCL half reductions do. Integer sums and
// products wrap modulo 2^width (two's complement), as Open MPI's do. kBool
// (one byte, 0 or 1) is for Broadcast only, as in Horovod: AllReduce
// refuses it.
enum class DataType : int32_t {
  kFloat32 = 1, kFloat64 = 2, kInt32 = 3, kInt64 = 4, kFloat16 = 5,
  kInt8 = 6, kUint8 = 7, kInt16 = 8, kUint16 = 9, kBool = 10,
};

// "float32", "uint8", ... ("unknown" for another value).
const char* DataTypeName(DataType dtype);
// Size in bytes of one element (0 for an unknown value).
size_t DataTypeSize(DataType dtype);
// Parses the names DataTypeName gives ("float32", "uint8", "bool", ...).
absl::StatusOr<DataType> ParseDataType(const std::string& name);

// The element-wise reduction of an AllReduce (Horovod's hvd.Sum, hvd.Min,
// hvd.Max, hvd.Product; Average is Sum divided by the caller).
enum class ReduceOp : int32_t { kSum = 0, kMin = 1, kMax = 2, kProduct = 3 };
// "sum", "min", "max", "product" ("unknown" for another value).
const char* ReduceOpName(ReduceOp op);
// Parses the names ReduceOpName gives; InvalidArgument naming the others.
absl::StatusOr<ReduceOp> ParseReduceOp(const std::string& name);

// What MakeAllReducer builds: the backend, this process's rank and the
// world's size, and the mlfabric backend's settings.
struct AllReduceOptions {
  std::string backend = "auto";     // mlfabric | mpi | nccl | auto
  // Rank and world size; -1 = from MLFABRIC_RANK/MLFABRIC_SIZE, else from
  // Open MPI's OMPI_COMM_WORLD_RANK/SIZE, else 0 and 1.
  int rank = -1;
  int size = -1;  // the world size, as for rank
  // mlfabric backend: how this rank reaches its daemon (name defaults to
  // "rank<r>"), the root server's name and the rank that runs it.
  ClientOptions client;
  std::string root_server;          // default "<job>-allreduce-root"
  int root_rank = 0;                // the rank that runs the root server
  double timeout_s = 300;           // a collective that takes longer fails
  // mlfabric backend: backup workers (Chen et al., 2016). Each AllReduce
  // sums the first size - backup_workers contributions the scheduler
  // receives; a rank whose contribution came later gets that same sum
  // (summed() tells how many contributions it holds). Every rank starts at
  // the root's first round and applies every round's sum in order, so a
  // rank that starts, or stays, more than the root daemon's --rounds_kept
  // rounds behind fails ("is gone"): construct the reducer on every rank
  // before any rank's first AllReduce (Python's backup_reducer() does a
  // barrier). Other backends: 0.
  int backup_workers = 0;
  // mlfabric backend: how long the root rank's reducer, when destroyed,
  // keeps its root server up so that ranks still collecting the last
  // round's sum (a get forwarded late by a loaded host), or with backup
  // workers a round behind, can still contribute to and collect it
  // (otherwise their last AllReduce fails with "... is not connected").
  // -1: three times the longest of its last rounds, at least 1 s with
  // backup workers and 0.5 s without, and at most timeout_s.
  double root_linger_s = -1;
  // mlfabric backend without backup workers: ranks whose daemon is the
  // same (one machine) sum in shared memory, and only one rank per host
  // takes part in the scheduler's rounds (api/local_reduce.h). Who shares
  // a host is learned by one round at construction. false, or the
  // environment's MLFABRIC_LOCAL_REDUCE=0: every rank in every round.
  bool local_reduce = true;
  // mlfabric backend, ranks on hosts of their own: each AllReduce is cut
  // into this many contiguous pieces, summed at once by as many root
  // servers, piece k's run by rank (root_rank + k) mod size. One root's
  // host carries every rank's contribution in and every copy of the sum
  // out; with a root per rank each host carries about 2/size of them, as
  // a ring's reduce-scatter and all-gather spread them. 0: one piece per
  // rank; 1: one root (the layout before pieces). Environment
  // MLFABRIC_ALLREDUCE_PIECES overrides. With backup workers, each piece
  // sums the first size - backup_workers contributions to reach its root,
  // so one sum's pieces may leave out different ranks. Ranks sharing a
  // host (local_reduce) keep one root for their hosts' leaders.
  int pieces = 1;
  // mlfabric backend launched by mpirun (mlfabric-run), without backup
  // workers: a call whose buffer is smaller than this many bytes goes
  // through Open MPI's MPI_Allreduce instead of the scheduler. A small sum
  // is bound by latency, where a planned round (the push's submission, the
  // commands, the get) costs milliseconds and its network-aware plan has
  // nothing to gain; larger calls take the scheduler's path. Every call
  // first agrees on length, dtype and reduce op through one small MPI
  // collective, so all ranks take the same path (min, max and product
  // between hosts: exchanges of blocks, see "Reduce ops" above). 0: every
  // call between hosts through the scheduler (the agreement still through
  // MPI). Environment MLFABRIC_ALLREDUCE_MPI_BELOW (bytes) overrides.
  size_t mpi_below_bytes = 64 * 1024;
};

// What a caller may say about one AllReduce beyond its buffer.
struct CallOptions {
  // The tensor's dimensions, as the caller's framework knows them ({} is a
  // scalar); its product must be the call's count. When set, the ranks
  // must agree on the shape too, not only on the element count, as
  // Horovod requires: [17, 1311] against [17, 23, 57] fails every rank
  // with FailedPrecondition naming the ranks (or workers) and both shapes.
  // Checked where the ranks agree through MPI (the mpi backend, and
  // mlfabric under mpirun / mlfabric-run), inside the one agreement
  // collective that runs anyway ("Mismatched AllReduce tensor shapes");
  // in the mlfabric backend's own rounds (launched without mpirun, or with
  // backup workers) by the root's scheduler, every push naming the shape
  // ("AllReduce inputs differ across ranks (round R): mismatch: ... has
  // shape [..] but round R sums shape [..] ..."), and among ranks sharing
  // a host in shared memory. With backup workers, a push that comes after
  // its round closed is left out before its shape is compared. nccl does
  // not compare shapes. Unset: only the count is agreed; a rank that
  // names no shape agrees with any.
  std::optional<std::vector<int64_t>> shape;
  // The most dimensions `shape` may have (more: InvalidArgument).
  static constexpr int kMaxDims = 64;
};

// The rank the launcher (mlfabric-run / mpirun) gave this process.
int EnvRank();
// The world size the launcher gave this process.
int EnvSize();

// Rows each rank receives from a ReduceScatter of `rows` rows over `size`
// ranks: rows / size each, and one more for each of the first rows % size
// ranks (Horovod's split).
std::vector<int64_t> ReduceScatterRows(int64_t rows, int size);

// Alltoall's receive buffer: given the rows each rank sends this one (in
// rank order), room for their sum times row_elements elements (nullptr is
// fine when that is 0), or an error that fails the call on this rank.
using AlltoallRecvBuffer =
    std::function<absl::StatusOr<void*>(const std::vector<int64_t>& recv_rows)>;

// A collective backend (MakeAllReducer builds one): AllReduce, Broadcast,
// Alltoall and ReduceScatter over all ranks. See the top of this file.
class AllReducer {
 public:
  virtual ~AllReducer() = default;
  // In place: `data` holds `count` elements of `dtype` and receives their
  // reduction by `op` over all ranks. InvalidArgument for kBool or an
  // unknown dtype or op (this rank only: check before calling collectively).
  absl::Status AllReduce(void* data, size_t count, DataType dtype, ReduceOp op = ReduceOp::kSum);
  // The same with what the caller knows about the call (CallOptions: the
  // tensor's shape). A shape whose product is not `count`, or with a
  // negative dimension, is InvalidArgument on this rank, and the other
  // ranks fail naming it (RefuseCollective).
  absl::Status AllReduce(void* data, size_t count, DataType dtype, ReduceOp op,
                         const CallOptions& call);
  // In place: every rank receives root's buffer (shapes and root must agree;
  // kBool too). Unimplemented with backup workers: a sum that closes
  // without the root's contribution would hand every rank zeros.
  virtual absl::Status Broadcast(void* data, size_t count, DataType dtype, int root);
  // Sends send_rows[d] rows of `send` to rank d; `recv_buffer` receives
  // every rank's rows for this one, in rank order, and *recv_rows their
  // counts. kBool is allowed (no arithmetic). InvalidArgument (this rank
  // only) for a send_rows whose length is not size() or whose sum is not
  // `rows`, a negative count or an unknown dtype.
  absl::Status Alltoall(const void* send, int64_t rows, int64_t row_elements,
                        const std::vector<int64_t>& send_rows, DataType dtype,
                        const AlltoallRecvBuffer& recv_buffer, std::vector<int64_t>* recv_rows);
  // Concatenates every rank's `rows` rows of `row_elements` elements, in
  // rank order (Horovod's hvd.allgather): the ranks may pass different
  // `rows`, not different dtypes or row lengths (FailedPrecondition on
  // every rank naming them). `recv_buffer` is asked for room for every
  // rank's rows once their counts are known, *recv_rows says them. kBool
  // is allowed. InvalidArgument (this rank only; the others fail naming
  // it) for a negative count or an unknown dtype.
  absl::Status Allgather(const void* send, int64_t rows, int64_t row_elements, DataType dtype,
                         const AlltoallRecvBuffer& recv_buffer, std::vector<int64_t>* recv_rows);
  // The same with the tensor's shape (CallOptions): its first dimension
  // must be `rows` and its product rows x row_elements (else
  // InvalidArgument on this rank, and the others fail naming it), and the
  // ranks must agree on its dimensions after the first: [5, 2, 6] against
  // [3, 3, 4] fails every rank with FailedPrecondition naming both row
  // shapes ("Mismatched Allgather tensor shapes: rank 0 passed shape [2, 6]
  // while rank 1 passed shape [3, 4]"), on every backend but nccl.
  absl::Status Allgather(const void* send, int64_t rows, int64_t row_elements, DataType dtype,
                         const AlltoallRecvBuffer& recv_buffer, std::vector<int64_t>* recv_rows,
                         const CallOptions& call);
  // Reduces every rank's `rows` x `row_elements` buffer `data` by `op`;
  // `out` receives this rank's ReduceScatterRows(rows, size())[rank()]
  // rows of the result. Same dtype and op rules as AllReduce.
  absl::Status ReduceScatter(const void* data, int64_t rows, int64_t row_elements,
                             DataType dtype, ReduceOp op, void* out);
  // The same with the tensor's shape (CallOptions): its first dimension
  // must be `rows` and its product rows x row_elements (else
  // InvalidArgument on this rank, and the others fail naming it), and the
  // ranks must agree on it as for an AllReduce: [17, 1311] against
  // [17, 23, 57] fails every rank with FailedPrecondition naming both
  // shapes, on every backend but nccl.
  absl::Status ReduceScatter(const void* data, int64_t rows, int64_t row_elements,
                             DataType dtype, ReduceOp op, void* out, const CallOptions& call);
  // "mlfabric", "mpi" or "nccl".
  virtual const char* backend() const = 0;
  int rank() const { return rank_; }  // this process's rank
  int size() const { return size_; }  // the number of ranks
  // How many ranks' contributions each sum holds: size() unless backup
  // workers leave the latest ones out. mlfabric backend: the last sum's
  // count, which is also smaller after a rank left a job whose config says
  // "member_loss": "shrink" (docs/user-guide/sync-training.md).
  virtual int summed() const { return size_; }
  // How many of this rank's contributions were left out of their sums so
  // far (late, with backup workers).
  virtual int64_t left_out() const { return 0; }
  // mlfabric backend: how many ranks (this one included) sum with this one
  // in shared memory before their host's sum crosses the network; 1 when
  // the rank has its host to itself or local_reduce is off.
  virtual int local_size() const { return 1; }

 protected:
  AllReducer(int rank, int size) : rank_(rank), size_(size) {}  // for backends
  // The backend's AllReduce, once `dtype` and `op` are known to be valid
  // and dtype is not kBool.
  virtual absl::Status Reduce(void* data, size_t count, DataType dtype, ReduceOp op) = 0;
  // Reduce with the call's tensor shape (valid, its product is `count`),
  // for backends whose agreement step can compare it; by default the
  // shape is not compared (CallOptions says where it is).
  virtual absl::Status ReduceShaped(void* data, size_t count, DataType dtype, ReduceOp op,
                                    const std::vector<int64_t>& shape) {
    (void)shape;
    return Reduce(data, count, dtype, op);
  }
  // The backend's Alltoall and ReduceScatter once the arguments are
  // checked; by default Unimplemented naming the collective and backend().
  virtual absl::Status DoAlltoall(const void* send, int64_t row_elements,
                                  const std::vector<int64_t>& send_rows, DataType dtype,
                                  const AlltoallRecvBuffer& recv_buffer,
                                  std::vector<int64_t>* recv_rows);
  // (the Allgather, once its arguments are checked; by default
  // Unimplemented naming backend())
  // `row_shape`: a row's dimensions, when the caller named the shape
  virtual absl::Status DoAllgather(const void* send, int64_t rows, int64_t row_elements,
                                   DataType dtype, const AlltoallRecvBuffer& recv_buffer,
                                   std::vector<int64_t>* recv_rows,
                                   const std::vector<int64_t>* row_shape);
  // (the ReduceScatter of the pair above; `shape` the caller's tensor
  // shape, checked against rows x row_elements, or nullptr)
  virtual absl::Status DoReduceScatter(const void* data, int64_t rows, int64_t row_elements,
                                       DataType dtype, ReduceOp op, void* out,
                                       const std::vector<int64_t>* shape);
  // A rank whose own arguments to an Alltoall or ReduceScatter are invalid
  // (say, a negative split on this rank only) still takes part in the
  // ranks' agreement step, marked invalid, so that the other ranks fail
  // with FailedPrecondition naming it instead of waiting for it; returns
  // `invalid`. Backends without an agreement step return it at once.
  virtual absl::Status RefuseCollective(const char* what, absl::Status invalid) {
    (void)what;
    return invalid;
  }

 private:
  int rank_;
  int size_;
};

// The one factory: picks and builds the backend `options.backend` names.
absl::StatusOr<std::unique_ptr<AllReducer>> MakeAllReducer(const AllReduceOptions& options);

// Backend names this build supports, e.g. {"mlfabric", "mpi"}.
std::vector<std::string> AvailableAllReduceBackends();

namespace internal {
// Backend constructors, defined in allreduce_*.cc; used only by the factory.
absl::StatusOr<std::unique_ptr<AllReducer>> MakeMlfabricAllReducer(const AllReduceOptions& options,
                                                                  int rank, int size);
absl::StatusOr<std::unique_ptr<AllReducer>> MakeMpiAllReducer(const AllReduceOptions& options);
absl::StatusOr<std::unique_ptr<AllReducer>> MakeNcclAllReducer(const AllReduceOptions& options);
// AllReduceOptions::mpi_below_bytes: `fabric` for calls of at least
// `below_bytes`, MPI_Allreduce below, after one agreement collective.
absl::StatusOr<std::unique_ptr<AllReducer>> WrapSmallViaMpi(std::unique_ptr<AllReducer> fabric,
                                                            size_t below_bytes);
// Whether the NCCL backend was compiled in and a GPU is visible (+ why not).
bool NcclUsable(std::string* why_not);
bool LaunchedByMpirun();
}  // namespace internal

}  // namespace mlfabric

#endif  // MLFABRIC_API_ALLREDUCE_H_
