// elastic_member: a rank of tests/mlfabric_run_elastic_hosts_test.sh under
// elastic mlfabric-run. Registers with its host's daemon as the job's
// worker $MLFABRIC_WORKER_NAME (the environment mlfabric-run gives:
// daemon socket, job, token), so that the scheduler counts it a member of
// the job, says so on stdout, and stays registered until the file named
// by argv[1] exists; then exits 0. Stopped (SIGTERM) it leaves the job.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "api/registration.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: elastic_member DONE_FILE\n");
    return 2;
  }
  auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value != nullptr ? value : "");
  };
  mlfabric::RegistrationParams params;
  params.client.name = env("MLFABRIC_WORKER_NAME");
  params.client.job = env("MLFABRIC_JOB");
  auto worker = mlfabric::RegisterAsWorker(params);
  if (!worker.ok()) {
    std::fprintf(stderr, "elastic_member %s: RegisterAsWorker: %s\n", params.client.name.c_str(),
                 std::string(worker.status().message()).c_str());
    return 1;
  }
  std::printf("elastic_member %s: registered on %s (size %s)\n", params.client.name.c_str(),
              env("MLFABRIC_HOSTNAME").c_str(), env("MLFABRIC_SIZE").c_str());
  std::fflush(stdout);
  while (::access(argv[1], F_OK) != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return 0;
}
