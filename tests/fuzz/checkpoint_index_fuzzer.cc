// Fuzz target: the checkpoint index reader (checkpoint/index_reader.cc, read_index), the first
// thing every rank's load reads: format_version, tensors with their chunk boxes, files with sizes
// and checksums, values, or a Hugging Face weight_map.
// Property (NOTE [fuzz property]): an Index or dtensor::Error; every chunk of an accepted index
// lies inside its tensor's shape and names a file inside the checkpoint directory.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "checkpoint/checkpoint_index.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtensor;
  const std::string_view input = fuzz::as_text(data, size);
  static const std::string dir = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string d = std::string(tmp != nullptr ? tmp : "/tmp") + "/checkpoint_index_fuzzer." +
                    std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  const std::string path = dir + "/" + checkpoint::kIndexFile;
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return 0;
    if (size > 0) std::fwrite(data, 1, size, f);  // data may be null when size is 0
    std::fclose(f);
  }
  checkpoint::Index index;
  if (fuzz::parses(input, [&] { index = checkpoint::read_index(dir); })) {
    for (const auto& [key, t] : index.tensors) {
      for (const checkpoint::ChunkRecord& c : t.chunks) {
        FUZZ_CHECK(c.offsets.size() == t.shape.size() && c.sizes.size() == t.shape.size(), input,
                   "a chunk of '" + key + "' has the wrong rank");
        for (size_t d = 0; d < t.shape.size(); ++d) {
          FUZZ_CHECK(c.offsets[d] >= 0 && c.sizes[d] >= 0 && c.offsets[d] <= t.shape[d] &&
                         c.sizes[d] <= t.shape[d] - c.offsets[d],
                     input, "a chunk of '" + key + "' leaves its shape");
        }
        FUZZ_CHECK(!c.file.empty() && c.file.find('/') == std::string::npos && c.file != "..",
                   input, "'" + key + "' names a file outside the checkpoint: " + c.file);
      }
    }
  }
  return 0;
}
