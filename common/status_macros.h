// Early-return helpers for absl::Status / absl::StatusOr (Debian's Abseil
// 20220623 ships none).
//
//   absl::Status Load(const std::string& path) {
//     RETURN_IF_ERROR(CheckReadable(path));
//     ASSIGN_OR_RETURN(std::string text, ReadFile(path));
//     ...
//   }
#ifndef MLFABRIC_COMMON_STATUS_MACROS_H_
#define MLFABRIC_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MLF_STATUS_CONCAT_INNER_(a, b) a##b
#define MLF_STATUS_CONCAT_(a, b) MLF_STATUS_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function if it is not OK.
#define RETURN_IF_ERROR(expr)                                  \
  do {                                                         \
    const ::absl::Status mlf_status_ = (expr);                 \
    if (!mlf_status_.ok()) return mlf_status_;                 \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status,
// otherwise moves the value into `lhs` (which may be a declaration).
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  MLF_ASSIGN_OR_RETURN_IMPL_(MLF_STATUS_CONCAT_(mlf_statusor_, __LINE__), lhs, rexpr)

#define MLF_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                               \
  if (!statusor.ok()) return statusor.status();          \
  lhs = std::move(statusor).value()

#endif  // MLFABRIC_COMMON_STATUS_MACROS_H_
