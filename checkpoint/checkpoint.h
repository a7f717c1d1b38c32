#pragma once
// Sharded checkpoints (PyTorch DCP's save/load, in C++): save a map of names to distributed
// tensors of any layout, plain tensors and non-tensor values; load it into tensors of any other
// layout, mesh or number of ranks. The files are safetensors, plus a Hugging Face index.
//
// NOTE [checkpoint API header]
// This header is the public C++ API for checkpoints, next to dtensor/api.h. save/load are not in
// api.h because checkpoint/ sits above dtensor/ (it uses api.h's distributed tensors), and a
// declaration in api.h would need dtensor/ to depend on checkpoint/: a layer cycle (NOTE
// [layers]). Users include both headers.
//
//   std::map<std::string, dtensor::checkpoint::Value> state = {
//       {"w", w_dtensor}, {"b", b_plain}, {"step", int64_t{100}}};
//   dtensor::checkpoint::save(state, "/ckpt/step100");   // every rank of the world calls it
//   dtensor::checkpoint::load(state, "/ckpt/step100");   // fills state in place
//
// NOTE [checkpoint format] (format_version 1)
// A checkpoint is a directory:
//   - data files, each a valid safetensors file. Saved by a job of several ranks: one
//     `rank-<r>.safetensors` per rank that writes something; by one process (no rank context,
//     or a world of 1): `model.safetensors`, so a single-process checkpoint is a plain safetensors
//     model as it is.
//   - `model.safetensors.index.json`, Hugging Face's index extended:
//       {"format_version": 1,
//        "metadata": {"total_size": <data bytes>, "format": "dtensor-checkpoint"},
//        "weight_map": {<name inside a file>: <file>, ...},            // Hugging Face's
//        "tensors": {<key>: {"dtype": "F32", "shape": [...],
//                            "chunks": [{"offsets": [...], "sizes": [...],
//                                        "file": <file>, "name": <name inside the file>}]}},
//        "files": {<file>: {"size": <bytes>, "crc32": <CRC-32 of the whole file>}},
//        "values": {<key>: {"int": 5} | {"float": 0.5} | {"string": "s"} | {"json": <any>}}}
// Each distinct box of a tensor is one chunk, written once, by the lowest rank holding it
// (replicas deduplicated). The name inside the file is the key when the chunk is the whole tensor
// (so an unsharded checkpoint reads as an ordinary model), else "<key>#<chunk index>".
// Load accepts, besides this format: a directory with `model.safetensors` alone, or a Hugging
// Face sharded model whose index has only "weight_map" (each tensor one chunk, no checksums).
// A format_version above 1 is refused naming the index file.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <variant>

namespace dtensor::checkpoint {

inline constexpr int64_t kFormatVersion = 1;
inline constexpr const char* kIndexFile = "model.safetensors.index.json";
inline constexpr const char* kSingleFile = "model.safetensors";

// JSON text stored as JSON (parsed on save, so it must be valid; dumped compactly on load).
struct Json {
  std::string text;
  friend bool operator==(const Json& a, const Json& b) { return a.text == b.text; }
};

// One entry of a state: a tensor (a distributed tensor made by dtensor/api.h, or a plain tensor
// that every rank holds equal, saved by rank 0 as one chunk) or a non-tensor value (step
// counters, learning rates, names, configuration as JSON). A double must be finite.
using Value = std::variant<at::Tensor, int64_t, double, std::string, Json>;

struct SaveOptions {
  // Test hook: called on every rank with "data_written" (this rank's file is durable) and on
  // rank 0 with "index_written" (before the rename into place); an exception it throws aborts
  // the save as a crash there would (every rank fails, none hangs), leaving any previous
  // checkpoint in `dir` in place.
  std::function<void(const std::string& stage)> on_stage;
};

struct LoadOptions {
  // Verify each data file's CRC-32 against the index (each file is read whole by one rank and
  // the verdicts are shared, so every rank fails naming the file).
  bool verify_checksums = true;
};

// Saves `state` into directory `dir` (replacing a previous checkpoint there atomically). Every
// rank of the world calls it with the same keys in a state of the same kinds and layouts; plain
// tensors are taken from rank 0. Partial tensors are reduced first (one redistribute to
// Replicate on their Partial mesh dims). Data goes to `<dir>.saving`, every file is fsynced,
// rank 0 writes the index after a barrier, then swaps `<dir>.saving` with `<dir>` (renameat2
// RENAME_EXCHANGE; two renames where unsupported) and removes the old one. The ranks must share
// the file system. Throws dtensor::Error on any failure.
void save(const std::map<std::string, Value>& state, const std::string& dir,
          const SaveOptions& options = {});

// Loads the checkpoint in `dir` into `state` in place: each tensor (distributed, of any layout,
// or plain) receives its box of the saved tensor, each non-tensor value is replaced. Keys must
// match exactly (a missing or unexpected key, a shape or a dtype mismatch is an error naming the
// key and the file, decided from the index alone so every rank raises it). Each rank reads only
// the byte ranges of its own box, with pread straight into its piece: extra memory is zero for
// a contiguous CPU piece, else one contiguous copy of the piece; a Partial destination gets the
// value on coordinate 0 of its Partial mesh dims and the reduction's identity elsewhere (as
// distribute_tensor does). With verify_checksums, the world's ranks exchange one all_reduce.
void load(std::map<std::string, Value>& state, const std::string& dir,
          const LoadOptions& options = {});

}  // namespace dtensor::checkpoint
