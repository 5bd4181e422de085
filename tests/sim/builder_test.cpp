// Builder invariants: an op may depend only on earlier ops; anything else is a bug in a schedule
// builder and is reported, never dropped.
#include "builder.hpp"

#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

namespace cpsim::sim::detail {
namespace {

std::string error_of(Builder& b, const OpSpec& spec) {
  try {
    (void)b.op(spec);
  } catch (const std::logic_error& e) {
    return e.what();
  }
  return "none";
}

TEST(Builder, DependencyOnEarlierOpIsKept) {
  Workload w;
  Builder b(w, 1, 1, 1, 1, 8);
  OpSpec first;
  first.name = "first";
  const OpSet a = b.op(first);
  OpSpec second;
  second.name = "second";
  second.stream = Stream::kComm;  // another stream: the dependency is not implied
  second.deps = {a};
  const OpSet s = b.op(second);
  const Op& op = w.ops[static_cast<std::size_t>(s.base)];
  ASSERT_EQ(op.deps_end - op.deps_begin, 1);
  EXPECT_EQ(w.edges[static_cast<std::size_t>(op.deps_begin)], a.base);
}

TEST(Builder, DependencyOnLaterOrUnknownOpThrows) {
  Workload w;
  Builder b(w, 1, 1, 1, 1, 8);
  OpSpec first;
  first.name = "first";
  (void)b.op(first);
  OpSpec bad;
  bad.name = "attn_fwd";
  bad.deps = {OpSet{5}};  // no op 5 yet
  const std::string later = error_of(b, bad);
  EXPECT_NE(later.find("'attn_fwd'"), std::string::npos) << later;
  EXPECT_NE(later.find("#5"), std::string::npos) << later;
  bad.deps = {OpSet{1}};  // itself
  EXPECT_NE(error_of(b, bad), "none");
  bad.deps = {OpSet{-7}};
  EXPECT_NE(error_of(b, bad).find("unknown"), std::string::npos);
}

}  // namespace
}  // namespace cpsim::sim::detail
