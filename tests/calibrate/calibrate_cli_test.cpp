// End-to-end tests of `cpsim calibrate`: run without a GPU (or without CUDA) exits 2 with the
// reason; fit writes a profile that `cpsim simulate --hardware` uses unchanged; bad raw files and
// bad fits exit 2 naming the field or curve.
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
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

#include "cpsim/calibrate/measure.hpp"
#include "cpsim/calibrate/raw.hpp"
#include "cpsim/models/io.hpp"

#include "synthetic.hpp"

namespace cpsim::calibrate {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr int kTimeoutSeconds = 120;

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class CalibrateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "cpsim_calibrate_cli_XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    ASSERT_NE(::mkdtemp(buf.data()), nullptr) << std::strerror(errno);
    dir_ = fs::path(buf.data());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  fs::path path(const std::string& name) const { return dir_ / name; }

  void write(const fs::path& p, const std::string& text) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << text;
    ASSERT_TRUE(out.good());
  }

  RunResult run(const std::vector<std::string>& args, bool loads_mpi = false) {
    std::vector<std::string> command{CPSIM_BINARY};
    command.insert(command.end(), args.begin(), args.end());
    return run_program(command, loads_mpi);
  }

  /// Runs argv[0] (an absolute path) with the arguments, without a shell. `loads_mpi`: the run
  /// initialises MPI, whose library does not free what MPI_Init allocates; a sanitized build's
  /// leak check would report it at exit, so it is off for that run (cpsim's own code is
  /// leak-checked by every other run).
  RunResult run_program(std::vector<std::string> storage, bool loads_mpi = false) {
    const fs::path out_path = dir_ / "stdout";
    const fs::path err_path = dir_ / "stderr";
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
      const int out_fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out_fd < 0 || err_fd < 0 || ::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0) {
        ::_exit(127);
      }
      ::setenv("CPSIM_DATA_DIR", CPSIM_TEST_DATA_DIR, 1);
      if (loads_mpi) {
        ::setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kTimeoutSeconds);
    int status = 0;
    for (;;) {
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        ADD_FAILURE() << "cpsim still running after " << kTimeoutSeconds << " s; killed";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (WIFEXITED(status)) {
      result.exit_code = WEXITSTATUS(status);
    }
    result.out = read_file(out_path);
    result.err = read_file(err_path);
    return result;
  }

  /// A synthetic raw file (see synthetic.hpp) at `name`.
  fs::path synthetic_raw_file(const std::string& name, double noise = 0.01) {
    const fs::path p = path(name);
    write(p, write_raw(testing::synthetic_raw(testing::truth_profile(), noise, 5)));
    return p;
  }

  fs::path dir_;
};

TEST_F(CalibrateCli, RunWithoutADeviceExitsTwoWithTheReason) {
  const auto backend = make_measure_backend();
  const auto reason = backend->unavailable_reason();
  if (!reason) {
    GTEST_SKIP() << "a CUDA device is present: `calibrate run` would measure for real";
  }
  const RunResult r = run({"calibrate", "run", "--out", path("raw.json").string(), "--quick"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  if (CPSIM_HAVE_CUDA) {
    EXPECT_THAT(r.err, HasSubstr("no CUDA device"));
  } else {
    EXPECT_THAT(r.err, HasSubstr("built without CUDA"));
  }
  EXPECT_THAT(r.err, HasSubstr("cpsim: error: calibrate: "));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;  // one line
  EXPECT_FALSE(fs::exists(path("raw.json")));
  EXPECT_FALSE(fs::exists(path("raw.json.tmp")));
}

TEST_F(CalibrateCli, RunRefusesUnknownSweepsNamingTheFlag) {
  for (const char* flag : {"--only", "--skip"}) {
    const RunResult r =
        run({"calibrate", "run", "--out", path("raw.json").string(), flag, "gemm,nccl"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr(std::string(flag) + ": unknown sweep 'nccl'; known: launch, "));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  const RunResult t =
      run({"calibrate", "run", "--out", path("raw.json").string(), "--collective-timeout", "0"});
  EXPECT_EQ(t.exit_code, 2) << t.err;
  EXPECT_THAT(t.err, HasSubstr("--collective-timeout: must be positive seconds"));
  const RunResult o = run({"calibrate", "run", "--out", "-"});
  EXPECT_EQ(o.exit_code, 2) << o.err;
  EXPECT_THAT(o.err, HasSubstr("--out: must be a file"));
  EXPECT_FALSE(fs::exists(path("raw.json")));
}

TEST_F(CalibrateCli, MpiRefusesTheSingleProcessFlagsAndExplainsWhatIsMissing) {
  const std::string out = path("inter.json").string();
  const std::vector<std::vector<std::string>> refused = {
      {"--gpus", "2"}, {"--max-seq", "8K"}, {"--resume"}, {"--only", "gemm"}, {"--skip", "gemm"}};
  for (const std::vector<std::string>& flag : refused) {
    std::vector<std::string> args{"calibrate", "run", "--mpi", "--out", out};
    args.insert(args.end(), flag.begin(), flag.end());
    const RunResult r = run(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr(flag.front() + ": not with --mpi"));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  // Without a launcher: no MPI in this build, or a single rank.
  const RunResult r = run({"calibrate", "run", "--mpi", "--out", out}, /*loads_mpi=*/true);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr(CPSIM_HAVE_MPI ? "--mpi: 1 rank: start one process per GPU"
                                              : "--mpi: this cpsim was built without MPI"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(CalibrateCli, RunNeedsOut) {
  const RunResult r = run({"calibrate", "run"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--out"));
}

TEST_F(CalibrateCli, FitWritesAProfileThatDrivesSimulate) {
  const fs::path raw = synthetic_raw_file("raw.json");
  const fs::path profile = path("my-node.json");
  const RunResult fit = run({"calibrate", "fit", raw.string(), "--out", profile.string()});
  ASSERT_EQ(fit.exit_code, 0) << fit.err << fit.out;
  EXPECT_THAT(fit.out, HasSubstr("collectives.intra_node.all_to_all"));
  EXPECT_THAT(fit.out, HasSubstr("hold-out MAPE"));
  ASSERT_TRUE(fs::exists(profile));

  const models::HardwareProfile p =
      models::parse_hardware_profile(read_file(profile), profile.string());
  EXPECT_EQ(p.name, "my-node");
  EXPECT_EQ(p.attention_kernels.count("cpsim-flash"), 1U);

  const RunResult sim = run({"simulate", "--hardware", profile.string(), "--model", "llama3-8b",
                             "--gpus", "8", "--method", "ulysses", "--seq", "256K", "--json"});
  ASSERT_EQ(sim.exit_code, 0) << sim.err;
  const Json j = Json::parse(sim.out);
  EXPECT_GT(j.at("step_time_s").get<double>(), 0.0);

  // The measured kernel can be chosen by name.
  const RunResult flash =
      run({"simulate", "--hardware", profile.string(), "--model", "llama3-8b", "--gpus", "8",
           "--method", "ulysses", "--seq", "256K", "--attention-kernel", "cpsim-flash", "--json"});
  ASSERT_EQ(flash.exit_code, 0) << flash.err;
  EXPECT_GT(Json::parse(flash.out).at("step_time_s").get<double>(),
            j.at("step_time_s").get<double>());  // slower than the published fa3
}

TEST_F(CalibrateCli, TheDefaultProfileStillDrivesSimulate) {
  const RunResult sim = run({"simulate", "--model", "llama3-8b", "--gpus", "8", "--method",
                             "ulysses", "--seq", "128K", "--json"});
  ASSERT_EQ(sim.exit_code, 0) << sim.err;
}

TEST_F(CalibrateCli, CorruptedRawExitsTwoNamingTheField) {
  Json j = Json::parse(write_raw(testing::synthetic_raw(testing::truth_profile())));
  j["samples"]["gemm"][3]["time_s"] = "slow";
  const fs::path raw = path("raw.json");
  write(raw, j.dump());
  const RunResult r = run({"calibrate", "fit", raw.string(), "--out", path("p.json").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(raw.string() + ":samples.gemm[3].time_s"));
  EXPECT_FALSE(fs::exists(path("p.json")));
}

TEST_F(CalibrateCli, MissingRawFileExitsTwo) {
  const RunResult r =
      run({"calibrate", "fit", path("absent.json").string(), "--out", path("p.json").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("cannot open"));
}

TEST_F(CalibrateCli, ABadFitIsRefusedUnlessForced) {
  RawCalibration raw = testing::synthetic_raw(testing::truth_profile());
  for (CollectiveSample& s : raw.samples.collectives) {
    if (s.op == models::Collective::kReduceScatter &&
        static_cast<int>(std::log2(s.size_bytes)) % 2 == 1) {
      s.time_s *= 3.0;
    }
  }
  const fs::path raw_path = path("raw.json");
  write(raw_path, write_raw(raw));
  const fs::path profile = path("p.json");
  const RunResult refused = run({"calibrate", "fit", raw_path.string(), "--out", profile.string()});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_THAT(refused.err, HasSubstr("collectives.intra_node.reduce_scatter"));
  EXPECT_THAT(refused.out, HasSubstr("EXCEEDS"));
  EXPECT_FALSE(fs::exists(profile));

  const RunResult loose =
      run({"calibrate", "fit", raw_path.string(), "--out", profile.string(), "--max-mape", "5"});
  EXPECT_EQ(loose.exit_code, 0) << loose.err;

  fs::remove(profile);
  const RunResult forced =
      run({"calibrate", "fit", raw_path.string(), "--out", profile.string(), "--force"});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_TRUE(fs::exists(profile));
}

// The committed H200 measurements fitted onto the A100 profile: the base's spec ranges cannot
// hold them, so the fitted profile does not load. That is bad input naming --base (exit 2, one
// line), not an internal error, and nothing is written.
TEST_F(CalibrateCli, MeasurementsOfAnotherGpuThanTheBaseNameTheBase) {
  const fs::path measured = fs::path(CPSIM_TEST_DATA_DIR) / "measurements" / "h200-2026-11-26";
  const fs::path profile = path("p.json");
  const RunResult r = run({"calibrate", "fit", (measured / "calibrate_full.json").string(),
                           (measured / "attention_cudnn.json").string(), "--base", "a100-sxm-80g",
                           "--force", "--out", profile.string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--base"));
  EXPECT_THAT(r.err, HasSubstr("132 SMs"));
  EXPECT_FALSE(fs::exists(profile));
}

// A measurement script of calibrate/scripts and a Python 3 to run it (empty when there is none).
std::pair<fs::path, std::string> script_and_python(const char* name) {
  const fs::path script = fs::path(CPSIM_TEST_DATA_DIR).parent_path() / "calibrate/scripts" / name;
  for (const char* candidate : {CPSIM_PYTHON, "/usr/bin/python3", "/usr/local/bin/python3"}) {
    if (fs::exists(candidate)) {
      return {script, candidate};
    }
  }
  return {script, ""};
}

TEST_F(CalibrateCli, TheTorchScriptWritesTheRawFormat) {
  // calibrate/scripts/torch_attention_timing.py --selftest needs Python 3, not PyTorch.
  const auto [script, python] = script_and_python("torch_attention_timing.py");
  ASSERT_TRUE(fs::exists(script)) << script;
  if (python.empty()) {
    GTEST_SKIP() << "no python3";
  }
  const fs::path raw = path("torch.json");
  const RunResult r = run_program({python, script.string(), "--selftest", "--out", raw.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const RawCalibration parsed = load_raw(raw, "RAW");
  EXPECT_FALSE(parsed.samples.attention.empty());
  EXPECT_EQ(parsed.samples.attention.front().kernel, "sdpa");
  EXPECT_EQ(parsed.context.method.timer, "torch-cuda-event");
  const RunResult fit = run({"calibrate", "fit", raw.string(), "--out", path("p.json").string()});
  EXPECT_EQ(fit.exit_code, 0) << fit.err;
  EXPECT_THAT(fit.out, HasSubstr("compute.attention_kernels.sdpa.bwd_full_flops_per_s"));
}

// calibrate/scripts/torch_gemm_timing.py --selftest: the three layouts of each Linear shape in
// the raw format, which the fit turns into the GEMM curve, with the backward's ratios noted (the
// made-up rates: forward 700, dgrad 680, wgrad 650 TFLOP/s).
TEST_F(CalibrateCli, TheTorchGemmScriptWritesEveryLayout) {
  const auto [script, python] = script_and_python("torch_gemm_timing.py");
  ASSERT_TRUE(fs::exists(script)) << script;
  if (python.empty()) {
    GTEST_SKIP() << "no python3";
  }
  const fs::path raw = path("gemm.json");
  const RunResult r = run_program({python, script.string(), "--selftest", "--out", raw.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const RawCalibration parsed = load_raw(raw, "RAW");
  std::array<int, 3> layouts{};
  for (const GemmSample& g : parsed.samples.gemm) {
    ++layouts[static_cast<std::size_t>(g.layout)];
  }
  EXPECT_EQ(layouts, (std::array<int, 3>{24, 24, 24}));
  const RunResult fit = run({"calibrate", "fit", raw.string(), "--out", path("p.json").string()});
  EXPECT_EQ(fit.exit_code, 0) << fit.err;
  EXPECT_THAT(fit.out, HasSubstr("compute.gemm_efficiency_by_flops"));
  EXPECT_THAT(fit.out, HasSubstr("dgrad takes 1.03 x the forward's time (median over 24 shapes)"));
  EXPECT_THAT(fit.out, HasSubstr("wgrad takes 1.08 x the forward's time"));
}

TEST_F(CalibrateCli, FitChecksItsFlags) {
  const fs::path raw = synthetic_raw_file("raw.json");
  RunResult r = run({"calibrate", "fit", raw.string(), "--out", path("p.json").string(), "--base",
                     "no-such-gpu"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--base"));
  r = run({"calibrate", "fit", raw.string(), "--out", path("p.json").string(), "--max-mape", "0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--max-mape"));
  r = run({"calibrate"});
  EXPECT_EQ(r.exit_code, 2);
}

TEST_F(CalibrateCli, FitOntoAnotherBase) {
  const fs::path raw = synthetic_raw_file("raw.json");
  const fs::path profile = path("on-h200.json");
  const RunResult r = run({"calibrate", "fit", raw.string(), "--out", profile.string(), "--base",
                           "h200-141g", "--name", "node-a"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const models::HardwareProfile p =
      models::parse_hardware_profile(read_file(profile), profile.string());
  EXPECT_EQ(p.name, "node-a");
  EXPECT_THAT(p.description, HasSubstr("h200-141g"));
}

fs::path published_log(const std::string& name) {
  return fs::path(CPSIM_TEST_DATA_DIR).parent_path() / "tests" / "data" / "nccl-tests" / name;
}

TEST_F(CalibrateCli, ImportsNcclTestsLogsAndFitsThemMergedWithARun) {
  const std::string single = published_log("h100_1node_8gpu_all_reduce_issue290.log").string();
  const std::string two_node =
      published_log("h100_2node_16gpu_all_reduce_ring_issue290.log").string();
  const fs::path nccl = path("nccl.json");
  // The 290 logs do not name their program.
  const RunResult no_op =
      run({"calibrate", "import", "nccl-tests", single, "--out", nccl.string()});
  EXPECT_EQ(no_op.exit_code, 2);
  EXPECT_THAT(no_op.err, HasSubstr("--op"));
  EXPECT_FALSE(fs::exists(nccl));

  const RunResult imported = run({"calibrate", "import", "nccl-tests", single, two_node, "--op",
                                  "all_reduce", "--out", nccl.string()});
  ASSERT_EQ(imported.exit_code, 0) << imported.err;
  EXPECT_THAT(imported.out, HasSubstr("all_reduce (--op), 8 ranks on 1 node(s)"));
  EXPECT_THAT(imported.out, HasSubstr("all_reduce (--op), 16 ranks on 2 node(s)"));

  const fs::path raw = synthetic_raw_file("raw.json");
  const fs::path profile = path("merged.json");
  const RunResult fit =
      run({"calibrate", "fit", raw.string(), nccl.string(), "--out", profile.string()});
  ASSERT_EQ(fit.exit_code, 0) << fit.err << fit.out;
  EXPECT_THAT(fit.out, HasSubstr("collectives.inter_node.all_reduce"));
  EXPECT_THAT(fit.out, HasSubstr("merged files disagree on method.timer"));
  const models::HardwareProfile p =
      models::parse_hardware_profile(read_file(profile), profile.string());
  EXPECT_THAT(p.provenance.at("collectives.inter_node.all_reduce.peak_busbw_bytes_per_s"),
              HasSubstr("all_reduce on 16 ranks"));
}

TEST_F(CalibrateCli, ImportRefusesAMalformedLogNamingFileAndLine) {
  const fs::path log = path("bad.log");
  write(log,
        "# Collective test starting: all_gather_perf\n"
        "#  Rank  0 Group  0 Pid 1 on host device  0 [0x18] NVIDIA H100 80GB HBM3\n"
        "#  Rank  1 Group  0 Pid 2 on host device  1 [0x2a] NVIDIA H100 80GB HBM3\n"
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
        "time   algbw   busbw #wrong\n"
        "        1024           256     float    none      -1    10.00    0.10\n");
  const RunResult r =
      run({"calibrate", "import", "nccl-tests", log.string(), "--out", path("raw.json").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(log.string() + ":5: malformed row"));
  EXPECT_FALSE(fs::exists(path("raw.json")));
}

TEST_F(CalibrateCli, APointInflatedTenTimesIsNamedAndRefusedUnlessForced) {
  RawCalibration raw = testing::synthetic_raw(testing::truth_profile());
  for (CollectiveSample& s : raw.samples.collectives) {
    if (s.op == models::Collective::kAllToAll && s.ranks == 8 && s.size_bytes == 1024) {
      s.time_s *= 10.0;
    }
  }
  const fs::path raw_path = path("raw.json");
  write(raw_path, write_raw(raw));
  const fs::path profile = path("p.json");
  const RunResult refused = run({"calibrate", "fit", raw_path.string(), "--out", profile.string()});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_THAT(refused.err, HasSubstr("collectives.intra_node.all_to_all: outlier all_to_all 8 "
                                     "ranks 1.0 KiB: measured"));
  EXPECT_THAT(refused.out, HasSubstr("OUTLIER"));
  EXPECT_FALSE(fs::exists(profile));
  const RunResult forced =
      run({"calibrate", "fit", raw_path.string(), "--out", profile.string(), "--force"});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_TRUE(fs::exists(profile));
}

}  // namespace
}  // namespace cpsim::calibrate
