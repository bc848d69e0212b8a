#include "api/registration.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace mlfabric {

absl::Status CheckBounds(const RegistrationParams& params) {
  if (params.delay_bound < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("delay_bound ", params.delay_bound, " is negative (-1 = the job's bound)"));
  }
  if (params.divergence_bound != -1 && params.divergence_bound <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "divergence_bound ", params.divergence_bound, " must be positive (-1 = the job's)"));
  }
  if (const char* job = std::getenv("MLFABRIC_DELAY_BOUND");
      job != nullptr && *job != '\0' && params.delay_bound >= 0 &&
      std::atoll(job) != params.delay_bound) {
    return absl::FailedPreconditionError(absl::StrCat(
        "delay_bound ", params.delay_bound, " differs from job '", params.client.job,
        "''s tau_max ", job, " (set it with mlfabric-run --delay_bound or the scheduler config)"));
  }
  if (const char* job = std::getenv("MLFABRIC_DIVERGENCE_BOUND");
      job != nullptr && *job != '\0' && params.divergence_bound > 0 &&
      std::atof(job) != params.divergence_bound) {
    return absl::FailedPreconditionError(absl::StrCat(
        "divergence_bound ", params.divergence_bound, " differs from job '", params.client.job,
        "''s ", job, " (set it with mlfabric-run --divergence_bound)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Worker>> RegisterAsWorker(const RegistrationParams& params) {
  if (auto status = CheckBounds(params); !status.ok()) return status;
  ClientOptions options = params.client;
  options.delay_bound = params.delay_bound;
  options.divergence_bound = params.divergence_bound;
  return Worker::Connect(options);
}

absl::StatusOr<std::unique_ptr<Server>> RegisterAsServer(const RegistrationParams& params) {
  if (auto status = CheckBounds(params); !status.ok()) return status;
  return Server::Connect(params.client);
}

}  // namespace mlfabric
