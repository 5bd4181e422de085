// Document lengths and packing (models/documents.hpp): the three sources, the sampler's
// determinism, and each packing by hand.
#include "cpsim/models/documents.hpp"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"

namespace cpsim::models {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

fs::path write_temp(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("cpsim_documents_test_" + name);
  std::ofstream(p) << text;
  return p;
}

std::vector<std::vector<std::int64_t>> documents_of(const std::vector<PackedSequence>& packed) {
  std::vector<std::vector<std::int64_t>> out;
  for (const PackedSequence& s : packed) {
    out.push_back(s.documents);
  }
  return out;
}

// Packs `count` sequences of `S` from documents all of `length` tokens.
std::vector<PackedSequence> pack_constant(
    std::int64_t length, std::int64_t S, std::int64_t span, Packing packing, int count) {
  LengthDistribution d;
  d.lengths = {length};
  d.weights = {1.0};
  DocumentSampler sampler(d, 7);
  return pack_documents(sampler, S, span, packing, count);
}

TEST(Documents, LognormalSpecIsParsed) {
  const LengthDistribution d =
      parse_length_distribution("lognormal:median=8K,sigma=1.5,max=1M", "--lengths");
  EXPECT_EQ(d.kind, LengthDistribution::Kind::kLognormal);
  EXPECT_EQ(d.median_tokens, 8192.0);
  EXPECT_EQ(d.sigma, 1.5);
  EXPECT_EQ(d.max_tokens, 1 << 20);
  EXPECT_DOUBLE_EQ(d.mean_tokens(), 8192.0 * std::exp(1.125));
}

TEST(Documents, BadSpecsNameTheField) {
  for (const char* bad : {"lognormal:median=8K", "lognormal:sigma=1", "lognormal:median=8K,sigma=x",
                          "lognormal:median=8K,sigma=1,mode=2", "zipf:1.1"}) {
    try {
      (void)parse_length_distribution(bad, "--lengths");
      ADD_FAILURE() << bad;
    } catch (const InputError& e) {
      EXPECT_THAT(e.what(), HasSubstr("--lengths")) << bad;
    }
  }
}

TEST(Documents, FileOfLengthsAndHistogram) {
  const fs::path lines = write_temp("lines.txt", "# lengths\n100\n\n2K\n");
  const LengthDistribution a = parse_length_distribution(lines.string(), "--lengths");
  EXPECT_EQ(a.lengths, (std::vector<std::int64_t>{100, 2048}));
  EXPECT_DOUBLE_EQ(a.mean_tokens(), 1074.0);
  const fs::path hist = write_temp("hist.json", R"({"lengths": [10, 30], "counts": [3, 1]})");
  const LengthDistribution b = parse_length_distribution(hist.string(), "--lengths");
  EXPECT_DOUBLE_EQ(b.mean_tokens(), 15.0);
  const fs::path bad_line = write_temp("bad.txt", "100\nten\n");
  try {
    (void)parse_length_distribution(bad_line.string(), "--lengths");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr(bad_line.string() + ":2"));
  }
  const fs::path bad_hist = write_temp("bad.json", R"({"lengths": [10], "counts": [-1]})");
  EXPECT_THROW((void)parse_length_distribution(bad_hist.string(), "--lengths"), InputError);
  EXPECT_THROW((void)parse_length_distribution("/no/such/lengths.txt", "--lengths"), InputError);
}

TEST(Documents, SamplerIsDeterministicForASeed) {
  const LengthDistribution d = parse_length_distribution("lognormal:median=4K,sigma=1", "x");
  DocumentSampler a(d, 42), b(d, 42), c(d, 43);
  std::vector<std::int64_t> from_a, from_b, from_c;
  for (int i = 0; i < 100; ++i) {
    from_a.push_back(a.next());
    from_b.push_back(b.next());
    from_c.push_back(c.next());
  }
  EXPECT_EQ(from_a, from_b);
  EXPECT_NE(from_a, from_c);
}

TEST(Documents, WeightedSamplerFollowsTheWeights) {
  LengthDistribution d;
  d.lengths = {10, 20};
  d.weights = {3.0, 1.0};
  DocumentSampler s(d, 1);
  int tens = 0;
  for (int i = 0; i < 40000; ++i) {
    tens += s.next() == 10 ? 1 : 0;
  }
  EXPECT_NEAR(tens / 40000.0, 0.75, 0.01);
}

TEST(Documents, ConcatCutsDocumentsAtTheSequenceEnd) {
  // Documents of 3 into sequences of 4: 3+1 | 2+2 | 1+3 | 3+1.
  EXPECT_EQ(documents_of(pack_constant(3, 4, 1, Packing::kConcat, 4)),
            (std::vector<std::vector<std::int64_t>>{{3, 1}, {2, 2}, {1, 3}, {3, 1}}));
  // A document longer than two sequences fills them.
  EXPECT_EQ(documents_of(pack_constant(9, 4, 1, Packing::kConcat, 3)),
            (std::vector<std::vector<std::int64_t>>{{4}, {4}, {1, 3}}));
}

TEST(Documents, GreedyPadsAndDropsLongDocuments) {
  const std::vector<PackedSequence> p = pack_constant(3, 4, 1, Packing::kGreedy, 2);
  EXPECT_EQ(documents_of(p), (std::vector<std::vector<std::int64_t>>{{3}, {3}}));
  EXPECT_EQ(p[0].real_tokens(), 3);
  // Spans rounded to 4: two documents of 3 fill a sequence of 8.
  EXPECT_EQ(documents_of(pack_constant(3, 8, 4, Packing::kGreedy, 1)),
            (std::vector<std::vector<std::int64_t>>{{3, 3}}));
  try {
    (void)pack_constant(9, 8, 1, Packing::kGreedy, 1);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("lengths"));
  }
}

TEST(Documents, FirstFitFillsEarlierSequences) {
  // Weighted lengths 5 and 3 alternate by chance; by hand with a fixed order instead: lengths
  // of 3 into 8 leave 2 free in each, so every sequence holds two and the window closes in order.
  const std::vector<PackedSequence> p = pack_constant(3, 8, 1, Packing::kFirstFit, 3);
  EXPECT_EQ(documents_of(p), (std::vector<std::vector<std::int64_t>>{{3, 3}, {3, 3}, {3, 3}}));
}

TEST(Documents, PackingNames) {
  for (const Packing p : {Packing::kConcat, Packing::kGreedy, Packing::kFirstFit}) {
    EXPECT_EQ(parse_packing(to_string(p), "--packing"), p);
  }
  EXPECT_THROW((void)parse_packing("best-fit", "--packing"), InputError);
}

}  // namespace
}  // namespace cpsim::models
