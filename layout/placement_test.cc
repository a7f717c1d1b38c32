#include "layout/placement.h"

#include <gtest/gtest.h>

#include <cmath>
#include <unordered_set>

namespace dtensor {
namespace {

TEST(PlacementTest, ToStringMatchesPyTorchShortForms) {
  struct Case {
    Placement p;
    const char* text;
  };
  const Case cases[] = {
      {Shard(0), "S(0)"},
      {Shard(-1), "S(-1)"},
      {Replicate(), "R"},
      {Partial(), "P(sum)"},
      {Partial(ReduceOp::kAvg), "P(avg)"},
      {Partial(ReduceOp::kMin), "P(min)"},
      {Partial(ReduceOp::kMax), "P(max)"},
      {Partial(ReduceOp::kProduct), "P(product)"},
      {Partial(ReduceOp::kBand), "P(band)"},
      {Partial(ReduceOp::kBor), "P(bor)"},
      {Partial(ReduceOp::kBxor), "P(bxor)"},
      {Placement::partial_norm(2), "P(norm2)"},
      {Placement::partial_norm(1.5), "P(norm1.5)"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(c.p.to_string(), c.text);
    EXPECT_EQ(parse_placement(c.text), c.p) << c.text;  // round trip
  }
}

TEST(PlacementTest, EqualityAndHashAreByValue) {
  EXPECT_EQ(Shard(1), Placement::shard(1));
  EXPECT_NE(Shard(0), Shard(1));
  EXPECT_NE(Partial(ReduceOp::kSum), Partial(ReduceOp::kMax));
  EXPECT_NE(Replicate(), Partial());
  EXPECT_NE(Replicate(), Shard(0));
  std::unordered_set<Placement> set = {
      Shard(0), Shard(0), Replicate(), Partial(), Partial(ReduceOp::kAvg), Shard(1)};
  EXPECT_EQ(set.size(), 5u);
  EXPECT_EQ(sizeof(Placement), 8u);
}

TEST(PlacementTest, NormPartialsByOrder) {
  EXPECT_NE(Placement::partial_norm(2), Placement::partial_norm(3));
  EXPECT_NE(Placement::partial_norm(2).hash(), Placement::partial_norm(3).hash());
  EXPECT_EQ(Placement::partial_norm(3).norm_order(), 3.0f);
  EXPECT_EQ(Partial().norm_order(), 0.0f);
  EXPECT_EQ(parse_placement("P(norm)"), Placement::partial_norm(2));
  // PyTorch's Partial("prod") is the product (PyTorch accepts the name, then cannot reduce it).
  EXPECT_EQ(parse_placement("P(prod)"), Partial(ReduceOp::kProduct));
  EXPECT_EQ(parse_reduce_op("prod"), ReduceOp::kProduct);
  EXPECT_EQ(parse_placement("Partial(norm3)"), Placement::partial_norm(3));
  // The orders with a plain reduce op, and those without any.
  EXPECT_EQ(*norm_partial_order(0), Partial());
  EXPECT_EQ(*norm_partial_order(1), Partial());
  EXPECT_EQ(*norm_partial_order(INFINITY), Partial(ReduceOp::kMax));
  EXPECT_EQ(*norm_partial_order(-INFINITY), Partial(ReduceOp::kMin));
  EXPECT_EQ(*norm_partial_order(2), Placement::partial_norm(2));
  EXPECT_FALSE(norm_partial_order(-1));
  EXPECT_FALSE(norm_partial_order(0.1));  // no float holds 0.1 exactly
  for (const char* bad : {"P(norm-1)", "P(norm0.1)", "P(norm1)", "P(normx)", "P(norminf)"}) {
    EXPECT_THROW(parse_placement(bad), Error) << bad;
  }
}

TEST(PlacementTest, KindQueries) {
  EXPECT_TRUE(Shard(2).is_shard());
  EXPECT_TRUE(Shard(2).is_shard(2));
  EXPECT_FALSE(Shard(2).is_shard(1));
  EXPECT_EQ(Shard(2).dim(), 2);
  EXPECT_TRUE(Replicate().is_replicate());
  EXPECT_TRUE(Partial(ReduceOp::kMax).is_partial());
  EXPECT_EQ(Partial(ReduceOp::kMax).reduce_op(), ReduceOp::kMax);
  EXPECT_TRUE(is_bitwise(ReduceOp::kBxor));
  EXPECT_FALSE(is_bitwise(ReduceOp::kProduct));
}

TEST(PlacementTest, ParsesListsInEveryAcceptedSpelling) {
  const Placements expected = {Shard(0), Replicate(), Partial(ReduceOp::kAvg)};
  for (const char* text : {"S(0),R,P(avg)", "[S(0),R,P(avg)]", " S( 0 ) , R , P(avg) ",
                           "Shard(0),Replicate(),Partial(avg)", "[Shard(0), Replicate, P(avg)]"}) {
    EXPECT_EQ(parse_placements(text), expected) << text;
  }
  EXPECT_EQ(parse_placements("P"), Placements{Partial()});
  EXPECT_EQ(parse_placements("[]"), Placements{});
  EXPECT_EQ(to_string(expected), "[S(0),R,P(avg)]");
  EXPECT_EQ(parse_placements(to_string(expected)), expected);
}

// Each bad text must be rejected with a message naming the bad token.
TEST(PlacementTest, RejectsBadTextNamingTheToken) {
  struct Case {
    const char* text;
    const char* token;
  };
  const Case cases[] = {
      {"S(0),X,R", "'X'"},
      {"S(a)", "'S(a)'"},
      {"S()", "'S()'"},
      {"S(0", "'S(0'"},
      {"R,P(mean)", "'P(mean)'"},
      {"S(0),,R", "''"},
      {"R(1)", "'R(1)'"},
      {"S(1.5)", "'S(1.5)'"},
      {"Shard0)", "'Shard0)'"},
      {"[S(0),R", "'[S(0),R'"},
      {"S(0)),R", "unexpected ')'"},
  };
  for (const auto& c : cases) {
    try {
      parse_placements(c.text);
      ADD_FAILURE() << "accepted " << c.text;
    } catch (const dtensor::Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.token), std::string::npos)
          << c.text << " -> " << e.what();
    }
  }
}

TEST(PlacementTest, ReduceOpNamesRoundTrip) {
  for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                  ReduceOp::kProduct, ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
    EXPECT_EQ(parse_reduce_op(reduce_op_name(op)), op);
  }
  EXPECT_THROW(parse_reduce_op("mean"), dtensor::Error);
}

}  // namespace
}  // namespace dtensor
