#include "launch/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace mlfabric::launch {

std::string BinaryPath(const std::string& workspace_relative) {
  std::vector<std::string> candidates;
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    if (const char* dir = std::getenv(var)) {
      candidates.push_back(absl::StrCat(dir, "/mlfabric/", workspace_relative));
    }
  }
  std::error_code error;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    candidates.push_back(absl::StrCat(self.string(), ".runfiles/mlfabric/", workspace_relative));
  }
  candidates.push_back(workspace_relative);  // `bazel run` starts in the runfiles root
  candidates.push_back(absl::StrCat("bazel-bin/", workspace_relative));
  for (const std::string& path : candidates) {
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return candidates.back();
}

std::string MakeTempDir(const std::string& prefix) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = absl::StrCat(base ? base : "/tmp", "/", prefix, "XXXXXX");
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  const char* made = ::mkdtemp(buffer.data());
  return made ? std::string(made) : pattern;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool WaitUntil(const std::function<bool()>& condition, double timeout_s) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const std::vector<std::string>& argv,
                                                              const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  auto process = std::unique_ptr<Subprocess>(new Subprocess());
  process->log_path_ = log_path;
  const int error = ::posix_spawn(&process->pid_, argv[0].c_str(), &actions, nullptr, args.data(),
                                  environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    // Nothing to stop: without this the destructor would signal pid -1,
    // which is every process this user may signal.
    process->pid_ = -1;
    process->exit_code_ = 127;
    return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", std::strerror(error)));
  }
  return process;
}

Subprocess::~Subprocess() {
  if (!exit_code_.has_value()) Stop(2.0);
}

bool Subprocess::Running() { return !WaitFor(0).has_value(); }

std::optional<int> Subprocess::WaitFor(double timeout_s) {
  if (exit_code_.has_value()) return exit_code_;
  WaitUntil(
      [&] {
        int status = 0;
        const pid_t done = ::waitpid(pid_, &status, WNOHANG);
        if (done == pid_) {
          exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          return true;
        }
        return false;
      },
      timeout_s);
  return exit_code_;
}

void Subprocess::Signal(int signal) {
  // Never pid <= 0: kill() would reach a whole process group or every process.
  if (!exit_code_.has_value() && pid_ > 0) ::kill(pid_, signal);
}

int Subprocess::Stop(double grace_s) {
  Signal(SIGTERM);
  if (auto code = WaitFor(grace_s)) return *code;
  Signal(SIGKILL);
  return WaitFor(10).value_or(-1);
}

}  // namespace mlfabric::launch
