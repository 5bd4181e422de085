// End-to-end tests of `cpsim report` (one self-contained HTML page with five chart sections,
// deterministic, rendered by headless Chromium when it is installed) and `cpsim sweep` (table, CSV,
// JSON; bad input exits 2 naming the flag).
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <signal.h>
#include <sstream>
#include <string>
#include <sys/types.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kCpsimTimeoutSeconds = 120;
constexpr int kChromiumTimeoutSeconds = 120;
constexpr const char* kChromium = "/usr/bin/chromium";

// The chart sections of the page and the SVG each one holds.
const std::vector<std::string> kSvgIds = {"svg-memory", "svg-timeline", "svg-throughput",
                                          "svg-peak", "svg-maxlen"};
const std::vector<std::string> kSectionIds = {"sec-memory", "sec-timeline", "sec-throughput",
                                              "sec-maxlen", "sec-config"};

struct RunResult {
  int exit_code = -1;  // -1: killed by a signal or the deadline
  std::string out;
  std::string err;
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
  }
  return lines;
}

// The markup of <svg id="ID" ...> ... </svg>, empty if absent.
std::string svg_body(const std::string& html, const std::string& id) {
  const std::size_t start = html.find("<svg id=\"" + id + "\"");
  if (start == std::string::npos) {
    return {};
  }
  const std::size_t end = html.find("</svg>", start);
  return end == std::string::npos ? std::string() : html.substr(start, end - start);
}

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "cpsim_report_test_XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    ASSERT_NE(::mkdtemp(buf.data()), nullptr) << "mkdtemp: " << std::strerror(errno);
    dir_ = fs::path(buf.data());
  }

  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) {
      fs::remove_all(dir_, ec);
    }
  }

  fs::path path(const std::string& name) const { return dir_ / name; }

  // Runs argv[0] (searched in PATH) in its own process group with stdout and stderr in files;
  // the group is killed after `timeout_s`.
  RunResult exec(const std::vector<std::string>& args, int timeout_s) {
    const int n = ++runs_;
    const fs::path out_path = dir_ / ("run" + std::to_string(n) + ".stdout");
    const fs::path err_path = dir_ / ("run" + std::to_string(n) + ".stderr");
    std::vector<std::string> storage = args;
    std::vector<char*> argv;
    for (auto& a : storage) {
      argv.push_back(a.data());
    }
    argv.push_back(nullptr);
    RunResult result;
    const pid_t pid = ::fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork: " << std::strerror(errno);
      return result;
    }
    if (pid == 0) {
      ::setpgid(0, 0);
      const int out_fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int in_fd = ::open("/dev/null", O_RDONLY);
      if (out_fd < 0 || err_fd < 0 || in_fd < 0 || ::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0 ||
          ::dup2(in_fd, 0) < 0) {
        ::_exit(127);
      }
      ::setenv("CPSIM_DATA_DIR", CPSIM_TEST_DATA_DIR, 1);
      ::execvp(argv[0], argv.data());
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    int status = 0;
    bool killed = false;
    for (;;) {
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        break;
      }
      if (r < 0 && errno != EINTR) {
        ADD_FAILURE() << "waitpid: " << std::strerror(errno);
        return result;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(-pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        killed = true;
        ADD_FAILURE() << args[0] << ": still running after " << timeout_s << " s; killed";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!killed && WIFEXITED(status)) {
      result.exit_code = WEXITSTATUS(status);
    }
    result.out = read_file(out_path);
    result.err = read_file(err_path);
    return result;
  }

  RunResult cpsim(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {CPSIM_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    return exec(argv, kCpsimTimeoutSeconds);
  }

  // A short report: llama3-8b on 8 GPUs, three methods, 128K..1M.
  std::string write_report(const std::string& name, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"report",   "--model",   "llama3-8b",          "--gpus",
                                     "8",        "--methods", "ulysses,upipe,ring", "--sweep",
                                     "128K..1M", "--html",    path(name).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    const RunResult r = cpsim(args);
    EXPECT_EQ(r.exit_code, 0) << "stderr: " << r.err;
    EXPECT_TRUE(fs::exists(path(name))) << name << " not written";
    return read_file(path(name));
  }

  // Headless Chromium with a fresh profile and no network use, bounded by `timeout`.
  RunResult chromium(const std::vector<std::string>& extra, const std::string& profile) {
    std::vector<std::string> argv = {"timeout",
                                     std::to_string(kChromiumTimeoutSeconds),
                                     kChromium,
                                     "--headless",
                                     "--no-sandbox",
                                     "--disable-gpu",
                                     "--disable-quic",
                                     "--no-first-run",
                                     "--disable-background-networking",
                                     "--disable-component-update",
                                     "--disable-sync",
                                     "--user-data-dir=" + path(profile).string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return exec(argv, kChromiumTimeoutSeconds + 30);
  }

  fs::path dir_;
  int runs_ = 0;
};

// ---------------------------------------------------------------------------------------------
// report

TEST_F(ReportTest, WritesOneSelfContainedPageWithFiveChartSections) {
  const std::string html = write_report("report.html");
  ASSERT_FALSE(html.empty());
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_THAT(html, HasSubstr("</html>"));
  // Nothing is fetched: no URLs at all (inline SVG needs no xmlns), no scripts, no external CSS.
  EXPECT_THAT(html, Not(HasSubstr("http://")));
  EXPECT_THAT(html, Not(HasSubstr("https://")));
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("<link")));
  EXPECT_THAT(html, Not(HasSubstr("@import")));
  EXPECT_THAT(html, Not(HasSubstr("src=")));
  for (const char* bad : {"=\"nan", "=\"-nan", "=\"inf", "=\"-inf", "Vnan", "Hnan", "NaN"}) {
    EXPECT_THAT(html, Not(HasSubstr(bad))) << "non-finite coordinate";
  }
  for (const auto& id : kSectionIds) {
    EXPECT_EQ(count(html, "<section id=\"" + id + "\""), 1u) << id;
  }
  for (const auto& id : kSvgIds) {
    EXPECT_EQ(count(html, "<svg id=\"" + id + "\""), 1u) << id;
    const std::string svg = svg_body(html, id);
    ASSERT_FALSE(svg.empty()) << id;
    EXPECT_THAT(svg, HasSubstr("<text")) << id << ": no axis labels or legend";
    EXPECT_GE(
        count(svg, "<path") + count(svg, "<rect") + count(svg, "<polyline") + count(svg, "<circle"),
        3u)
        << id << " has no data";
  }
  // (1) memory: seven stacked bands with data, the GPU limit, the peak.
  const std::string mem = svg_body(html, "svg-memory");
  EXPECT_EQ(count(mem, "<path class=\"area\""), 7u);
  for (const char* band : {"model_states", "param_gather", "grad_buffers", "activations",
                           "attention", "other", "fixed"}) {
    EXPECT_THAT(mem, HasSubstr(band));
  }
  EXPECT_THAT(mem, HasSubstr("class=\"limit\""));
  EXPECT_THAT(mem, HasSubstr("class=\"reserved\""));  // the allocator model's reserved peak
  EXPECT_THAT(mem, HasSubstr("reserved (nvidia-smi) "));
  EXPECT_THAT(mem, HasSubstr("peak "));
  EXPECT_GT(count(mem, "V"), 50u) << "the memory areas have hardly any points";
  // (2) timeline: the five streams with bars.
  const std::string tl = svg_body(html, "svg-timeline");
  for (const char* stream : {"compute", "comm", "fsdp", "d2h", "h2d"}) {
    EXPECT_THAT(tl, HasSubstr(">" + std::string(stream) + "</text>"));
  }
  EXPECT_GT(count(tl, "<rect class=\"b"), 10u);
  // (3) one point per method and length, log2 length axis labels.
  const std::string tput = svg_body(html, "svg-throughput");
  EXPECT_EQ(count(tput, "<circle cx") + count(tput, "class=\"oom\" stroke=\"#d62728\" d=\"M"),
            3u * 4u + 3u + 1u);  // points, method legend, OOM legend
  for (const char* label : {">128K<", ">256K<", ">512K<", ">1M<"}) {
    EXPECT_THAT(tput, HasSubstr(label));
  }
  for (const char* method : {">ulysses<", ">upipe<", ">ring<"}) {
    EXPECT_THAT(tput, HasSubstr(method));
  }
  // Relative to the fastest that fits at each length: a 100 % tick, and every point's tooltip
  // says its share.
  EXPECT_THAT(tput, HasSubstr(">100 %<"));
  EXPECT_EQ(count(tput, "at this length)"), 3u * 4u);
  // (4) one bar per method; (5) the configuration tables.
  EXPECT_EQ(count(svg_body(html, "svg-maxlen"), "<rect x="), 3u);
  EXPECT_THAT(html, HasSubstr("<table id=\"config-setup\">"));
  EXPECT_THAT(html, HasSubstr("<table id=\"config-methods\">"));
  EXPECT_THAT(html, HasSubstr("<table id=\"config-results\">"));
  EXPECT_THAT(html, HasSubstr("llama3-8b"));
  EXPECT_THAT(html, HasSubstr("h100-sxm-80g"));
  // Written atomically: no temporary file left.
  EXPECT_FALSE(fs::exists(path("report.html.tmp")));
  EXPECT_LT(html.size(), 2u * 1024u * 1024u) << "the page should stay small";
}

TEST_F(ReportTest, IsByteIdenticalAcrossRuns) {
  const std::string a = write_report("a.html");
  const std::string b = write_report("b.html");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "two runs with the same inputs gave different pages";
}

TEST_F(ReportTest, MarksLengthsThatDoNotFit) {
  const RunResult r =
      cpsim({"report", "--model", "llama3-8b", "--gpus", "8", "--methods", "ulysses,allgather",
             "--sweep", "2M..8M", "--html", path("oom.html").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string html = read_file(path("oom.html"));
  // 8M fits neither method on 8 H100s: red x markers in both length charts, red cells.
  EXPECT_GE(count(svg_body(html, "svg-throughput"), "<path class=\"oom\""), 3u);
  EXPECT_GE(count(svg_body(html, "svg-peak"), "<path class=\"oom\""), 3u);
  EXPECT_THAT(html, HasSubstr("class=\"num oom\""));
  EXPECT_THAT(html, HasSubstr("OOM (GPU)"));
}

// The memory chart draws what the fit is judged on (reserved memory) against the capacity less
// the margin, so a point marked out of memory is above the line; usp beside ulysses is a mixed
// split, not ulysses' own line under another name.
TEST_F(ReportTest, MemoryChartAndUspSplitSayWhatTheyAre) {
  const RunResult r = cpsim({"sweep", "--model", "llama3-8b", "--gpus", "8", "--methods",
                             "ulysses,usp", "--sweep", "1M..4M", "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  std::string ulysses, usp;
  for (const auto& m : j.at("config").at("methods")) {
    (m.at("method") == "usp" ? usp : ulysses) = m.at("degrees").get<std::string>();
  }
  EXPECT_NE(usp, ulysses);
  EXPECT_THAT(usp, HasSubstr("ring 2"));
  const RunResult html =
      cpsim({"report", "--model", "llama3-8b", "--gpus", "8", "--methods", "ulysses,usp", "--sweep",
             "1M..4M", "--html", path("mem.html").string()});
  ASSERT_EQ(html.exit_code, 0) << html.err;
  const std::string page = read_file(path("mem.html"));
  EXPECT_THAT(svg_body(page, "svg-peak"), HasSubstr("usable: capacity − margin, 75.7 GiB"));
  EXPECT_THAT(svg_body(page, "svg-peak"), HasSubstr("reserved"));
}

TEST_F(ReportTest, SingleLengthAndMethodsThatCannotRun) {
  // U = 12 does not divide llama3-8b's 32 heads: upipe cannot run, ulysses can.
  const RunResult r =
      cpsim({"report", "--model", "llama3-8b", "--gpus", "8", "--methods", "ulysses,upipe",
             "--heads-per-stage", "12", "--seq", "256K", "--html", path("one.html").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string html = read_file(path("one.html"));
  EXPECT_THAT(html, HasSubstr("cannot run"));
  EXPECT_THAT(html, HasSubstr("--heads-per-stage"));
  EXPECT_EQ(count(svg_body(html, "svg-throughput"), "<circle cx"), 2u);  // the point, its legend
  EXPECT_THAT(svg_body(html, "svg-throughput"), HasSubstr(">256K<"));
  EXPECT_THAT(svg_body(html, "svg-memory"), HasSubstr("<path class=\"area\""));
}

TEST_F(ReportTest, PackedBatchesChartOnlyWithLengths) {
  const std::vector<std::string> base = {"report", "--model",   "llama3-8b", "--gpus",
                                         "8",      "--methods", "ring",      "--impl",
                                         "none",   "--seq",     "128K"};
  std::vector<std::string> with = base;
  with.insert(with.end(), {"--lengths", "lognormal:median=8K,sigma=1", "--batches", "20", "--html",
                           path("batches.html").string()});
  const RunResult r = cpsim(with);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string html = read_file(path("batches.html"));
  const std::string chart = svg_body(html, "svg-batches");
  // One step line per load balancer, its legend, and the one-document line.
  EXPECT_EQ(count(chart, "<path class=\"series\""), 5u);
  EXPECT_THAT(chart, HasSubstr("per-document: p50"));
  EXPECT_THAT(chart, HasSubstr("one document a sequence"));
  std::vector<std::string> without = base;
  without.insert(without.end(), {"--html", path("plain.html").string()});
  ASSERT_EQ(cpsim(without).exit_code, 0);
  EXPECT_THAT(read_file(path("plain.html")), Not(HasSubstr("sec-batches")));
}

TEST_F(ReportTest, BadInputExitsTwoNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string flag;
  };
  const std::string out = path("x.html").string();
  const std::vector<Case> cases = {
      {{"report", "--sweep", "8M..128K", "--html", out}, "--sweep"},
      {{"report", "--sweep", "abc", "--html", out}, "--sweep"},
      {{"report", "--seq", "1M", "--sweep", "128K..1M", "--html", out}, "--sweep"},
      {{"report", "--methods", "ulysses,nope", "--html", out}, "--methods"},
      {{"report", "--methods", "ulysses", "--detail-method", "ring", "--html", out},
       "--detail-method"},
      {{"report", "--sweep", "128K..1M"}, "--html"},
  };
  for (const auto& c : cases) {
    const RunResult r = cpsim(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args[2] << " " << c.args[3] << "\nstderr: " << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.flag));
    EXPECT_EQ(count(r.err, "\n"), 1u) << r.err;
  }
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(ReportTest, RendersInHeadlessChromium) {
  if (!fs::exists(kChromium)) {
    GTEST_SKIP() << kChromium << " is not installed (scripts/setup.sh installs Debian's chromium)";
  }
  const std::string html = write_report("render.html");
  ASSERT_FALSE(html.empty());
  const std::string url = "file://" + path("render.html").string();
  const fs::path png = path("render.png");
  const RunResult shot = chromium(
      {"--screenshot=" + png.string(), "--window-size=1400,3000", "--hide-scrollbars", url},
      "profile1");
  ASSERT_EQ(shot.exit_code, 0) << shot.err;
  ASSERT_TRUE(fs::exists(png)) << shot.err;
  EXPECT_GT(fs::file_size(png), 20u * 1024u) << "the screenshot is nearly blank";
  const std::string bytes = read_file(png);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));

  const RunResult dom = chromium({"--dump-dom", url}, "profile2");
  ASSERT_EQ(dom.exit_code, 0) << dom.err;
  for (const auto& id : kSvgIds) {
    EXPECT_THAT(dom.out, HasSubstr("id=\"" + id + "\"")) << "rendered DOM lacks " << id;
  }
  EXPECT_THAT(dom.out, HasSubstr("id=\"config-setup\""));
}

// ---------------------------------------------------------------------------------------------
// sweep

const std::vector<std::string> kSweep = {"sweep",   "--model",   "llama3-8b",          "--gpus",
                                         "8",       "--methods", "ulysses,upipe,ring", "--sweep",
                                         "128K..1M"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST_F(ReportTest, SweepCsvHasAHeaderAndOneRowPerMethodAndLength) {
  const RunResult r = cpsim(with(kSweep, {"--format", "csv"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 1u + 3u * 4u) << r.out;
  EXPECT_EQ(lines[0],
            "method,seq_len,step_time_s,tokens_per_s_per_gpu,model_tflops_per_gpu,mfu,"
            "peak_memory_bytes,host_memory_bytes,fits,binding,error");
  EXPECT_EQ(lines[1].rfind("ulysses,131072,", 0), 0u) << lines[1];
  EXPECT_EQ(lines[4].rfind("ulysses,1048576,", 0), 0u) << lines[4];
  EXPECT_EQ(lines[12].rfind("ring,1048576,", 0), 0u) << lines[12];
  for (std::size_t i = 1; i < lines.size(); ++i) {
    EXPECT_EQ(count(lines[i], ","), 10u) << lines[i];
    EXPECT_THAT(lines[i], HasSubstr(",true,")) << lines[i];
  }
}

TEST_F(ReportTest, SweepJsonParses) {
  const RunResult r = cpsim(with(kSweep, {"--format", "json"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out.substr(0, 500);
  EXPECT_EQ(j.at("schema_version"), 1);
  EXPECT_EQ(j.at("command"), "sweep");
  ASSERT_EQ(j.at("rows").size(), 12u);
  for (const auto& row : j.at("rows")) {
    EXPECT_GT(row.at("step_time_s").get<double>(), 0.0);
    EXPECT_GT(row.at("tokens_per_s_per_gpu").get<double>(), 0.0);
    EXPECT_GT(row.at("peak_memory_bytes").get<std::int64_t>(), 0);
    EXPECT_TRUE(row.at("fits").is_boolean());
    EXPECT_TRUE(row.at("error").is_null());
  }
  EXPECT_EQ(j.at("rows")[0].at("method"), "ulysses");
  EXPECT_EQ(j.at("rows")[0].at("seq_len"), 131072);
  EXPECT_EQ(j.at("config").at("lengths").size(), 4u);
  EXPECT_EQ(j.at("config").at("model"), "llama3-8b");
}

TEST_F(ReportTest, SweepTableAndSingleLength) {
  const RunResult table = cpsim(kSweep);
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("tok/s/GPU"));
  EXPECT_EQ(count(table.out, "\nring "), 4u) << table.out;

  const RunResult one =
      cpsim({"sweep", "--methods", "ulysses,ring", "--seq", "1M", "--format", "csv"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_EQ(lines_of(one.out).size(), 3u) << one.out;

  // 8M does not fit on 8 H100s.
  const RunResult oom = cpsim({"sweep", "--methods", "ulysses", "--seq", "8M", "--format", "json"});
  ASSERT_EQ(oom.exit_code, 0) << oom.err;
  const auto j = nlohmann::json::parse(oom.out);
  EXPECT_FALSE(j.at("rows")[0].at("fits").get<bool>());
  EXPECT_FALSE(j.at("rows")[0].at("binding_constraint").is_null());
}

TEST_F(ReportTest, SweepBadInputExitsTwoNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string flag;
  };
  const std::vector<Case> cases = {
      {{"sweep", "--sweep", "8M..128K"}, "--sweep"},
      {{"sweep", "--sweep", "abc"}, "--sweep"},
      {{"sweep", "--sweep", "128K.."}, "--sweep"},
      {{"sweep", "--sweep", "128K...1M"}, "--sweep"},
      {{"sweep", "--sweep", "100K..120K"}, "--sweep"},
      {{"sweep", "--format", "xml"}, "--format"},
      {{"sweep", "--seq", "0"}, "--seq"},
      {{"sweep", "--gpus", "0"}, "--gpus"},
  };
  for (const auto& c : cases) {
    const RunResult r = cpsim(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args[1] << " " << c.args[2] << "\nstderr: " << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.flag)) << c.args[2];
    EXPECT_EQ(count(r.err, "\n"), 1u) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

}  // namespace
