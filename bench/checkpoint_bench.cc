// ./x bench checkpoint: save and load bandwidth per rank of a sharded checkpoint (checkpoint.h),
// next to `dd` writing and reading the same number of bytes per rank in the same run, and the
// peak extra memory a rank uses while loading.
//
//   checkpoint_bench [--sizes-mib 256,1024,2048] [--ranks 4] [--repeats 3] [--dir DIR]
//
// Ranks are processes (shm collectives). The state is 8 float32 tensors of `size` bytes in all,
// each Shard(0) on mesh (ranks,): every rank saves and loads size/ranks bytes. Each measurement
// runs all ranks at once between two barriers and times the slowest; each is repeated (--repeats,
// each next to its dd run) and the medians are reported:
//   save:  checkpoint::save into a new directory (data written, fsynced, index, rename); the
//     previous one is removed and synced before, outside the timing, as dd's file is.
//   dd write: every rank runs `dd if=<its pieces' bytes in /dev/shm> of=<a new file> bs=1M
//     conv=fsync`: the same bytes as save writes (random floats: a VM disk may write zeros
//     faster), into a new file as save does (overwriting a file in place is faster here).
//   load (Shard(0), the saved layout) and load (Shard(1), resharded: every rank reads a quarter
//     of every row), checksums verified; then dd read: `dd if=<its file> of=/dev/null bs=1M`.
// Page cache: before every read, each file read is dropped from the page cache with
// posix_fadvise(POSIX_FADV_DONTNEED) (its pages are clean after fsync, so this works for any
// user and touches no other file). The VM's host may still cache below the guest; dd's reads
// pass through the same path, so the ratio compares like with like.
// gbs = bytes per rank / seconds. Peak extra memory: the rise of the rank's peak resident set
// (VmHWM, reset through /proc/self/clear_refs) during load over its resident set before, with
// the destination tensors already allocated.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "checkpoint/checkpoint.h"
#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "collectives/testing/fork_ranks.h"
#include "dtensor/api.h"
#include "tools/cli_args.h"

ABSL_FLAG(dtensor::cli::IntList, sizes_mib, (dtensor::cli::IntList{{256, 1024, 2048}}),
          "total state sizes in MiB (also --sizes-mib)");
ABSL_FLAG(int64_t, ranks, 4, "ranks (processes)");
ABSL_FLAG(int64_t, repeats, 3, "repeats per size (medians are reported)");
ABSL_FLAG(std::string, dir, "",
          "scratch directory (default $TMPDIR or /tmp, + /dtensor_ckpt_bench)");

using namespace dtensor;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kTensors = 8;
constexpr int64_t kCols = 1024;

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_dir_cache(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) drop_cache(e.path().string());
}

int64_t status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) return std::atoll(line.c_str() + prefix.size());
  return -1;
}

void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

// Runs `body` on every rank between barriers; returns the slowest rank's seconds (on every rank).
double timed(const std::function<void()>& body) {
  collectives::barrier(collectives::RankContext::kWorld);
  const auto t0 = Clock::now();
  body();
  const double mine = std::chrono::duration<double>(Clock::now() - t0).count();
  const at::Tensor t = at::full({1}, mine, at::kDouble);
  return collectives::all_reduce(t, ReduceOp::kMax, collectives::RankContext::kWorld)
      .item<double>();
}

void run_shell(const std::string& cmd) {
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
}

void print(const char* op, const char* layout, int64_t ranks, int64_t bytes, double s, double dd_s,
           int64_t extra_kib) {
  const double gbs = bytes / s / 1e9, dd_gbs = bytes / dd_s / 1e9;
  std::printf("%-5s %-9s %5lld %14lld %9.3f %9.3f %9.3f %10s\n", op, layout,
              static_cast<long long>(ranks), static_cast<long long>(bytes), gbs, dd_gbs,
              gbs / dd_gbs, extra_kib < 0 ? "-" : std::to_string(extra_kib / 1024).c_str());
  std::printf(
      "{\"bench\":\"checkpoint\",\"op\":\"%s\",\"layout\":\"%s\",\"ranks\":%lld,\"bytes\":%lld,"
      "\"gbs\":%.4f,\"dd_gbs\":%.4f,\"ratio_to_dd\":%.3f%s}\n",
      op, layout, static_cast<long long>(ranks), static_cast<long long>(bytes), gbs, dd_gbs,
      gbs / dd_gbs,
      extra_kib < 0 ? "" : (",\"peak_extra_mib\":" + std::to_string(extra_kib / 1024.0)).c_str());
  std::fflush(stdout);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One size on this rank, `repeats` times (each op next to its dd, medians reported): save and
// dd write; load into Shard(0) (the saved layout) and into Shard(1) (resharded), each next to a
// dd read.
void run_size(int64_t rank, int64_t n, int64_t total_mib, int64_t repeats,
              const std::string& base) {
  const int64_t rows = (total_mib << 20) / (kTensors * kCols * 4);
  const int64_t per_rank = (total_mib << 20) / n;
  const DeviceMesh mesh = api::init_device_mesh({n});
  std::map<std::string, checkpoint::Value> state;
  for (int64_t i = 0; i < kTensors; ++i) {
    const at::Tensor local = at::rand({rows / n, kCols}, at::kFloat);
    state["layer" + std::to_string(i) + ".weight"] = api::from_local(local, mesh, {Shard(0)});
  }
  const std::string ckpt = base + "/ckpt", dd_file = base + "/dd-" + std::to_string(rank);
  // dd writes the same bytes: this rank's pieces, copied to a file in /dev/shm (memory, as the
  // tensors are) and written to a new file each time, as save writes new files.
  const std::string dd_src = "/dev/shm/dtensor_ckpt_bench_src-" + std::to_string(::getpid());
  {
    std::FILE* f = std::fopen(dd_src.c_str(), "wb");
    if (f == nullptr) throw std::runtime_error("cannot create " + dd_src);
    for (const auto& [key, v] : state) {
      const at::Tensor piece = api::local(std::get<at::Tensor>(v)).contiguous();
      std::fwrite(piece.data_ptr(), 1, piece.numel() * piece.element_size(), f);
    }
    std::fclose(f);
  }
  const std::vector<Placement> layouts = {Shard(0), Shard(1)};
  std::vector<double> save_s, ddw_s;
  std::vector<std::vector<double>> load_s(layouts.size()), ddr_s(layouts.size());
  std::vector<int64_t> extra(layouts.size(), 0);

  for (int64_t rep = 0; rep < repeats; ++rep) {
    // Each write goes to a new place: the previous copy is removed and the removal synced
    // outside the timing (the disk here is mounted with discard: deleting 1 GiB costs about as
    // much as writing it, and would land in whichever measurement comes next).
    if (rank == 0) fs::remove_all(ckpt);
    fs::remove(dd_file);
    ::sync();
    save_s.push_back(timed([&] { checkpoint::save(state, ckpt); }));
    ddw_s.push_back(timed([&] {
      run_shell("dd if=" + dd_src + " of=" + dd_file + " bs=1M conv=fsync status=none");
    }));
    for (size_t l = 0; l < layouts.size(); ++l) {
      std::map<std::string, checkpoint::Value> into;
      for (const auto& [key, v] : state)
        into[key] = api::empty({rows, kCols}, mesh, {layouts[l]}, at::TensorOptions(at::kFloat));
      for (auto& [key, v] : into) api::local(std::get<at::Tensor>(v)).fill_(0);  // resident
      drop_dir_cache(ckpt);
      drop_cache(dd_file);
      const int64_t rss_before = status_kib("VmRSS");
      reset_peak_rss();
      load_s[l].push_back(timed([&] { checkpoint::load(into, ckpt); }));
      extra[l] = std::max(extra[l], status_kib("VmHWM") - rss_before);
      ddr_s[l].push_back(
          timed([&] { run_shell("dd if=" + dd_file + " of=/dev/null bs=1M status=none"); }));
      // The loaded pieces equal the saved tensors' (outside the timing).
      for (const auto& [key, v] : state) {
        const at::Tensor got = api::redistribute(std::get<at::Tensor>(into.at(key)), {Shard(0)});
        if (!api::local(got).equal(api::local(std::get<at::Tensor>(v))))
          throw std::runtime_error("loaded " + key + " differs from the saved tensor");
      }
    }
  }
  if (rank == 0) print("save", "Shard(0)", n, per_rank, median(save_s), median(ddw_s), -1);
  for (size_t l = 0; l < layouts.size(); ++l) {
    const at::Tensor extras = collectives::all_gather_into_tensor(
        at::full({1}, extra[l], at::kLong), 0, collectives::RankContext::kWorld);
    if (rank == 0)
      print("load", layouts[l].is_shard(0) ? "Shard(0)" : "Shard(1)", n, per_rank,
            median(load_s[l]), median(ddr_s[l]), extras.max().item<int64_t>());
  }
  collectives::barrier(collectives::RankContext::kWorld);
  if (rank == 0) fs::remove_all(ckpt);
  fs::remove(dd_file);
  fs::remove(dd_src);
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::cli::parse_command_line(
      argc, argv,
      "./x bench checkpoint: save/load bandwidth per rank next to dd in the same run.\n"
      "  checkpoint_bench [--sizes-mib 256,1024,2048] [--ranks 4] [--repeats 3] [--dir DIR]");
  const int64_t n = absl::GetFlag(FLAGS_ranks);
  std::string base = absl::GetFlag(FLAGS_dir);
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    base = std::string(tmp && *tmp ? tmp : "/tmp") + "/dtensor_ckpt_bench";
  }
  fs::create_directories(base);
  std::printf("scratch directory: %s; page cache dropped per file (posix_fadvise DONTNEED)\n",
              base.c_str());
  std::printf("%-5s %-9s %5s %14s %9s %9s %9s %10s\n", "op", "layout", "ranks", "bytes/rank",
              "GB/s", "dd_GB/s", "ratio", "peak+MiB");
  std::fflush(stdout);
  int failures = 0;
  for (int64_t mib : absl::GetFlag(FLAGS_sizes_mib).values) {
    if (mib < 16 || mib % (16 * n) != 0) {
      std::fprintf(stderr, "checkpoint_bench: --sizes-mib: %lld is not a multiple of %lld\n",
                   static_cast<long long>(mib), static_cast<long long>(16 * n));
      return 2;
    }
    const int port = dtensor::testing::free_port();
    const auto codes = dtensor::testing::run_forked(
        static_cast<int>(n),
        [&](int r) {
          dtensor::testing::set_launch_env(r, static_cast<int>(n), port);
          at::set_num_threads(1);
          auto ctx = api::init_from_env("shm");
          run_size(r, n, mib, absl::GetFlag(FLAGS_repeats), base);
          return 0;
        },
        std::chrono::seconds(1800));
    for (int c : codes) failures += c != 0;
  }
  return failures == 0 ? 0 : 1;
}
