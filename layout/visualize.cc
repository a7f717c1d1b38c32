#include "layout/visualize.h"

#include <algorithm>
#include <map>
#include <set>

#include "layout/shard_layout.h"

namespace dtensor {
namespace {

std::string range(int64_t begin, int64_t end) {
  return std::to_string(begin) + ":" + std::to_string(end);
}

std::string owners_text(const DTensorSpec& spec, const std::vector<int64_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? " r" : "r") + std::to_string(ranks[i]);
  if (spec.has_partial()) out += " *";
  return out;
}

std::string pad_right(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

// Boundaries along tensor dim `d`: every offset and end of a non-empty box.
std::vector<int64_t> cuts(const std::vector<LocalBox>& boxes, int64_t d, int64_t size) {
  std::set<int64_t> s = {0, size};
  for (const auto& b : boxes) {
    if (b.numel() == 0) continue;
    s.insert(b.offset[d]);
    s.insert(b.offset[d] + b.shape[d]);
  }
  return {s.begin(), s.end()};
}

}  // namespace

namespace {

// Columns (and rows, for 2-D) cut at every box edge; each cell names its owners.
std::string table_text(const DTensorSpec& spec, const std::vector<LocalBox>& boxes) {
  const bool two_d = spec.ndim() == 2;
  const std::vector<int64_t> rows =
      two_d ? cuts(boxes, 0, spec.shape()[0]) : std::vector<int64_t>{0, 1};
  const std::vector<int64_t> cols = cuts(boxes, two_d ? 1 : 0, spec.shape()[two_d ? 1 : 0]);
  std::vector<std::vector<std::string>> cells(rows.size(), std::vector<std::string>(cols.size()));
  for (size_t j = 0; j + 1 < cols.size(); ++j)
    cells[0][j + 1] = "cols " + range(cols[j], cols[j + 1]);
  for (size_t i = 0; i + 1 < rows.size(); ++i) {
    cells[i + 1][0] = two_d ? "rows " + range(rows[i], rows[i + 1]) : "";
    for (size_t j = 0; j + 1 < cols.size(); ++j) {
      const std::vector<int64_t> index =
          two_d ? std::vector<int64_t>{rows[i], cols[j]} : std::vector<int64_t>{cols[j]};
      cells[i + 1][j + 1] = owners_text(spec, owner_ranks(spec, index));
    }
  }
  std::vector<size_t> width(cols.size(), 0);
  for (const auto& row : cells) {
    for (size_t j = 0; j < row.size(); ++j) width[j] = std::max(width[j], row[j].size());
  }
  std::string out;
  for (const auto& row : cells) {
    std::string line = " ";
    for (size_t j = 0; j < row.size(); ++j) line += " " + pad_right(row[j], width[j] + 2);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

// N-D: one line per distinct box.
std::string boxes_text(const DTensorSpec& spec, const std::vector<LocalBox>& boxes,
                       const std::vector<int64_t>& ranks) {
  std::map<std::vector<int64_t>, std::pair<LocalBox, std::vector<int64_t>>> by_offset;
  for (size_t i = 0; i < boxes.size(); ++i) {
    if (boxes[i].numel() == 0) continue;
    auto& entry = by_offset[boxes[i].offset];
    entry.first = boxes[i];
    entry.second.push_back(ranks[i]);
  }
  std::string out;
  for (const auto& [offset, entry] : by_offset) {
    std::string line = "  [";
    for (size_t d = 0; d < offset.size(); ++d) {
      line += (d ? ", " : "") + range(offset[d], offset[d] + entry.first.shape[d]);
    }
    out += line + "]  " + owners_text(spec, entry.second) + "\n";
  }
  return out;
}

}  // namespace

std::string visualize_sharding(const DTensorSpec& spec) {
  const DeviceMesh& mesh = spec.mesh();
  std::string out = "Tensor " + spec.meta().to_string() + " as " + to_string(spec.placements()) +
                    " on " + mesh.to_string();
  if (!spec.has_default_shard_order()) {
    const std::string text = spec.to_string();
    out += " with shard " + text.substr(text.find(" order{") + 1);
  }
  out += "\n";
  std::vector<LocalBox> boxes;
  std::vector<int64_t> empty_ranks;
  for (int64_t r : mesh.ranks()) {
    boxes.push_back(*local_box_of_rank(spec, r));
    if (boxes.back().numel() == 0 && spec.meta().numel() > 0) empty_ranks.push_back(r);
  }
  if (spec.ndim() == 0 || spec.meta().numel() == 0) {
    out += "  (every rank holds " + std::string(spec.ndim() == 0 ? "the scalar" : "no elements") +
           "): " + owners_text(spec, mesh.ranks()) + "\n";
    return out;
  }
  // The runs of a strided shard (NOTE [strided shards]): one box per run, with its rank.
  std::vector<LocalBox> runs;
  std::vector<int64_t> owners;
  for (int64_t r : mesh.ranks()) {
    const auto coord = *mesh.coordinate(r);
    const LocalBox box = local_box(spec, coord);
    const auto per_dim = local_runs(spec, coord);
    for (int64_t d = 0; d < spec.ndim(); ++d) {
      if (per_dim[d].size() < 2) continue;
      for (const ChunkSlice& run : per_dim[d]) {
        LocalBox piece = box;
        piece.offset[d] = run.offset;
        piece.shape[d] = run.size;
        runs.push_back(piece);
        owners.push_back(r);
      }
    }
    if (!spec.has_strided_shard()) {
      runs.push_back(box);
      owners.push_back(r);
    }
  }
  out += spec.ndim() <= 2 ? table_text(spec, runs) : boxes_text(spec, runs, owners);
  if (!empty_ranks.empty())
    out += "  empty (uneven shards): " + owners_text(spec, empty_ranks) + "\n";
  if (spec.has_partial()) out += "  * partial values: the tensor is their reduction\n";
  return out;
}

}  // namespace dtensor
