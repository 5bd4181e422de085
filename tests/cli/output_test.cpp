// End-to-end tests of how cpsim writes its outputs (cli/output.hpp): what a path names decides
// how it is written (FIFO and devices directly, symbolic links through to their target, the mode
// and the hard links of a replaced file kept), every write is checked (standard output included),
// a failed write leaves the previous file, `-` is standard output, an empty path is bad input, and
// with --json an error is also a JSON object on standard output.
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <poll.h>
#include <pwd.h>
#include <string>
#include <sys/resource.h>
#include <sys/stat.h>
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
using ::testing::StartsWith;

constexpr int kTimeoutSeconds = 60;
constexpr const char* kDevFull = "/dev/full";

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

bool is_trace(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    return j.contains("traceEvents") && j.at("traceEvents").is_array() &&
           !j.at("traceEvents").empty();
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

bool dev_full_usable() {
  struct stat st {};
  return ::stat(kDevFull, &st) == 0 && S_ISCHR(st.st_mode) && ::access(kDevFull, W_OK) == 0;
}

bool is_char_device(const char* path) {
  struct stat st {};
  return ::lstat(path, &st) == 0 && S_ISCHR(st.st_mode);
}

struct Outcome {
  int exit_code = -1;  // -1: did not exit normally
  int signal = 0;      // the signal that ended it, if any
  std::string out;     // standard output (when it went to a file of the test)
  std::string err;
};

/// How a run is started: where its standard output goes and what the child changes first.
struct RunOptions {
  std::optional<std::string> stdout_path;  // default: a file of the test
  int stdout_fd = -1;                      // a descriptor to use as standard output instead
  bool ignore_sigpipe = false;
  long file_size_limit_bytes = -1;  // RLIMIT_FSIZE (SIGXFSZ ignored: writes fail with EFBIG)
  uid_t run_as = 0;                 // non-zero: setgid/setuid to this user first
  gid_t run_as_group = 0;
};

class OutputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "cpsim_output_test_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_ / "ro", fs::perms::owner_all, ec);
    fs::remove_all(dir_, ec);
  }

  fs::path path(const std::string& name) const { return dir_ / name; }

  Outcome run(const std::vector<std::string>& args, const RunOptions& opt = {}) {
    const int n = ++runs_;
    const std::string out_path =
        opt.stdout_path.value_or((dir_ / ("run" + std::to_string(n) + ".out")).string());
    const std::string err_path = (dir_ / ("run" + std::to_string(n) + ".err")).string();
    std::vector<std::string> storage{CPSIM_BINARY};
    storage.insert(storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : storage) {
      argv.push_back(a.data());
    }
    argv.push_back(nullptr);

    const pid_t pid = ::fork();
    if (pid == 0) {
      ::umask(022);
      const int out_fd = opt.stdout_fd >= 0
                             ? opt.stdout_fd
                             : ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int in_fd = ::open("/dev/null", O_RDONLY);
      if (out_fd < 0 || err_fd < 0 || in_fd < 0 || ::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0 ||
          ::dup2(in_fd, 0) < 0) {
        ::_exit(127);
      }
      ::signal(SIGPIPE, opt.ignore_sigpipe ? SIG_IGN : SIG_DFL);
      if (opt.file_size_limit_bytes >= 0) {
        ::signal(SIGXFSZ, SIG_IGN);
        const rlimit limit{static_cast<rlim_t>(opt.file_size_limit_bytes),
                           static_cast<rlim_t>(opt.file_size_limit_bytes)};
        if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) {
          ::_exit(126);
        }
      }
      if (opt.run_as != 0 && (::setgid(opt.run_as_group) != 0 || ::setuid(opt.run_as) != 0)) {
        ::_exit(125);
      }
      ::setenv("CPSIM_DATA_DIR", CPSIM_TEST_DATA_DIR, 1);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    Outcome r;
    if (pid < 0) {
      ADD_FAILURE() << "fork: " << std::strerror(errno);
      return r;
    }
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kTimeoutSeconds);
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        ADD_FAILURE() << "cpsim still running after " << kTimeoutSeconds << " s; killed";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (WIFEXITED(status)) {
      r.exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      r.signal = WTERMSIG(status);
    }
    if (!opt.stdout_path && opt.stdout_fd < 0) {
      r.out = slurp(out_path);
    }
    r.err = slurp(err_path);
    return r;
  }

  /// A small simulation that writes its trace to `trace_path`.
  Outcome simulate_trace(const std::string& trace_path, const RunOptions& opt = {}) {
    return run({"simulate", "--seq", "32K", "--method", "ulysses", "--trace", trace_path}, opt);
  }

  /// The trace of an uninterrupted run into a new file.
  const std::string& reference_trace() {
    if (reference_.empty()) {
      const Outcome r = simulate_trace(path("reference.json").string());
      EXPECT_EQ(r.exit_code, 0) << r.err;
      reference_ = slurp(path("reference.json"));
      EXPECT_TRUE(is_trace(reference_));
    }
    return reference_;
  }

  fs::path dir_;
  int runs_ = 0;
  std::string reference_;
};

/// Reads a FIFO until its writer closes it, or until `run_over` when no writer ever opens it (a
/// FIFO replaced by a file): opened without blocking, so the reader can always stop.
std::string read_fifo(const fs::path& fifo, const std::atomic<bool>& run_over) {
  std::string received;
  const int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  if (fd < 0) {
    return received;
  }
  std::vector<char> chunk(1 << 16);
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const bool over = run_over.load();
    if (::poll(&p, 1, 50) > 0 && (p.revents & (POLLIN | POLLHUP)) != 0) {
      const ssize_t n = ::read(fd, chunk.data(), chunk.size());
      if (n > 0) {
        received.append(chunk.data(), static_cast<std::size_t>(n));
        continue;
      }
      if (n == 0 || errno != EAGAIN) {
        break;  // the writer closed it
      }
    } else if (over) {
      break;  // the run ended and never wrote to the FIFO
    }
  }
  ::close(fd);
  return received;
}

TEST_F(OutputTest, FifoReaderGetsEveryByte) {
  const fs::path fifo = path("trace.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  std::atomic<bool> run_over{false};
  std::string received;
  std::thread reader([&] { received = read_fifo(fifo, run_over); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the reader opens first
  const Outcome r = simulate_trace(fifo.string());
  run_over = true;
  reader.join();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(received.size(), reference_trace().size());
  EXPECT_TRUE(received == reference_trace()) << "the reader got other bytes";
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
  EXPECT_FALSE(fs::exists(path("trace.fifo.tmp")));
}

TEST_F(OutputTest, SymlinkKeptAndTargetReplaced) {
  fs::create_directory(path("real"));
  spit(path("real/trace.json"), "previous");
  fs::create_symlink("real/trace.json", path("link.json"));  // relative to the link's folder
  const Outcome r = simulate_trace(path("link.json").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(path("link.json"))) << "the link became a regular file";
  EXPECT_EQ(slurp(path("real/trace.json")), reference_trace());
  EXPECT_FALSE(fs::exists(path("link.json.tmp")));
  EXPECT_FALSE(fs::exists(path("real/trace.json.tmp")));
}

TEST_F(OutputTest, DanglingSymlinkCreatesItsTarget) {
  fs::create_symlink("new.json", path("link.json"));
  const Outcome r = simulate_trace(path("link.json").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(path("link.json")));
  EXPECT_EQ(slurp(path("new.json")), reference_trace());
}

TEST_F(OutputTest, ModeOfReplacedFileKept) {
  spit(path("trace.json"), "previous");
  ASSERT_EQ(::chmod(path("trace.json").c_str(), 0600), 0);
  const Outcome r = simulate_trace(path("trace.json").string());  // umask 022: a new file is 0644
  EXPECT_EQ(r.exit_code, 0) << r.err;
  struct stat st {};
  ASSERT_EQ(::stat(path("trace.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(slurp(path("trace.json")), reference_trace());
}

TEST_F(OutputTest, NewFileGetsModeFromUmask) {
  const Outcome r = simulate_trace(path("trace.json").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  struct stat st {};
  ASSERT_EQ(::stat(path("trace.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
}

TEST_F(OutputTest, HardLinkKept) {
  // longer than the new text: what is left past its end must go
  spit(path("trace.json"), reference_trace() + std::string(4096, 'x'));
  fs::create_hard_link(path("trace.json"), path("other_name.json"));
  const Outcome r = simulate_trace(path("trace.json").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(fs::hard_link_count(path("trace.json")), 2u);
  EXPECT_EQ(slurp(path("other_name.json")), reference_trace());
  EXPECT_EQ(slurp(path("trace.json")), reference_trace());
  EXPECT_FALSE(fs::exists(path("trace.json.tmp")));
}

TEST_F(OutputTest, FailedWriteLeavesPreviousFile) {
  spit(path("trace.json"), "previous");
  RunOptions opt;
  opt.file_size_limit_bytes = 4096;  // the trace is far larger: its write fails with EFBIG
  const Outcome r = simulate_trace(path("trace.json").string(), opt);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, StartsWith("cpsim: error: writing '" + path("trace.json").string() + "': "));
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
  EXPECT_EQ(slurp(path("trace.json")), "previous");
  EXPECT_FALSE(fs::exists(path("trace.json.tmp"))) << "the temporary file was left";
}

TEST_F(OutputTest, StaleTemporaryReplaced) {
  fs::create_symlink("victim.txt", path("trace.json.tmp"));  // never followed
  spit(path("victim.txt"), "untouched");
  const Outcome r = simulate_trace(path("trace.json").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(slurp(path("victim.txt")), "untouched");
  EXPECT_EQ(slurp(path("trace.json")), reference_trace());
  EXPECT_FALSE(fs::exists(path("trace.json.tmp")));
}

// --- /dev/full: every output path must report the failure and leave the device alone ---------

void expect_no_space(const Outcome& r, const std::string& what) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err, "cpsim: error: writing " + what + ": No space left on device\n");
  EXPECT_TRUE(is_char_device(kDevFull)) << kDevFull << " is no longer a character device";
}

TEST_F(OutputTest, DevFullTrace) {
  if (!dev_full_usable()) {
    GTEST_SKIP() << "no writable " << kDevFull;
  }
  expect_no_space(simulate_trace(kDevFull), "'/dev/full'");
}

TEST_F(OutputTest, DevFullHtml) {
  if (!dev_full_usable()) {
    GTEST_SKIP() << "no writable " << kDevFull;
  }
  expect_no_space(run({"report", "--seq", "32K", "--methods", "ulysses", "--html", kDevFull}),
                  "'/dev/full'");
}

TEST_F(OutputTest, DevFullEmitOut) {
  if (!dev_full_usable()) {
    GTEST_SKIP() << "no writable " << kDevFull;
  }
  expect_no_space(run({"plan", "--seq", "32K", "--methods", "ulysses", "--emit", "deepspeed",
                       "--out", kDevFull}),
                  "'/dev/full'");
}

TEST_F(OutputTest, DevFullStdout) {
  if (!dev_full_usable()) {
    GTEST_SKIP() << "no writable " << kDevFull;
  }
  RunOptions opt;
  opt.stdout_path = kDevFull;
  expect_no_space(run({"simulate", "--seq", "32K", "--method", "ulysses"}, opt), "<stdout>");
  expect_no_space(run({"models"}, opt), "<stdout>");
  expect_no_space(simulate_trace("-", opt), "<stdout>");
}

TEST_F(OutputTest, DevFullJsonErrorStillOneStderrLine) {
  if (!dev_full_usable()) {
    GTEST_SKIP() << "no writable " << kDevFull;
  }
  const Outcome r =
      run({"simulate", "--seq", "32K", "--method", "ulysses", "--json", "--trace", kDevFull});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "cpsim: error: writing '/dev/full': No space left on device\n");
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("error").at("kind"), "io");
  EXPECT_EQ(j.at("error").at("path"), kDevFull);
  EXPECT_EQ(j.at("error").at("field"), "--trace");
}

// --- folders that cannot be written ------------------------------------------------------------

TEST_F(OutputTest, ReadOnlyFolder) {
  RunOptions opt;
  if (::geteuid() == 0) {
    // root writes anyway: run as an unprivileged user (when there is one) to see the refusal
    const passwd* nobody = ::getpwnam("nobody");
    if (nobody == nullptr) {
      GTEST_SKIP() << "running as root and no user 'nobody'";
    }
    opt.run_as = nobody->pw_uid;
    opt.run_as_group = nobody->pw_gid;
    fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                              fs::perms::others_read | fs::perms::others_exec);
    // the run's stdout and stderr files are opened before the user changes
  }
  fs::create_directory(path("ro"));
  spit(path("ro/trace.json"), "previous");
  fs::permissions(path("ro"), fs::perms::owner_read | fs::perms::owner_exec |
                                  fs::perms::group_read | fs::perms::group_exec |
                                  fs::perms::others_read | fs::perms::others_exec);
  if (opt.run_as == 0 && ::access(path("ro").c_str(), W_OK) == 0) {
    GTEST_SKIP() << "this user can write into a read-only folder";
  }
  const std::string target = path("ro/trace.json").string();
  const Outcome r = simulate_trace(target, opt);
  if (r.exit_code == 125 || r.exit_code == 127) {
    GTEST_SKIP() << "cannot run cpsim as another user here";
  }
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, StartsWith("cpsim: error: writing '" + target + "': "));
  EXPECT_THAT(r.err, HasSubstr("Permission denied"));
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
  EXPECT_EQ(slurp(path("ro/trace.json")), "previous");
}

TEST_F(OutputTest, FolderAsOutput) {
  fs::create_directory(path("folder"));
  const Outcome r = simulate_trace(path("folder").string());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("Is a directory"));
  EXPECT_TRUE(fs::is_directory(path("folder")));
}

// --- standard output ---------------------------------------------------------------------------

TEST_F(OutputTest, DashIsStandardOutput) {
  const Outcome r = simulate_trace("-");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, reference_trace()) << "stdout is the trace alone";
  EXPECT_THAT(r.err, HasSubstr("step time")) << "the summary goes to stderr";
  EXPECT_FALSE(fs::exists(fs::current_path() / "-"));
  EXPECT_FALSE(fs::exists(path("-")));
}

TEST_F(OutputTest, EmptyPathIsBadInput) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"plan", "--seq", "32K", "--methods", "ulysses", "--emit",
                                 "deepspeed", "--out", ""},
        std::vector<std::string>{"simulate", "--seq", "32K", "--trace", ""},
        std::vector<std::string>{"report", "--seq", "32K", "--html", ""}}) {
    const Outcome r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args.back() << r.err;
    const std::string flag = args[args.size() - 2];
    EXPECT_THAT(r.err, StartsWith("cpsim: error: " + flag)) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out.substr(0, 200);
  }
}

TEST_F(OutputTest, ClosedPipeEndsQuietly) {
  for (const bool ignore : {false, true}) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    ::close(fds[0]);  // the reader is gone before cpsim writes anything
    RunOptions opt;
    opt.stdout_fd = fds[1];
    opt.ignore_sigpipe = ignore;
    const Outcome r = run({"plan", "--seq", "32K", "--methods", "ulysses"}, opt);
    ::close(fds[1]);
    EXPECT_EQ(r.err, "") << "SIGPIPE ignored: " << ignore;
    if (ignore) {
      EXPECT_EQ(r.exit_code, 1);
    } else {
      EXPECT_EQ(r.signal, SIGPIPE);
    }
  }
}

// --- --json errors -----------------------------------------------------------------------------

TEST_F(OutputTest, JsonErrorOnBadInput) {
  const Outcome r = run({"simulate", "--seq", "banana", "--json"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, StartsWith("cpsim: error: --seq"));
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
  ASSERT_TRUE(j.contains("error")) << r.out;
  EXPECT_EQ(j.at("error").at("kind"), "input");
  EXPECT_EQ(j.at("error").at("field"), "--seq");
  EXPECT_THAT(j.at("error").at("message").get<std::string>(), HasSubstr("banana"));
}

TEST_F(OutputTest, JsonErrorOnParseError) {
  const Outcome r = run({"maxlen", "--gpus", "many", "--json"});
  EXPECT_EQ(r.exit_code, 2);
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
  EXPECT_EQ(j.at("error").at("kind"), "input");
  EXPECT_EQ(j.at("error").at("field"), "--gpus");
}

TEST_F(OutputTest, NoJsonErrorWithoutJson) {
  const Outcome r = run({"simulate", "--seq", "banana"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
}

}  // namespace
