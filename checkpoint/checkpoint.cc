#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <stdio.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "base/error.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/safetensors.h"
#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "dtensor/api.h"
#include "dtensor/local_tensor.h"
#include "layout/shard_layout.h"

namespace dtensor::checkpoint {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using collectives::current_context;
using collectives::has_current_context;
using collectives::RankContext;

// A job of several ranks (they write rank-<r>.safetensors and talk over the world group);
// otherwise one process (model.safetensors, no collectives).
bool multi_rank() { return has_current_context() && current_context().world_size() > 1; }
int64_t my_rank() { return has_current_context() ? current_context().rank() : 0; }

std::string data_file(int64_t rank, bool multi) {
  return multi ? "rank-" + std::to_string(rank) + ".safetensors" : kSingleFile;
}

std::string strip_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

json encode_value(const std::string& key, const Value& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return {{"int", *i}};
  if (const auto* d = std::get_if<double>(&value)) {
    DTENSOR_CHECK(std::isfinite(*d), "checkpoint.save: value '", key, "' is ", *d,
                  ": JSON holds finite numbers only");
    return {{"float", *d}};
  }
  if (const auto* s = std::get_if<std::string>(&value)) return {{"string", *s}};
  const auto& text = std::get<Json>(value).text;
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  DTENSOR_CHECK(!parsed.is_discarded(), "checkpoint.save: value '", key,
                "' is not valid JSON text: ", text.substr(0, 80));
  return {{"json", std::move(parsed)}};
}

// The box written for one chunk and the tensor this rank writes for it.
struct PlannedChunk {
  LocalBox box;
  int64_t writer = 0;
};

// Swaps the finished `tmp` into `dir`: one atomic exchange where the file system allows it, so a
// crash leaves either the old or the new checkpoint at `dir`; then removes the old one.
void publish(const std::string& tmp, const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir)) {
    fs::rename(tmp, dir, ec);
    DTENSOR_CHECK(!ec, "checkpoint.save: cannot rename ", tmp, " to ", dir, ": ", ec.message());
  } else if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp, ec);  // now the previous checkpoint
  } else {
    // No RENAME_EXCHANGE (e.g. some network file systems): two renames; between them the
    // previous checkpoint is at <dir>.old, which load names when <dir> is missing.
    const std::string old = dir + ".old";
    fs::remove_all(old, ec);
    fs::rename(dir, old, ec);
    DTENSOR_CHECK(!ec, "checkpoint.save: cannot move ", dir, " aside: ", ec.message());
    fs::rename(tmp, dir, ec);
    DTENSOR_CHECK(!ec, "checkpoint.save: cannot rename ", tmp, " to ", dir, ": ", ec.message());
    fs::remove_all(old, ec);
  }
  const fs::path parent = fs::absolute(dir).parent_path();
  fsync_path(parent.string());
}

// int64 on the device the world's collectives take (NOTE [control tensors]).
at::TensorOptions control_options() {
  return at::TensorOptions(at::kLong).device(collectives::group_device(RankContext::kWorld));
}

// all_reduce(max) of a flag over the world: true when any rank raised it. Single process: `flag`.
bool any_rank(bool flag) {
  if (!multi_rank()) return flag;
  // NOTE [control tensors]: on the world's device (NCCL takes CUDA tensors only).
  const at::Tensor t = at::full({1}, flag ? 1 : 0, control_options());
  return collectives::all_reduce(t, ReduceOp::kMax, RankContext::kWorld).item<int64_t>() != 0;
}

}  // namespace

void save(const std::map<std::string, Value>& state, const std::string& dir_arg,
          const SaveOptions& options) {
  DTENSOR_CHECK(!dir_arg.empty(), "checkpoint.save: the directory is empty");
  const std::string dir = strip_slashes(dir_arg);
  const bool multi = multi_rank();
  const int64_t rank = my_rank();
  const int64_t world = multi ? current_context().world_size() : 1;
  const std::string tmp = dir + ".saving";

  // Rank 0 prepares an empty staging directory; the barrier orders it before every write.
  std::string prepare_error;
  if (rank == 0) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec) prepare_error = "cannot create " + tmp + ": " + ec.message();
  }
  if (any_rank(!prepare_error.empty()))
    fail("checkpoint.save: ",
         prepare_error.empty() ? "rank 0 failed: see its error" : prepare_error);

  // The plan: every rank computes every chunk (and its writer) from the layouts alone, so rank 0
  // can write the index without receiving anything but the files' sizes and checksums.
  json tensors = json::object(), values = json::object(), weight_map = json::object();
  std::vector<std::pair<std::string, at::Tensor>> mine;
  int64_t total_bytes = 0;
  for (const auto& [key, value] : state) {
    const auto* tensor = std::get_if<at::Tensor>(&value);
    if (tensor == nullptr) continue;  // values: rank 0's, encoded below
    DTENSOR_CHECK(tensor->defined(), "checkpoint.save: tensor '", key, "' is undefined");
    at::Tensor t = *tensor;
    std::vector<PlannedChunk> chunks;
    std::vector<int64_t> shape;
    at::Tensor piece;
    if (is_dtensor(t)) {
      DTensorSpec spec = api::spec(t);
      if (spec.has_partial() || spec.has_strided_shard()) {
        // Reduce first: each element then has one value, held by the Shard/Replicate owners.
        // A general strided shard's pieces are not boxes (NOTE [strided shards]): it is
        // gathered too, so the chunks are boxes.
        Placements reduced = spec.placements();
        for (auto& p : reduced)
          if (p.is_partial() || p.is_strided_shard()) p = Replicate();
        t = api::redistribute(t, reduced);
        spec = api::spec(t);
      }
      shape = spec.shape();
      piece = api::local(t);
      std::vector<int64_t> ranks = spec.mesh().ranks();
      std::sort(ranks.begin(), ranks.end());
      if (numel_of(shape) == 0) {
        chunks.push_back({LocalBox{shape, std::vector<int64_t>(shape.size(), 0)}, ranks.front()});
        if (rank == ranks.front()) piece = at::empty(shape, piece.options());
      } else {
        // One chunk per distinct box, written by the lowest rank holding it (boxes of one layout
        // are equal or disjoint).
        for (int64_t r : ranks) {
          const LocalBox b = *local_box_of_rank(spec, r);
          if (b.numel() == 0) continue;
          bool seen = false;
          for (const auto& c : chunks) seen = seen || c.box == b;
          if (!seen) chunks.push_back({b, r});
        }
      }
    } else {
      shape = t.sizes().vec();
      piece = t;
      chunks.push_back({LocalBox{shape, std::vector<int64_t>(shape.size(), 0)}, 0});
    }
    const bool whole = chunks.size() == 1 && chunks[0].box.shape == shape;
    json chunk_list = json::array();
    for (size_t i = 0; i < chunks.size(); ++i) {
      const std::string name = whole ? key : key + "#" + std::to_string(i);
      const std::string file = data_file(chunks[i].writer, multi);
      DTENSOR_CHECK(!weight_map.contains(name), "checkpoint.save: key '", key,
                    "' collides with the chunk name '", name, "' of another key");
      weight_map[name] = file;
      chunk_list.push_back({{"offsets", chunks[i].box.offset},
                            {"sizes", chunks[i].box.shape},
                            {"file", file},
                            {"name", name}});
      if (chunks[i].writer == rank) mine.emplace_back(name, piece.detach());
    }
    const at::ScalarType dtype = t.scalar_type();
    total_bytes += numel_of(shape) * static_cast<int64_t>(c10::elementSize(dtype));
    tensors[key] = {{"dtype", safetensors_dtype(dtype)}, {"shape", shape}, {"chunks", chunk_list}};
  }

  // Data: each writing rank its own file, fsynced. A failure is flagged to every rank below.
  FileStats stats;
  std::string write_error;
  try {
    // Rank 0's values go to the index; encoding can fail (a NaN), so it sits inside the flagged
    // section: a failure on one rank must not leave the others waiting in the collective.
    if (rank == 0)
      for (const auto& [key, value] : state)
        if (!std::holds_alternative<at::Tensor>(value)) values[key] = encode_value(key, value);
    if (!mine.empty())
      stats = write_safetensors(tmp + "/" + data_file(rank, multi), mine, {{"format", "pt"}});
    if (options.on_stage) options.on_stage("data_written");
  } catch (const std::exception& e) {
    write_error = e.what();
  }
  // Sizes and checksums of every rank's file; also the barrier after which all data is durable.
  at::Tensor mine_stats = at::tensor({static_cast<int64_t>(write_error.empty() ? 0 : 1),
                                      static_cast<int64_t>(mine.empty() ? 0 : 1), stats.size,
                                      static_cast<int64_t>(stats.crc32)},
                                     at::kLong)
                              .view({1, 4});
  const at::Tensor all_stats = multi ? collectives::all_gather_into_tensor(
                                           mine_stats.to(control_options()), 0, RankContext::kWorld)
                                           .cpu()
                                     : mine_stats;
  for (int64_t r = 0; r < world; ++r) {
    if (all_stats[r][0].item<int64_t>() == 0) continue;
    if (r == rank) fail("checkpoint.save: writing ", dir, " failed on rank ", r, ": ", write_error);
    fail("checkpoint.save: writing ", dir, " failed on rank ", r, " (see its error); ", dir,
         " keeps its previous checkpoint");
  }

  // Rank 0: the index, then the swap into place; the other ranks wait for its verdict.
  std::string index_error;
  if (rank == 0) {
    try {
      json files = json::object();
      for (int64_t r = 0; r < world; ++r)
        if (all_stats[r][1].item<int64_t>() != 0)
          files[data_file(r, multi)] = {{"size", all_stats[r][2].item<int64_t>()},
                                        {"crc32", all_stats[r][3].item<int64_t>()}};
      const json index = {
          {"format_version", kFormatVersion},
          {"metadata", {{"total_size", total_bytes}, {"format", "dtensor-checkpoint"}}},
          {"weight_map", weight_map},
          {"tensors", tensors},
          {"files", files},
          {"values", values}};
      write_index_file(tmp + "/" + kIndexFile, index.dump(1));
      fsync_path(tmp);
      if (options.on_stage) options.on_stage("index_written");
      publish(tmp, dir);
    } catch (const std::exception& e) {
      index_error = e.what();
    }
  }
  if (any_rank(!index_error.empty())) {
    if (rank == 0)
      fail("checkpoint.save: writing the index of ", dir, " failed (", dir,
           " keeps its previous checkpoint): ", index_error);
    fail("checkpoint.save: rank 0 failed to write the index of ", dir, " (see its error)");
  }
}

void load(std::map<std::string, Value>& state, const std::string& dir_arg,
          const LoadOptions& options) {
  const std::string dir = strip_slashes(dir_arg);
  Index index = read_index(dir);
  check_state_against_index(state, index);
  check_files(index);
  if (options.verify_checksums) {
    // Each file is verified by one rank (file i by rank i mod world); the verdicts are summed
    // over the world so every rank fails naming the same file.
    const bool multi = multi_rank();
    const int64_t world = multi ? current_context().world_size() : 1, rank = my_rank();
    std::vector<std::string> names;
    for (const auto& [name, info] : index.files)
      if (info.crc32) names.push_back(name);
    at::Tensor bad = at::zeros({static_cast<int64_t>(names.size()) + 1}, at::kLong);
    for (size_t i = 0; i < names.size(); ++i) {
      if (static_cast<int64_t>(i) % world != rank) continue;
      try {
        if (index.open(names[i]).checksum() != *index.files.at(names[i]).crc32) bad[i] = 1;
      } catch (const std::exception&) {
        bad[i] = 1;
      }
    }
    if (multi) {
      bad = collectives::all_reduce(bad.to(control_options()), ReduceOp::kSum, RankContext::kWorld)
                .cpu();
    }
    for (size_t i = 0; i < names.size(); ++i)
      if (bad[i].item<int64_t>() != 0)
        fail("checkpoint.load: checksum mismatch in data file ", dir, "/", names[i],
             " (CRC-32 differs from the index's): it holds ", index.keys_in(names[i]));
  }

  at::NoGradGuard no_grad;
  for (auto& [key, value] : state) {
    if (auto* tensor = std::get_if<at::Tensor>(&value)) {
      load_tensor(*tensor, key, index);
    } else {
      value = decode_value(key, index);
    }
  }
}

}  // namespace dtensor::checkpoint
