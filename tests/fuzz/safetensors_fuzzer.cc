// Fuzz target: the checkpoint data-file reader (checkpoint/safetensors.h, SafetensorsFile): the
// 8-byte header length, the JSON header (dtypes, shapes, data offsets, __metadata__) and the
// reads of each tensor's bytes, as a load meets them in any file handed to it.
// Property (NOTE [fuzz property]): opening the file gives a validated header or dtensor::Error;
// every entry the reader accepts lies inside the file, has as many bytes as its dtype and shape
// say, and reads back whole without error.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtensor;
  const std::string_view input = fuzz::as_text(data, size);
  static const std::string path = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    return std::string(tmp != nullptr ? tmp : "/tmp") + "/safetensors_fuzzer." +
           std::to_string(::getpid()) + ".safetensors";
  }();
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return 0;
    if (size > 0) std::fwrite(data, 1, size, f);  // data may be null when size is 0
    std::fclose(f);
  }
  std::unique_ptr<checkpoint::SafetensorsFile> file;
  if (fuzz::parses(input, [&] { file = std::make_unique<checkpoint::SafetensorsFile>(path); })) {
    std::vector<char> buf;
    for (const checkpoint::SafetensorsEntry& e : file->entries()) {
      FUZZ_CHECK(e.begin >= 0 && e.begin <= e.end && e.end <= file->size(), input,
                 "entry '" + e.name + "' lies outside the file");
      int64_t bytes = e.element_size;
      bool overflow = false;
      for (int64_t s : e.shape) overflow |= s < 0 || __builtin_mul_overflow(bytes, s, &bytes);
      FUZZ_CHECK(!overflow && e.end - e.begin == bytes, input,
                 "entry '" + e.name + "' has a byte count its dtype and shape do not give");
      buf.resize(static_cast<size_t>(e.end - e.begin));
      FUZZ_CHECK(fuzz::parses(input, [&] { file->read(e, 0, e.end - e.begin, buf.data()); }), input,
                 "entry '" + e.name + "' was accepted but does not read back");
    }
  }
  ::unlink(path.c_str());
  return 0;
}
