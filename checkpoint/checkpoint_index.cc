#include "checkpoint/checkpoint_index.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "collectives/rank_context.h"
#include "dtensor/api.h"
#include "dtensor/local_tensor.h"
#include "layout/shard_layout.h"

namespace dtensor::checkpoint {

using nlohmann::json;
namespace fs = std::filesystem;

void check_state_against_index(const std::map<std::string, Value>& state, const Index& index) {
  std::vector<std::string> problems;
  for (const auto& [key, value] : state) {
    const bool is_tensor = std::holds_alternative<at::Tensor>(value);
    const auto t = index.tensors.find(key);
    const bool saved_tensor = t != index.tensors.end();
    const bool saved_value = index.values.count(key) > 0;
    if (!saved_tensor && !saved_value) {
      problems.push_back("key '" + key + "' is missing from " + index.source);
      continue;
    }
    if (is_tensor != saved_tensor) {
      problems.push_back("key '" + key + "' is a " + (is_tensor ? "tensor" : "non-tensor value") +
                         " in the state but a " + (saved_tensor ? "tensor" : "non-tensor value") +
                         " in " + index.source);
      continue;
    }
    if (!is_tensor) continue;
    const at::Tensor& tensor = std::get<at::Tensor>(value);
    DTENSOR_CHECK(tensor.defined(), "checkpoint.load: tensor '", key, "' is undefined");
    const std::string file =
        t->second.chunks.empty() ? index.source : index.dir + "/" + t->second.chunks.front().file;
    const std::vector<int64_t> shape = tensor.sizes().vec();
    if (shape != t->second.shape)
      problems.push_back("key '" + key + "' has shape " + shape_text(shape) + " in the state but " +
                         shape_text(t->second.shape) + " in " + file);
    const std::string dtype = safetensors_dtype(tensor.scalar_type());
    if (dtype != t->second.dtype)
      problems.push_back("key '" + key + "' has dtype " + dtype + " in the state but " +
                         t->second.dtype + " in " + file);
  }
  for (const auto& [key, t] : index.tensors)
    if (!state.count(key))
      problems.push_back(
          "unexpected key '" + key + "' in " +
          (t.chunks.empty() ? index.source : index.dir + "/" + t.chunks.front().file) +
          " (the state to load has no such key)");
  for (const auto& [key, v] : index.values)
    if (!state.count(key))
      problems.push_back("unexpected key '" + key + "' in " + index.source +
                         " (the state to load has no such key)");
  if (problems.empty()) return;
  std::string msg = "checkpoint.load: the state does not match the checkpoint " + index.dir + ": ";
  for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
  fail(msg);
}

void check_files(Index& index) {
  for (const auto& [file, rec] : index.files) {
    const std::string path = index.dir + "/" + file;
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    DTENSOR_CHECK(!ec, "checkpoint.load: data file ", path, " is missing or unreadable (",
                  ec.message(), "); it holds ", index.keys_in(file));
    DTENSOR_CHECK(!rec.size || static_cast<int64_t>(size) == *rec.size,
                  "checkpoint.load: data file ", path, " is truncated or changed: ", size,
                  " bytes, the index records ", rec.size.value_or(0), "; it holds ",
                  index.keys_in(file));
  }
  for (const auto& [key, t] : index.tensors) {
    for (const auto& c : t.chunks) {
      const std::string path = index.dir + "/" + c.file;
      DTENSOR_CHECK(index.files.count(c.file), "checkpoint.load: key '", key, "' names data file ",
                    path, " that the index does not list");
      const SafetensorsEntry* e = index.open(c.file).find(c.name);
      DTENSOR_CHECK(e != nullptr, "checkpoint.load: key '", key, "': chunk '", c.name,
                    "' is not in data file ", path);
      DTENSOR_CHECK(e->dtype == t.dtype && e->shape == c.sizes, "checkpoint.load: key '", key,
                    "': chunk '", c.name, "' in data file ", path, " is ", e->dtype,
                    shape_text(e->shape), " but the index says ", t.dtype, shape_text(c.sizes));
    }
  }
}

namespace {

// Reads the part of `chunk` inside `box` (global offsets `box_offset`, sizes `box_shape`) into
// `dst`, a contiguous buffer laid out as the box. NOTE [box reads]: the intersection is a set
// of row-runs contiguous in both the chunk and the box: the trailing dims where the
// intersection spans the whole chunk and the whole box merge into one run, read straight into the
// destination; runs closer than a page share one preadv (NOTE [gathered reads]).
void read_intersection(const SafetensorsFile& file, const SafetensorsEntry& entry,
                       const ChunkRecord& chunk, const std::vector<int64_t>& box_offset,
                       const std::vector<int64_t>& box_shape, char* dst) {
  const int64_t n = static_cast<int64_t>(box_shape.size());
  const int64_t es = entry.element_size;
  if (n == 0) {
    file.read(entry, 0, es, dst);
    return;
  }
  std::vector<int64_t> lo(n), size(n);
  for (int64_t d = 0; d < n; ++d) {
    lo[d] = std::max(box_offset[d], chunk.offsets[d]);
    const int64_t hi = std::min(box_offset[d] + box_shape[d], chunk.offsets[d] + chunk.sizes[d]);
    if (hi <= lo[d]) return;  // disjoint
    size[d] = hi - lo[d];
  }
  std::vector<int64_t> cstride(n, 1), bstride(n, 1);
  for (int64_t d = n - 2; d >= 0; --d) {
    cstride[d] = cstride[d + 1] * chunk.sizes[d + 1];
    bstride[d] = bstride[d + 1] * box_shape[d + 1];
  }
  int64_t k = n - 1;
  while (k > 0 && size[k] == chunk.sizes[k] && size[k] == box_shape[k]) --k;
  int64_t run = 1;
  for (int64_t d = k; d < n; ++d) run *= size[d];
  std::vector<int64_t> idx(k, 0);          // odometer over the dims before k
  std::vector<SafetensorsFile::Run> runs;  // in increasing file order (NOTE [gathered reads])
  while (true) {
    int64_t src = 0, out = 0;
    for (int64_t d = 0; d < n; ++d) {
      const int64_t i = lo[d] + (d < k ? idx[d] : 0);
      src += (i - chunk.offsets[d]) * cstride[d];
      out += (i - box_offset[d]) * bstride[d];
    }
    runs.push_back({src * es, run * es, dst + out * es});
    if (runs.size() == 4096) {  // bounded memory for boxes of millions of tiny runs
      file.read_runs(entry, runs);
      runs.clear();
    }
    int64_t d = k - 1;
    while (d >= 0 && ++idx[d] == size[d]) idx[d--] = 0;
    if (d < 0) break;
  }
  file.read_runs(entry, runs);
}

// Reads the box (offset, shape) of the saved tensor into `target` (contiguous, on the CPU).
void read_box(at::Tensor& target, const TensorRecord& rec, Index& index,
              const std::vector<int64_t>& offset, const std::vector<int64_t>& shape) {
  char* dst = static_cast<char*>(target.data_ptr());
  for (const ChunkRecord& c : rec.chunks) {
    const SafetensorsFile& file = index.open(c.file);
    read_intersection(file, *file.find(c.name), c, offset, shape, dst);
  }
}

// A piece under a general strided shard (NOTE [strided shards]) is several boxes, one per
// combination of runs (local_runs): each is read on its own and copied to its place in `piece`.
void load_runs(at::Tensor& piece, const TensorRecord& rec, Index& index,
               const std::vector<std::vector<ChunkSlice>>& runs) {
  const size_t n = runs.size();
  std::vector<size_t> pick(n, 0);
  for (;;) {
    std::vector<int64_t> offset(n), shape(n);
    at::Tensor view = piece;
    for (size_t d = 0; d < n; ++d) {
      int64_t at = 0;
      for (size_t j = 0; j < pick[d]; ++j) at += runs[d][j].size;
      offset[d] = runs[d][pick[d]].offset;
      shape[d] = runs[d][pick[d]].size;
      view = view.narrow(static_cast<int64_t>(d), at, shape[d]);
    }
    if (view.numel() > 0) {
      at::Tensor box = at::empty(shape, piece.options().device(at::kCPU));
      read_box(box, rec, index, offset, shape);
      view.copy_(box);
    }
    size_t d = n;
    while (d > 0 && ++pick[d - 1] == runs[d - 1].size()) pick[--d] = 0;
    if (d == 0) return;
  }
}

}  // namespace

void load_tensor(at::Tensor& tensor, const std::string& key, Index& index) {
  const TensorRecord& rec = index.tensors.at(key);
  at::Tensor piece;
  std::vector<int64_t> box_offset, box_shape;
  std::optional<DTensorSpec> spec;
  std::vector<int64_t> coordinate;
  if (is_dtensor(tensor)) {
    spec = api::spec(tensor);
    piece = api::local(tensor);
    const int64_t rank =
        collectives::has_current_context() ? collectives::current_context().rank() : 0;
    const auto box = local_box_of_rank(*spec, rank);
    if (!box) return;  // this rank is outside the tensor's mesh: it holds nothing
    box_offset = box->offset;
    box_shape = box->shape;
    coordinate = *spec->mesh().coordinate(rank);
    TORCH_INTERNAL_ASSERT(piece.sizes().vec() == box_shape, "local piece ", piece.sizes(),
                          " differs from its box ", c10::IntArrayRef(box_shape));
  } else {
    piece = tensor;
    box_shape = tensor.sizes().vec();
    box_offset.assign(box_shape.size(), 0);
  }
  if (piece.numel() > 0 && spec && spec->has_strided_shard()) {
    load_runs(piece, rec, index, local_runs(*spec, coordinate));
  } else if (piece.numel() > 0) {
    // Straight into the piece when it is one contiguous CPU buffer; else through one copy.
    const bool direct =
        piece.is_cpu() && piece.is_contiguous() && !piece.is_conj() && !piece.is_neg();
    at::Tensor target = direct ? piece : at::empty(box_shape, piece.options().device(at::kCPU));
    read_box(target, rec, index, box_offset, box_shape);
    if (!direct) piece.copy_(target);
  }
  if (spec && spec->has_partial()) {
    // NOTE [loading into Partial]: the loaded value is the reduced one; ranks off coordinate 0 of
    // a Partial mesh dim hold the reduction's identity (or the value for idempotent ops), as
    // distribute_tensor lays out a Partial, so reducing gives the saved tensor back.
    for (int64_t m = 0; m < spec->mesh().ndim(); ++m) {
      const Placement& p = spec->placement(m);
      if (p.is_partial() && coordinate[m] != 0)
        piece.copy_(partial_share(piece, p.reduce_op(), /*holder=*/false));
    }
  }
}

Value decode_value(const std::string& key, const Index& index) {
  const json j = json::parse(index.values.at(key), nullptr, false);
  const std::string where = "value '" + key + "' of " + index.source;
  DTENSOR_CHECK(j.is_object() && j.size() == 1, "checkpoint.load: ", where, " is malformed");
  if (j.contains("int") && j["int"].is_number_integer()) return j["int"].get<int64_t>();
  if (j.contains("float") && j["float"].is_number()) return j["float"].get<double>();
  if (j.contains("string") && j["string"].is_string()) return j["string"].get<std::string>();
  if (j.contains("json")) return Json{j["json"].dump()};
  fail("checkpoint.load: ", where, " has an unknown kind: ", j.dump().substr(0, 80));
}

void write_index_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("checkpoint.save: cannot create ", tmp, ": ", std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      fail("checkpoint.save: cannot write ", tmp, ": ", err);
    }
    done += static_cast<size_t>(w);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  DTENSOR_CHECK(synced, "checkpoint.save: fsync of ", tmp, " failed: ", std::strerror(errno));
  DTENSOR_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "checkpoint.save: cannot rename ", tmp,
                " to ", path, ": ", std::strerror(errno));
}

}  // namespace dtensor::checkpoint
