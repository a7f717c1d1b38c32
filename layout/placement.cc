#include "layout/placement.h"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>

#include "base/error.h"

namespace dtensor {
namespace {

constexpr std::array<std::string_view, 9> kReduceOpNames = {"sum",  "avg", "min",  "max", "product",
                                                            "band", "bor", "bxor", "norm"};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

[[noreturn]] void bad_token(std::string_view token, const std::string& why) {
  throw Error(
      "bad placement '" + std::string(token) + "': " + why +
      " (expected S(<dim>), R, P(<op>) or _S(<dim>,<split_factor>), e.g. \"S(0),R,P(sum)\")");
}

// Splits "Name(arg)" into name and arg; arg is empty and has_parens false for "Name".
struct Call {
  std::string_view name;
  std::string_view arg;
  bool has_parens = false;
};

Call split_call(std::string_view token) {
  Call call;
  const size_t open = token.find('(');
  if (open == std::string_view::npos) {
    if (token.find(')') != std::string_view::npos) bad_token(token, "unbalanced ')'");
    call.name = token;
    return call;
  }
  if (token.back() != ')') bad_token(token, "missing ')'");
  call.name = trim(token.substr(0, open));
  call.arg = trim(token.substr(open + 1, token.size() - open - 2));
  call.has_parens = true;
  return call;
}

int32_t parse_int(std::string_view token, std::string_view text, const char* what) {
  int32_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) {
    bad_token(token, std::string(what) + " '" + std::string(text) + "' is not an integer");
  }
  return v;
}

// "_S(0,2)" or "_StridedShard(0, split_factor=2)" (the keyword is optional in both).
Placement parse_strided(std::string_view token, std::string_view arg) {
  const size_t comma = arg.find(',');
  if (comma == std::string_view::npos) {
    bad_token(token, "a strided shard needs a dim and a split factor, e.g. _S(0,2)");
  }
  // Drops "key=" in front of a value (repr's "_StridedShard(dim=0, sf=2)" parses too).
  const auto value = [](std::string_view text, std::initializer_list<std::string_view> keys) {
    for (std::string_view key : keys) {
      const std::string_view rest = trim(text.substr(std::min(key.size(), text.size())));
      if (text.substr(0, key.size()) == key && rest.substr(0, 1) == "=") {
        return trim(rest.substr(1));
      }
    }
    return text;
  };
  const int32_t dim = parse_int(token, value(trim(arg.substr(0, comma)), {"dim"}), "shard dim");
  const std::string_view sf = value(trim(arg.substr(comma + 1)), {"split_factor", "sf"});
  try {
    return Placement::strided_shard(dim, parse_int(token, sf, "split factor"));
  } catch (const Error& e) {
    bad_token(token, e.what());
  }
}

}  // namespace

std::string_view reduce_op_name(ReduceOp op) { return kReduceOpNames[static_cast<size_t>(op)]; }

ReduceOp parse_reduce_op(std::string_view text) {
  for (size_t i = 0; i < kReduceOpNames.size(); ++i) {
    if (kReduceOpNames[i] == text) return static_cast<ReduceOp>(i);
  }
  // PyTorch accepts Partial("prod") (its name for aten.prod's reduction) and fails only when it
  // reduces one; here it is the product, reduced as one.
  if (text == "prod") return ReduceOp::kProduct;
  throw Error("unknown reduce op '" + std::string(text) +
              "' (expected one of sum, avg, min, max, product, band, bor, bxor, norm<p>)");
}

bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
}

Placement Placement::strided_shard(int32_t dim, int64_t split_factor) {
  DTENSOR_CHECK(split_factor >= 1 && split_factor <= UINT16_MAX, "_StridedShard(", dim,
                ", split_factor=", split_factor, "): the split factor must be in [1, ", UINT16_MAX,
                "]");
  if (split_factor == 1) return Placement::shard(dim);  // one piece: a plain Shard
  return Placement(Kind::kStridedShard, dim, ReduceOp::kSum, static_cast<uint16_t>(split_factor));
}

std::string Placement::to_string() const {
  switch (kind_) {
    case Kind::kStridedShard:
      return "_S(" + std::to_string(dim_) + "," + std::to_string(split_) + ")";
    case Kind::kReplicate:
      return "R";
    case Kind::kShard:
      return "S(" + std::to_string(dim_) + ")";
    case Kind::kPartial:
      if (op_ == ReduceOp::kNorm) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "P(norm%.9g)", static_cast<double>(norm_order()));
        return buf;
      }
      return "P(" + std::string(reduce_op_name(op_)) + ")";
  }
  return "?";
}

std::string to_string(const Placements& placements) {
  std::string out = "[";
  for (size_t i = 0; i < placements.size(); ++i) {
    if (i) out += ",";
    out += placements[i].to_string();
  }
  return out + "]";
}

Placement parse_placement(std::string_view text) {
  const std::string_view token = trim(text);
  if (token.empty()) bad_token(token, "empty placement");
  const Call call = split_call(token);
  if (call.name == "R" || call.name == "Replicate") {
    if (!call.arg.empty()) bad_token(token, "Replicate takes no argument");
    return Placement::replicate();
  }
  if (call.name == "S" || call.name == "Shard") {
    if (call.arg.empty()) bad_token(token, "Shard needs a tensor dim, e.g. S(0)");
    int32_t dim = 0;
    const char* end = call.arg.data() + call.arg.size();
    const auto [ptr, ec] = std::from_chars(call.arg.data(), end, dim);
    if (ec != std::errc() || ptr != end) {
      bad_token(token, "shard dim '" + std::string(call.arg) + "' is not an integer");
    }
    return Placement::shard(dim);
  }
  if (call.name == "_S" || call.name == "_StridedShard") {
    return parse_strided(token, call.arg);
  }
  if (call.name == "P" || call.name == "Partial") {
    if (call.arg.empty()) return Placement::partial(ReduceOp::kSum);
    if (call.arg.substr(0, 4) == "norm") {
      const std::string order(call.arg.substr(4));
      char* end = nullptr;
      const double p = order.empty() ? 2.0 : std::strtod(order.c_str(), &end);
      const std::optional<Placement> made = norm_partial_order(p);
      if ((!order.empty() && end != order.c_str() + order.size()) || !made ||
          made->reduce_op() != ReduceOp::kNorm) {
        bad_token(token,
                  "a norm Partial's order is a finite p > 0 other than 1, held exactly by "
                  "a float (P(norm2), P(norm3), P(norm1.5))");
      }
      return *made;
    }
    try {
      return Placement::partial(parse_reduce_op(call.arg));
    } catch (const Error& e) {
      bad_token(token, e.what());
    }
  }
  bad_token(token, "unknown placement kind '" + std::string(call.name) + "'");
}

std::optional<Placement> norm_partial_order(double ord) {
  if (ord == 0 || ord == 1) return Placement::partial(ReduceOp::kSum);
  if (std::isinf(ord)) return Placement::partial(ord > 0 ? ReduceOp::kMax : ReduceOp::kMin);
  if (!(ord > 0) || static_cast<double>(static_cast<float>(ord)) != ord) return std::nullopt;
  return Placement::partial_norm(static_cast<float>(ord));
}

Placements parse_placements(std::string_view text) {
  std::string_view body = trim(text);
  if (!body.empty() && body.front() == '[') {
    if (body.back() != ']') bad_token(body, "missing ']'");
    body = trim(body.substr(1, body.size() - 2));
  }
  Placements out;
  if (body.empty()) return out;  // "[]": a 0-D mesh has no placements.
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= body.size(); ++i) {
    if (i < body.size() && body[i] == '(') ++depth;
    if (i < body.size() && body[i] == ')' && --depth < 0) {
      bad_token(body.substr(start, i + 1 - start), "unexpected ')'");
    }
    if (i == body.size() || (body[i] == ',' && depth == 0)) {
      const std::string_view token = body.substr(start, i - start);
      try {
        out.push_back(parse_placement(token));
      } catch (const Error& e) {
        throw Error(std::string(e.what()) + " at position " + std::to_string(out.size()) +
                    " of \"" + std::string(text) + "\"");
      }
      start = i + 1;
    }
  }
  return out;
}

}  // namespace dtensor
