// mlfabric-run: launches a training job with Open MPI's mpirun, with
// MLfabric's scheduler and daemons up for it (docs/architecture.md §9).
//
//   mlfabric-run -np 4 python3 train.py
//   mlfabric-run -np 4 ./my_cpp_worker --flag=value
//   mlfabric-run -np 8 --hostfile hosts.txt --planner fifo --delay_bound 8 python3 train.py
//
// Unless MLFABRIC_SOCKET_DIR names a directory where daemons already listen
// (h<host>.sock), it starts mlfabric-scheduler and one mlfabricd for this
// machine, shared by all its ranks as on any host of a cluster
// (--ranks_per_host K instead emulates a host of K ranks each, every one
// with a daemon of its own on loopback, so that the scheduler has a network
// to plan) in a private directory, runs
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
// With --hostfile (and no MLFABRIC_SOCKET_DIR) it starts the scheduler here
// and one mlfabricd on every host of the hostfile through a second mpirun
// (tools/run/hosts.h); each rank uses its own host's daemon.
// With --host-discovery-script (elastic mode, tools/run/elastic.h) there is
// no job-wide mpirun: every rank is a launch of its own, started, stopped
// and replaced as the script's hosts change, each host with its daemon.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/secrets.h"
#include "launch/cluster.h"
#include "launch/process.h"
#include "tools/run/elastic.h"
#include "tools/run/hosts.h"

namespace {

constexpr char kUsage[] = R"(usage: mlfabric-run [options] [--] COMMAND [ARGS...]

  -np N               number of ranks (default 1)
  --hostfile FILE     Open MPI hostfile (default: this host only); starts the
                      scheduler here and one mlfabricd on every host of it,
                      through mpirun (docs/operations/many-hosts.md)
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
  --ranks_per_host K  emulate hosts of K ranks on this machine, each with a
                      daemon of its own on loopback: ranks r and r' share one
                      when r / K == r' / K (1: a host per rank, so that the
                      scheduler plans a network even here). Default: every
                      rank shares this machine's one daemon, as the ranks of
                      a machine do with --hostfile (an AllReduce sums in
                      shared memory then); with MLFABRIC_SOCKET_DIR, 1
  --mpirun_arg ARG    extra argument for mpirun (repeatable; with a hostfile
                      also for the mpirun that starts the daemons)
  --head_address A    with a hostfile: this machine's address the hosts reach
                      the scheduler at (default: the source address of the
                      route to the first host)
  --daemon_arg FLAG   a flag for every host's mlfabricd, emulated or real
                      (repeatable), e.g. --daemon_arg=--log_level=debug
  --scheduler_arg FLAG
                      a flag for mlfabric-scheduler (repeatable), e.g.
                      --scheduler_arg=--log_level=debug
  -v                  print what is started

Elastic mode (Horovod's horovodrun --host-discovery-script), instead of -np
and --hostfile; docs/operations/many-hosts.md "Elastic launching":
  --host-discovery-script SCRIPT
                      an executable printing the hosts ranks may run on,
                      one `host` or `host:slots` a line; run at start (a
                      failure is fatal) and every --discovery_interval_s
                      (a failure then is a warning; the last hosts stay).
                      Every slot gets a rank (one launch each: a process
                      here, `mpirun -np 1 --host H` elsewhere) and every
                      host an mlfabricd; a vanished host's ranks are
                      stopped, a failed rank is replaced (a host is
                      blacklisted after 3 failures); the job ends with 0
                      once its ranks exit 0
  --min-np N          fewer running ranks than N for --elastic_timeout_s
                      ends the job with an error; no rank starts until N
                      can (default 1)
  --max-np M          at most M ranks (default: every slot)
  --discovery_interval_s S  (default 1)
  --discovery_timeout_s S   a discovery run longer than S fails (default 10)
  --elastic_timeout_s S     (default 600)
  Ranks also get MLFABRIC_HOSTNAME (the discovered host) and
  MLFABRIC_ELASTIC=1; a started rank takes the lowest free rank number, and
  MLFABRIC_SIZE is the number of ranks running once it has started.
Every rank gets MLFABRIC_RANK, MLFABRIC_SIZE, MLFABRIC_DAEMON_SOCKET, ...
)";

volatile sig_atomic_t g_signal = 0;
void OnSignal(int signal) { g_signal = signal; }

// What --exec-rank is told in elastic mode (tools/run/elastic.h), where
// mpirun's rank numbers mean nothing: every rank is a launch of its own.
struct ElasticRank {
  std::string rank, size, local_rank, local_size, hostname;  // hostname empty: not elastic
};

// Reads --rank, --size, --local_rank, --local_size and --hostname up to
// "--"; returns the index of the command, or -1 (said why).
int ParseExecRankArgs(int argc, char** argv, int first, ElasticRank* e) {
  for (int i = first; i < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--") return i + 1 < argc ? i + 1 : -1;
    std::string* value = arg == "--rank"         ? &e->rank
                         : arg == "--size"       ? &e->size
                         : arg == "--local_rank" ? &e->local_rank
                         : arg == "--local_size" ? &e->local_size
                         : arg == "--hostname"   ? &e->hostname
                                                 : nullptr;
    if (value == nullptr && arg.rfind("-", 0) != 0) return i;  // the command, no "--"
    if (value == nullptr || i + 1 >= argc) {
      std::cerr << "mlfabric-run --exec-rank: unexpected argument " << arg << "\n";
      return -1;
    }
    *value = argv[i + 1];
  }
  return first < argc ? first : -1;
}

// Elastic mode: the rank's host's daemon is <dir>/<host>.sock, which its
// launcher may still be starting. Returns 0, or the exit code.
int UseElasticDaemon(const ElasticRank& e, const std::string& dir) {
  setenv("MLFABRIC_HOSTNAME", e.hostname.c_str(), 1);
  setenv("MLFABRIC_ELASTIC", "1", 1);
  const std::string socket = dir + "/" + e.hostname + ".sock";
  if (!mlfabric::launch::WaitUntil([&] { return ::access(socket.c_str(), F_OK) == 0; }, 60)) {
    std::cerr << "mlfabric-run: rank " << e.rank << ": no daemon at " << socket
              << " after 60 s (see " << dir << "/" << e.hostname << ".log on that host)\n";
    return 1;
  }
  setenv("MLFABRIC_DAEMON_SOCKET", socket.c_str(), 1);
  return 0;
}

int ExecRank(int argc, char** argv, int first) {
  auto env = [](const char* name, const char* fallback) {
    const char* value = std::getenv(name);
    return std::string(value && *value ? value : fallback);
  };
  ElasticRank e;
  first = ParseExecRankArgs(argc, argv, first, &e);
  if (first < 0) return 2;
  const bool elastic = !e.hostname.empty();
  const std::string rank = elastic ? e.rank : env("OMPI_COMM_WORLD_RANK", "0");
  const std::string size = elastic ? e.size : env("OMPI_COMM_WORLD_SIZE", "1");
  const std::string dir = env("MLFABRIC_SOCKET_DIR", "");
  setenv("MLFABRIC_RANK", rank.c_str(), 1);
  setenv("MLFABRIC_SIZE", size.c_str(), 1);
  setenv("MLFABRIC_LOCAL_RANK",
         (elastic ? e.local_rank : env("OMPI_COMM_WORLD_LOCAL_RANK", "0")).c_str(), 1);
  setenv("MLFABRIC_LOCAL_SIZE",
         (elastic ? e.local_size : env("OMPI_COMM_WORLD_LOCAL_SIZE", "1")).c_str(), 1);
  setenv("MLFABRIC_WORKER_NAME", ("rank" + rank).c_str(), 1);
  // --ranks_per_host K: ranks r with the same r / K share host h<r / K>.
  const int per_host = std::max(1, std::atoi(env("MLFABRIC_RANKS_PER_HOST", "1").c_str()));
  const std::string host = std::to_string(std::atoi(rank.c_str()) / per_host);
  if (elastic) {
    if (int code = UseElasticDaemon(e, dir); code != 0) return code;
  } else if (const std::string hosts = env("MLFABRIC_HOSTS", ""); !hosts.empty() && !dir.empty()) {
    // Many hosts: the daemon of the host this rank runs on.
    const std::vector<std::string> names = absl::StrSplit(hosts, ',', absl::SkipEmpty());
    const int index = mlfabric::run::FindLocalHost(names, mlfabric::run::LocalNames());
    if (index < 0) {
      std::cerr << "mlfabric-run: rank " << rank << " runs on none of the hosts " << hosts
                << " (no interface address or host name matches)\n";
      return 1;
    }
    const std::string socket = dir + "/" + names[index] + ".sock";
    // Its daemon may still be starting (each host's launcher starts one).
    if (!mlfabric::launch::WaitUntil([&] { return ::access(socket.c_str(), F_OK) == 0; }, 60)) {
      std::cerr << "mlfabric-run: rank " << rank << ": no daemon at " << socket
                << " after 60 s (see " << dir << "/" << names[index] << ".log on that host)\n";
      return 1;
    }
    setenv("MLFABRIC_DAEMON_SOCKET", socket.c_str(), 1);
  } else if (!dir.empty()) {
    setenv("MLFABRIC_DAEMON_SOCKET", (dir + "/h" + host + ".sock").c_str(), 1);
  }
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

// What the command line asks for.
struct RunOptions {
  int np = 1;
  int delay_bound = 30;
  int ssp = -1;             // -1: asynchronous
  int ranks_per_host = 0;   // 0: not given
  std::string divergence_bound;  // empty: none
  std::vector<std::pair<std::string, std::string>> extra_jobs;
  std::string hostfile, planner = "mlfabric", job = "demo", token;
  std::vector<std::string> mpirun_args, daemon_args, scheduler_args;
  std::string head_address;
  bool verbose = false;
  bool np_given = false;
  int command = 0;  // argv index of the command to run
  // Elastic mode (tools/run/elastic.h), on with a host discovery script.
  std::string discovery_script;
  int min_np = 0, max_np = 0;  // 0: not given
  double discovery_interval_s = 1.0, discovery_timeout_s = 10.0, elastic_timeout_s = 600.0;
};

// An integer flag's value in [low, high]; otherwise says so (`what` names
// its unit) and returns nullopt.
std::optional<int> IntegerFlag(const std::string& flag, const std::string& text, long low,
                               long high, const std::string& what) {
  char* end = nullptr;
  const long parsed = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || parsed < low || parsed > high) {
    std::cerr << "mlfabric-run: " << flag << " must be an integer in [" << low << ", " << high
              << "]" << what << ", not '" << text << "'\n";
    return std::nullopt;
  }
  return static_cast<int>(parsed);
}

// A duration flag's value in (0, 1e6] seconds; otherwise says so.
std::optional<double> SecondsFlag(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double parsed = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(parsed > 0) || parsed > 1e6) {
    std::cerr << "mlfabric-run: " << flag << " must be a number of seconds in (0, 1e6], not '"
              << text << "'\n";
    return std::nullopt;
  }
  return parsed;
}

// Horovod spells them with dashes; mlfabric-run's own flags use underscores.
std::string Canonical(const std::string& flag) {
  if (flag == "--min_np") return "--min-np";
  if (flag == "--max_np") return "--max-np";
  if (flag == "--host_discovery_script") return "--host-discovery-script";
  return flag;
}

// The elastic mode's options. Returns 0, or the exit code (said why); 1 if
// `arg` is none of them.
int ParseElasticOption(const std::string& arg, const std::string& text, RunOptions* o) {
  if (arg == "--host-discovery-script") {
    o->discovery_script = text;
  } else if (arg == "--min-np" || arg == "--max-np") {
    auto parsed = IntegerFlag(arg, text, 1, 1024, " (ranks)");
    if (!parsed) return 2;
    (arg == "--min-np" ? o->min_np : o->max_np) = *parsed;
  } else if (arg == "--discovery_interval_s" || arg == "--discovery_timeout_s" ||
             arg == "--elastic_timeout_s") {
    auto parsed = SecondsFlag(arg, text);
    if (!parsed) return 2;
    (arg == "--discovery_interval_s"  ? o->discovery_interval_s
     : arg == "--discovery_timeout_s" ? o->discovery_timeout_s
                                      : o->elastic_timeout_s) = *parsed;
  } else {
    return 1;
  }
  return 0;
}

// Reads the options that take a value. Returns 0, or the exit code.
int ParseValueOption(const std::string& flag, const std::string& text, RunOptions* o) {
  const std::string arg = Canonical(flag);
  if (int code = ParseElasticOption(arg, text, o); code != 1) return code;
  if (arg == "-np" || arg == "-n" || arg == "--np") {
    o->np = std::atoi(text.c_str());
    o->np_given = true;
  } else if (arg == "--hostfile" || arg == "-hostfile") {
    o->hostfile = text;
  } else if (arg == "--planner") {
    o->planner = text;
  } else if (arg == "--delay_bound") {
    auto parsed = IntegerFlag(arg, text, 0, 1000000, " (model versions)");
    if (!parsed) return 2;
    o->delay_bound = *parsed;
  } else if (arg == "--ssp") {
    auto parsed = IntegerFlag(arg, text, 0, 1000000,
                              " (iterations a worker may run ahead of the slowest)");
    if (!parsed) return 2;
    o->ssp = *parsed;
  } else if (arg == "--divergence_bound") {
    char* end = nullptr;
    const double parsed = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !(parsed > 0) || parsed > 1e12) {
      std::cerr << "mlfabric-run: --divergence_bound must be a positive number (an L2 "
                   "distance), not '" << text << "'\n";
      return 2;
    }
    o->divergence_bound = text;
  } else if (arg == "--extra_job") {
    const size_t colon = text.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == text.size() ||
        text.find_first_of("\"\\") != std::string::npos) {
      std::cerr << "mlfabric-run: --extra_job must be NAME:TOKEN (no quotes), not '" << text
                << "'\n";
      return 2;
    }
    o->extra_jobs.emplace_back(text.substr(0, colon), text.substr(colon + 1));
  } else if (arg == "--job") {
    o->job = text;
  } else if (arg == "--token") {
    o->token = text;
  } else if (arg == "--ranks_per_host") {
    auto parsed = IntegerFlag(arg, text, 1, 1024, "");
    if (!parsed) return 2;
    o->ranks_per_host = *parsed;
  } else if (arg == "--head_address") {
    o->head_address = text;
  } else if (arg == "--daemon_arg") {
    o->daemon_args.push_back(text);
  } else if (arg == "--scheduler_arg") {
    o->scheduler_args.push_back(text);
  } else if (arg == "--mpirun_arg") {
    o->mpirun_args.push_back(text);
  }
  return 0;
}

bool TakesValue(const std::string& arg) {
  for (const char* flag : {"-np", "-n", "--np", "--hostfile", "-hostfile", "--planner",
                           "--delay_bound", "--ssp", "--divergence_bound", "--extra_job", "--job",
                           "--token", "--ranks_per_host", "--head_address", "--daemon_arg",
                           "--scheduler_arg", "--mpirun_arg", "--host-discovery-script",
                           "--min-np", "--max-np", "--discovery_interval_s",
                           "--discovery_timeout_s", "--elastic_timeout_s"}) {
    if (Canonical(arg) == flag) return true;
  }
  return false;
}

// Elastic mode's flags against the others. Returns 0, or the exit code.
int CheckElasticOptions(const RunOptions& o) {
  auto refuse = [](const std::string& why) {
    std::cerr << "mlfabric-run: " << why << "\n";
    return 2;
  };
  if (o.discovery_script.empty()) {
    if (o.min_np > 0 || o.max_np > 0) {
      return refuse("--min-np and --max-np need --host-discovery-script (elastic mode: the "
                    "script lists the hosts ranks may run on)");
    }
    return 0;
  }
  if (o.np_given) {
    return refuse("-np does not go with --host-discovery-script: in elastic mode the ranks are "
                  "the discovered slots, between --min-np and --max-np");
  }
  if (!o.hostfile.empty()) {
    return refuse("--hostfile does not go with --host-discovery-script: the script lists the "
                  "hosts");
  }
  if (o.ranks_per_host > 0) {
    return refuse("--ranks_per_host does not go with --host-discovery-script: every discovered "
                  "host has a daemon of its own");
  }
  if (o.min_np > 0 && o.max_np > 0 && o.min_np > o.max_np) {
    return refuse("--min-np " + std::to_string(o.min_np) + " is more than --max-np " +
                  std::to_string(o.max_np));
  }
  if (const char* dir = std::getenv("MLFABRIC_SOCKET_DIR"); dir != nullptr && *dir != '\0') {
    return refuse("elastic mode starts a daemon per discovered host; unset MLFABRIC_SOCKET_DIR");
  }
  return 0;
}

// The checks between options, and the defaults that depend on others.
// Returns 0, or the exit code.
int CheckOptions(int argc, RunOptions* o) {
  if (o->command >= argc) {
    std::cerr << "mlfabric-run: no command to run\n" << kUsage;
    return 2;
  }
  if (o->np < 1 || o->np > 1024) {
    std::cerr << "mlfabric-run: -np must be between 1 and 1024\n";
    return 2;
  }
  if (o->planner != "fifo" && o->planner != "mlfabric") {
    std::cerr << "mlfabric-run: --planner must be fifo or mlfabric, not '" << o->planner
              << "'\n";
    return 2;
  }
  if (int code = CheckElasticOptions(*o); code != 0) return code;
  if (o->ranks_per_host > 1 && !o->hostfile.empty()) {
    std::cerr << "mlfabric-run: --ranks_per_host places ranks on emulated hosts of this "
                 "machine; with --hostfile, Open MPI places them (its slots=, or --mpirun_arg "
                 "--map-by)\n";
    return 2;
  }
  if (o->ranks_per_host == 0) {
    // The ranks of one machine share its daemon, here as on every host of
    // a --hostfile run. Daemons started by someone else (MLFABRIC_SOCKET_DIR,
    // examples/many_hosts.sh) are one per rank, h<rank>.sock.
    const char* existing = std::getenv("MLFABRIC_SOCKET_DIR");
    const bool own_daemons = (existing == nullptr || *existing == '\0') && o->hostfile.empty();
    o->ranks_per_host = own_daemons ? o->np : 1;
  }
  if (o->token.empty()) {
    // No token ships: the caller's, or one made for this run (the ranks
    // get it as MLFABRIC_JOB_TOKEN).
    const char* given = std::getenv("MLFABRIC_JOB_TOKEN");
    o->token = given != nullptr && *given != '\0' ? given : mlfabric::RandomHex(16);
  }
  return 0;
}

// The scheduler's config: the job, and the extra jobs it admits.
void WriteSchedulerConfig(const RunOptions& o, const std::string& path) {
  std::ofstream out(path);
  out << "{\"jobs\": [{\"name\": \"" << o.job << "\", \"token\": \"" << o.token
      << "\", \"tau_max\": " << o.delay_bound;
  // Elastic: a round in progress completes with the ranks that are left
  // (docs/user-guide/sync-training.md "Job membership").
  if (!o.discovery_script.empty()) out << ", \"member_loss\": \"shrink\"";
  if (o.ssp >= 0) out << ", \"mode\": \"ssp\", \"staleness_k\": " << o.ssp;
  if (!o.divergence_bound.empty()) out << ", \"divergence_max\": " << o.divergence_bound;
  out << "}";
  for (const auto& [name, secret] : o.extra_jobs) {
    out << ", {\"name\": \"" << name << "\", \"token\": \"" << secret
        << "\", \"tau_max\": " << o.delay_bound << "}";
  }
  out << "]}\n";
}

// What a run started, to stop when the job ends.
struct Started {
  std::unique_ptr<mlfabric::launch::Cluster> cluster;  // this machine's hosts
  // Many hosts: the scheduler here, a daemon per host through mpirun.
  std::unique_ptr<mlfabric::launch::Subprocess> scheduler, daemons;
  std::string socket_dir, config_dir, ompi_dir, hosts_dir;
  std::vector<std::string> hosts;  // many hosts: their names
};

// Many hosts: the scheduler here, reachable at the head address, with a
// secret made for this run. Returns its address, or empty (said why).
std::string StartHeadScheduler(const RunOptions& o, const std::string& head_address,
                               Started* run) {
  using mlfabric::launch::Subprocess;
  const std::string& dir = run->socket_dir;
  WriteSchedulerConfig(o, dir + "/scheduler.json");
  // The hosts authenticate with a secret made for this run; it reaches
  // the other hosts in mpirun's environment for the launchers (-x).
  const std::string secret = mlfabric::RandomHex(32);
  {
    std::ofstream(dir + "/cluster.secret") << secret << "\n";
  }
  ::chmod((dir + "/cluster.secret").c_str(), 0600);
  setenv("MLFABRIC_CLUSTER_SECRET", secret.c_str(), 1);
  std::vector<std::string> argv = {
      mlfabric::launch::BinaryPath("scheduler/mlfabric-scheduler"),
      "--config=" + dir + "/scheduler.json", "--planner=" + o.planner,
      "--listen_address=" + head_address, "--grpc_port=0", "--port_file=" + dir + "/scheduler.port",
      "--cluster_secret_file=" + dir + "/cluster.secret"};
  argv.insert(argv.end(), o.scheduler_args.begin(), o.scheduler_args.end());
  auto started = Subprocess::Start(argv, dir + "/scheduler.log");
  const std::string port_file = dir + "/scheduler.port";
  auto port = [&] { return mlfabric::launch::ReadFile(port_file); };
  if (!started.ok() ||
      !mlfabric::launch::WaitUntil([&] { return !port().empty() || !(*started)->Running(); },
                                   30) ||
      port().empty()) {
    std::cerr << "mlfabric-run: the scheduler did not start at " << head_address << ": "
              << (started.ok() ? (*started)->Log() : std::string(started.status().message()))
              << "\n";
    return "";
  }
  run->scheduler = std::move(*started);
  return head_address + ":" + std::to_string(std::atoi(port().c_str()));
}

// Many hosts: one mlfabricd per host through a second mpirun. The job
// starts once every host's daemon serves (each launcher says so through
// mpirun's output). Open MPI 4.1 launching through an rsh agent now and
// then starts every orted and then no process (seen here in about one
// launch in five across network namespaces, and by eval/testbed under
// load): a launch that has started no daemon after 20 s is stopped and
// made again, three times at most. Returns the hosts with no daemon.
std::vector<std::string> LaunchHostDaemons(const std::vector<std::string>& launch,
                                           Started* run) {
  using mlfabric::launch::Subprocess;
  std::vector<std::string> missing;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    const auto began = std::chrono::steady_clock::now();
    auto launched = Subprocess::Start(launch, run->socket_dir + "/daemons.log");
    if (!launched.ok()) {
      std::cerr << "mlfabric-run: cannot start the daemons' mpirun: "
                << launched.status().message() << "\n";
      return run->hosts;
    }
    run->daemons = std::move(*launched);
    Subprocess& daemons = *run->daemons;
    auto serving = [&](const std::string& host) {
      return daemons.Log().find("host " + host + ": mlfabricd serving") != std::string::npos;
    };
    auto started_any = [&] { return daemons.Log().find(": mlfabricd (pid") != std::string::npos; };
    mlfabric::launch::WaitUntil([&] {
      return std::all_of(run->hosts.begin(), run->hosts.end(), serving) || !daemons.Running() ||
             (!started_any() && attempt < 3 &&
              std::chrono::steady_clock::now() - began > std::chrono::seconds(20));
    }, 90);
    missing.clear();
    for (const std::string& host : run->hosts) {
      if (!serving(host)) missing.push_back(host);
    }
    if (missing.empty()) break;
    const bool stalled = !started_any() && daemons.Running();
    daemons.Stop(15);
    if (!stalled || attempt == 3) break;
    std::cerr << "mlfabric-run: the daemons' mpirun started no daemon in 20 s (attempt "
              << attempt << " of 3); stopping it and launching again\n";
  }
  return missing;
}

// Many hosts: the run's directory for sockets and logs. In /tmp, not under
// $TEST_TMPDIR: the same path must exist on every host, and Unix socket
// paths are short (108 bytes). False if it cannot be made (said why).
bool MakeHostsDir(Started* run) {
  std::string pattern = "/tmp/mlfabric-run-hosts-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::cerr << "mlfabric-run: cannot make a directory in /tmp: " << std::strerror(errno)
              << "\n";
    return false;
  }
  run->socket_dir = pattern;
  run->hosts_dir = pattern;
  return true;
}

// With --hostfile: the scheduler here and a daemon on every host. Returns
// 0, or the exit code.
int StartManyHosts(const RunOptions& o, const std::string& self, const std::string& mpirun_path,
                   Started* run) {
  const std::string text = mlfabric::launch::ReadFile(o.hostfile);
  auto entries = mlfabric::run::ParseHostfile(text);
  if (text.empty() || !entries.ok()) {
    std::cerr << "mlfabric-run: " << o.hostfile << ": "
              << (text.empty() ? "cannot read it, or it is empty"
                               : std::string(entries.status().message()))
              << "\n";
    return 2;
  }
  for (const auto& entry : *entries) run->hosts.push_back(entry.host);
  std::string head_address = o.head_address;
  if (head_address.empty()) head_address = mlfabric::run::RouteSource(run->hosts.front());
  if (head_address.empty()) {
    std::cerr << "mlfabric-run: no route from here to " << run->hosts.front()
              << "; name this machine's address with --head_address\n";
    return 2;
  }
  if (!MakeHostsDir(run)) return 1;
  const std::string address = StartHeadScheduler(o, head_address, run);
  if (address.empty()) return 1;
  setenv("MLFABRIC_SCHEDULER", address.c_str(), 1);
  const std::string hosts = absl::StrJoin(run->hosts, ",");
  std::vector<std::string> launch = {mpirun_path, "--hostfile", o.hostfile, "--map-by",
                                     "ppr:1:node", "-np", std::to_string(run->hosts.size()),
                                     "-x", "MLFABRIC_CLUSTER_SECRET"};
  launch.insert(launch.end(), o.mpirun_args.begin(), o.mpirun_args.end());
  launch.insert(launch.end(), {self, "--exec-daemon", "--dir", run->socket_dir, "--scheduler",
                               address, "--hosts", hosts});
  for (const std::string& flag : o.daemon_args) launch.insert(launch.end(), {"--daemon_arg", flag});
  const std::vector<std::string> missing = LaunchHostDaemons(launch, run);
  if (!missing.empty()) {
    std::cerr << "mlfabric-run: no daemon serves on " << absl::StrJoin(missing, ", ")
              << "; the daemons' mpirun said:\n"
              << (run->daemons ? run->daemons->Log() : "") << "\n";
    run->scheduler->Stop(5);
    std::cerr << "mlfabric-run: logs in " << run->socket_dir << "\n";
    return 1;
  }
  unsetenv("MLFABRIC_CLUSTER_SECRET");  // the job's ranks need no secret
  setenv("MLFABRIC_HOSTS", hosts.c_str(), 1);
  if (o.verbose) {
    std::cerr << "mlfabric-run: started mlfabric-scheduler at " << address << " (planner "
              << o.planner << ", tau_max " << o.delay_bound << ") and, through mpirun, one "
              << "mlfabricd on each of " << absl::StrJoin(run->hosts, ", ") << "; logs in "
              << run->socket_dir << "\n";
  }
  return 0;
}

// This machine only: the scheduler and a daemon per emulated host, on
// loopback. Returns 0, or the exit code.
int StartOnThisMachine(const RunOptions& o, Started* run) {
  run->config_dir = mlfabric::launch::MakeTempDir("mlfabric-run-config");
  const std::string config = run->config_dir + "/scheduler.json";
  WriteSchedulerConfig(o, config);
  std::vector<std::string> hosts;
  const int host_count = (o.np + o.ranks_per_host - 1) / o.ranks_per_host;
  for (int h = 0; h < host_count; ++h) hosts.push_back("h" + std::to_string(h));
  std::vector<std::string> scheduler_argv = {"--config=" + config, "--planner=" + o.planner};
  scheduler_argv.insert(scheduler_argv.end(), o.scheduler_args.begin(), o.scheduler_args.end());
  auto started = mlfabric::launch::Cluster::StartLoopback(hosts, scheduler_argv, o.daemon_args);
  if (!started.ok()) {
    std::cerr << "mlfabric-run: cannot start the scheduler and daemons: "
              << started.status().message() << "\n";
    return 1;
  }
  run->cluster = std::move(*started);
  run->socket_dir = run->cluster->dir();
  setenv("MLFABRIC_SCHEDULER", run->cluster->scheduler_address().c_str(), 1);
  if (o.verbose) {
    std::cerr << "mlfabric-run: started mlfabric-scheduler at "
              << run->cluster->scheduler_address() << " (planner " << o.planner << ", tau_max "
              << o.delay_bound << ") and " << hosts.size() << " mlfabricd; logs in "
              << run->socket_dir << "\n";
  }
  return 0;
}

// The environment every rank gets (through mpirun's -x, MpirunCommand).
void ExportJobEnvironment(const RunOptions& o, const std::string& socket_dir) {
  setenv("MLFABRIC_SOCKET_DIR", socket_dir.c_str(), 1);
  setenv("MLFABRIC_JOB", o.job.c_str(), 1);
  setenv("MLFABRIC_JOB_TOKEN", o.token.c_str(), 1);
  // Emulated hosts only: with a hostfile each rank's host is the machine it runs on.
  if (o.hostfile.empty() && o.discovery_script.empty()) {
    setenv("MLFABRIC_RANKS_PER_HOST", std::to_string(o.ranks_per_host).c_str(), 1);
  } else {
    unsetenv("MLFABRIC_RANKS_PER_HOST");
  }
  setenv("MLFABRIC_DELAY_BOUND", std::to_string(o.delay_bound).c_str(), 1);
  if (!o.divergence_bound.empty()) {
    setenv("MLFABRIC_DIVERGENCE_BOUND", o.divergence_bound.c_str(), 1);
  } else {
    unsetenv("MLFABRIC_DIVERGENCE_BOUND");
  }
  if (const char* path = std::getenv("PATH")) setenv("MLFABRIC_USER_PATH", path, 1);
}

// What mpirun passes on to the ranks (-x), when set.
constexpr const char* kRankEnvironment[] = {
    "MLFABRIC_SOCKET_DIR",         "MLFABRIC_JOB",           "MLFABRIC_JOB_TOKEN",
    "MLFABRIC_DELAY_BOUND",        "MLFABRIC_DIVERGENCE_BOUND", "MLFABRIC_SCHEDULER",
    "MLFABRIC_USER_PATH",          "MLFABRIC_ALLREDUCE_BACKEND", "MLFABRIC_RANKS_PER_HOST",
    "MLFABRIC_LOCAL_REDUCE",       "MLFABRIC_HOSTS",         "MLFABRIC_ALLREDUCE_PIECES",
    "MLFABRIC_ALLREDUCE_MPI_BELOW"};

// mpirun with the ranks' environment, each rank starting as
// `mlfabric-run --exec-rank -- COMMAND...`.
std::vector<std::string> MpirunCommand(const RunOptions& o, int argc, char** argv,
                                       const std::string& self, const std::string& mpirun_path,
                                       Started* run) {
  std::vector<std::string> command = {mpirun_path, "-np", std::to_string(o.np)};
  if (!o.hostfile.empty()) {
    command.insert(command.end(), {"--hostfile", o.hostfile});
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
        run->ompi_dir = pattern;
        command.insert(command.end(), {"--mca", "orte_tmpdir_base", run->ompi_dir, "--mca",
                                       "btl_vader_backing_directory", run->ompi_dir});
      }
    }
  }
  for (const char* name : kRankEnvironment) {
    if (std::getenv(name)) command.insert(command.end(), {"-x", name});
  }
  command.insert(command.end(), o.mpirun_args.begin(), o.mpirun_args.end());
  command.insert(command.end(), {self, "--exec-rank", "--"});
  command.insert(command.end(), argv + o.command, argv + argc);
  return command;
}

// Waits for the job's mpirun; a signal, or the daemons' mpirun ending,
// stops it. Returns its exit code.
int WaitForJob(mlfabric::launch::Subprocess& mpirun, const Started& run) {
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  std::optional<int> code;
  while (!(code = mpirun.WaitFor(0.2)).has_value()) {
    if (g_signal != 0) {
      std::cerr << "mlfabric-run: interrupted; stopping the job and what it started\n";
      return mpirun.Stop(10);
    }
    if (run.daemons != nullptr && !run.daemons->Running()) {
      std::cerr << "mlfabric-run: the daemons' mpirun ended (a daemon failed?): "
                << run.daemons->Log() << "\nmlfabric-run: stopping the job\n";
      const int stopped = mpirun.Stop(10);
      return stopped == 0 ? 1 : stopped;
    }
  }
  return *code;
}

// Stops what the run started and removes its directories (the logs stay
// when the job failed).
void StopStarted(const RunOptions& o, int code, Started* run) {
  if (run->daemons != nullptr) {
    // SIGTERM: mpirun signals every host's launcher, which stops its
    // daemon and removes its socket (a launcher killed outright takes its
    // daemon with it: PR_SET_PDEATHSIG).
    run->daemons->Stop(15);
    // mpirun may end before a launcher's daemon has: wait (bounded) for
    // the sockets visible from here (hosts on this machine or a shared
    // filesystem) to go, so that none outlives this command.
    const bool gone = mlfabric::launch::WaitUntil(
        [&] {
          return std::none_of(run->hosts.begin(), run->hosts.end(), [&](const std::string& h) {
            return ::access((run->socket_dir + "/" + h + ".sock").c_str(), F_OK) == 0;
          });
        },
        15);
    if (!gone) {
      std::cerr << "mlfabric-run: a daemon's socket is still in " << run->socket_dir << "\n";
    }
    if (o.verbose) std::cerr << "mlfabric-run: stopped the daemons\n";
  }
  if (run->scheduler != nullptr) run->scheduler->Stop(5);
  std::error_code error;
  if (!run->config_dir.empty()) std::filesystem::remove_all(run->config_dir, error);
  if (!run->ompi_dir.empty()) std::filesystem::remove_all(run->ompi_dir, error);
  if (!run->hosts_dir.empty() && code == 0) std::filesystem::remove_all(run->hosts_dir, error);
  if (code != 0 && (run->cluster || !run->hosts_dir.empty())) {
    std::cerr << "mlfabric-run: the job exited with " << code << "; logs in " << run->socket_dir
              << "\n";
  }
}

// Elastic mode (tools/run/elastic.h): the first discovery, the scheduler
// here, then ranks and daemons as the hosts come and go. Returns the job's
// exit code.
int RunElasticJob(const RunOptions& o, int argc, char** argv, const std::string& self,
                  const std::string& mpirun_path) {
  mlfabric::run::ElasticOptions e;
  e.script = o.discovery_script;
  e.discovery_timeout_s = o.discovery_timeout_s;
  // A script that fails at start is fatal; later, a warning.
  auto first = mlfabric::run::RunDiscovery(e.script, e.discovery_timeout_s);
  if (!first.ok() || first->empty()) {
    std::cerr << "mlfabric-run: "
              << (first.ok() ? "host discovery script " + e.script + " listed no host at start"
                             : std::string(first.status().message()))
              << "\n";
    return 2;
  }
  std::string head_address = o.head_address;
  if (head_address.empty()) head_address = mlfabric::run::RouteSource(first->front().host);
  if (head_address.empty()) {
    std::cerr << "mlfabric-run: no route from here to " << first->front().host
              << "; name this machine's address with --head_address\n";
    return 2;
  }
  Started run;
  if (!MakeHostsDir(&run)) return 1;
  const std::string address = StartHeadScheduler(o, head_address, &run);
  if (address.empty()) return 1;
  e.cluster_secret = std::getenv("MLFABRIC_CLUSTER_SECRET");
  unsetenv("MLFABRIC_CLUSTER_SECRET");  // the ranks need none
  setenv("MLFABRIC_SCHEDULER", address.c_str(), 1);
  ExportJobEnvironment(o, run.socket_dir);
  e.limits.min_np = std::max(1, o.min_np);
  if (o.max_np > 0) e.limits.max_np = o.max_np;
  e.discovery_interval_s = o.discovery_interval_s;
  e.elastic_timeout_s = o.elastic_timeout_s;
  e.self = self;
  e.mpirun_path = mpirun_path;
  e.socket_dir = run.socket_dir;
  e.scheduler_address = address;
  e.mpirun_args = o.mpirun_args;
  e.daemon_args = o.daemon_args;
  e.forwarded_env.assign(std::begin(kRankEnvironment), std::end(kRankEnvironment));
  e.command.assign(argv + o.command, argv + argc);
  e.verbose = o.verbose;
  if (o.verbose) {
    std::cerr << "mlfabric-run: elastic: started mlfabric-scheduler at " << address
              << " (member_loss shrink); logs in " << run.socket_dir << "\n";
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  const int code = mlfabric::run::RunElastic(e, *first, &g_signal);
  StopStarted(o, code, &run);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  RunOptions o;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--exec-daemon") return mlfabric::run::RunHostDaemon(argc, argv, i + 1);
    if (arg == "--exec-rank") return ExecRank(argc, argv, i + 1);
    if (arg == "--") { ++i; break; }
    if (arg == "-h" || arg == "--help") { std::cout << kUsage; return 0; }
    if (const size_t eq = arg.find('='); eq != std::string::npos && TakesValue(arg.substr(0, eq))) {
      // --flag=value, as the usage shows for --daemon_arg.
      if (int code = ParseValueOption(arg.substr(0, eq), arg.substr(eq + 1), &o); code != 0) {
        return code;
      }
    } else if (TakesValue(arg)) {
      if (i + 1 >= argc) {
        std::cerr << "mlfabric-run: " << arg << " needs a value\n" << kUsage;
        return 2;
      }
      if (int code = ParseValueOption(arg, argv[++i], &o); code != 0) return code;
    } else if (arg == "-v") {
      o.verbose = true;
    } else if (!arg.empty() && arg[0] == '-') {
      std::cerr << "mlfabric-run: unknown option " << arg << "\n" << kUsage;
      return 2;
    } else {
      break;
    }
  }
  o.command = i;
  if (int code = CheckOptions(argc, &o); code != 0) return code;
  if (::geteuid() == 0) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
  std::error_code error;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", error).string();
  std::string mpirun_path = "/usr/bin/mpirun";
  if (::access(mpirun_path.c_str(), X_OK) != 0) mpirun_path = "mpirun";

  if (!o.discovery_script.empty()) return RunElasticJob(o, argc, argv, self, mpirun_path);
  Started run;
  if (const char* existing = std::getenv("MLFABRIC_SOCKET_DIR"); existing && *existing) {
    run.socket_dir = existing;
    if (o.verbose) std::cerr << "mlfabric-run: using the daemons in " << run.socket_dir << "\n";
  } else if (int code = !o.hostfile.empty() ? StartManyHosts(o, self, mpirun_path, &run)
                                            : StartOnThisMachine(o, &run);
             code != 0) {
    return code;
  }
  ExportJobEnvironment(o, run.socket_dir);
  const std::vector<std::string> command = MpirunCommand(o, argc, argv, self, mpirun_path, &run);
  if (o.verbose) {
    std::cerr << "mlfabric-run:";
    for (const auto& part : command) std::cerr << " " << part;
    std::cerr << "\n";
  }
  auto mpirun = mlfabric::launch::Subprocess::Start(command, "");
  if (!mpirun.ok()) {
    std::cerr << "mlfabric-run: cannot start mpirun: " << mpirun.status().message() << "\n";
    return 1;
  }
  const int code = WaitForJob(**mpirun, run);
  StopStarted(o, code, &run);
  return code;
}
