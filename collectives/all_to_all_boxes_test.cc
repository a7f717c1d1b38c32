// all_to_all_boxes (NOTE [boxed all_to_all] in functional.h) against one device: every rank
// sends each peer (itself included) views of its input with other strides, shapes and counts
// than the views the peer receives into, and each rank's whole receive tensor must equal the
// single-device result: the sender's boxes flattened and concatenated, written into the
// receiver's views, every other element untouched. On ranks as threads, as processes on shm
// (default, tiny and cross-memory-attach buffers), and on cuda_ipc's staged host buffers, which
// take no boxes (the packing fallback).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "collectives/testing/collective_reference.h"
#include "collectives/testing/shm_ranks.h"

namespace dtensor::collectives {
namespace {

using namespace dtensor::testing;

using Lists = std::vector<std::vector<at::Tensor>>;

const std::vector<c10::ScalarType> kDtypes = {at::kFloat, at::kDouble,       at::kBool,
                                              at::kLong,  at::kBFloat16,     at::kChar,
                                              at::kShort, at::kComplexDouble};

// Rank s's region for peer d is q = its input[d], of shape (5, w); rank d receives what s sends
// into p = its output[s], of shape (5, w + 3), initially -1. Which views each side uses depends
// on (s + 2d) mod 5, so every pair of ranks meets another case and every rank meets several.
// `sending` picks the sender's views of q, else the receiver's views of p.
std::vector<at::Tensor> views(const at::Tensor& t, int64_t s, int64_t d, int64_t w, bool sending) {
  switch ((s + 2 * d) % 5) {
    case 0:  // one strided block, the same shape on both sides
      return sending ? std::vector<at::Tensor>{t.narrow(1, 1, w - 2)}
                     : std::vector<at::Tensor>{t.narrow(1, 0, w - 2)};
    case 1:  // a transposed block, an empty box and a row; received into other shapes
      if (sending) return {t.t().narrow(0, 0, 3), t.narrow(1, 0, 0), t.narrow(0, 4, 1)};
      return {t.select(1, 0), t.narrow(1, 1, 2), t.narrow(0, 0, 1).narrow(1, 3, w)};
    case 2:  // nothing: an empty box against an empty list
      if (sending) return {t.narrow(0, 0, 0)};
      return {};
    case 3:  // the whole contiguous region into a strided block
      return sending ? std::vector<at::Tensor>{t} : std::vector<at::Tensor>{t.narrow(1, 2, w)};
    default:  // two consecutive row blocks into one transposed block, uneven split of 5 rows
      if (sending) return {t.narrow(0, 0, 2), t.narrow(0, 2, 3)};
      return {t.narrow(1, 0, w).t()};
  }
}

at::Tensor flat_cat(const std::vector<at::Tensor>& boxes, c10::ScalarType dtype) {
  std::vector<at::Tensor> flats;
  for (const at::Tensor& b : boxes) flats.push_back(b.reshape(-1));
  return flats.empty() ? at::empty({0}, at::TensorOptions().dtype(dtype)) : at::cat(flats);
}

struct Exchange {
  at::Tensor input, output, want;
  Lists send, recv;
};

// Rank r's side of the exchange, and the one-device result of its receive tensor.
Exchange exchange_for(int64_t n, int64_t r, int64_t w, c10::ScalarType dtype) {
  Exchange e;
  e.input = input_for(r, {n, 5, w}, dtype);
  e.output = at::full({n, 5, w + 3}, -1).to(dtype);
  e.want = e.output.clone();
  for (int64_t p = 0; p < n; ++p) {
    e.send.push_back(views(e.input[p], r, p, w, true));
    e.recv.push_back(views(e.output[p], p, r, w, false));
    // One device: what p sends r, flattened, written into r's views by plain copies.
    const at::Tensor from_p = input_for(p, {n, 5, w}, dtype)[r];
    const at::Tensor stream = flat_cat(views(from_p, p, r, w, true), dtype);
    int64_t at = 0;
    for (const at::Tensor& v : views(e.want[p], p, r, w, false)) {
      v.copy_(stream.narrow(0, at, v.numel()).view(v.sizes()));
      at += v.numel();
    }
    expect(at == stream.numel(), "test setup: counts differ");
  }
  return e;
}

std::string what(const char* how, c10::ScalarType dtype, int64_t w) {
  return std::string(how) + " " + c10::toString(dtype) + " w=" + std::to_string(w);
}

// Every dtype, a small and a larger width (the larger crosses shm's chunk boundaries mid-row
// and mid-box), synchronous and async.
void check_boxes(int64_t n, int64_t r) {
  for (const auto dtype : kDtypes) {
    for (const int64_t w : {int64_t{3}, int64_t{700}}) {
      Exchange e = exchange_for(n, r, w, dtype);
      const at::Tensor before = e.input.clone();
      const at::Tensor got = all_to_all_boxes(e.send, e.recv, e.output, RankContext::kWorld);
      expect(got.is_same(e.output), "all_to_all_boxes returns its result");
      expect_same(e.output, e.want, what("all_to_all_boxes", dtype, w));
      expect(at::equal(e.input, before), "all_to_all_boxes modified its input");
      Exchange a = exchange_for(n, r, w, dtype);
      const at::Tensor pending =
          all_to_all_boxes(a.send, a.recv, a.output, RankContext::kWorld, /*async_op=*/true);
      expect_same(wait_tensor(pending), a.want, what("async all_to_all_boxes", dtype, w));
    }
  }
}

// Rank 0 calls all_to_all_single with flat buffers, the others all_to_all_boxes: the calls pair
// by their counts.
void check_pairs_with_flat(int64_t n, int64_t r) {
  const int64_t w = 300;
  Exchange e = exchange_for(n, r, w, at::kFloat);
  if (r != 0) {
    all_to_all_boxes(e.send, e.recv, e.output, RankContext::kWorld);
    expect_same(e.output, e.want, "boxed beside a flat all_to_all_single");
    return;
  }
  std::vector<at::Tensor> flats;
  std::vector<int64_t> in_splits, out_splits;
  for (int64_t p = 0; p < n; ++p) {
    flats.push_back(flat_cat(e.send[p], at::kFloat));
    in_splits.push_back(flats.back().numel());
    int64_t count = 0;
    for (const at::Tensor& v : e.recv[p]) count += v.numel();
    out_splits.push_back(count);
  }
  const at::Tensor got =
      all_to_all_single(at::cat(flats), out_splits, in_splits, RankContext::kWorld);
  std::vector<at::Tensor> want;  // what each rank sends rank 0, flattened, in rank order
  for (int64_t p = 0; p < n; ++p) {
    want.push_back(
        flat_cat(views(input_for(p, {n, 5, w}, at::kFloat)[r], p, r, w, true), at::kFloat));
  }
  expect_same(got, at::cat(want), "flat all_to_all_single beside boxed ones");
}

// Every rank sends its rows of one contiguous tensor in consecutive runs and receives into
// consecutive rows of one: the packing fallback passes both as they are.
void check_consecutive_runs(int64_t n, int64_t r) {
  const at::Tensor input = input_for(r, {n, 4, 6}, at::kFloat);
  const at::Tensor output = at::empty({n, 4, 6});
  Lists send, recv;
  for (int64_t p = 0; p < n; ++p) {
    send.push_back({input[p].narrow(0, 0, 1), input[p].narrow(0, 1, 3)});
    recv.push_back({output[p]});
  }
  all_to_all_boxes(send, recv, output, RankContext::kWorld);
  std::vector<at::Tensor> want;
  for (int64_t p = 0; p < n; ++p) want.push_back(input_for(p, {n, 4, 6}, at::kFloat)[r]);
  expect_same(output, at::stack(want), "consecutive runs");
}

void check_everything(int64_t n, int64_t r) {
  check_boxes(n, r);
  check_pairs_with_flat(n, r);
  check_consecutive_runs(n, r);
}

class AllToAllBoxesTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(AllToAllBoxesTest, RanksAsThreads) {
  const int64_t n = GetParam();
  run_threads(n, [n](int64_t r) { check_everything(n, r); });
}

TEST_P(AllToAllBoxesTest, ShmProcesses) { run_ranks(GetParam(), check_everything); }

TEST_P(AllToAllBoxesTest, ShmProcessesThroughTinyBuffers) {
  RunOptions o;
  o.buffer_bytes = "1024";  // slots of a few elements: ranges end mid-row and mid-box
  run_ranks(GetParam(), check_everything, o);
}

// A boxed call never reads peers' memory directly (its boxes have no flat address); the flat
// calls beside it still may.
TEST_P(AllToAllBoxesTest, ShmProcessesWithCrossMemoryAttach) {
  RunOptions o;
  o.buffer_bytes = "4096";
  o.cma = "1";
  run_ranks(GetParam(), check_everything, o);
}

// cuda_ipc takes no boxes: the functional layer packs and unpacks them.
TEST_P(AllToAllBoxesTest, PackingFallbackOnStagedHostBuffers) {
  RunOptions o;
  o.backend = "cuda_ipc";
  run_ranks(
      GetParam(),
      [](int64_t n, int64_t r) {
        ::setenv("DTENSOR_CUDA_IPC_STAGE_CPU", "1", 1);
        ::setenv("DTENSOR_CUDA_IPC_BUFFER_BYTES", "4096", 1);
        check_everything(n, r);
      },
      o);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AllToAllBoxesTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

// CommCounter sees a boxed call as an all_to_all of its boxes' bytes.
TEST(AllToAllBoxes, CountedAsAnAllToAllOfItsBoxesBytes) {
  run_threads(2, [](int64_t r) {
    const at::Tensor input = at::arange(12, at::kDouble).view({3, 4});
    const at::Tensor output = at::zeros({4, 3}, at::kDouble);
    CommCounter counter;
    // 3 x 2 elements to each rank, as column blocks, received as rows of the transposed output.
    all_to_all_boxes({{input.narrow(1, 0, 2)}, {input.narrow(1, 2, 2)}},
                     {{output.narrow(0, 0, 2).t()}, {output.narrow(0, 2, 2).t()}}, output,
                     RankContext::kWorld);
    ASSERT_EQ(counter.count(CollectiveKind::kAllToAll), 1);
    EXPECT_EQ(counter.records()[0].input_bytes, 12 * 8);
    EXPECT_EQ(counter.records()[0].output_bytes, 12 * 8);
    EXPECT_TRUE(
        at::equal(output.t(), at::cat({input.narrow(1, 2 * r, 2), input.narrow(1, 2 * r, 2)}, 1)))
        << output;
  });
}

// Bad calls fail on the calling rank before any communication, naming the collective, the group
// and the rank.
TEST(AllToAllBoxes, BadCallsNameTheCollectiveGroupAndRank) {
  run_threads(2, [](int64_t r) {
    const at::Tensor a = at::zeros({4}), b = at::zeros({4});
    const std::string where = "on group 'world' (global rank " + std::to_string(r) + ")";
    const auto error = [](const std::function<void()>& fn) {
      try {
        fn();
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    std::string err = error([&] { all_to_all_boxes({{a}}, {{b}}, b, RankContext::kWorld); });
    EXPECT_TRUE(contains(err, "all_to_all_boxes " + where) && contains(err, "per rank")) << err;
    err = error([&] {
      all_to_all_boxes({{a}, {}}, {{a.narrow(0, 0, 2)}, {}}, b, RankContext::kWorld, false, "x");
    });
    EXPECT_TRUE(contains(err, "x " + where) && contains(err, "shares storage")) << err;
    err = error([&] {
      all_to_all_boxes({{a.to(at::kLong)}, {}}, {{b}, {}}, b, RankContext::kWorld);
    });
    EXPECT_TRUE(contains(err, where) && contains(err, "Long")) << err;
    err = error([&] {
      all_to_all_boxes({{a}, {}}, {{b.expand({2, 4})}, {}}, b, RankContext::kWorld);
    });
    EXPECT_TRUE(contains(err, where) && contains(err, "overlaps itself")) << err;
    err = error([&] { all_to_all_boxes({{}, {}}, {{}, {}}, at::Tensor(), RankContext::kWorld); });
    EXPECT_TRUE(contains(err, where) && contains(err, "defined result")) << err;
    const at::Tensor c = at::zeros({2}, at::kComplexFloat);
    err = error([&] { all_to_all_boxes({{}, {}}, {{c.conj()}, {}}, c, RankContext::kWorld); });
    EXPECT_TRUE(contains(err, where) && contains(err, "conjugation")) << err;
  });
}

}  // namespace
}  // namespace dtensor::collectives
