// The streamed Chrome/Perfetto trace: parsed whole and checked for structure (processes, threads,
// slices, counters, flows) and for the rank and layer selection; its size estimate.
#include "cpsim/sim/trace.hpp"

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "evaluate_step.hpp"
#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using Json = nlohmann::json;

// USP over 8 GPUs (Ulysses 4 × ring 2): all-to-alls, send/recv and FSDP collectives.
const test::Evaluation& usp_step() {
  static const test::Evaluation e = [] {
    ScheduleInputs in = testing::inputs(models::CpMethod::kUsp, "llama3-8b", 8, 128 * 1024);
    in.parallel.ring_degree = 2;
    test::EvaluateOptions o;
    o.keep_trace = true;
    o.model_allocator = true;
    return test::evaluate(in, o);
  }();
  return e;
}

TraceOptions options(std::vector<bool> ranks, std::vector<bool> layers) {
  TraceOptions o;
  o.selection.ranks = std::move(ranks);
  o.selection.layers = std::move(layers);
  o.allocator_mode = AllocatorMode::kExpandableSegments;
  o.device_capacity_bytes = std::int64_t{80} << 30;
  return o;
}

struct Written {
  std::string text;
  std::int64_t events = 0;
};

Written write(const TraceOptions& o) {
  const test::Evaluation& e = usp_step();
  std::ostringstream out;
  Written w;
  w.events = write_chrome_trace(*e.workload, *e.result, out, o);
  w.text = out.str();
  return w;
}

// µs with ns precision back to integer ns (the writer prints them exactly).
std::int64_t ns(const Json& v) {
  return std::llround(v.get<double>() * 1000.0);
}

TEST(Trace, SelectedRanksAndLayersAreAWellFormedTrace) {
  const std::set<int> ranks = {0, 1, 4};
  const Written w = write(options({true, true, false, false, true, false, false, false},
                                  {true, true}));  // layers 0 and 1
  Json t;
  ASSERT_NO_THROW(t = Json::parse(w.text));
  ASSERT_TRUE(t.contains("traceEvents") && t["traceEvents"].is_array());
  const Json& events = t["traceEvents"];
  EXPECT_EQ(static_cast<std::int64_t>(events.size()), w.events);

  std::set<int> processes;
  std::map<int, std::set<int>> threads;
  std::map<std::pair<int, int>, std::vector<std::pair<std::int64_t, std::int64_t>>> slices;
  std::map<int, std::set<std::string>> counters;
  std::map<std::int64_t, std::tuple<int, int, std::int64_t>> flow_starts, flow_ends;
  std::set<std::int64_t> layers;
  for (const Json& e : events) {
    const std::string ph = e.at("ph").get<std::string>();
    const int pid = e.at("pid").get<int>();
    EXPECT_TRUE(ranks.count(pid)) << e.dump();
    if (ph == "M") {
      if (e.at("name") == "process_name") {
        EXPECT_TRUE(processes.insert(pid).second) << "two process names for " << pid;
      } else if (e.at("name") == "thread_name") {
        threads[pid].insert(e.at("tid").get<int>());
      }
    } else if (ph == "X") {
      const int tid = e.at("tid").get<int>();
      EXPECT_TRUE(e.at("name").is_string());
      EXPECT_GE(e.at("dur").get<double>(), 0.0);
      slices[{pid, tid}].emplace_back(ns(e.at("ts")), ns(e.at("ts")) + ns(e.at("dur")));
      ASSERT_TRUE(e.at("args").contains("layer")) << "op outside the layers: " << e.dump();
      layers.insert(e.at("args").at("layer").get<std::int64_t>());
    } else if (ph == "C") {
      counters[pid].insert(e.at("name").get<std::string>());
      for (const auto& [key, value] : e.at("args").items()) {
        EXPECT_TRUE(value.is_number()) << key;
      }
    } else if (ph == "s" || ph == "f") {
      auto& side = ph == "s" ? flow_starts : flow_ends;
      const auto id = e.at("id").get<std::int64_t>();
      EXPECT_TRUE(side.emplace(id, std::tuple{pid, e.at("tid").get<int>(), ns(e.at("ts"))}).second)
          << "flow id used twice: " << e.dump();
      if (ph == "f") {
        EXPECT_EQ(e.value("bp", ""), "e");
      }
    } else {
      ADD_FAILURE() << "unexpected event " << e.dump();
    }
  }
  EXPECT_EQ(processes, ranks);
  EXPECT_EQ(layers, (std::set<std::int64_t>{0, 1}));
  for (int r : ranks) {
    // The five streams and the host issue track (the profile has node.host_issue).
    EXPECT_EQ(threads[r], (std::set<int>{0, 1, 2, 3, 4, 5})) << "rank " << r;
    EXPECT_EQ(counters[r], (std::set<std::string>{"device memory (GiB)", "host memory (GiB)",
                                                  "reserved memory (GiB)"}))
        << "rank " << r;
  }
  // Each track: slices in time order, none overlapping (a stream runs one op at a time).
  for (const auto& [track, list] : slices) {
    for (std::size_t k = 1; k < list.size(); ++k) {
      EXPECT_LE(list[k - 1].second, list[k].first)
          << "pid " << track.first << " tid " << track.second;
    }
  }
  // Flows: paired, between two selected ranks, each end at the start of a slice of its track.
  ASSERT_FALSE(flow_starts.empty());
  EXPECT_EQ(flow_starts.size(), flow_ends.size());
  std::set<std::pair<int, int>> rank_pairs;
  for (const auto& [id, start] : flow_starts) {
    ASSERT_TRUE(flow_ends.count(id)) << "flow " << id << " never ends";
    const auto& end = flow_ends.at(id);
    EXPECT_NE(std::get<0>(start), std::get<0>(end));
    rank_pairs.insert({std::get<0>(start), std::get<0>(end)});
    for (const auto& point : {start, end}) {
      const auto& list = slices[{std::get<0>(point), std::get<1>(point)}];
      const bool on_slice = std::any_of(
          list.begin(), list.end(), [&](const auto& s) { return s.first == std::get<2>(point); });
      EXPECT_TRUE(on_slice) << "flow " << id << " is not at the start of a slice";
    }
  }
  // Ulysses groups {0..3}: all-to-alls from 0 to 1; ring pairs {0, 4}: send/recv both ways.
  EXPECT_TRUE(rank_pairs.count({0, 1}));
  EXPECT_TRUE(rank_pairs.count({0, 4}));
  EXPECT_TRUE(rank_pairs.count({4, 0}));
}

TEST(Trace, DefaultShowsEveryRankAndOpAndIsDeterministic) {
  const Written a = write(options({}, {}));
  const Written b = write(options({}, {}));
  EXPECT_TRUE(a.text == b.text);
  const Json t = Json::parse(a.text);
  std::set<int> pids;
  bool outside_layers = false;
  for (const Json& e : t["traceEvents"]) {
    pids.insert(e.at("pid").get<int>());
    outside_layers = outside_layers || (e.at("ph") == "X" && !e.at("args").contains("layer"));
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(outside_layers) << "embedding, loss and optimizer ops belong to no layer";
}

TEST(Trace, EstimateIsCloseToTheWrittenSize) {
  const test::Evaluation& e = usp_step();
  for (const TraceOptions& o :
       {options({}, {}), options({true}, {}), options({false, true, true}, {false, false, true})}) {
    const TraceEstimate est = estimate_chrome_trace(*e.workload, *e.result, o);
    const Written w = write(o);
    std::int64_t reserved = 0;
    const Json parsed = Json::parse(w.text);
    for (const Json& ev : parsed["traceEvents"]) {
      reserved += ev.value("name", "") == "reserved memory (GiB)" ? 1 : 0;
    }
    EXPECT_EQ(est.events + reserved, w.events);
    const auto bytes = static_cast<double>(w.text.size());
    EXPECT_NEAR(static_cast<double>(est.bytes), bytes, 0.1 * bytes);
  }
}

TEST(Trace, ProgressCountsTheEventsWritten) {
  TraceOptions o = options({}, {});
  std::int64_t last = 0;
  int calls = 0;
  o.progress = [&](std::int64_t written) {
    EXPECT_GT(written, last);
    last = written;
    ++calls;
  };
  const Written w = write(o);
  EXPECT_GT(calls, 0);
  EXPECT_LE(last, w.events);
}

TEST(Trace, SelectionMasks) {
  TraceSelection s;
  EXPECT_TRUE(s.has_rank(5));
  EXPECT_TRUE(s.has_layer(-1));
  s.ranks = {false, true};
  s.layers = {true};
  EXPECT_FALSE(s.has_rank(0));
  EXPECT_TRUE(s.has_rank(1));
  EXPECT_FALSE(s.has_rank(2));
  EXPECT_TRUE(s.has_layer(0));
  EXPECT_FALSE(s.has_layer(1));
  EXPECT_FALSE(s.has_layer(-1));
}

}  // namespace
}  // namespace cpsim::sim
