// Sharded checkpoints (checkpoint.h): save on one layout, load on another, every piece compared
// with the slice of the one-device tensor; every data file read back by an independent
// safetensors reader written here from the format description (8-byte little-endian header
// length, JSON header, raw bytes); deduplication; errors naming key and file on every rank;
// crash safety. Ranks are threads.

#include "checkpoint/checkpoint.h"

#include "checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>

#include "checkpoint/testing/independent_safetensors.h"
#include "collectives/rank_context.h"
#include "dtensor/api.h"
#include "dtensor/local_tensor.h"
#include "layout/shard_layout.h"
#include "layout/testing/layout_enumeration.h"

namespace dtensor::checkpoint {
namespace {

namespace fs = std::filesystem;
using collectives::run_threads;
using nlohmann::json;
// The independent safetensors reader and writer.
using checkpoint::testing::bitwise_crc32;
using checkpoint::testing::bytes_of;
using checkpoint::testing::RawFile;
using checkpoint::testing::RawTensor;
using checkpoint::testing::read_bytes;
using checkpoint::testing::read_raw;
using checkpoint::testing::write_hf_file;

std::string fresh_dir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base ? base : "/tmp") / ("ckpt_" + name);
  fs::remove_all(dir);
  fs::remove_all(dir.string() + ".saving");
  return dir.string();
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// Deterministic one-device tensors of every dtype (values exact in bf16/f16 not required: the
// same tensor is compared bit for bit).
at::Tensor global_tensor(const std::vector<int64_t>& shape, at::ScalarType dtype, int64_t salt) {
  const at::Tensor i = at::arange(numel(shape), at::kLong);
  if (dtype == at::kBool) return ((i * (salt + 3)) % 5 < 2).reshape(shape);
  if (at::isIntegralType(dtype, false))
    return ((i * (salt + 7)) % 1001 - 500).to(dtype).reshape(shape);
  return at::sin(i.to(at::kDouble) * 1.37 + salt).to(dtype).reshape(shape);
}

struct Entry {
  std::string key;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
};
// Uneven on every mesh used below (13/4, 7/2, 5/4 with an empty shard, 3/4 with an empty shard).
const std::vector<Entry> kEntries = {
    {"layer.f32", {13, 7}, at::kFloat}, {"layer.bf16", {8, 6}, at::kBFloat16},
    {"layer.f16", {5, 9}, at::kHalf},   {"layer.i64", {3, 10}, at::kLong},
    {"mask", {9, 5}, at::kBool},        {"empty", {0, 4}, at::kFloat}};

// Every data file of `dir` read independently: each chunk of the index holds exactly the bytes
// of its box of the one-device tensor, checksums and sizes match, and the data files together
// hold each element once.
void check_files_independently(const std::string& dir,
                               const std::map<std::string, at::Tensor>& globals) {
  const json index = json::parse(read_bytes(dir + "/model.safetensors.index.json"));
  EXPECT_EQ(index["format_version"], 1);
  int64_t data_bytes = 0, global_bytes = 0;
  for (const auto& [file, info] : index["files"].items()) {
    const std::string bytes = read_bytes(dir + "/" + file);
    EXPECT_EQ(static_cast<int64_t>(bytes.size()), info["size"].get<int64_t>()) << file;
    EXPECT_EQ(bitwise_crc32(bytes), info["crc32"].get<uint32_t>()) << file;
    const RawFile raw = read_raw(dir + "/" + file);
    EXPECT_EQ(raw.metadata["format"], "pt") << file;
    data_bytes += raw.data_bytes;
    for (const auto& [name, t] : raw.tensors) EXPECT_EQ(index["weight_map"][name], file) << name;
  }
  for (const auto& [key, g] : globals) {
    global_bytes += g.numel() * g.element_size();
    const json& rec = index["tensors"][key];
    ASSERT_TRUE(rec.is_object()) << key;
    EXPECT_EQ(rec["shape"].get<std::vector<int64_t>>(), g.sizes().vec()) << key;
    for (const auto& c : rec["chunks"]) {
      const RawFile raw = read_raw(dir + "/" + c["file"].get<std::string>());
      const RawTensor& t = raw.tensors.at(c["name"].get<std::string>());
      EXPECT_EQ(t.dtype, rec["dtype"]) << key;
      const LocalBox box{c["sizes"].get<std::vector<int64_t>>(),
                         c["offsets"].get<std::vector<int64_t>>()};
      EXPECT_EQ(t.shape, box.shape) << key;
      EXPECT_EQ(t.bytes, bytes_of(slice_box(g, box))) << key << " chunk " << c["name"];
    }
  }
  EXPECT_EQ(data_bytes, global_bytes) << "each element is written exactly once";
  EXPECT_FALSE(fs::exists(dir + ".saving"));
}

// This rank's piece of `t` equals the slice of the one-device tensor, bit for bit.
void expect_piece(const at::Tensor& t, const at::Tensor& global, const std::string& key) {
  if (!api::is_dtensor(t)) {
    EXPECT_EQ(bytes_of(t), bytes_of(global)) << key;
    return;
  }
  const DTensorSpec& spec = api::spec(t);
  const auto box = local_box_of_rank(spec, collectives::current_context().rank());
  if (!box) return;
  const auto coord = *spec.mesh().coordinate(collectives::current_context().rank());
  EXPECT_EQ(bytes_of(api::local(t)), bytes_of(local_tensor_for(global, spec, coord)))
      << key << " on " << api::to_string(t);
}

std::map<std::string, at::Tensor> globals_of(int64_t salt) {
  std::map<std::string, at::Tensor> g;
  for (const auto& e : kEntries) g[e.key] = global_tensor(e.shape, e.dtype, salt);
  return g;
}

// A plain tensor that every rank of a distributed save holds (saved once, by rank 0).
at::Tensor bias_of(int64_t salt) { return global_tensor({11}, at::kDouble, salt); }

std::map<std::string, at::Tensor> with_bias(std::map<std::string, at::Tensor> g, int64_t salt) {
  g["bias"] = bias_of(salt);
  return g;
}

// Saves every entry distributed on `mesh_shape` by `placements` (world = mesh size).
void save_distributed(const std::string& dir, const std::vector<int64_t>& mesh_shape,
                      const Placements& placements, int64_t salt) {
  const auto globals = globals_of(salt);
  run_threads(numel(mesh_shape), [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh(mesh_shape);
    std::map<std::string, Value> state;
    for (const auto& [key, g] : globals) state[key] = api::distribute_tensor(g, mesh, placements);
    state["step"] = int64_t{salt};
    state["bias"] = bias_of(salt);
    save(state, dir);
  });
}

// Loads into zeros distributed on `mesh_shape` by `placements` and compares every piece.
void load_and_check(const std::string& dir, const std::vector<int64_t>& mesh_shape,
                    const Placements& placements, int64_t salt) {
  const auto globals = globals_of(salt);
  run_threads(numel(mesh_shape), [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh(mesh_shape);
    std::map<std::string, Value> state;
    for (const auto& [key, g] : globals)
      state[key] = api::zeros(g.sizes().vec(), mesh, placements, g.options());
    state["step"] = int64_t{-1};
    state["bias"] = at::zeros({11}, at::kDouble);
    load(state, dir);
    for (const auto& [key, g] : globals) expect_piece(std::get<at::Tensor>(state[key]), g, key);
    EXPECT_EQ(std::get<int64_t>(state["step"]), salt);
    expect_piece(std::get<at::Tensor>(state["bias"]), bias_of(salt), "bias");
  });
}

// Loads in one process (no rank context) into plain tensors.
void load_plain_and_check(const std::string& dir, int64_t salt, bool with_step = true) {
  const auto globals = globals_of(salt);
  std::map<std::string, Value> state;
  for (const auto& [key, g] : globals) state[key] = at::zeros_like(g);
  if (with_step) state["step"] = int64_t{-1};
  if (with_step) state["bias"] = at::zeros({11}, at::kDouble);
  load(state, dir);
  for (const auto& [key, g] : globals) expect_piece(std::get<at::Tensor>(state[key]), g, key);
  if (with_step) expect_piece(std::get<at::Tensor>(state["bias"]), bias_of(salt), "bias");
}

TEST(Checkpoint, Shard0OnFourLoadsIntoEveryLayout) {
  const std::string dir = fresh_dir("reshard");
  save_distributed(dir, {4}, {Shard(0)}, 1);
  check_files_independently(dir, with_bias(globals_of(1), 1));
  EXPECT_TRUE(fs::exists(dir + "/rank-0.safetensors"));
  load_and_check(dir, {2}, {Shard(1)}, 1);
  load_and_check(dir, {2, 2}, {Shard(0), Shard(1)}, 1);
  load_and_check(dir, {2, 2}, {Shard(1), Shard(1)}, 1);
  load_and_check(dir, {4}, {Replicate()}, 1);
  load_and_check(dir, {3}, {Shard(0)}, 1);
  load_plain_and_check(dir, 1);
}

TEST(Checkpoint, EachRankReadsOnlyItsBox) {
  const std::string dir = fresh_dir("reads");
  save_distributed(dir, {2}, {Shard(1)}, 10);
  const auto globals = globals_of(10);
  for (const Placements& pl : {Placements{Shard(0)}, Placements{Shard(1)}}) {
    run_threads(4, [&](int64_t) {
      const DeviceMesh mesh = api::init_device_mesh({4});
      std::map<std::string, Value> state = {{"step", int64_t{0}},
                                            {"bias", at::zeros({11}, at::kDouble)}};
      // The plain bias is read whole by every rank.
      int64_t piece_bytes = bias_of(10).numel() * 8;
      for (const auto& [key, g] : globals) {
        const at::Tensor t = api::zeros(g.sizes().vec(), mesh, pl, g.options());
        piece_bytes += api::local(t).numel() * g.element_size();
        state[key] = t;
      }
      const int64_t before = tensor_bytes_read_by_this_thread();
      LoadOptions options;
      options.verify_checksums = false;  // a checksum reads whole files, by design
      load(state, dir, options);
      EXPECT_EQ(tensor_bytes_read_by_this_thread() - before, piece_bytes);
      for (const auto& [key, g] : globals) expect_piece(std::get<at::Tensor>(state[key]), g, key);
    });
  }
}

// Every layout of the property enumeration on 4 ranks (meshes (4) and (2,2); 2-D shapes, uneven
// and empty ones included; R, P(sum), P(max), S(d) on each mesh dim) saved in one checkpoint,
// loaded back into the same layouts (Partial destinations included) and into [S(1), S(0)].
TEST(Checkpoint, EveryPropertyLayoutRoundTrips) {
  for (const std::vector<int64_t>& mesh_shape : {std::vector<int64_t>{4}, {2, 2}}) {
    std::vector<DTensorSpec> specs;
    dtensor::testing::for_each_property_spec([&](const DTensorSpec& spec) {
      if (spec.mesh().shape() == mesh_shape && spec.ndim() == 2 && spec.has_default_shard_order())
        specs.push_back(spec);
    });
    ASSERT_GE(specs.size(), 20u);
    std::vector<at::Tensor> globals;
    for (size_t i = 0; i < specs.size(); ++i)
      globals.push_back(global_tensor(specs[i].shape(), at::kDouble, static_cast<int64_t>(i)));
    const std::string dir = fresh_dir("property_" + std::to_string(mesh_shape.size()));
    run_threads(4, [&](int64_t rank) {
      const DeviceMesh mesh = api::init_device_mesh(mesh_shape);
      const auto coord = *mesh.coordinate(rank);
      std::map<std::string, Value> state, same, other;
      for (size_t i = 0; i < specs.size(); ++i) {
        const std::string key = "t" + std::to_string(i);
        const at::Tensor piece = local_tensor_for(globals[i], specs[i], coord);
        state[key] = api::from_local(piece, mesh, specs[i].placements(), false, specs[i].shape());
        same[key] = api::from_local(at::zeros_like(piece), mesh, specs[i].placements(), false,
                                    specs[i].shape());
        other[key] = api::zeros(specs[i].shape(), api::init_device_mesh({2, 2}),
                                {Shard(1), Shard(0)}, at::kDouble);
      }
      save(state, dir);
      load(same, dir);
      load(other, dir);
      for (size_t i = 0; i < specs.size(); ++i) {
        const std::string key = "t" + std::to_string(i);
        expect_piece(std::get<at::Tensor>(same[key]), globals[i], key + " " + specs[i].to_string());
        expect_piece(std::get<at::Tensor>(other[key]), globals[i], key);
      }
    });
    std::map<std::string, at::Tensor> by_key;
    for (size_t i = 0; i < specs.size(); ++i) by_key["t" + std::to_string(i)] = globals[i];
    check_files_independently(dir, by_key);
  }
}

TEST(Checkpoint, TwoDimMeshAndReplicasAreWrittenOnce) {
  const std::string dir = fresh_dir("mesh2d");
  save_distributed(dir, {2, 2}, {Replicate(), Shard(1)}, 2);
  check_files_independently(dir, with_bias(globals_of(2), 2));
  // Only the ranks at coordinate 0 of the replicated dim write.
  EXPECT_FALSE(fs::exists(dir + "/rank-2.safetensors"));
  load_and_check(dir, {4}, {Shard(0)}, 2);

  const std::string rep = fresh_dir("replicated");
  save_distributed(rep, {4}, {Replicate()}, 3);
  check_files_independently(rep, with_bias(globals_of(3), 3));
  EXPECT_TRUE(fs::exists(rep + "/rank-0.safetensors"));
  EXPECT_FALSE(fs::exists(rep + "/rank-1.safetensors"));
  load_and_check(rep, {2, 2}, {Shard(0), Shard(0)}, 3);

  // Two mesh dims splitting one tensor dim.
  const std::string twice = fresh_dir("shard_twice");
  save_distributed(twice, {2, 2}, {Shard(0), Shard(0)}, 4);
  check_files_independently(twice, with_bias(globals_of(4), 4));
  load_and_check(twice, {2}, {Shard(1)}, 4);
  load_plain_and_check(twice, 4);
}

TEST(Checkpoint, PartialIsReducedBeforeSaving) {
  const std::string dir = fresh_dir("partial");
  const at::Tensor g = global_tensor({6, 5}, at::kLong, 4);
  run_threads(4, [&](int64_t rank) {
    const DeviceMesh mesh = api::init_device_mesh({2, 2});
    // Rank r holds its box of g * (r + 1); the Partial(sum) over mesh dim 0 is the sum.
    const Placements pl = {Partial(), Shard(0)};
    const DTensorSpec spec =
        DTensorSpec::make(mesh, pl, TensorMeta::make(g.sizes().vec(), g.scalar_type()));
    const LocalBox box = *local_box_of_rank(spec, rank);
    const at::Tensor t = api::from_local(slice_box(g, box) * (rank + 1), mesh, pl);
    save({{"p", t}}, dir);
  });
  // The one-device value: the sum over mesh dim 0 of the ranks' contributions.
  const at::Tensor want = at::cat({g.slice(0, 0, 3) * (1 + 3), g.slice(0, 3, 6) * (2 + 4)});
  check_files_independently(dir, {{"p", want}});
  std::map<std::string, Value> state = {{"p", at::zeros_like(want)}};
  load(state, dir);
  expect_piece(std::get<at::Tensor>(state["p"]), want, "p");
  // Loading into a Partial layout: reducing it gives the saved tensor.
  run_threads(2, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2});
    std::map<std::string, Value> s = {
        {"p", api::from_local(at::zeros_like(want), mesh, {Partial()})}};
    load(s, dir);
    EXPECT_TRUE(at::equal(api::full_tensor(std::get<at::Tensor>(s["p"])), want));
  });
}

TEST(Checkpoint, OneProcessIsAPlainSafetensorsModel) {
  const std::string dir = fresh_dir("plain");
  const auto globals = globals_of(5);
  std::map<std::string, Value> state;
  for (const auto& [key, g] : globals) state[key] = g;
  state["lr"] = 0.125;
  state["name"] = std::string("llama");
  state["config"] = Json{R"({"dim":64,"layers":[1,2]})"};
  save(state, dir);
  check_files_independently(dir, globals);
  // One file whose names are the keys themselves.
  const RawFile raw = read_raw(dir + "/model.safetensors");
  for (const auto& [key, g] : globals) EXPECT_EQ(raw.tensors.at(key).bytes, bytes_of(g)) << key;

  std::map<std::string, Value> back;
  for (const auto& [key, g] : globals) back[key] = at::zeros_like(g);
  back["lr"] = 0.0;
  back["name"] = std::string();
  back["config"] = Json{};
  load(back, dir);
  for (const auto& [key, g] : globals) expect_piece(std::get<at::Tensor>(back[key]), g, key);
  EXPECT_EQ(std::get<double>(back["lr"]), 0.125);
  EXPECT_EQ(std::get<std::string>(back["name"]), "llama");
  EXPECT_EQ(json::parse(std::get<Json>(back["config"]).text),
            json::parse(R"({"dim":64,"layers":[1,2]})"));
  // ... and into distributed tensors of another layout.
  run_threads(4, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2, 2});
    std::map<std::string, Value> s = back;
    for (const auto& [key, g] : globals)
      s[key] = api::zeros(g.sizes().vec(), mesh, {Shard(1), Shard(0)}, g.options());
    load(s, dir);
    for (const auto& [key, g] : globals) expect_piece(std::get<at::Tensor>(s[key]), g, key);
  });
}

// A Hugging Face model (one file, and two files with an index holding only weight_map),
// written by write_hf_file from the format description, not by the library.
TEST(Checkpoint, HuggingFaceModelsLoadIntoAnyLayout) {
  const auto globals = globals_of(6);
  const std::string single = fresh_dir("hf_single");
  fs::create_directories(single);
  write_hf_file(single + "/model.safetensors", globals);
  load_plain_and_check(single, 6, /*with_step=*/false);

  const std::string sharded = fresh_dir("hf_sharded");
  fs::create_directories(sharded);
  std::map<std::string, at::Tensor> first, second;
  json weight_map;
  for (const auto& [key, g] : globals) {
    const bool one = first.size() < 2;
    (one ? first : second)[key] = g;
    weight_map[key] = one ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_hf_file(sharded + "/model-00001-of-00002.safetensors", first);
  write_hf_file(sharded + "/model-00002-of-00002.safetensors", second);
  std::ofstream(sharded + "/model.safetensors.index.json")
      << json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump();
  for (const std::string& dir : {single, sharded}) {
    run_threads(4, [&](int64_t) {
      const DeviceMesh mesh = api::init_device_mesh({2, 2});
      std::map<std::string, Value> s;
      for (const auto& [key, g] : globals)
        s[key] = api::zeros(g.sizes().vec(), mesh, {Shard(0), Shard(1)}, g.options());
      load(s, dir);
      for (const auto& [key, g] : globals) expect_piece(std::get<at::Tensor>(s[key]), g, key);
    });
  }
}

// Runs `load` of `state_for(mesh)` on 2 ranks; every rank must fail with a message holding every
// one of `needles`.
void expect_load_error_on_every_rank(
    const std::string& dir, const std::function<std::map<std::string, Value>()>& make_state,
    const std::vector<std::string>& needles) {
  std::mutex mu;
  std::vector<std::string> messages;
  run_threads(2, [&](int64_t) {
    std::map<std::string, Value> state = make_state();
    try {
      load(state, dir);
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      messages.push_back(e.what());
    }
  });
  ASSERT_EQ(messages.size(), 2u) << "every rank raises";
  for (const auto& m : messages)
    for (const auto& needle : needles) EXPECT_NE(m.find(needle), std::string::npos) << m;
}

std::map<std::string, Value> plain_state(int64_t salt) {
  std::map<std::string, Value> s;
  for (const auto& [key, g] : globals_of(salt)) s[key] = at::zeros_like(g);
  s["step"] = int64_t{0};
  s["bias"] = at::zeros({11}, at::kDouble);
  return s;
}

TEST(Checkpoint, BadInputFailsOnEveryRankNamingKeyAndFile) {
  const std::string dir = fresh_dir("errors");
  save_distributed(dir, {2}, {Shard(0)}, 7);
  const std::string index = dir + "/model.safetensors.index.json";
  expect_load_error_on_every_rank(dir,
                                  [] {
                                    auto s = plain_state(7);
                                    s["extra.weight"] = at::zeros({2});
                                    return s;
                                  },
                                  {"'extra.weight'", "is missing", index});
  expect_load_error_on_every_rank(dir,
                                  [] {
                                    auto s = plain_state(7);
                                    s.erase("layer.f16");
                                    return s;
                                  },
                                  {"unexpected key 'layer.f16'", dir + "/rank-0.safetensors"});
  expect_load_error_on_every_rank(
      dir,
      [] {
        auto s = plain_state(7);
        s["layer.f32"] = at::zeros({13, 8});
        return s;
      },
      {"'layer.f32'", "shape [13, 8]", "[13, 7]", dir + "/rank-0.safetensors"});
  expect_load_error_on_every_rank(dir,
                                  [] {
                                    auto s = plain_state(7);
                                    s["layer.i64"] = at::zeros({3, 10}, at::kInt);
                                    return s;
                                  },
                                  {"'layer.i64'", "dtype I32", "I64", dir + "/rank-0.safetensors"});

  // A flipped data byte: same size, checksum differs.
  const std::string rank1 = dir + "/rank-1.safetensors";
  const std::string good = read_bytes(rank1);
  std::string bad = good;
  bad[bad.size() - 3] ^= 0x5A;
  std::ofstream(rank1, std::ios::binary | std::ios::trunc) << bad;
  expect_load_error_on_every_rank(dir, [] { return plain_state(7); },
                                  {"checksum", rank1, "'layer.f32'"});
  // Truncated.
  std::ofstream(rank1, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() - 10);
  expect_load_error_on_every_rank(dir, [] { return plain_state(7); },
                                  {"truncated", rank1, "'layer.f32'"});
  std::ofstream(rank1, std::ios::binary | std::ios::trunc) << good;
  load_plain_and_check(dir, 7);

  // A newer format.
  json j = json::parse(read_bytes(index));
  j["format_version"] = 2;
  std::ofstream(index, std::ios::trunc) << j.dump();
  expect_load_error_on_every_rank(dir, [] { return plain_state(7); }, {"format_version 2", index});
}

TEST(Checkpoint, BrokenFilesAndValuesFailClearly) {
  // A truncated plain model (no index to record sizes): the header check names file and tensor.
  const std::string hf = fresh_dir("hf_truncated");
  fs::create_directories(hf);
  const at::Tensor w = global_tensor({6, 4}, at::kFloat, 11);
  write_hf_file(hf + "/model.safetensors", {{"w", w}});
  const std::string whole = read_bytes(hf + "/model.safetensors");
  std::ofstream(hf + "/model.safetensors", std::ios::binary | std::ios::trunc)
      << whole.substr(0, whole.size() - 4);
  expect_load_error_on_every_rank(hf,
                                  [&] {
                                    return std::map<std::string, Value>{{"w", at::zeros_like(w)}};
                                  },
                                  {"truncated", "'w'", hf + "/model.safetensors"});

  // A missing data file and a missing directory.
  const std::string dir = fresh_dir("missing_file");
  save_distributed(dir, {2}, {Shard(0)}, 12);
  fs::remove(dir + "/rank-1.safetensors");
  expect_load_error_on_every_rank(dir, [] { return plain_state(12); },
                                  {dir + "/rank-1.safetensors", "missing", "'layer.f32'"});
  expect_load_error_on_every_rank(dir + "_nowhere", [] { return plain_state(12); },
                                  {dir + "_nowhere", "model.safetensors.index.json"});

  // A value JSON cannot hold, on rank 0 only: every rank fails, none waits forever, and the
  // previous checkpoint stays.
  std::atomic<int> failures{0};
  run_threads(2, [&](int64_t rank) {
    std::map<std::string, Value> state = {{"lr", rank == 0 ? std::nan("") : 0.5}};
    try {
      save(state, dir);
    } catch (const Error& e) {
      ++failures;
      if (rank == 0) {
        EXPECT_NE(std::string(e.what()).find("'lr'"), std::string::npos) << e.what();
      }
    }
  });
  EXPECT_EQ(failures.load(), 2);
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
}

TEST(Checkpoint, FailedSaveKeepsThePreviousCheckpoint) {
  const std::string dir = fresh_dir("crash");
  save_distributed(dir, {2}, {Shard(0)}, 8);
  for (const std::string stage : {"data_written", "index_written"}) {
    // Rank 1 (or rank 0 for the index) "crashes" at `stage`: every rank fails, none hangs.
    std::atomic<int> failures{0};
    const auto globals = globals_of(9);
    run_threads(2, [&](int64_t rank) {
      const DeviceMesh mesh = api::init_device_mesh({2});
      std::map<std::string, Value> state;
      for (const auto& [key, g] : globals) state[key] = api::distribute_tensor(g, mesh, {Shard(1)});
      state["step"] = int64_t{9};
      state["bias"] = bias_of(9);
      SaveOptions options;
      options.on_stage = [&](const std::string& s) {
        if (s == stage && (rank == 1 || s == "index_written"))
          throw std::runtime_error("simulated crash at " + s);
      };
      try {
        save(state, dir, options);
      } catch (const Error& e) {
        ++failures;
        EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
      }
    });
    EXPECT_EQ(failures.load(), 2) << stage;
    load_plain_and_check(dir, 8);
  }
  save_distributed(dir, {2}, {Shard(1)}, 9);
  check_files_independently(dir, with_bias(globals_of(9), 9));
  load_plain_and_check(dir, 9);
}

}  // namespace
}  // namespace dtensor::checkpoint
