// TensorFlow custom ops MlfabricAllreduce, MlfabricBroadcast, MlfabricAlltoall, MlfabricAllgather,
// MlfabricReducescatter, MlfabricPush, MlfabricGet. Each
// kernel is asynchronous and only converts tensors and forwards a completion
// callback into the client core through api/c_api.h and
// api/c_api.h: no scheduling logic here (per-tensor priorities
// are handed down as given), and no Debian Abseil (TensorFlow brings its own).
#include <cstdio>
#include <cstring>
#include <string>

#include <vector>

#include "api/c_api.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace mlfabric {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

absl::Status ToStatus(int code, const char* message) {
  if (code == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

int DtypeCode(tensorflow::DataType dtype) {
  switch (dtype) {
    case tensorflow::DT_FLOAT: return MLF_FLOAT32;
    case tensorflow::DT_DOUBLE: return MLF_FLOAT64;
    case tensorflow::DT_INT32: return MLF_INT32;
    case tensorflow::DT_INT64: return MLF_INT64;
    case tensorflow::DT_HALF: return MLF_FLOAT16;
    case tensorflow::DT_INT8: return MLF_INT8;
    case tensorflow::DT_UINT8: return MLF_UINT8;
    case tensorflow::DT_INT16: return MLF_INT16;
    case tensorflow::DT_UINT16: return MLF_UINT16;
    case tensorflow::DT_BOOL: return MLF_BOOL;  // alltoall only (data movement)
    default: return 0;
  }
}

int OpCode(const std::string& op) {
  if (op == "min") return MLF_MIN;
  if (op == "max") return MLF_MAX;
  if (op == "product") return MLF_PRODUCT;
  return MLF_SUM;  // the attr allows only these four
}

// bool has no reduction (Horovod broadcasts and allgathers it only): the
// Python layer sends it as uint8 through the sum.
REGISTER_OP("MlfabricAllreduce")
    .Attr("T: {half, float, double, int8, uint8, int16, uint16, int32, int64}")
    .Attr("handle: int")
    .Attr("reduce_op: {'sum', 'min', 'max', 'product'} = 'sum'")
    .Input("tensor: T")
    .Output("sum: T")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc("Element-wise reduction (`reduce_op`) of `tensor` over all ranks of the AllReducer "
         "`handle`; inputs (dtype, length, shape, op) that differ across ranks fail every rank "
         "with FailedPrecondition.");

// The end of an in-place collective (an mlf_done_fn): sets the kernel's
// status, calls its done callback and frees itself.
struct CollectiveDone {
  OpKernelContext* c;
  AsyncOpKernel::DoneCallback done;
  static void Run(void* p, int code, const char* message) {
    auto* self = static_cast<CollectiveDone*>(p);
    self->c->SetStatus(ToStatus(code, message));
    self->done();
    delete self;
  }
};

// Output 0, shaped as input 0 and holding a copy of it, for a collective
// that works in place; nullptr once the kernel has failed (and `done` ran).
char* InPlaceOutput(OpKernelContext* c, const AsyncOpKernel::DoneCallback& done) {
  const Tensor& input = c->input(0);
  Tensor* output = nullptr;
  if (auto status = c->allocate_output(0, input.shape(), &output); !status.ok()) {
    c->SetStatus(status);
    done();
    return nullptr;
  }
  char* data = const_cast<char*>(output->tensor_data().data());
  if (input.TotalBytes() > 0) std::memcpy(data, input.tensor_data().data(), input.TotalBytes());
  return data;
}

class AllreduceOp : public AsyncOpKernel {
 public:
  explicit AllreduceOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("handle", &handle_));
    std::string op;
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
    op_ = OpCode(op);
  }
  void ComputeAsync(OpKernelContext* c, DoneCallback done) override {
    char* data = InPlaceOutput(c, done);
    if (data == nullptr) return;
    const Tensor& input = c->input(0);
    // The shape too, so that ranks whose tensors differ in shape but not
    // in element count fail (as Horovod's "Mismatched allreduce tensor
    // shapes"), not only those whose lengths differ.
    std::vector<int64_t> dims(static_cast<size_t>(input.dims()));
    for (int d = 0; d < input.dims(); ++d) dims[d] = input.dim_size(d);
    mlf_ext_allreduce_shaped_async(handle_, data, input.NumElements(), DtypeCode(input.dtype()),
                                   op_, dims.data(), static_cast<int>(dims.size()),
                                   &CollectiveDone::Run, new CollectiveDone{c, std::move(done)});
  }

 private:
  int64_t handle_ = 0;
  int op_ = MLF_SUM;
};
REGISTER_KERNEL_BUILDER(Name("MlfabricAllreduce").Device(tensorflow::DEVICE_CPU), AllreduceOp);

// Horovod's broadcast as AllReducer::Broadcast: the ranks first agree on
// the root (and length and dtype), so a root_rank that differs across
// ranks fails every rank with FailedPrecondition naming the ranks and
// their roots instead of summing two ranks' tensors.
REGISTER_OP("MlfabricBroadcast")
    .Attr("T: {bool, half, float, double, int8, uint8, int16, uint16, int32, int64}")
    .Attr("handle: int")
    .Attr("root_rank: int")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc("Rank `root_rank`'s `tensor` on every rank of the AllReducer `handle`; a root, "
         "length or dtype that differs across ranks fails every rank with FailedPrecondition.");

class BroadcastOp : public AsyncOpKernel {
 public:
  explicit BroadcastOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("handle", &handle_));
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
  }
  void ComputeAsync(OpKernelContext* c, DoneCallback done) override {
    char* data = InPlaceOutput(c, done);
    if (data == nullptr) return;
    const Tensor& input = c->input(0);
    mlf_ext_broadcast_async(handle_, data, input.NumElements(), DtypeCode(input.dtype()),
                            static_cast<int>(root_), &CollectiveDone::Run,
                            new CollectiveDone{c, std::move(done)});
  }

 private:
  int64_t handle_ = 0;
  int64_t root_ = 0;
};
REGISTER_KERNEL_BUILDER(Name("MlfabricBroadcast").Device(tensorflow::DEVICE_CPU), BroadcastOp);

// A tensor as rows along its first dimension (a scalar is one row).
int64_t RowElements(const tensorflow::TensorShape& shape) {
  int64_t elements = 1;
  for (int d = 1; d < shape.dims(); ++d) elements *= shape.dim_size(d);
  return elements;
}

// An Alltoall's or Allgather's outputs, once every rank's rows for this
// one are known (mlf_alloc_fn): output 0 is `input`'s shape with the rows'
// sum as its first dimension (*buffer its data), output 1 the rows per
// rank as R. A failed allocation's code, its message in `err`.
template <typename R>
int AllocateRows(OpKernelContext* c, const Tensor& input, const int64_t* recv_rows, int n,
                 void** buffer, char* err, size_t err_len, const char* what) {
  int64_t total = 0;
  for (int i = 0; i < n; ++i) total += recv_rows[i];
  tensorflow::TensorShape shape = input.shape();
  shape.set_dim(0, total);
  Tensor* out = nullptr;
  Tensor* received = nullptr;
  absl::Status status = c->allocate_output(0, shape, &out);
  if (status.ok()) status = c->allocate_output(1, {n}, &received);
  if (!status.ok()) {
    std::snprintf(err, err_len, "%s: %s", what, std::string(status.message()).c_str());
    return static_cast<int>(status.code());
  }
  for (int i = 0; i < n; ++i) received->flat<R>()(i) = static_cast<R>(recv_rows[i]);
  *buffer = const_cast<char*>(out->tensor_data().data());
  return 0;
}

REGISTER_OP("MlfabricAlltoall")
    .Attr("T: {bool, half, float, double, int8, uint8, int16, uint16, int32, int64}")
    .Attr("handle: int")
    .Input("tensor: T")
    .Input("splits: int32")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle output;
      TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(0), 0, c->UnknownDim(), &output));
      c->set_output(0, output);
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc("Sends splits[d] rows (first dimension) of `tensor` to rank d and concatenates, in "
         "rank order, the rows every rank sent this one; received_splits[s] rows came from "
         "rank s. Empty `splits`: the first dimension divided equally (it must divide).");

class AlltoallOp : public AsyncOpKernel {
 public:
  explicit AlltoallOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("handle", &handle_));
  }
  void ComputeAsync(OpKernelContext* c, DoneCallback done) override {
    const Tensor& input = c->input(0);
    const Tensor& splits = c->input(1);
    OP_REQUIRES_ASYNC(c, input.dims() >= 1,
                      absl::InvalidArgumentError("alltoall: the tensor needs a first dimension "
                                                 "(a scalar cannot be split)"),
                      done);
    const int size = mlf_ext_allreducer_size(handle_);
    const int64_t rows = input.dim_size(0);
    std::vector<int64_t> send_rows;
    if (splits.NumElements() == 0) {
      OP_REQUIRES_ASYNC(c, size > 0 && rows % size == 0,
                        absl::InvalidArgumentError(
                            "alltoall: without splits the first dimension (" +
                            std::to_string(rows) + ") must divide by the number of ranks (" +
                            std::to_string(size) + ")"),
                        done);
      send_rows.assign(size, rows / size);
    } else {
      auto flat = splits.flat<int32_t>();
      send_rows.assign(flat.data(), flat.data() + flat.size());
    }
    struct Ctx {
      OpKernelContext* c;
      DoneCallback done;
      Tensor input;  // keeps the send buffer alive
      std::vector<int64_t> send_rows;
    };
    auto* ctx = new Ctx{c, std::move(done), input, std::move(send_rows)};
    mlf_ext_alltoall_async(
        handle_, ctx->input.tensor_data().data(), rows, RowElements(input.shape()),
        ctx->send_rows.data(), static_cast<int>(ctx->send_rows.size()), DtypeCode(input.dtype()),
        [](void* p, const int64_t* recv_rows, int n, void** buffer, char* err, size_t err_len) {
          auto* ctx = static_cast<Ctx*>(p);
          return AllocateRows<int32_t>(ctx->c, ctx->input, recv_rows, n, buffer, err, err_len,
                                       "alltoall");
        },
        [](void* p, int code, const char* message) {
          auto* ctx = static_cast<Ctx*>(p);
          ctx->c->SetStatus(ToStatus(code, message));
          ctx->done();
          delete ctx;
        },
        ctx);
  }

 private:
  int64_t handle_ = 0;
};
REGISTER_KERNEL_BUILDER(Name("MlfabricAlltoall").Device(tensorflow::DEVICE_CPU), AlltoallOp);

REGISTER_OP("MlfabricAllgather")
    .Attr("T: {bool, half, float, double, int8, uint8, int16, uint16, int32, int64}")
    .Attr("handle: int")
    .Input("tensor: T")
    .Output("output: T")
    .Output("received_rows: int64")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle output;
      TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(0), 0, c->UnknownDim(), &output));
      c->set_output(0, output);
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc("Concatenates every rank's `tensor` along the first dimension, in rank order "
         "(first dimensions may differ); received_rows[s] rows came from rank s.");

class AllgatherOp : public AsyncOpKernel {
 public:
  explicit AllgatherOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("handle", &handle_));
  }
  void ComputeAsync(OpKernelContext* c, DoneCallback done) override {
    const Tensor& input = c->input(0);
    OP_REQUIRES_ASYNC(c, input.dims() >= 1,
                      absl::InvalidArgumentError("allgather: the tensor needs a first dimension "
                                                 "(reshape a scalar to [1])"),
                      done);
    struct Ctx {
      OpKernelContext* c;
      DoneCallback done;
      Tensor input;  // keeps the send buffer alive
    };
    auto* ctx = new Ctx{c, std::move(done), input};
    // The shape, so that the ranks agree on a row's dimensions too.
    std::vector<int64_t> dims;
    for (int d = 0; d < input.dims(); ++d) dims.push_back(input.dim_size(d));
    mlf_ext_allgather_async(
        handle_, ctx->input.tensor_data().data(), input.dim_size(0), RowElements(input.shape()),
        DtypeCode(input.dtype()), dims.data(), static_cast<int>(dims.size()),
        [](void* p, const int64_t* recv_rows, int n, void** buffer, char* err, size_t err_len) {
          auto* ctx = static_cast<Ctx*>(p);
          return AllocateRows<int64_t>(ctx->c, ctx->input, recv_rows, n, buffer, err, err_len,
                                       "allgather");
        },
        [](void* p, int code, const char* message) {
          auto* ctx = static_cast<Ctx*>(p);
          ctx->c->SetStatus(ToStatus(code, message));
          ctx->done();
          delete ctx;
        },
        ctx);
  }

 private:
  int64_t handle_ = 0;
};
REGISTER_KERNEL_BUILDER(Name("MlfabricAllgather").Device(tensorflow::DEVICE_CPU), AllgatherOp);

REGISTER_OP("MlfabricReducescatter")
    .Attr("T: {half, float, double, int8, uint8, int16, uint16, int32, int64}")
    .Attr("handle: int")
    .Attr("reduce_op: {'sum', 'min', 'max', 'product'} = 'sum'")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle output;
      TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(0), 0, c->UnknownDim(), &output));
      c->set_output(0, output);
      return absl::OkStatus();
    })
    .Doc("Reduces `tensor` over all ranks by `reduce_op`; rank r gets its rows of the result, "
         "the first dimension divided as evenly as possible with the earlier ranks taking the "
         "extra rows (Horovod's split).");

class ReducescatterOp : public AsyncOpKernel {
 public:
  explicit ReducescatterOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("handle", &handle_));
    std::string op;
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
    op_ = OpCode(op);
  }
  void ComputeAsync(OpKernelContext* c, DoneCallback done) override {
    const Tensor& input = c->input(0);
    OP_REQUIRES_ASYNC(c, input.dims() >= 1,
                      absl::InvalidArgumentError("reducescatter: the tensor needs a first "
                                                 "dimension (a scalar cannot be scattered)"),
                      done);
    const int64_t rows = input.dim_size(0);
    tensorflow::TensorShape shape = input.shape();
    shape.set_dim(0, mlf_reducescatter_rows(rows, mlf_ext_allreducer_size(handle_),
                                            mlf_ext_allreducer_rank(handle_)));
    Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(c, c->allocate_output(0, shape, &output), done);
    struct Ctx {
      OpKernelContext* c;
      DoneCallback done;
      Tensor input;  // keeps the send buffer alive
    };
    auto* ctx = new Ctx{c, std::move(done), input};
    // The shape too: ranks whose tensors differ in shape but not in rows
    // or element count fail, as Horovod's "Mismatched reducescatter".
    std::vector<int64_t> dims(static_cast<size_t>(input.dims()));
    for (int d = 0; d < input.dims(); ++d) dims[d] = input.dim_size(d);
    mlf_ext_reducescatter_async(
        handle_, ctx->input.tensor_data().data(), rows, RowElements(input.shape()),
        DtypeCode(input.dtype()), op_, const_cast<char*>(output->tensor_data().data()),
        dims.data(), static_cast<int>(dims.size()),
        [](void* p, int code, const char* message) {
          auto* ctx = static_cast<Ctx*>(p);
          ctx->c->SetStatus(ToStatus(code, message));
          ctx->done();
          delete ctx;
        },
        ctx);
  }

 private:
  int64_t handle_ = 0;
  int op_ = MLF_SUM;
};
REGISTER_KERNEL_BUILDER(Name("MlfabricReducescatter").Device(tensorflow::DEVICE_CPU),
                        ReducescatterOp);

REGISTER_OP("MlfabricPush")
    .Attr("T: list({float, double, int32, int64})")
    .Attr("handle: int")
    .Attr("server: string")
    .Input("updates: T")
    .Input("version: int64")
    .Input("norm: float")
    .Input("priorities: int32")
    .Output("outcome: int32")
    .Output("applied_version: int64")
    .Output("delay: int64")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 0; i < 3; ++i) c->set_output(i, c->Scalar());
      return absl::OkStatus();
    })
    .Doc("Pushes the tensors `updates` (in layer order) to `server` as one update, tensor i "
         "with priority priorities[i] (empty: i; lower = sent first); outcome 0 applied, "
         "1 dropped (deadline); a failed push is an error.");

class PushOp : public AsyncOpKernel {
 public:
  explicit PushOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("handle", &handle_));
    OP_REQUIRES_OK(c, c->GetAttr("server", &server_));
  }
  void ComputeAsync(OpKernelContext* c, DoneCallback done) override {
    tensorflow::OpInputList updates;
    OP_REQUIRES_OK_ASYNC(c, c->input_list("updates", &updates), done);
    const int64_t version = c->input(updates.size()).scalar<int64_t>()();
    const float norm = c->input(updates.size() + 1).scalar<float>()();
    const Tensor& priorities = c->input(updates.size() + 2);
    std::vector<const void*> data;
    std::vector<uint64_t> bytes;
    for (int i = 0; i < updates.size(); ++i) {
      data.push_back(updates[i].tensor_data().data());
      bytes.push_back(updates[i].TotalBytes());
    }
    std::vector<int32_t> prio;
    if (priorities.NumElements() > 0) {
      OP_REQUIRES_ASYNC(c, priorities.NumElements() == updates.size(),
                        absl::InvalidArgumentError(
                            "MlfabricPush: priorities has " +
                            std::to_string(priorities.NumElements()) + " entries for " +
                            std::to_string(updates.size()) + " tensors (one per tensor)"),
                        done);
      auto flat = priorities.flat<int32_t>();
      prio.assign(flat.data(), flat.data() + flat.size());
    }
    struct Ctx {
      OpKernelContext* c;
      DoneCallback done;
    };
    auto* ctx = new Ctx{c, std::move(done)};
    // The tensors are copied into shared memory before this returns.
    mlf_ext_push_async(
        handle_, server_.c_str(), data.size(), data.data(), bytes.data(),
        prio.empty() ? nullptr : prio.data(), version, norm,
        [](void* p, int outcome, const char* reason, int64_t applied_version, int64_t delay) {
          auto* ctx = static_cast<Ctx*>(p);
          Tensor* out = nullptr;
          if (outcome == MLF_FAILED) {
            ctx->c->SetStatus(absl::UnavailableError(std::string("push failed: ") + reason));
          } else if (ctx->c->allocate_output(0, {}, &out).ok()) {
            out->scalar<int32_t>()() = outcome;
            if (ctx->c->allocate_output(1, {}, &out).ok()) out->scalar<int64_t>()() = applied_version;
            if (ctx->c->allocate_output(2, {}, &out).ok()) out->scalar<int64_t>()() = delay;
          }
          ctx->done();
          delete ctx;
        },
        ctx);
  }

 private:
  int64_t handle_ = 0;
  std::string server_;
};
REGISTER_KERNEL_BUILDER(Name("MlfabricPush").Device(tensorflow::DEVICE_CPU), PushOp);

REGISTER_OP("MlfabricGet")
    .Attr("T: {float, double, int32, int64}")
    .Attr("handle: int")
    .Attr("server: string")
    .Attr("priority: int = 0")
    .Output("version: int64")
    .Output("model: T")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc("The current model of `server` as a flat vector of T, with its version.");

class GetOp : public AsyncOpKernel {
 public:
  explicit GetOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("handle", &handle_));
    OP_REQUIRES_OK(c, c->GetAttr("server", &server_));
    OP_REQUIRES_OK(c, c->GetAttr("priority", &priority_));
    OP_REQUIRES_OK(c, c->GetAttr("T", &dtype_));
  }
  void ComputeAsync(OpKernelContext* c, DoneCallback done) override {
    struct Ctx {
      OpKernelContext* c;
      DoneCallback done;
      tensorflow::DataType dtype;
    };
    auto* ctx = new Ctx{c, std::move(done), dtype_};
    mlf_ext_get_async(
        handle_, server_.c_str(), static_cast<int32_t>(priority_),
        [](void* p, int code, const char* message, int64_t version, const void* data,
           uint64_t bytes) {
          auto* ctx = static_cast<Ctx*>(p);
          Tensor* out = nullptr;
          const size_t element = tensorflow::DataTypeSize(ctx->dtype);
          if (code != 0) {
            ctx->c->SetStatus(ToStatus(code, message));
          } else if (bytes % element != 0) {
            ctx->c->SetStatus(absl::InvalidArgumentError(
                "the model's size is not a multiple of the requested dtype's size"));
          } else if (ctx->c->allocate_output(0, {}, &out).ok()) {
            out->scalar<int64_t>()() = version;
            if (ctx->c->allocate_output(1, {static_cast<int64_t>(bytes / element)}, &out).ok() &&
                bytes > 0) {
              std::memcpy(const_cast<char*>(out->tensor_data().data()), data, bytes);
            }
          }
          ctx->done();
          delete ctx;
        },
        ctx);
  }

 private:
  int64_t handle_ = 0;
  std::string server_;
  int64_t priority_ = 0;
  tensorflow::DataType dtype_;
};
REGISTER_KERNEL_BUILDER(Name("MlfabricGet").Device(tensorflow::DEVICE_CPU), GetOp);

}  // namespace
}  // namespace mlfabric
