// Checkpoints across real processes (forked ranks, shm collectives, one shared directory):
// saved by 4 processes on mesh (4,), loaded by 2 processes on mesh (2,) with Shard(1), by 4 on
// mesh (2,2), and by this one process as plain tensors; and a rank killed (SIGKILL) in the
// middle of a save: the survivors fail with an error instead of hanging, and the directory still
// holds the previous checkpoint, which loads on another number of ranks; the next save succeeds.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "collectives/launch_env.h"
#include "collectives/rank_context.h"
#include "collectives/testing/fork_ranks.h"
#include "dtensor/api.h"
#include "dtensor/local_tensor.h"

namespace dtensor::checkpoint {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base ? base : "/tmp") / ("ckpt_proc_" + name);
  fs::remove_all(dir);
  fs::remove_all(dir.string() + ".saving");
  return dir.string();
}

// The one-device tensors of version `v` of the state: uneven on 4 and 2 ranks, four dtypes.
std::map<std::string, at::Tensor> globals(int64_t v) {
  const auto ramp = [&](int64_t n) { return at::arange(n, at::kLong) * (v + 3) % 97 - 40; };
  return {{"w.f32", (ramp(13 * 6).to(at::kFloat) / 7).reshape({13, 6})},
          {"w.bf16", (ramp(9 * 5).to(at::kFloat) / 4).to(at::kBFloat16).reshape({9, 5})},
          {"w.f16", (ramp(7 * 3).to(at::kFloat) / 8).to(at::kHalf).reshape({7, 3})},
          {"idx.i64", ramp(6 * 10).reshape({6, 10}) * 1000003},
          {"mask", (ramp(5 * 9) % 3 == 0).reshape({5, 9})}};
}

std::map<std::string, Value> state_of(int64_t v, const DeviceMesh& mesh, const Placements& pl) {
  std::map<std::string, Value> state = {{"step", v}, {"lr", 0.5 / (v + 1)}};
  for (const auto& [key, g] : globals(v)) state[key] = api::distribute_tensor(g, mesh, pl);
  return state;
}

// Loads `dir` into `pl` on `mesh_shape` and compares every piece with the one-device slice of
// version `v`; returns the number of wrong entries.
int load_and_count_errors(const std::string& dir, const std::vector<int64_t>& mesh_shape,
                          const Placements& pl, int64_t v, int rank) {
  const DeviceMesh mesh = api::init_device_mesh(mesh_shape);
  std::map<std::string, Value> state = {{"step", int64_t{-1}}, {"lr", 0.0}};
  for (const auto& [key, g] : globals(v))
    state[key] = api::zeros(g.sizes().vec(), mesh, pl, g.options());
  load(state, dir);
  int errors = 0;
  for (const auto& [key, g] : globals(v)) {
    const at::Tensor t = std::get<at::Tensor>(state[key]);
    const auto box = local_box_of_rank(api::spec(t), rank);
    if (!at::equal(api::local(t), slice_box(g, *box))) {
      std::fprintf(stderr, "[rank %d] %s differs from version %lld\n", rank, key.c_str(),
                   static_cast<long long>(v));
      ++errors;
    }
  }
  errors += std::get<int64_t>(state["step"]) != v;
  errors += std::get<double>(state["lr"]) != 0.5 / (v + 1);
  return errors;
}

// Runs `body` on `n` forked ranks (shm, 5 s collective timeout); returns their exit codes.
std::vector<int> on_processes(int n, const std::function<int(int)>& body) {
  const int port = testing::free_port();
  return testing::run_forked(
      n,
      [&](int r) {
        testing::set_launch_env(r, n, port);
        at::set_num_threads(1);
        auto ctx = collectives::init_from_env("shm", std::chrono::seconds(5));
        return body(r);
      },
      std::chrono::seconds(120));
}

void expect_codes(const std::vector<int>& codes, const std::vector<int>& want,
                  const std::string& what) {
  ASSERT_EQ(codes.size(), want.size());
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], want[r]) << what << ", rank " << r;
}

// This process, no rank context: plain tensors receive the whole saved tensors.
void expect_plain_load(const std::string& dir, int64_t v) {
  std::map<std::string, Value> state = {{"step", int64_t{-1}}, {"lr", 0.0}};
  for (const auto& [key, g] : globals(v)) state[key] = at::zeros_like(g);
  load(state, dir);
  for (const auto& [key, g] : globals(v))
    EXPECT_TRUE(at::equal(std::get<at::Tensor>(state[key]), g)) << key;
  EXPECT_EQ(std::get<int64_t>(state["step"]), v);
}

// Version `v` saved by 4 processes on mesh (4,) with Shard(0).
void save_on_four(const std::string& dir, int64_t v, const std::string& what) {
  expect_codes(on_processes(4,
                            [&](int) {
                              const DeviceMesh mesh = api::init_device_mesh({4});
                              save(state_of(v, mesh, {Shard(0)}), dir);
                              return 0;
                            }),
               {0, 0, 0, 0}, what);
}

TEST(CheckpointProcesses, SavedOnFourLoadsOnTwoOnTwoByTwoAndOnOne) {
  const std::string dir = fresh_dir("meshes");
  save_on_four(dir, 1, "save on (4,)");
  expect_codes(
      on_processes(2, [&](int r) { return load_and_count_errors(dir, {2}, {Shard(1)}, 1, r); }),
      {0, 0}, "load on (2,) Shard(1)");
  expect_codes(on_processes(4,
                            [&](int r) {
                              return load_and_count_errors(dir, {2, 2}, {Shard(0), Shard(1)}, 1, r);
                            }),
               {0, 0, 0, 0}, "load on (2,2) [Shard(0), Shard(1)]");
  expect_plain_load(dir, 1);
}

// A rank dies (SIGKILL) at `stage` of the second save: every survivor's save throws (no hang, no
// success), the directory still holds the first checkpoint (loaded on 2 ranks resharded and on
// one process), and a third save over the debris succeeds.
void kill_mid_save(int victim, const std::string& stage) {
  const std::string dir = fresh_dir("crash_" + stage);
  expect_codes(
      on_processes(4,
                   [&](int r) {
                     const DeviceMesh mesh = api::init_device_mesh({4});
                     save(state_of(1, mesh, {Shard(0)}), dir);
                     SaveOptions options;
                     options.on_stage = [&](const std::string& s) {
                       if (r == victim && s == stage) ::raise(SIGKILL);
                     };
                     try {
                       save(state_of(2, mesh, {Shard(0)}), dir, options);
                     } catch (const Error& e) {
                       std::fprintf(stderr, "[rank %d] expected failure: %s\n", r, e.what());
                       return 0;
                     }
                     return 1;  // the save must not succeed without the dead rank
                   }),
      [&] {
        std::vector<int> want(4, 0);
        want[victim] = -SIGKILL;
        return want;
      }(),
      "second save with rank " + std::to_string(victim) + " killed at " + stage);
  expect_codes(
      on_processes(2, [&](int r) { return load_and_count_errors(dir, {2}, {Shard(1)}, 1, r); }),
      {0, 0}, "load of the previous checkpoint on (2,)");
  expect_plain_load(dir, 1);
  save_on_four(dir, 3, "save after the crash");
  expect_plain_load(dir, 3);
  EXPECT_FALSE(fs::exists(dir + ".saving"));
}

TEST(CheckpointProcesses, RankKilledWhileOthersWriteKeepsThePreviousCheckpoint) {
  kill_mid_save(2, "data_written");
}

TEST(CheckpointProcesses, RankZeroKilledBeforeTheRenameKeepsThePreviousCheckpoint) {
  kill_mid_save(0, "index_written");
}

}  // namespace
}  // namespace dtensor::checkpoint
