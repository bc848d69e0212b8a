#include "scheduler/service/control_auth.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/secrets.h"

namespace mlfabric {

ControlAuth::ControlAuth(const SchedulerConfig& config)
    : cluster_secret_(config.cluster_secret),
      mutual_tls_(!config.tls_client_ca_file.empty()),
      data_plane_auth_(config.data_plane_auth),
      data_encryption_(config.data_plane_auth && config.data_plane_encryption) {
  base_ = cluster_secret_.empty() ? RandomBytes(32)
                                  : HmacSha256(cluster_secret_, "mlfabric data-plane keys v1");
  if (data_plane_auth_) data_key_ = HmacSha256(base_, "cluster");
}

void ControlAuth::AddJob(uint32_t id, const std::string& name, const std::string& token) {
  if (!data_plane_auth_) return;
  job_keys_[id] = HmacSha256(base_, absl::StrCat("job|", name.size(), "|", name, "|", token));
}

std::string ControlAuth::JobDataKey(uint32_t job_id) const {
  auto it = job_keys_.find(job_id);
  return it == job_keys_.end() ? std::string() : it->second;
}

absl::Status ControlAuth::CheckRegistration(const std::string& host, const std::string& secret,
                                            const std::vector<std::string>& cert_names) const {
  if (mutual_tls_) {
    // gRPC verified the chain; the certificate must also be this host's.
    if (std::find(cert_names.begin(), cert_names.end(), host) == cert_names.end()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "host '", host, "' presented a certificate for ",
          cert_names.empty() ? std::string("no name") : absl::StrCat("'", cert_names.front(), "'"),
          "; its common name must be the host's name"));
    }
  }
  if (!cluster_secret_.empty() && !ConstantTimeEquals(secret, cluster_secret_)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "host '", host, "': ", secret.empty() ? "no" : "a wrong",
        " cluster secret (the daemon's cluster_secret_file must hold the scheduler's)"));
  }
  return absl::OkStatus();
}

std::string ControlAuth::NewSessionToken() { return RandomHex(16); }

}  // namespace mlfabric
