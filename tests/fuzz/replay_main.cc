// main() of a fuzz target's corpus test (and of its build without libFuzzer): every file under the
// directories or files named on the command line goes once through LLVMFuzzerTestOneInput, one
// gtest case per file. With gcc in the normal build this replays the checked-in seed corpus as a
// regression test (also under ./x test --asan); `bazel run //tests/fuzz:NAME_corpus_test --
// $PWD/crash-...` replays a reproducer without clang.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

class ReplayFile : public testing::Test {
 public:
  explicit ReplayFile(fs::path path) : path_(std::move(path)) {}
  void TestBody() override {
    std::ifstream in(path_, std::ios::binary);
    ASSERT_TRUE(in) << "cannot read " << path_;
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    // A copy of exactly the file's size, so ASan sees reads past the end as libFuzzer would.
    std::vector<uint8_t> data(bytes.begin(), bytes.end());
    EXPECT_EQ(LLVMFuzzerTestOneInput(data.data(), data.size()), 0);
  }

 private:
  fs::path path_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path root = argv[i];
    if (fs::is_directory(root)) {
      for (const auto& e : fs::recursive_directory_iterator(root)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else {
      files.push_back(root);
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...: no input files\n", argv[0]);
    return 1;
  }
  for (const fs::path& f : files) {
    testing::RegisterTest("Corpus", f.filename().c_str(), nullptr, nullptr, __FILE__, __LINE__,
                          [f]() -> testing::Test* { return new ReplayFile(f); });
  }
  return RUN_ALL_TESTS();
}
