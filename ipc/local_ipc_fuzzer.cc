// libFuzzer target for the local IPC framing (local_ipc.h): any bytes a
// peer writes to the socket must end as messages or an error naming the
// problem, never a crash or a hang; every message received sends and
// receives again unchanged. Build and run with clang: tools/fuzz ipc
// [seconds]; local_ipc_fuzzer_smoke_test runs it over the corpus (a
// daemon's view: an application writing garbage cannot take it down).
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ipc/local_ipc.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mlfabric;
  if (size > (1 << 16)) return 0;  // stays within one socket buffer: no blocking write
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) std::abort();
  size_t written = 0;
  while (written < size) {
    const ssize_t n = ::write(fds[0], data + written, size - written);
    if (n <= 0) std::abort();
    written += static_cast<size_t>(n);
  }
  ::shutdown(fds[0], SHUT_WR);  // the peer is done: Receive ends with an error, not a hang
  LocalChannel channel(fds[1]);
  for (int messages = 0; messages < 64; ++messages) {
    v1::LocalMessage message;
    int fd = -1;
    absl::Status status = channel.Receive(&message, &fd);
    if (fd >= 0) ::close(fd);
    if (!status.ok()) {
      if (status.message().empty()) std::abort();
      break;
    }
    // Round trip through a second channel.
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) std::abort();
    LocalChannel out(pair[0]), in(pair[1]);
    if (!out.Send(message).ok()) std::abort();
    v1::LocalMessage again;
    int again_fd = -1;
    if (!in.Receive(&again, &again_fd).ok()) std::abort();
    if (again.SerializeAsString() != message.SerializeAsString()) std::abort();
  }
  ::close(fds[0]);
  return 0;
}
