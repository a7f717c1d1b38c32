#pragma once
// Internal to checkpoint/: the index of a checkpoint as load sees it (NOTE [checkpoint format] in
// checkpoint.h), the checks that decide from it alone whether a state can be loaded (so every
// rank decides alike and raises the same error), and the box-intersection reads.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"

namespace dtensor::checkpoint {

struct ChunkRecord {
  std::vector<int64_t> offsets, sizes;
  std::string file;  // relative to the checkpoint directory
  std::string name;  // inside the file
};

struct TensorRecord {
  std::string dtype;  // safetensors spelling
  std::vector<int64_t> shape;
  std::vector<ChunkRecord> chunks;
};

struct FileRecord {
  std::optional<int64_t> size;    // absent for a plain Hugging Face model
  std::optional<uint32_t> crc32;  // likewise
};

// Parsed from the text of the index value {"int": ...} etc.; kept as JSON text here so this
// header needs no JSON library.
struct Index {
  std::string dir;
  std::string source;  // the file the keys came from: the index, or model.safetensors
  std::map<std::string, TensorRecord> tensors;
  std::map<std::string, std::string> values;  // key -> its JSON encoding
  std::map<std::string, FileRecord> files;

  // The data file `file` (opened once, header parsed and validated).
  const SafetensorsFile& open(const std::string& file);
  // "'a', 'b'": the keys with a chunk in `file` (for error messages).
  std::string keys_in(const std::string& file) const;

 private:
  std::map<std::string, std::unique_ptr<SafetensorsFile>> opened_;
};

// "[2, 3]": a shape in error messages.
std::string shape_text(const std::vector<int64_t>& shape);
// Reads `dir`'s index (ours, a Hugging Face one with only weight_map, or a lone
// model.safetensors). Throws naming the file for unreadable JSON or a newer format_version.
Index read_index(const std::string& dir);
// Missing and unexpected keys, tensor-vs-value kinds, shapes and dtypes; throws naming every key
// wrong and its file.
void check_state_against_index(const std::map<std::string, Value>& state, const Index& index);
// Every data file exists with its recorded size, and every chunk is in its file with the right
// dtype and shape; throws naming the file and its keys.
void check_files(Index& index);
// Fills `tensor` (distributed or plain) with its box of `key`.
void load_tensor(at::Tensor& tensor, const std::string& key, Index& index);
// The saved non-tensor value of `key`.
Value decode_value(const std::string& key, const Index& index);
// Writes `text` to `path` through `path`.tmp, fsync and rename.
void write_index_file(const std::string& path, const std::string& text);

}  // namespace dtensor::checkpoint
