// mlfabric-run: launches a training job with Open MPI's mpirun, with
// MLfabric's scheduler and daemons up for it (DESIGN.md §9).
//
//   mlfabric-run -np 4 python3 train.py
//   mlfabric-run -np 4 ./my_cpp_worker --flag=value
//   mlfabric-run -np 8 --hostfile hosts.txt --planner fifo --delay_bound 8 python3 train.py
//
// Unless MLFABRIC_SOCKET_DIR names a directory where daemons already listen
// (h<host>.sock), it starts mlfabric-scheduler and one mlfabricd per rank (an
// emulated host each, on loopback; --ranks_per_host K puts K ranks on each)
// in a private directory, runs
//   mpirun -np N [--hostfile F] --oversubscribe mlfabric-run --exec-rank -- CMD...
// and in every rank, before exec'ing CMD, exports
//   MLFABRIC_RANK, MLFABRIC_SIZE, MLFABRIC_LOCAL_RANK, MLFABRIC_LOCAL_SIZE,
//   MLFABRIC_DAEMON_SOCKET,
//   MLFABRIC_WORKER_NAME (rank<r>), MLFABRIC_JOB, MLFABRIC_JOB_TOKEN,
//   MLFABRIC_DELAY_BOUND, MLFABRIC_DIVERGENCE_BOUND (when given),
//   MLFABRIC_SCHEDULER, MLFABRIC_SOCKET_DIR.
// The scheduler plans with the MLfabric planner by default, like
// mlfabric-scheduler itself and the demo; --planner fifo is the vanilla-PS
// baseline.
// When CMD ends it stops everything it started and exits with mpirun's code.
// Daemons are started on this machine only: with a hostfile naming other
// machines, start mlfabricd there and set MLFABRIC_SOCKET_DIR (README).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "common/secrets.h"
#include "testing/cluster.h"
#include "tools/launch/process.h"

namespace {

constexpr char kUsage[] = R"(usage: mlfabric-run [options] [--] COMMAND [ARGS...]

  -np N               number of ranks (default 1)
  --hostfile FILE     Open MPI hostfile (default: this host only)
  --planner P         scheduler planner: mlfabric | fifo (default mlfabric;
                      fifo is the vanilla-PS baseline)
  --delay_bound K     the job's tau_max in model versions (default 30)
  --divergence_bound D  the job's Div_max, an L2 distance > 0 (default none)
  --ssp K             the job is stale-synchronous: a worker more than K
                      pushes ahead of the slowest waits at its get (default:
                      asynchronous, bounded by --delay_bound)
  --job NAME          job name (default demo); --token TOKEN (default
                      $MLFABRIC_JOB_TOKEN, else a random one made for this run)
  --extra_job NAME:TOKEN  another job the scheduler admits (repeatable), e.g.
                      for a second program sharing these daemons
  --ranks_per_host K  ranks that share each emulated host's daemon (default
                      1: a host per rank); ranks r and r' share one when
                      r / K == r' / K, as K ranks on one machine would
                      (their AllReduce sums in shared memory there)
  --mpirun_arg ARG    extra argument for mpirun (repeatable)
  -v                  print what is started
Every rank gets MLFABRIC_RANK, MLFABRIC_SIZE, MLFABRIC_DAEMON_SOCKET, ...
)";

volatile sig_atomic_t g_signal = 0;
void OnSignal(int signal) { g_signal = signal; }

int ExecRank(int argc, char** argv, int first) {
  auto env = [](const char* name, const char* fallback) {
    const char* value = std::getenv(name);
    return std::string(value && *value ? value : fallback);
  };
  const std::string rank = env("OMPI_COMM_WORLD_RANK", "0");
  const std::string size = env("OMPI_COMM_WORLD_SIZE", "1");
  const std::string dir = env("MLFABRIC_SOCKET_DIR", "");
  setenv("MLFABRIC_RANK", rank.c_str(), 1);
  setenv("MLFABRIC_SIZE", size.c_str(), 1);
  setenv("MLFABRIC_LOCAL_RANK", env("OMPI_COMM_WORLD_LOCAL_RANK", "0").c_str(), 1);
  setenv("MLFABRIC_LOCAL_SIZE", env("OMPI_COMM_WORLD_LOCAL_SIZE", "1").c_str(), 1);
  setenv("MLFABRIC_WORKER_NAME", ("rank" + rank).c_str(), 1);
  // --ranks_per_host K: ranks r with the same r / K share host h<r / K>.
  const int per_host = std::max(1, std::atoi(env("MLFABRIC_RANKS_PER_HOST", "1").c_str()));
  const std::string host = std::to_string(std::atoi(rank.c_str()) / per_host);
  if (!dir.empty()) setenv("MLFABRIC_DAEMON_SOCKET", (dir + "/h" + host + ".sock").c_str(), 1);
  // mpirun, started by absolute path, puts its own bin directory first in
  // PATH; restore the user's so `python3` is the one of their (virtual)
  // environment, as when they typed the command without mlfabric-run.
  if (const char* path = std::getenv("MLFABRIC_USER_PATH"); path != nullptr && *path != '\0') {
    setenv("PATH", path, 1);
  }
  std::vector<char*> args(argv + first, argv + argc);
  args.push_back(nullptr);
  execvp(args[0], args.data());
  std::cerr << "mlfabric-run: cannot run " << args[0] << ": " << std::strerror(errno) << "\n";
  return 127;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mlfabric::launch;
  int np = 1, delay_bound = 30, ssp = -1, ranks_per_host = 1;
  std::string divergence_bound;  // empty: none
  std::vector<std::pair<std::string, std::string>> extra_jobs;
  std::string hostfile, planner = "mlfabric", job = "demo", token;
  std::vector<std::string> mpirun_args;
  bool verbose = false;
  int i = 1;
  auto value = [&](const char* flag) -> std::string {
    if (i + 1 >= argc) {
      std::cerr << "mlfabric-run: " << flag << " needs a value\n" << kUsage;
      std::exit(2);
    }
    return argv[++i];
  };
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--exec-rank") {
      if (i + 1 < argc && std::string(argv[i + 1]) == "--") ++i;
      if (i + 1 >= argc) return 2;
      return ExecRank(argc, argv, i + 1);
    }
    if (arg == "--") { ++i; break; }
    if (arg == "-h" || arg == "--help") { std::cout << kUsage; return 0; }
    if (arg == "-np" || arg == "-n" || arg == "--np") {
      np = std::atoi(value("-np").c_str());
    } else if (arg == "--hostfile" || arg == "-hostfile") {
      hostfile = value("--hostfile");
    } else if (arg == "--planner") {
      planner = value("--planner");
    } else if (arg == "--delay_bound") {
      const std::string text = value("--delay_bound");
      char* end = nullptr;
      const long parsed = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || parsed < 0 || parsed > 1000000) {
        std::cerr << "mlfabric-run: --delay_bound must be an integer in [0, 1000000] (model "
                     "versions), not '" << text << "'\n";
        return 2;
      }
      delay_bound = static_cast<int>(parsed);
    } else if (arg == "--ssp") {
      const std::string text = value("--ssp");
      char* end = nullptr;
      const long parsed = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || parsed < 0 || parsed > 1000000) {
        std::cerr << "mlfabric-run: --ssp must be an integer in [0, 1000000] (iterations a "
                     "worker may run ahead of the slowest), not '" << text << "'\n";
        return 2;
      }
      ssp = static_cast<int>(parsed);
    } else if (arg == "--divergence_bound") {
      divergence_bound = value("--divergence_bound");
      char* end = nullptr;
      const double parsed = std::strtod(divergence_bound.c_str(), &end);
      if (divergence_bound.empty() || *end != '\0' || !(parsed > 0) || parsed > 1e12) {
        std::cerr << "mlfabric-run: --divergence_bound must be a positive number (an L2 "
                     "distance), not '" << divergence_bound << "'\n";
        return 2;
      }
    } else if (arg == "--extra_job") {
      const std::string spec = value("--extra_job");
      const size_t colon = spec.find(':');
      if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size() ||
          spec.find_first_of("\"\\") != std::string::npos) {
        std::cerr << "mlfabric-run: --extra_job must be NAME:TOKEN (no quotes), not '" << spec
                  << "'\n";
        return 2;
      }
      extra_jobs.emplace_back(spec.substr(0, colon), spec.substr(colon + 1));
    } else if (arg == "--job") {
      job = value("--job");
    } else if (arg == "--token") {
      token = value("--token");
    } else if (arg == "--ranks_per_host") {
      const std::string text = value("--ranks_per_host");
      char* end = nullptr;
      const long parsed = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || parsed < 1 || parsed > 1024) {
        std::cerr << "mlfabric-run: --ranks_per_host must be an integer in [1, 1024], not '"
                  << text << "'\n";
        return 2;
      }
      ranks_per_host = static_cast<int>(parsed);
    } else if (arg == "--mpirun_arg") {
      mpirun_args.push_back(value("--mpirun_arg"));
    } else if (arg == "-v") {
      verbose = true;
    } else if (!arg.empty() && arg[0] == '-') {
      std::cerr << "mlfabric-run: unknown option " << arg << "\n" << kUsage;
      return 2;
    } else {
      break;
    }
  }
  if (i >= argc) {
    std::cerr << "mlfabric-run: no command to run\n" << kUsage;
    return 2;
  }
  if (np < 1 || np > 1024) {
    std::cerr << "mlfabric-run: -np must be between 1 and 1024\n";
    return 2;
  }
  if (planner != "fifo" && planner != "mlfabric") {
    std::cerr << "mlfabric-run: --planner must be fifo or mlfabric, not '" << planner << "'\n";
    return 2;
  }

  if (token.empty()) {
    // No token ships: the caller's, or one made for this run (the ranks
    // get it as MLFABRIC_JOB_TOKEN).
    const char* given = std::getenv("MLFABRIC_JOB_TOKEN");
    token = given != nullptr && *given != '\0' ? given : mlfabric::RandomHex(16);
  }
  std::unique_ptr<mlfabric::testing::Cluster> cluster;
  std::string socket_dir, config_dir, ompi_dir;
  if (const char* existing = std::getenv("MLFABRIC_SOCKET_DIR"); existing && *existing) {
    socket_dir = existing;
    if (verbose) std::cerr << "mlfabric-run: using the daemons in " << socket_dir << "\n";
  } else {
    config_dir = MakeTempDir("mlfabric-run-config");
    const std::string config = config_dir + "/scheduler.json";
    {
      std::ofstream out(config);
      out << "{\"jobs\": [{\"name\": \"" << job << "\", \"token\": \"" << token
          << "\", \"tau_max\": " << delay_bound;
      if (ssp >= 0) out << ", \"mode\": \"ssp\", \"staleness_k\": " << ssp;
      if (!divergence_bound.empty()) out << ", \"divergence_max\": " << divergence_bound;
      out << "}";
      for (const auto& [name, secret] : extra_jobs) {
        out << ", {\"name\": \"" << name << "\", \"token\": \"" << secret
            << "\", \"tau_max\": " << delay_bound << "}";
      }
      out << "]}\n";
    }
    std::vector<std::string> hosts;
    const int host_count = (np + ranks_per_host - 1) / ranks_per_host;
    for (int h = 0; h < host_count; ++h) hosts.push_back("h" + std::to_string(h));
    auto started = mlfabric::testing::Cluster::StartLoopback(
        hosts, {"--config=" + config, "--planner=" + planner});
    if (!started.ok()) {
      std::cerr << "mlfabric-run: cannot start the scheduler and daemons: "
                << started.status().message() << "\n";
      return 1;
    }
    cluster = std::move(*started);
    socket_dir = cluster->dir();
    setenv("MLFABRIC_SCHEDULER", cluster->scheduler_address().c_str(), 1);
    if (verbose) {
      std::cerr << "mlfabric-run: started mlfabric-scheduler at " << cluster->scheduler_address()
                << " (planner " << planner << ", tau_max " << delay_bound << ") and "
                << hosts.size() << " mlfabricd; logs in " << socket_dir << "\n";
    }
  }
  setenv("MLFABRIC_SOCKET_DIR", socket_dir.c_str(), 1);
  setenv("MLFABRIC_JOB", job.c_str(), 1);
  setenv("MLFABRIC_JOB_TOKEN", token.c_str(), 1);
  setenv("MLFABRIC_RANKS_PER_HOST", std::to_string(ranks_per_host).c_str(), 1);
  setenv("MLFABRIC_DELAY_BOUND", std::to_string(delay_bound).c_str(), 1);
  if (!divergence_bound.empty()) {
    setenv("MLFABRIC_DIVERGENCE_BOUND", divergence_bound.c_str(), 1);
  } else {
    unsetenv("MLFABRIC_DIVERGENCE_BOUND");
  }
  if (const char* path = std::getenv("PATH")) setenv("MLFABRIC_USER_PATH", path, 1);
  if (::geteuid() == 0) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }

  std::error_code error;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", error).string();
  std::vector<std::string> command = {"mpirun", "-np", std::to_string(np)};
  if (!hostfile.empty()) {
    command.insert(command.end(), {"--hostfile", hostfile});
  } else {
    command.push_back("--oversubscribe");
    // Open MPI names its session directory and its shared-memory segments
    // after mpirun's pid; two jobs whose mpirun got the same pid in
    // different pid namespaces (parallel Bazel tests in their sandboxes)
    // collided in /tmp and /dev/shm: "getting local rank failed" in
    // orte_init, or a crash in the vader BTL. A private directory (in
    // /dev/shm, so shared memory stays in memory) avoids both.
    if (std::getenv("OMPI_MCA_orte_tmpdir_base") == nullptr) {
      std::string pattern = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm/mlfabric-run-XXXXXX"
                                                             : "/tmp/mlfabric-run-XXXXXX";
      if (::mkdtemp(pattern.data()) != nullptr) {
        ompi_dir = pattern;
        command.insert(command.end(), {"--mca", "orte_tmpdir_base", ompi_dir, "--mca",
                                       "btl_vader_backing_directory", ompi_dir});
      }
    }
  }
  for (const char* name : {"MLFABRIC_SOCKET_DIR", "MLFABRIC_JOB", "MLFABRIC_JOB_TOKEN",
                           "MLFABRIC_DELAY_BOUND", "MLFABRIC_DIVERGENCE_BOUND",
                           "MLFABRIC_SCHEDULER", "MLFABRIC_USER_PATH",
                           "MLFABRIC_ALLREDUCE_BACKEND", "MLFABRIC_RANKS_PER_HOST",
                           "MLFABRIC_LOCAL_REDUCE"}) {
    if (std::getenv(name)) command.insert(command.end(), {"-x", name});
  }
  command.insert(command.end(), mpirun_args.begin(), mpirun_args.end());
  command.insert(command.end(), {self, "--exec-rank", "--"});
  command.insert(command.end(), argv + i, argv + argc);
  std::string mpirun_path = "/usr/bin/mpirun";
  if (::access(mpirun_path.c_str(), X_OK) != 0) mpirun_path = "mpirun";
  command[0] = mpirun_path;
  if (verbose) {
    std::cerr << "mlfabric-run:";
    for (const auto& part : command) std::cerr << " " << part;
    std::cerr << "\n";
  }
  auto mpirun = Subprocess::Start(command, "");
  if (!mpirun.ok()) {
    std::cerr << "mlfabric-run: cannot start mpirun: " << mpirun.status().message() << "\n";
    return 1;
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  std::optional<int> code;
  while (!(code = (*mpirun)->WaitFor(0.2)).has_value()) {
    if (g_signal != 0) {
      std::cerr << "mlfabric-run: interrupted; stopping the job and what it started\n";
      code = (*mpirun)->Stop(10);
      break;
    }
  }
  if (!config_dir.empty()) std::filesystem::remove_all(config_dir, error);
  if (!ompi_dir.empty()) std::filesystem::remove_all(ompi_dir, error);
  if (*code != 0 && cluster) {
    std::cerr << "mlfabric-run: the job exited with " << *code << "; logs in " << socket_dir
              << "\n";
  }
  return *code;
}
