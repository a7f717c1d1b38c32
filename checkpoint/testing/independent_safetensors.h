#pragma once
// Test helper: a safetensors reader and writer written from the format description alone
// (https://huggingface.co/docs/safetensors: an 8-byte little-endian header length N, N bytes of
// JSON header name -> {dtype, shape, data_offsets}, optional "__metadata__", then raw bytes),
// sharing no code with checkpoint/safetensors.h, so checkpoint tests check the library's files
// against the format rather than against itself.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace dtensor::checkpoint::testing {

using nlohmann::json;

inline int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// CRC-32, bit by bit (zlib's polynomial), independent of the library's table-driven one.
inline uint32_t bitwise_crc32(const std::string& bytes) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
  }
  return ~c;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline int64_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, int64_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  return sizes.at(dtype);
}

struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
struct RawFile {
  std::map<std::string, RawTensor> tensors;
  json metadata;
  int64_t data_bytes = 0;
};

// Parses a whole file and checks the format's rules: the header fits, offsets are in order,
// cover the data region exactly with no gap or overlap, and match dtype x shape.
inline RawFile read_raw(const std::string& path) {
  const std::string file = read_bytes(path);
  EXPECT_GE(file.size(), 8u) << path;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(file[i])} << (8 * i);
  EXPECT_LE(8 + n, file.size()) << path;
  const json header = json::parse(file.substr(8, n));
  const std::string data = file.substr(8 + n);
  RawFile out;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      out.metadata = v;
      continue;
    }
    RawTensor t{v["dtype"], v["shape"].get<std::vector<int64_t>>(), ""};
    const int64_t b = v["data_offsets"][0], e = v["data_offsets"][1];
    EXPECT_EQ(e - b, shape_numel(t.shape) * dtype_bytes(t.dtype)) << path << " " << name;
    t.bytes = data.substr(b, e - b);
    ranges.emplace_back(b, e);
    out.tensors[name] = t;
  }
  std::sort(ranges.begin(), ranges.end());
  int64_t at = 0;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, at) << path << ": gap or overlap in the data region";
    at = e;
  }
  EXPECT_EQ(at, static_cast<int64_t>(data.size())) << path << ": data region not covered";
  out.data_bytes = static_cast<int64_t>(data.size());
  return out;
}

inline std::string bytes_of(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

// Writes a safetensors file as Hugging Face's writer lays it out (tensors in name order).
inline void write_hf_file(const std::string& path,
                          const std::map<std::string, at::Tensor>& tensors) {
  static const std::map<at::ScalarType, std::string> names = {{at::kFloat, "F32"},
                                                              {at::kBFloat16, "BF16"},
                                                              {at::kHalf, "F16"},
                                                              {at::kLong, "I64"},
                                                              {at::kBool, "BOOL"}};
  json header;
  std::string data;
  for (const auto& [name, t] : tensors) {
    const std::string b = bytes_of(t);
    header[name] = {{"dtype", names.at(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {data.size(), data.size() + b.size()}}};
    data += b;
  }
  const std::string h = header.dump();
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((h.size() >> (8 * i)) & 0xFF);
  std::ofstream(path, std::ios::binary) << len << h << data;
}

}  // namespace dtensor::checkpoint::testing
