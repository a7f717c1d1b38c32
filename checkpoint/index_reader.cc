// The reading of a checkpoint's index (NOTE [checkpoint format] in checkpoint.h), apart from the
// rest of load so that it depends on no part of the engine: tests/fuzz:checkpoint_index_fuzzer
// runs it on any index text.

#include <c10/util/ArrayRef.h>
#include <c10/util/StringUtil.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "checkpoint/checkpoint_index.h"

namespace dtensor::checkpoint {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::vector<int64_t> int_list(const json& j, const std::string& what) {
  DTENSOR_CHECK(j.is_array(), "checkpoint.load: ", what, " is not a list of integers");
  std::vector<int64_t> out;
  for (const auto& v : j) {
    DTENSOR_CHECK(v.is_number_integer(), "checkpoint.load: ", what, " is not a list of integers");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

// A tensor stored whole in one file (a Hugging Face model): one chunk covering it.
TensorRecord whole_record(const SafetensorsEntry& e, const std::string& file) {
  TensorRecord r{e.dtype, e.shape, {}};
  r.chunks.push_back({std::vector<int64_t>(e.shape.size(), 0), e.shape, file, e.name});
  return r;
}

void parse_ours(const json& j, const std::string& path, Index& index) {
  const auto need = [&](const json& v, const char* field, bool ok) {
    DTENSOR_CHECK(ok, "checkpoint.load: ", path, ": field '", field, "' is missing or malformed");
    (void)v;
  };
  need(j, "tensors", j.contains("tensors") && j["tensors"].is_object());
  for (const auto& [key, t] : j["tensors"].items()) {
    const std::string what = "tensor '" + key + "' of " + path;
    DTENSOR_CHECK(t.is_object() && t.contains("dtype") && t["dtype"].is_string() &&
                      t.contains("shape") && t.contains("chunks") && t["chunks"].is_array(),
                  "checkpoint.load: ", what, " lacks dtype, shape or chunks");
    TensorRecord r;
    r.dtype = t["dtype"].get<std::string>();
    scalar_type_of(r.dtype, what);
    r.shape = int_list(t["shape"], what + " shape");
    for (int64_t s : r.shape)
      DTENSOR_CHECK(s >= 0, "checkpoint.load: ", what, " has a negative size in its shape");
    for (const auto& c : t["chunks"]) {
      DTENSOR_CHECK(c.is_object() && c.contains("offsets") && c.contains("sizes") &&
                        c.contains("file") && c["file"].is_string() && c.contains("name") &&
                        c["name"].is_string(),
                    "checkpoint.load: a chunk of ", what, " lacks offsets, sizes, file or name");
      ChunkRecord ch{int_list(c["offsets"], what + " chunk offsets"),
                     int_list(c["sizes"], what + " chunk sizes"), c["file"].get<std::string>(),
                     c["name"].get<std::string>()};
      DTENSOR_CHECK(ch.offsets.size() == r.shape.size() && ch.sizes.size() == r.shape.size(),
                    "checkpoint.load: a chunk of ", what, " has the wrong rank");
      for (size_t d = 0; d < r.shape.size(); ++d)
        DTENSOR_CHECK(  // no overflow: offsets and sizes are checked non-negative first
            ch.offsets[d] >= 0 && ch.sizes[d] >= 0 && ch.offsets[d] <= r.shape[d] &&
                ch.sizes[d] <= r.shape[d] - ch.offsets[d],
            "checkpoint.load: chunk '", ch.name, "' of ", what, " leaves the shape ",
            shape_text(r.shape));
      DTENSOR_CHECK(ch.file.find('/') == std::string::npos && ch.file != ".." && !ch.file.empty(),
                    "checkpoint.load: ", what, " names a file outside the checkpoint: ", ch.file);
      r.chunks.push_back(std::move(ch));
    }
    index.tensors[key] = std::move(r);
  }
  if (j.contains("files")) {
    need(j, "files", j["files"].is_object());
    for (const auto& [file, f] : j["files"].items()) {
      FileRecord rec;
      if (f.contains("size") && f["size"].is_number_integer()) rec.size = f["size"].get<int64_t>();
      if (f.contains("crc32") && f["crc32"].is_number_integer())
        rec.crc32 = static_cast<uint32_t>(f["crc32"].get<int64_t>());
      index.files[file] = rec;
    }
  }
  if (j.contains("values")) {
    need(j, "values", j["values"].is_object());
    for (const auto& [key, v] : j["values"].items()) index.values[key] = v.dump();
  }
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) {
  return c10::str(c10::IntArrayRef(shape));
}

const SafetensorsFile& Index::open(const std::string& file) {
  auto& slot = opened_[file];
  if (!slot) slot = std::make_unique<SafetensorsFile>(dir + "/" + file);
  return *slot;
}

std::string Index::keys_in(const std::string& file) const {
  std::string out;
  for (const auto& [key, t] : tensors) {
    bool in = false;
    for (const auto& c : t.chunks) in = in || c.file == file;
    if (in) out += (out.empty() ? "'" : ", '") + key + "'";
  }
  return out.empty() ? "no tensor" : out;
}

Index read_index(const std::string& dir) {
  Index index;
  index.dir = dir;
  const std::string path = dir + "/" + kIndexFile;
  if (!fs::exists(path)) {
    const std::string single = dir + "/" + kSingleFile;
    if (!fs::exists(single)) {
      std::string hint;
      if (fs::exists(dir + ".old"))
        hint =
            "; a save was interrupted while swapping: the previous checkpoint is " + dir + ".old";
      fail("checkpoint.load: ", dir, " holds neither ", kIndexFile, " nor ", kSingleFile, hint);
    }
    index.source = single;
    for (const auto& e : index.open(kSingleFile).entries())
      index.tensors[e.name] = whole_record(e, kSingleFile);
    index.files[kSingleFile] = {};
    return index;
  }
  index.source = path;
  std::ifstream in(path, std::ios::binary);
  DTENSOR_CHECK(in.good(), "checkpoint.load: cannot read ", path);
  std::stringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  DTENSOR_CHECK(j.is_object(), "checkpoint.load: ", path, " is not a JSON object (truncated?)");
  if (j.contains("format_version")) {
    DTENSOR_CHECK(j["format_version"].is_number_integer(), "checkpoint.load: ", path,
                  ": format_version is not an integer");
    const int64_t v = j["format_version"].get<int64_t>();
    DTENSOR_CHECK(v <= kFormatVersion, "checkpoint.load: ", path, " has format_version ", v,
                  ", newer than this engine reads (", kFormatVersion,
                  "); load it with a newer dtensor");
    parse_ours(j, path, index);
    return index;
  }
  // A Hugging Face sharded model: weight_map only; shapes and dtypes come from the files.
  DTENSOR_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), "checkpoint.load: ", path,
                " has neither format_version nor weight_map");
  for (const auto& [name, file] : j["weight_map"].items()) {
    DTENSOR_CHECK(file.is_string(), "checkpoint.load: weight_map entry '", name, "' of ", path,
                  " is not a file name");
    const std::string f = file.get<std::string>();
    const SafetensorsEntry* e = index.open(f).find(name);
    DTENSOR_CHECK(e != nullptr, "checkpoint.load: key '", name, "' is in the weight_map of ", path,
                  " but not in its file ", dir, "/", f);
    index.tensors[name] = whole_record(*e, f);
    index.files[f] = {};
  }
  return index;
}

}  // namespace dtensor::checkpoint
