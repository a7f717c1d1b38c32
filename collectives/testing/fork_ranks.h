#pragma once
// Runs N ranks as real processes (fork) for multi-process backend tests: each child runs
// body(rank) and exits with its return value (an uncaught exception exits 3 after printing it).
// The parent waits for all, killing them at `deadline`, and returns each child's exit code
// (-signal when killed).

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace dtensor::testing {

// Sets torchrun's variables for rank `rank` of `n` local ranks rendezvousing at 127.0.0.1:port
// (what init_from_env reads).
inline void set_launch_env(int rank, int n, int port) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
}

inline std::vector<int> run_forked(int n, const std::function<int(int rank)>& body,
                                   std::chrono::seconds deadline = std::chrono::seconds(120)) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 3;
      try {
        code = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] uncaught: %s\n", r, e.what());
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(n, 0);
  std::vector<bool> done(n, false);
  const auto end = std::chrono::steady_clock::now() + deadline;
  int remaining = n;
  while (remaining > 0) {
    for (int r = 0; r < n; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --remaining;
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      }
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > end) {
      for (int r = 0; r < n; ++r) {
        if (!done[r]) ::kill(pids[r], SIGKILL);
      }
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return codes;
}

// A TCP port that was free a moment ago (for a TCPStore the children create).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace dtensor::testing
