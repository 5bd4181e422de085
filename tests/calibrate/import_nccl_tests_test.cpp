// `calibrate import nccl-tests`: the published H100 logs in tests/data/nccl-tests (SOURCES.md)
// parse and fit to the bus bandwidth they print; format variants and bad input on constructed
// text.
#include "cpsim/calibrate/import_nccl_tests.hpp"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cpsim/calibrate/profile_fit.hpp"
#include "cpsim/calibrate/raw.hpp"
#include "cpsim/calibrate/raw_merge.hpp"
#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"

namespace cpsim::calibrate {
namespace {

namespace fs = std::filesystem;
using models::Collective;
using models::Span;
using ::testing::HasSubstr;

fs::path log_dir() {
  return fs::path(CPSIM_TEST_DATA_DIR).parent_path() / "tests" / "data" / "nccl-tests";
}

NcclTestsRun load(const std::string& name, std::optional<Collective> op = std::nullopt) {
  return load_nccl_tests_log(log_dir() / name, op);
}

// ---------------------------------------------------------------------------------------------
// Published logs

struct PublishedLog {
  const char* file;
  bool names_program;
  int ranks;
  int nodes;
  std::size_t rows;
  const char* nccl_version;
  /// Out-of-place busbw the log prints (GB/s) at its largest sizes, largest last.
  std::vector<std::pair<std::int64_t, double>> printed_busbw;
};

const std::vector<PublishedLog>& published() {
  static const std::vector<PublishedLog> logs = {
      {"h100_1node_8gpu_all_reduce_issue290.log",
       false,
       8,
       1,
       6,
       "unknown",
       {{1073741824, 465.25}, {2147483648, 468.57}, {4294967296, 473.60}}},
      {"h100_2node_16gpu_all_reduce_issue290.log",
       false,
       16,
       2,
       11,
       "unknown",
       {{2147483648, 153.09}, {4294967296, 154.74}, {8589934592, 155.57}}},
      {"h100_2node_16gpu_all_reduce_ring_issue290.log",
       false,
       16,
       2,
       11,
       "unknown",
       {{2147483648, 89.17}, {4294967296, 89.90}, {8589934592, 89.90}}},
      {"h100_2node_16gpu_all_reduce_mpi_issue309.log",
       true,
       16,
       2,
       32,
       "2.26.2",
       {{4294967296, 466.52}, {8589934592, 468.46}, {17179869184, 469.21}}},
  };
  return logs;
}

TEST(ImportNcclTests, ParsesEveryPublishedLog) {
  for (const PublishedLog& log : published()) {
    SCOPED_TRACE(log.file);
    const NcclTestsRun run = load(log.file, Collective::kAllReduce);
    EXPECT_EQ(run.op, Collective::kAllReduce);
    EXPECT_EQ(run.program, log.names_program ? "all_reduce_perf" : "");
    EXPECT_EQ(run.ranks, log.ranks);
    EXPECT_EQ(run.nodes, log.nodes);
    EXPECT_EQ(run.device, "NVIDIA H100 80GB HBM3");
    EXPECT_EQ(run.nccl_version, log.nccl_version);
    ASSERT_EQ(run.samples.size(), 2 * log.rows);
    EXPECT_FALSE(run.samples.front().in_place);
    EXPECT_TRUE(run.samples.back().in_place);
    for (const CollectiveSample& s : run.samples) {
      EXPECT_EQ(s.ranks, log.ranks);
      EXPECT_EQ(s.nodes, log.nodes);
    }
  }
}

TEST(ImportNcclTests, ReadsTheNumbersOfARow) {
  // issue 309, 1 GiB: 4484.9 us out-of-place, 4470.2 us in-place, 16 ranks.
  const NcclTestsRun run = load("h100_2node_16gpu_all_reduce_mpi_issue309.log");
  const CollectiveSample& out = run.samples[27];
  EXPECT_EQ(out.size_bytes, 1073741824);
  EXPECT_DOUBLE_EQ(out.time_s, 4484.9e-6);
  EXPECT_NEAR(out.algbw_bytes_per_s / 1e9, 239.41, 0.01);
  EXPECT_NEAR(out.busbw_bytes_per_s / 1e9, 448.90, 0.01);
  const CollectiveSample& in = run.samples[32 + 27];
  EXPECT_TRUE(in.in_place);
  EXPECT_DOUBLE_EQ(in.time_s, 4470.2e-6);
  EXPECT_EQ(run.iters, 20);
  EXPECT_EQ(run.warmup_iters, 5);
  EXPECT_DOUBLE_EQ(run.avg_busbw_gb_s, 139.56);
}

TEST(ImportNcclTests, LogsWithoutAProgramNameNeedOp) {
  try {
    (void)load("h100_1node_8gpu_all_reduce_issue290.log");
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--op");
    EXPECT_THAT(e.what(), HasSubstr("h100_1node_8gpu_all_reduce_issue290.log"));
  }
  // A log that names its program refuses a contradicting --op.
  EXPECT_THROW((void)load("h100_2node_16gpu_all_reduce_mpi_issue309.log", Collective::kAllToAll),
               InputError);
}

/// The fitted profile's bus bandwidth at the log's largest sizes, t = alpha + launch + wire /
/// (peak · eff) as the simulator computes it, against the busbw the log prints: within 1 %
/// (measured: 0.43 % at most).
TEST(ImportNcclTests, FittedBusBandwidthMatchesThePrintedOneAtLargeSizes) {
  const models::HardwareProfile base =
      models::load_hardware("h100-sxm-80g", models::DataDir{CPSIM_TEST_DATA_DIR}, "--base");
  for (const PublishedLog& log : published()) {
    SCOPED_TRACE(log.file);
    const RawCalibration raw =
        raw_from_nccl_tests({load(log.file, Collective::kAllReduce)}, {}, "test");
    const ProfileFit fit = fit_profile(raw, base, FitOptions{});
    const Span span = log.nodes > 1 ? Span::kInterNode : Span::kIntraNode;
    const models::CollectiveModel& m = fit.profile.collective(span, Collective::kAllReduce);
    const double n = log.ranks;
    for (const auto& [size, printed] : log.printed_busbw) {
      const double wire = 2.0 * static_cast<double>(size / log.ranks) * (n - 1.0);
      const double t =
          m.alpha_s + fit.profile.collective_launch_s +
          wire / (m.peak_busbw_bytes_per_s * m.efficiency_by_size(static_cast<double>(size), 1.0));
      const double busbw = static_cast<double>(size) / t * 2.0 * (n - 1.0) / n / 1e9;
      EXPECT_NEAR(busbw / printed, 1.0, 0.01) << size << ": fitted " << busbw << " GB/s";
    }
  }
}

TEST(ImportNcclTests, NamesTheWarmUpOutliersOfThePublishedMpiLog) {
  const models::HardwareProfile base =
      models::load_hardware("h100-sxm-80g", models::DataDir{CPSIM_TEST_DATA_DIR}, "--base");
  const RawCalibration raw =
      raw_from_nccl_tests({load("h100_2node_16gpu_all_reduce_mpi_issue309.log")}, {}, "test");
  const ProfileFit fit = fit_profile(raw, base, FitOptions{});
  const CurveFit* row = nullptr;
  for (const CurveFit& r : fit.curves) {
    if (r.curve == "collectives.inter_node.all_reduce") {
      row = &r;
    }
  }
  ASSERT_NE(row, nullptr);
  std::vector<std::string> names;
  for (const CurveFit::Outlier& o : row->outliers) {
    names.push_back(o.name);
  }
  EXPECT_THAT(names, ::testing::Contains(HasSubstr("all_reduce 16 ranks 8 B: measured 68.5 us")));
  EXPECT_THAT(names, ::testing::Contains(HasSubstr("all_reduce 16 ranks 256 B: measured 94.4 us")));
  EXPECT_THROW(check_fit_quality(fit, 0.15), InputError);
}

// ---------------------------------------------------------------------------------------------
// Format variants and bad input, on constructed text (not measurements)

/// A results table in the given header layout; algbw and busbw consistent with size, time and
/// `ranks` for `op` (busbw factor as nccl-tests computes it).
std::string table(Collective op, int ranks, const std::string& header, bool with_root) {
  std::string out = header + "\n";
  for (std::int64_t size = 1024; size <= 1 << 20; size *= 4) {
    const double time_us = 10.0 + static_cast<double>(size) / 1e5;
    const double algbw = static_cast<double>(size) / (time_us * 1e-6) / 1e9;
    const double busbw = algbw * busbw_factor(op, ranks);
    out += fmt::format(
        "{:>12} {:>13} {:>9} {:>7}{} {:8.2f} {:7.2f} {:7.2f} {:6} {:8.2f} {:7.2f} "
        "{:7.2f} {:6}\n",
        size, size / 4, "float", "none", with_root ? "      -1" : "", time_us, algbw, busbw, 0,
        time_us, algbw, busbw, 0);
  }
  return out;
}

std::string rank_lines(int ranks, int per_node) {
  std::string out = "# Using devices\n";
  for (int r = 0; r < ranks; ++r) {
    out += fmt::format(
        "#  Rank {:2} Group  0 Pid {:6} on {:>10} device {:2} [0x{:02x}] NVIDIA "
        "H100 80GB HBM3\n",
        r, 1000 + r, fmt::format("node{}", r / per_node), r % per_node, r);
  }
  return out;
}

constexpr const char* kHeader =
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time"
    "   algbw   busbw #wrong";
constexpr const char* kOldHeader =
    "#       size         count    type   redop     time   algbw   busbw  error     time   algbw"
    "   busbw  error";

TEST(ImportNcclTests, TakesTheCollectiveFromTheProgramLine) {
  const std::string text =
      "# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807\n"
      "# Collective test starting: alltoall_perf\n" +
      rank_lines(4, 4) + table(Collective::kAllToAll, 4, kHeader, true);
  const NcclTestsRun run = parse_nccl_tests_log(text, "a2a.log", std::nullopt);
  EXPECT_EQ(run.op, Collective::kAllToAll);
  EXPECT_EQ(run.program, "alltoall_perf");
  EXPECT_EQ(run.ranks, 4);
  EXPECT_EQ(run.nccl_version, "2.28.7");
  EXPECT_EQ(run.samples.size(), 12U);
}

TEST(ImportNcclTests, ReadsTheOlderLayoutWithoutRootAndMpiTaggedLines) {
  std::string text = "mpirun -np 8 ./build/reduce_scatter_perf -b 1K -e 1M -f 4\n" +
                     rank_lines(8, 4) + table(Collective::kReduceScatter, 8, kOldHeader, false);
  std::string tagged;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    tagged += "[1,0]<stdout>:" + text.substr(start, end - start) + "\n";
    start = end + 1;
  }
  const NcclTestsRun run = parse_nccl_tests_log(tagged, "rs.log", std::nullopt);
  EXPECT_EQ(run.op, Collective::kReduceScatter);
  EXPECT_EQ(run.ranks, 8);
  EXPECT_EQ(run.nodes, 2);
  EXPECT_EQ(run.samples.size(), 12U);
}

TEST(ImportNcclTests, BadInputNamesFileAndLine) {
  const std::string good = "# Collective test starting: all_gather_perf\n" + rank_lines(2, 2) +
                           table(Collective::kAllGather, 2, kHeader, true);
  auto field_of = [](const std::string& text) {
    try {
      (void)parse_nccl_tests_log(text, "ag.log", std::nullopt);
    } catch (const InputError& e) {
      return e.field();
    }
    return std::string("no error");
  };
  EXPECT_EQ(field_of(good), "no error");
  // A malformed row (line 6: program line, "# Using devices", 2 rank lines, header, row).
  std::string truncated = good;
  truncated.erase(truncated.find("   0\n") - 30, 30);
  EXPECT_EQ(field_of(truncated), "ag.log:6");
  std::string letters = good;
  letters.replace(letters.find("float") + 40, 4, "abcd");
  EXPECT_EQ(field_of(letters), "ag.log:6");
  // No table.
  EXPECT_EQ(field_of("# Collective test starting: all_gather_perf\n" + rank_lines(2, 2)), "ag.log");
  // The rank lines do not match the busbw the table was computed with.
  EXPECT_EQ(field_of("# Collective test starting: all_gather_perf\n" + rank_lines(4, 4) +
                     table(Collective::kAllGather, 2, kHeader, true)),
            "ag.log:8");
  // Wrong results.
  std::string wrong = good;
  wrong.replace(wrong.rfind("      0\n"), 8, "      3\n");
  EXPECT_THAT(field_of(wrong), HasSubstr("ag.log:"));
  // A program cpsim has no model of.
  EXPECT_EQ(field_of("# Collective test starting: broadcast_perf\n" + rank_lines(2, 2) +
                     table(Collective::kAllGather, 2, kHeader, true)),
            "ag.log");
}

TEST(ImportNcclTests, TheRawFileRoundTripsAndRecordsTheSource) {
  const NcclTestsRun run = load("h100_2node_16gpu_all_reduce_mpi_issue309.log");
  const RawCalibration raw = raw_from_nccl_tests({run}, {"cpsim", "calibrate"}, "test");
  EXPECT_EQ(raw.context.device, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(raw.context.nccl_version, "2.26.2");
  EXPECT_EQ(raw.context.method.timer, "nccl-tests");
  ASSERT_FALSE(raw.context.notes.empty());
  EXPECT_THAT(raw.context.notes[0], HasSubstr("h100_2node_16gpu_all_reduce_mpi_issue309.log"));
  const std::string text = write_raw(raw);
  EXPECT_THAT(text, HasSubstr("\"in_place\": true"));
  EXPECT_THAT(text, HasSubstr("\"nodes\": 2"));
  EXPECT_EQ(write_raw(parse_raw(text, "raw.json")), text);
}

TEST(ImportNcclTests, MergingNotesConflictingContexts) {
  RawCalibration a =
      raw_from_nccl_tests({load("h100_2node_16gpu_all_reduce_mpi_issue309.log")}, {}, "test");
  RawCalibration b = raw_from_nccl_tests(
      {load("h100_1node_8gpu_all_reduce_issue290.log", Collective::kAllReduce)}, {}, "test");
  b.context.device = "NVIDIA H200";
  const MergedRaw result = merge_raw({{"a.json", a}, {"b.json", b}});
  const RawCalibration& merged = result.raw;
  EXPECT_EQ(result.conflicts.size(), 1U);
  EXPECT_EQ(merged.samples.collectives.size(),
            a.samples.collectives.size() + b.samples.collectives.size());
  EXPECT_EQ(merged.context.gpu_count, 16);
  EXPECT_THAT(merged.context.notes,
              ::testing::Contains(HasSubstr("disagree on device: a.json 'NVIDIA H100 80GB HBM3' "
                                            "vs b.json 'NVIDIA H200'")));
  EXPECT_THROW((void)merge_raw({}), InputError);
}

}  // namespace
}  // namespace cpsim::calibrate
