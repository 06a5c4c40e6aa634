// Status propagation macros (Debian's Abseil 20220623 ships none).
#ifndef KVTIER_SRC_STATUS_MACROS_H_
#define KVTIER_SRC_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVTIER_CONCAT_INNER_(a, b) a##b
#define KVTIER_CONCAT_(a, b) KVTIER_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` is not OK.
#define KVTIER_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    const ::absl::Status kvtier_status_ = (expr);     \
    if (!kvtier_status_.ok()) return kvtier_status_;  \
  } while (0)

// `lhs = value of rexpr`, or returns its error. `lhs` may be a declaration.
#define KVTIER_ASSIGN_OR_RETURN(lhs, rexpr) \
  KVTIER_ASSIGN_OR_RETURN_IMPL_(KVTIER_CONCAT_(kvtier_statusor_, __LINE__), lhs, rexpr)
#define KVTIER_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) return statusor.status();             \
  lhs = std::move(statusor).value()

#endif  // KVTIER_SRC_STATUS_MACROS_H_
