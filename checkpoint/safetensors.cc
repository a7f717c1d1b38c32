#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace dtensor::checkpoint {
namespace {

using nlohmann::json;

// safetensors caps headers at 100 MB; a larger length is a corrupt file, not a big model.
constexpr int64_t kMaxHeader = int64_t{100} << 20;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this writer copies raw bytes");

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr std::array<DtypeName, 10> kDtypes = {{{at::kDouble, "F64"},
                                                {at::kFloat, "F32"},
                                                {at::kHalf, "F16"},
                                                {at::kBFloat16, "BF16"},
                                                {at::kLong, "I64"},
                                                {at::kInt, "I32"},
                                                {at::kShort, "I16"},
                                                {at::kChar, "I8"},
                                                {at::kByte, "U8"},
                                                {at::kBool, "BOOL"}}};

std::string errno_text() { return std::strerror(errno); }

thread_local int64_t tensor_bytes_read = 0;

void write_all(int fd, const void* data, int64_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Linux writes at most ~2 GiB per call; loop on short writes.
    const ssize_t w = ::write(fd, p, static_cast<size_t>(std::min<int64_t>(n, int64_t{1} << 30)));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("safetensors: cannot write ", path, ": ", errno_text());
    p += w;
    n -= w;
  }
}

}  // namespace

std::string safetensors_dtype(at::ScalarType type) {
  for (const auto& d : kDtypes)
    if (d.type == type) return d.name;
  fail("safetensors: dtype ", c10::toString(type),
       " has no safetensors spelling here (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
}

at::ScalarType scalar_type_of(const std::string& name, const std::string& context) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  fail("safetensors: unknown dtype '", name, "'", context.empty() ? "" : " in ", context,
       " (known: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
}

uint32_t crc32(uint32_t crc, const void* data, size_t n) {
  // zlib's (4+ GB/s here; a hand-written slicing-by-8 table loop was half that). zlib takes
  // uInt lengths: feed it at most 1 GiB at a time.
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {
    const size_t piece = std::min<size_t>(n, size_t{1} << 30);
    c = ::crc32(c, p, static_cast<uInt>(piece));
    p += piece;
    n -= piece;
  }
  return static_cast<uint32_t>(c);
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("checkpoint: cannot open ", path, " to fsync it: ", errno_text());
  const int rc = ::fsync(fd);
  const std::string err = rc != 0 ? errno_text() : "";
  ::close(fd);
  if (rc != 0) fail("checkpoint: fsync of ", path, " failed: ", err);
}

FileStats write_safetensors(const std::string& path,
                            const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                            const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> data;
  data.reserve(tensors.size());
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    DTENSOR_CHECK(name != "__metadata__" && !header.contains(name), "safetensors: tensor name '",
                  name, "' is repeated or reserved in ", path);
    // Raw bytes: a pending conjugation or negation is applied first (NOTE [lazy conjugate and
    // negative views] in collectives/functional.cc).
    at::Tensor t = tensor.cpu().resolve_conj().resolve_neg().contiguous();
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    header[name] = {{"dtype", safetensors_dtype(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(std::move(t));
  }
  std::string text = header.dump();
  // Pad with spaces so the data starts 8-byte aligned (what Hugging Face's writer does; a
  // reader that mmaps the file gets aligned tensors).
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));

  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("safetensors: cannot create ", path, ": ", errno_text());
  FileStats stats;
  try {
    write_all(fd, len, 8, path);
    write_all(fd, text.data(), static_cast<int64_t>(n), path);
    stats.crc32 = crc32(crc32(0, len, 8), text.data(), n);
    // NOTE [streamed writeback]: data goes out in 16 MiB pieces, and after each piece the
    // kernel is told to start writing it to disk (sync_file_range, asynchronous), so the disk
    // works while the next piece is copied and checksummed, instead of all at the final fsync.
    constexpr int64_t kPiece = int64_t{16} << 20;
    int64_t written = 8 + static_cast<int64_t>(n);
    for (const at::Tensor& t : data) {
      const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
      const char* p = static_cast<const char*>(t.data_ptr());
      for (int64_t at = 0; at < bytes; at += kPiece) {
        const int64_t len = std::min(kPiece, bytes - at);
        write_all(fd, p + at, len, path);
        ::sync_file_range(fd, written, len, SYNC_FILE_RANGE_WRITE);  // a hint: errors ignored
        stats.crc32 = crc32(stats.crc32, p + at, static_cast<size_t>(len));
        written += len;
      }
    }
    if (::fsync(fd) != 0) fail("safetensors: fsync of ", path, " failed: ", errno_text());
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) fail("safetensors: closing ", path, " failed: ", errno_text());
  stats.size = 8 + static_cast<int64_t>(n) + offset;
  return stats;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail("safetensors: cannot open ", path, ": ", errno_text());
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail("safetensors: cannot stat ", path, ": ", errno_text());
    size_ = st.st_size;
    DTENSOR_CHECK(size_ >= 8, "safetensors: ", path, " is truncated: ", size_,
                  " bytes, shorter than the 8-byte header length");
    uint8_t len[8];
    pread_all(0, 8, len);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t{len[i]} << (8 * i);
    DTENSOR_CHECK(n <= static_cast<uint64_t>(kMaxHeader) && static_cast<int64_t>(n) <= size_ - 8,
                  "safetensors: ", path, " is truncated or corrupt: its header claims ", n,
                  " bytes but the file has ", size_, " bytes");
    std::string text(n, '\0');
    pread_all(8, static_cast<int64_t>(n), text.data());
    const json header = json::parse(text, nullptr, /*allow_exceptions=*/false);
    DTENSOR_CHECK(header.is_object(), "safetensors: the header of ", path, " is not a JSON object");
    const int64_t data_start = 8 + static_cast<int64_t>(n);
    const int64_t data_size = size_ - data_start;
    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__") {
        DTENSOR_CHECK(value.is_object(), "safetensors: __metadata__ of ", path,
                      " is not an object");
        for (const auto& [k, v] : value.items()) {
          DTENSOR_CHECK(v.is_string(), "safetensors: __metadata__ '", k, "' of ", path,
                        " is not a string");
          metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      const std::string where = "tensor '" + name + "' of " + path;
      DTENSOR_CHECK(value.is_object() && value.contains("dtype") && value["dtype"].is_string() &&
                        value.contains("shape") && value["shape"].is_array() &&
                        value.contains("data_offsets") && value["data_offsets"].is_array() &&
                        value["data_offsets"].size() == 2,
                    "safetensors: ", where, " lacks dtype, shape or data_offsets");
      SafetensorsEntry e;
      e.name = name;
      e.dtype = value["dtype"].get<std::string>();
      e.scalar_type = scalar_type_of(e.dtype, where);
      e.element_size = static_cast<int64_t>(c10::elementSize(e.scalar_type));
      int64_t numel = 1;
      for (const auto& d : value["shape"]) {
        DTENSOR_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0, "safetensors: ", where,
                      " has a bad shape ", value["shape"].dump());
        e.shape.push_back(d.get<int64_t>());
        DTENSOR_CHECK(e.shape.back() == 0 || numel <= (int64_t{1} << 62) / e.shape.back(),
                      "safetensors: ", where, " has an absurd shape");
        numel *= e.shape.back();
      }
      const auto& off = value["data_offsets"];
      DTENSOR_CHECK(off[0].is_number_integer() && off[1].is_number_integer() &&
                        off[0].get<int64_t>() >= 0 &&
                        off[1].get<int64_t>() >= off[0].get<int64_t>(),
                    "safetensors: ", where, " has bad data_offsets ", off.dump());
      const int64_t b = off[0].get<int64_t>(), en = off[1].get<int64_t>();
      DTENSOR_CHECK(en <= data_size, "safetensors: ", path, " is truncated: ", where,
                    " ends at data byte ", en, " but the file holds ", data_size, " data bytes");
      DTENSOR_CHECK(en - b == numel * e.element_size, "safetensors: ", where, " has ", en - b,
                    " bytes for ", numel, " elements of ", e.dtype);
      e.begin = data_start + b;
      e.end = data_start + en;
      by_name_[name] = entries_.size();
      entries_.push_back(std::move(e));
    }
    // No two tensors may share bytes (empty tensors hold none, wherever their offsets point).
    std::vector<const SafetensorsEntry*> sorted;
    for (const auto& e : entries_)
      if (e.end > e.begin) sorted.push_back(&e);
    std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    for (size_t i = 1; i < sorted.size(); ++i)
      DTENSOR_CHECK(sorted[i]->begin >= sorted[i - 1]->end, "safetensors: tensors '",
                    sorted[i - 1]->name, "' and '", sorted[i]->name, "' of ", path, " overlap");
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

void SafetensorsFile::pread_all(int64_t offset, int64_t n, void* dst) const {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r =
        ::pread(fd_, p, static_cast<size_t>(std::min<int64_t>(n, int64_t{1} << 30)), offset);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("safetensors: cannot read ", path_, ": ", errno_text());
    if (r == 0)
      fail("safetensors: ", path_, " is truncated: it ends before byte ", offset + n,
           " (it shrank after it was opened)");
    p += r;
    offset += r;
    n -= r;
  }
}

void SafetensorsFile::read(const SafetensorsEntry& entry, int64_t offset, int64_t n,
                           void* dst) const {
  DTENSOR_CHECK(offset >= 0 && n >= 0 && entry.begin + offset + n <= entry.end,
                "safetensors: read of bytes [", offset, ", ", offset + n, ") leaves tensor '",
                entry.name, "' of ", path_, " (", entry.end - entry.begin, " bytes)");
  pread_all(entry.begin + offset, n, dst);
  tensor_bytes_read += n;
}

void SafetensorsFile::read_runs(const SafetensorsEntry& entry, const std::vector<Run>& runs) const {
  constexpr int64_t kGap = 4096;
  thread_local char scratch[kGap];  // gap bytes land here and are never read
  const int max_iov = static_cast<int>(std::min<long>(::sysconf(_SC_IOV_MAX), 1024));
  std::vector<iovec> iov;
  size_t i = 0;
  while (i < runs.size()) {
    // One preadv: runs[i..j) with every gap below a page, at most max_iov pieces.
    const Run& first = runs[i];
    DTENSOR_CHECK(
        first.offset >= 0 && first.n >= 0 && entry.begin + first.offset + first.n <= entry.end,
        "safetensors: read of bytes [", first.offset, ", ", first.offset + first.n,
        ") leaves tensor '", entry.name, "' of ", path_, " (", entry.end - entry.begin, " bytes)");
    iov.assign(1, iovec{first.dst, static_cast<size_t>(first.n)});
    int64_t end = first.offset + first.n, wanted = first.n;
    size_t j = i + 1;
    for (; j < runs.size(); ++j) {
      const Run& r = runs[j];
      const int64_t gap = r.offset - end;
      if (gap < 0 || gap >= kGap || static_cast<int>(iov.size()) + 2 > max_iov) break;
      if (r.n < 0 || entry.begin + r.offset + r.n > entry.end) break;  // read() below names it
      if (gap > 0) iov.push_back(iovec{scratch, static_cast<size_t>(gap)});
      iov.push_back(iovec{r.dst, static_cast<size_t>(r.n)});
      end = r.offset + r.n;
      wanted += r.n;
    }
    if (j == i + 1) {
      read(entry, first.offset, first.n, first.dst);
      i = j;
      continue;
    }
    // preadv may return short; finish the rest piece by piece with pread.
    int64_t done = 0;
    const int64_t total = end - first.offset;
    while (true) {
      const ssize_t r =
          ::preadv(fd_, iov.data(), static_cast<int>(iov.size()), entry.begin + first.offset);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail("safetensors: cannot read ", path_, ": ", errno_text());
      done = r;
      break;
    }
    if (done < total) {
      // Skip the pieces fully read, then read the remainder of each piece.
      int64_t at = entry.begin + first.offset, skip = done;
      for (const iovec& v : iov) {
        const int64_t len = static_cast<int64_t>(v.iov_len);
        if (skip >= len) {
          skip -= len;
        } else {
          pread_all(at + skip, len - skip, static_cast<char*>(v.iov_base) + skip);
          skip = 0;
        }
        at += len;
      }
    }
    tensor_bytes_read += wanted;
    i = j;
  }
}

int64_t tensor_bytes_read_by_this_thread() { return tensor_bytes_read; }

uint32_t SafetensorsFile::checksum() const {
  constexpr int64_t kPiece = int64_t{4} << 20;
  std::vector<char> buf(static_cast<size_t>(std::min(kPiece, std::max<int64_t>(size_, 1))));
  uint32_t crc = 0;
  for (int64_t at = 0; at < size_; at += kPiece) {
    const int64_t n = std::min(kPiece, size_ - at);
    pread_all(at, n, buf.data());
    crc = crc32(crc, buf.data(), static_cast<size_t>(n));
  }
  return crc;
}

}  // namespace dtensor::checkpoint
