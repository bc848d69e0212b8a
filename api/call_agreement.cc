#include "api/call_agreement.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace mlfabric {
namespace internal {

int64_t ShapeHash(const std::vector<int64_t>& shape) {
  uint64_t hash = 1469598103934665603ull;
  const auto mix = [&hash](int64_t v) {
    for (int i = 0; i < 8; ++i) {
      hash = (hash ^ ((static_cast<uint64_t>(v) >> (8 * i)) & 0xff)) * 1099511628211ull;
    }
  };
  mix(static_cast<int64_t>(shape.size()));
  for (int64_t d : shape) mix(d);
  return static_cast<int64_t>(hash);
}

std::string ShapeText(const int64_t* dims, int64_t n) {
  std::string out = "[";
  for (int64_t i = 0; i < n; ++i) absl::StrAppend(&out, i > 0 ? ", " : "", dims[i]);
  return out + "]";
}

CallShape ReduceShape(size_t count, DataType dtype, ReduceOp op,
                      const std::vector<int64_t>* shape) {
  CallShape out{static_cast<int64_t>(count), static_cast<int64_t>(dtype),
                static_cast<int64_t>(op), -1};
  if (shape != nullptr) {
    out.dims = static_cast<int64_t>(shape->size());
    out.shape_hash = ShapeHash(*shape);
  }
  return out;
}

CallShape AlltoallShape(int64_t row_elements, DataType dtype,
                        const std::vector<int64_t>* row_shape) {
  CallShape out{-1, static_cast<int64_t>(dtype), -1, -1, row_elements};
  if (row_shape != nullptr) {
    out.dims = static_cast<int64_t>(row_shape->size());
    out.shape_hash = ShapeHash(*row_shape);
  }
  return out;
}

CallShape ReduceScatterShape(int64_t rows, int64_t row_elements, DataType dtype, ReduceOp op,
                             const std::vector<int64_t>* shape) {
  CallShape out{rows * row_elements, static_cast<int64_t>(dtype), static_cast<int64_t>(op), -1,
                row_elements};
  if (shape != nullptr) {
    out.dims = static_cast<int64_t>(shape->size());
    out.shape_hash = ShapeHash(*shape);
  }
  return out;
}

absl::Status CompareCallShapes(const char* what, const std::vector<CallShape>& all,
                               bool* shapes_differ) {
  *shapes_differ = false;
  const int size = static_cast<int>(all.size());
  for (int r = 0; r < size; ++r) {
    if (all[static_cast<size_t>(r)].count == kInvalidArguments) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": rank ", r, " passed invalid arguments (its own error says which);",
                       " no data moved"));
    }
  }
  const auto dtype_name = [](int64_t v) { return DataTypeName(static_cast<DataType>(v)); };
  const auto op_name = [](int64_t v) { return ReduceOpName(static_cast<ReduceOp>(v)); };
  for (int r = 1; r < size; ++r) {
    const CallShape& a = all[0];
    const CallShape& b = all[static_cast<size_t>(r)];
    std::string field, first, other;
    if (a.count != b.count) {
      field = "length", first = absl::StrCat(a.count, " elements");
      other = absl::StrCat(b.count, " elements");
    } else if (a.dtype != b.dtype) {
      field = "dtype", first = dtype_name(a.dtype), other = dtype_name(b.dtype);
    } else if (a.op != b.op) {
      field = "reduce op", first = op_name(a.op), other = op_name(b.op);
    } else if (a.row != b.row) {
      field = "row length", first = absl::StrCat(a.row, " elements per row");
      other = absl::StrCat(b.row, " elements per row");
    } else if (a.root != b.root) {
      field = "root rank", first = absl::StrCat("root ", a.root);
      other = absl::StrCat("root ", b.root);
    } else if (a.dims >= 0 && b.dims >= 0 && a.shape_hash != b.shape_hash) {
      // Ranks that named no shape agree with any (a C++ caller's buffer).
      *shapes_differ = true;
      return absl::OkStatus();
    } else {
      continue;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "Mismatched ", what, " ", field, ": rank 0 passed ", first, " while rank ", r,
        " passed ", other, " (", what, " inputs differ across ranks)"));
  }
  return absl::OkStatus();
}

absl::Status ShapeMismatchError(const char* what, const std::vector<CallShape>& all,
                                const std::vector<std::vector<int64_t>>& shapes) {
  for (size_t r = 1; r < all.size() && r < shapes.size(); ++r) {
    if (all[r].dims < 0 || all[r].shape_hash == all[0].shape_hash) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "Mismatched ", what, " tensor shapes: rank 0 passed shape ",
        ShapeText(shapes[0].data(), static_cast<int64_t>(shapes[0].size())), " while rank ", r,
        " passed shape ", ShapeText(shapes[r].data(), static_cast<int64_t>(shapes[r].size())),
        " (", what, " inputs differ across ranks)"));
  }
  return absl::InternalError("shape hashes differ but no rank's shape does");
}

}  // namespace internal
}  // namespace mlfabric
