// The `nccl` AllReduce backend. Compiled against nccl.h / cuda_runtime.h
// when the build found them (MLFABRIC_HAVE_NCCL, see python/configure.bzl:
// they come from the nvidia-nccl-cu12 and nvidia-cuda-runtime-cu12 wheels);
// libnccl.so.2 and libcudart.so.12 are opened at run time, so the rest of
// MLfabric loads on machines without CUDA. The NCCL unique id travels over
// MPI (launch with mlfabric-run); buffers are staged through device memory.
#include <dlfcn.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "api/allreduce.h"

#if MLFABRIC_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace mlfabric {
namespace internal {

#if MLFABRIC_HAVE_NCCL
namespace {

struct CudaNccl {
  decltype(&cudaGetDeviceCount) get_device_count = nullptr;
  decltype(&cudaSetDevice) set_device = nullptr;
  cudaError_t (*malloc)(void**, size_t) = nullptr;
  decltype(&cudaFree) free = nullptr;
  decltype(&cudaMemcpy) memcpy = nullptr;
  decltype(&cudaStreamCreate) stream_create = nullptr;
  decltype(&cudaStreamSynchronize) stream_synchronize = nullptr;
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  std::string error;  // why loading failed
};

void* OpenFirst(std::initializer_list<std::string> names) {
  for (const std::string& name : names) {
    if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
  }
  return nullptr;
}

const CudaNccl& Load() {
  static const CudaNccl* loaded = [] {
    auto* api = new CudaNccl();
    const std::string venv = MLFABRIC_NVIDIA_DIR;
    void* cudart = OpenFirst({"libcudart.so.12", venv + "/cuda_runtime/lib/libcudart.so.12"});
    void* nccl = OpenFirst({"libnccl.so.2", venv + "/nccl/lib/libnccl.so.2"});
    if (cudart == nullptr || nccl == nullptr) {
      api->error = "libcudart.so.12 or libnccl.so.2 cannot be loaded";
      return api;
    }
#define MLF_SYM(lib, field, name) \
  api->field = reinterpret_cast<decltype(api->field)>(dlsym(lib, name))
    MLF_SYM(cudart, get_device_count, "cudaGetDeviceCount");
    MLF_SYM(cudart, set_device, "cudaSetDevice");
    MLF_SYM(cudart, malloc, "cudaMalloc");
    MLF_SYM(cudart, free, "cudaFree");
    MLF_SYM(cudart, memcpy, "cudaMemcpy");
    MLF_SYM(cudart, stream_create, "cudaStreamCreate");
    MLF_SYM(cudart, stream_synchronize, "cudaStreamSynchronize");
    MLF_SYM(nccl, get_version, "ncclGetVersion");
    MLF_SYM(nccl, get_unique_id, "ncclGetUniqueId");
    MLF_SYM(nccl, comm_init_rank, "ncclCommInitRank");
    MLF_SYM(nccl, all_reduce, "ncclAllReduce");
    MLF_SYM(nccl, error_string, "ncclGetErrorString");
#undef MLF_SYM
    if (!api->get_device_count || !api->all_reduce || !api->comm_init_rank) {
      api->error = "libcudart/libnccl lack expected symbols";
    }
    return api;
  }();
  return *loaded;
}

ncclDataType_t NcclType(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kInt8: return ncclInt8;
    case DataType::kUint8: return ncclUint8;
    case DataType::kBool: return ncclUint8;
    case DataType::kInt16:
    case DataType::kUint16: break;  // NCCL has no 16-bit integers: NcclAllReducer uses MPI
  }
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
  }
  return ncclSum;
}

class NcclAllReducer : public AllReducer {
 public:
  NcclAllReducer(int rank, int size, std::unique_ptr<AllReducer> mpi, ncclComm_t comm,
                 cudaStream_t stream)
      : AllReducer(rank, size), mpi_(std::move(mpi)), comm_(comm), stream_(stream) {}
  const char* backend() const override { return "nccl"; }

 protected:
  absl::Status Reduce(void* data, size_t count, DataType dtype, ReduceOp op) override {
    if (dtype == DataType::kInt16 || dtype == DataType::kUint16) {
      return mpi_->AllReduce(data, count, dtype, op);  // NCCL has no 16-bit integers
    }
    const CudaNccl& api = Load();
    const size_t bytes = count * DataTypeSize(dtype);
    void* device = nullptr;
    if (api.malloc(&device, bytes) != cudaSuccess) {
      return absl::ResourceExhaustedError("cudaMalloc failed for the NCCL AllReduce buffer");
    }
    api.memcpy(device, data, bytes, cudaMemcpyHostToDevice);
    ncclResult_t result =
        api.all_reduce(device, device, count, NcclType(dtype), NcclOp(op), comm_, stream_);
    api.stream_synchronize(stream_);
    api.memcpy(data, device, bytes, cudaMemcpyDeviceToHost);
    api.free(device);
    if (result != ncclSuccess) {
      return absl::InternalError(absl::StrCat("ncclAllReduce: ", api.error_string(result)));
    }
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<AllReducer> mpi_;  // carries the unique id; kept for its MPI lifetime
  ncclComm_t comm_;
  cudaStream_t stream_;
};

}  // namespace

bool NcclUsable(std::string* why_not) {
  const CudaNccl& api = Load();
  if (!api.error.empty()) {
    *why_not = api.error;
    return false;
  }
  int devices = 0;
  if (api.get_device_count(&devices) != cudaSuccess || devices == 0) {
    *why_not = "no GPU is visible (cudaGetDeviceCount found none)";
    return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<AllReducer>> MakeNcclAllReducer(const AllReduceOptions& options) {
  std::string why_not;
  if (!NcclUsable(&why_not)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the nccl AllReduce backend cannot run here: ", why_not,
        "; use backend \"mlfabric\" or \"mpi\" instead"));
  }
  auto mpi = MakeMpiAllReducer(options);
  if (!mpi.ok()) return mpi.status();
  const CudaNccl& api = Load();
  int devices = 0;
  api.get_device_count(&devices);
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  api.set_device((local ? std::atoi(local) : 0) % devices);
  ncclUniqueId id;
  if ((*mpi)->rank() == 0) api.get_unique_id(&id);
  static_assert(sizeof(id) % 4 == 0, "ncclUniqueId is sent as int32s");
  if (auto status = (*mpi)->Broadcast(&id, sizeof(id) / 4, DataType::kInt32, 0); !status.ok()) {
    return status;
  }
  ncclComm_t comm;
  ncclResult_t result = api.comm_init_rank(&comm, (*mpi)->size(), id, (*mpi)->rank());
  if (result != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("ncclCommInitRank: ", api.error_string(result)));
  }
  cudaStream_t stream;
  api.stream_create(&stream);
  const int rank = (*mpi)->rank(), size = (*mpi)->size();
  return std::unique_ptr<AllReducer>(new NcclAllReducer(rank, size, std::move(*mpi), comm, stream));
}

#else  // !MLFABRIC_HAVE_NCCL

bool NcclUsable(std::string* why_not) {
  *why_not = "this build has no NCCL (nccl.h was not found when it was compiled)";
  return false;
}

absl::StatusOr<std::unique_ptr<AllReducer>> MakeNcclAllReducer(const AllReduceOptions&) {
  std::string why_not;
  NcclUsable(&why_not);
  return absl::FailedPreconditionError(absl::StrCat(
      "the nccl AllReduce backend cannot run here: ", why_not,
      "; use backend \"mlfabric\" or \"mpi\" instead"));
}

#endif  // MLFABRIC_HAVE_NCCL

}  // namespace internal
}  // namespace mlfabric
