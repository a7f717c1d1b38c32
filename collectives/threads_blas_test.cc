// Ranks as threads share one BLAS (NOTE [thread-safe BLAS] in rank_context.h):
// - the BLAS this process loads computes concurrent matrix products as one thread does
//   (OpenBLAS's serial build, which ./x installed before, got 16 of 8000 wrong: the cause of
//   tests/model_test's failure in CI);
// - run_threads refuses OpenBLAS's serial build with an error naming it, in a child process that
//   loads that build instead (LD_LIBRARY_PATH), when it is installed.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "collectives/rank_context.h"

namespace dtensor::collectives {
namespace {

constexpr int kThreads = 4;
constexpr const char* kSerialDir = "/usr/lib/x86_64-linux-gnu/openblas-serial";

// kThreads threads each run kProducts matrix products at once, against the same products computed
// on one thread before.
TEST(ThreadsBlas, ConcurrentMatrixProductsEqualOneThread) {
  constexpr int kProducts = 2000;
  std::vector<at::Tensor> x, w, b, want;
  for (int t = 0; t < kThreads; ++t) {
    x.push_back(at::sin(at::arange(512, at::kDouble) * (1.3 + t)).reshape({64, 8}));
    w.push_back(at::cos(at::arange(64, at::kDouble) * (0.7 + t)).reshape({8, 8}));
    b.push_back(at::cos(at::arange(8, at::kDouble) * (0.3 + t)));
    want.push_back(at::linear(x[t], w[t], b[t]));
  }
  std::atomic<int> ready{0}, wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) {
      }
      for (int i = 0; i < kProducts; ++i) {
        if (!at::equal(at::linear(x[t], w[t], b[t]), want[t])) wrong.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0) << "of " << kThreads * kProducts
                             << " products on concurrent threads were wrong: this process's BLAS "
                                "is not thread-safe";
}

// Child: run_threads must raise naming the serial build. Exit 0 when it did.
int child_refusal() {
  try {
    run_threads(2, [](int64_t) {});
  } catch (const Error& e) {
    return std::strstr(e.what(), "libopenblas0-serial") != nullptr ? 0 : 3;
  }
  return 2;
}

// Runs this binary as a child in `mode`, with LD_LIBRARY_PATH=`libs` when given; its exit code.
int run_child(const char* mode, const char* libs = nullptr) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (libs != nullptr) ::setenv("LD_LIBRARY_PATH", libs, 1);
    ::execl("/proc/self/exe", "threads_blas_test", mode, static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(ThreadsBlas, RunThreadsRefusesSerialOpenBlas) {
  if (::access((std::string(kSerialDir) + "/libopenblas.so.0").c_str(), R_OK) != 0) {
    GTEST_SKIP() << "OpenBLAS's serial build is not installed (" << kSerialDir << ")";
  }
  EXPECT_EQ(run_child("--child-refusal", kSerialDir), 0);
}

}  // namespace
}  // namespace dtensor::collectives

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--child-refusal") == 0) {
    return dtensor::collectives::child_refusal();
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
