#pragma once
// One safetensors file (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON header (name -> {"dtype", "shape", "data_offsets": [begin, end]},
// offsets relative to the first byte after the header, plus an optional "__metadata__" map of
// strings), then the raw little-endian bytes of every tensor.
//
// The writer streams: the header first, then each tensor's bytes straight from its storage
// (write(2), no staging copy), then fsync. The reader parses and validates the header once
// (every offset against the file size, every byte count against dtype x shape, no overlaps)
// and reads any byte range of a tensor with pread(2), so a rank reads only the rows of a box it
// needs. Every call that fails throws dtensor::Error naming the file (and the tensor).
//
// Checksums are CRC-32 (the IEEE polynomial of zlib and Python's zlib.crc32) over the whole
// file, so any tool can verify them without this engine.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dtensor::checkpoint {

// The safetensors spelling of a dtype: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL. Throws for
// dtypes safetensors cannot hold here (complex, quantized).
std::string safetensors_dtype(at::ScalarType type);
// The inverse; throws naming `name` (and `context`, e.g. the file) for an unknown spelling.
at::ScalarType scalar_type_of(const std::string& name, const std::string& context = "");

// CRC-32 (computed by zlib) of `n` bytes continuing from `crc` (start with 0).
uint32_t crc32(uint32_t crc, const void* data, size_t n);

// What a write produced: the file's size and its CRC-32 (header included).
struct FileStats {
  int64_t size = 0;
  uint32_t crc32 = 0;
};

// Writes `tensors` (name, tensor) in the order given to `path` (created or truncated), then
// fsyncs it. Tensors are written from contiguous CPU copies (a contiguous CPU tensor is written
// from its own storage). Names must be distinct.
FileStats write_safetensors(const std::string& path,
                            const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                            const std::map<std::string, std::string>& metadata = {});

// One tensor of a safetensors file.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as the file spells it
  at::ScalarType scalar_type = at::kFloat;
  std::vector<int64_t> shape;
  int64_t begin = 0;  // absolute byte offsets in the file
  int64_t end = 0;
  int64_t element_size = 0;
};

// An open safetensors file with its parsed, validated header. Not copyable; closes on
// destruction. Reads are pread(2) and thread safe.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The entry named `name`, or null.
  const SafetensorsEntry* find(const std::string& name) const;

  // Reads `n` bytes starting `offset` bytes into `entry`'s data into `dst`; throws when the
  // range leaves the entry or the file ends early.
  void read(const SafetensorsEntry& entry, int64_t offset, int64_t n, void* dst) const;
  // One piece of a batched read: `n` bytes at `offset` bytes into an entry's data, into `dst`.
  struct Run {
    int64_t offset;
    int64_t n;
    void* dst;
  };
  // Reads every run of `runs` (sorted by offset, disjoint) of `entry`, as read() each would.
  // NOTE [gathered reads]: runs closer than a page (4 KiB) are read by one preadv(2), the bytes
  // between them going to a scratch page and dropped, up to IOV_MAX pieces per call: a column
  // slice of a row-major chunk (1 KiB of every 4 KiB row) takes one system call per ~500 rows
  // instead of one per row, and reads no extra page (the kernel reads whole pages anyway).
  // Only the runs' bytes count as tensor bytes read.
  void read_runs(const SafetensorsEntry& entry, const std::vector<Run>& runs) const;
  // CRC-32 of the whole file (read in 4 MiB pieces).
  uint32_t checksum() const;

 private:
  void pread_all(int64_t offset, int64_t n, void* dst) const;

  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// Bytes of tensor data the calling thread has read through SafetensorsFile::read (headers and
// checksums not counted): lets tests check that a rank reads only its box.
int64_t tensor_bytes_read_by_this_thread();

// File-system helpers shared with checkpoint.cc: fsync a path (file or directory); throw naming
// the path and errno on failure.
void fsync_path(const std::string& path);

}  // namespace dtensor::checkpoint
