#pragma once
// Output files of the subcommands. Every write, flush and close is checked; what a path names
// decides how it is written:
//   - "-": standard output, written directly;
//   - a regular file or a new path: a temporary `FILE.tmp` in the same folder, fsync, rename onto
//     FILE (mode and, where permitted, owner of the replaced file kept), so a failed or killed run
//     never leaves a half-written FILE (a SIGKILL can leave FILE.tmp, which the next run replaces);
//   - a symbolic link: the same, at the final target (the link stays a link);
//   - a regular file with several hard links: staged in FILE.tmp, then copied into FILE in place
//     so every link sees the new text (a failure while copying can leave FILE partly rewritten);
//   - a character device, FIFO or socket: written directly (never replaced, never renamed over).

#include <memory>
#include <ostream>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <sys/stat.h>
#include <vector>

#include <CLI/CLI.hpp>

namespace cpsim::cli {

/// An output could not be written. `what()` is one line: `writing 'PATH': reason` (`<stdout>` for
/// standard output). The command exits with status 1.
class OutputError : public std::runtime_error {
 public:
  OutputError(std::string field, std::string path, const std::string& reason, int error_number);
  /// The flag that named the output (`--trace`), empty for standard output.
  const std::string& field() const { return field_; }
  /// The path as given, or `<stdout>`.
  const std::string& path() const { return path_; }
  /// The errno of the failure (EPIPE: the reader of a pipe went away).
  int error_number() const { return error_number_; }

 private:
  std::string field_;
  std::string path_;
  int error_number_;
};

/// A buffered stream buffer over a file descriptor (not owned) that remembers the first failed
/// write: `error()` is its errno, 0 while every write succeeded.
class FdStreamBuf : public std::streambuf {
 public:
  explicit FdStreamBuf(int fd);
  ~FdStreamBuf() override = default;
  FdStreamBuf(const FdStreamBuf&) = delete;
  FdStreamBuf& operator=(const FdStreamBuf&) = delete;

  int error() const { return error_; }
  /// Writes what is buffered; false after any failed write.
  bool flush_buffer();

 protected:
  int_type overflow(int_type ch) override;
  std::streamsize xsputn(const char* data, std::streamsize size) override;
  int sync() override;

 private:
  bool write_all(const char* data, std::size_t size);

  int fd_;
  int error_ = 0;
  bool line_buffered_;  // a terminal: written at each end of line
  std::vector<char> buffer_;
};

/// One output being written: open -> stream() -> commit(). Destroyed without commit() (an
/// exception, an early return), a replaced file is left as it was and the temporary is removed.
///
///   OutputFile out(path, "--trace");      // @throws InputError (empty path, no such folder),
//   OutputError
///   write_something(out.stream());
///   out.commit();                          // @throws OutputError; afterwards the file is in place
class OutputFile {
 public:
  OutputFile(const std::string& path, const std::string& field);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  std::ostream& stream() { return stream_; }
  /// Flushes and checks every write, then puts the file in place.
  void commit();

 private:
  enum class Mode { kStdout, kDirect, kReplace, kInPlace };

  void open_staged(const struct stat* existing);
  [[noreturn]] void fail(int error_number, const std::string& context = "");
  void discard() noexcept;
  void replace_target();
  void copy_into_target();

  std::string field_;
  std::string path_;    // as given (for messages)
  std::string target_;  // the file finally written (symbolic links resolved)
  std::string temp_;    // kReplace / kInPlace: the staging file
  Mode mode_ = Mode::kReplace;
  int fd_ = -1;         // what the stream writes to
  int target_fd_ = -1;  // kInPlace: the target, opened early to fail early
  bool done_ = false;
  std::unique_ptr<FdStreamBuf> buf_;
  std::ostream stream_{nullptr};
};

/// Writes `content` to `path` as described at the top of this file.
/// @throws InputError(field) for an empty path or a folder that does not exist, OutputError when
/// it cannot be written.
void write_output(const std::string& path, const std::string& content, const std::string& field);

/// Fails early (before a long computation) when `path` cannot be written: creates and removes
/// the temporary of a regular file, checks write permission of a device or FIFO without opening
/// it. @throws InputError(field) for an empty path, OutputError.
void check_output_writable(const std::string& path, const std::string& field);

/// A CLI11 check for output flags: an empty path is bad input (exit 2 naming the flag).
CLI::Validator output_path_check();

/// Standard output of the whole run: std::cout goes through a checked buffer on descriptor 1 from
/// construction; `finish()` flushes it and reports the first failed write. Restores std::cout's
/// buffer when destroyed.
class StdoutGuard {
 public:
  StdoutGuard();
  ~StdoutGuard();
  StdoutGuard(const StdoutGuard&) = delete;
  StdoutGuard& operator=(const StdoutGuard&) = delete;

  /// Flushes; 0 when every write to standard output succeeded, else its errno.
  int finish();

 private:
  FdStreamBuf buf_;
  std::streambuf* previous_;
};

}  // namespace cpsim::cli
