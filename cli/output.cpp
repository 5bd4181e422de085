#include "output.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <iostream>
#include <unistd.h>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim::cli {
namespace {

constexpr std::size_t kBufferBytes = std::size_t{64} << 10;
constexpr int kMaxSymlinkHops = 40;
constexpr const char* kStdoutName = "<stdout>";

std::string describe(const std::string& path) {
  return path == kStdoutName ? path : fmt::format("'{}'", path);
}

std::string reason_text(int error_number, const std::string& context) {
  const std::string reason = std::strerror(error_number);
  return context.empty() ? reason : fmt::format("{}: {}", context, reason);
}

void require_path(const std::string& path, const std::string& field) {
  if (path.empty()) {
    throw InputError(field, "empty path (use - for standard output)");
  }
}

/// The folder part of `path` ("." when it has none).
std::string folder_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) {
    return ".";
  }
  return slash == 0 ? "/" : path.substr(0, slash);
}

/// Follows symbolic links to the path finally written (which may not exist yet, like the target
/// of a dangling link). Sets `error_number` (ELOOP, or readlink's) and returns "" when it cannot.
std::string resolve_links(const std::string& path, int& error_number) {
  std::string current = path;
  for (int hop = 0; hop < kMaxSymlinkHops; ++hop) {
    struct stat st {};
    if (::lstat(current.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) {
      return current;
    }
    std::vector<char> link(static_cast<std::size_t>(std::max<off_t>(st.st_size, 255)) + 1);
    const ssize_t n = ::readlink(current.c_str(), link.data(), link.size());
    if (n < 0 || static_cast<std::size_t>(n) >= link.size()) {
      error_number = n < 0 ? errno : ENAMETOOLONG;
      return "";
    }
    std::string next(link.data(), static_cast<std::size_t>(n));
    if (next.front() != '/' && current.find('/') != std::string::npos) {
      next = current.substr(0, current.rfind('/') + 1) + next;
    }
    current = std::move(next);
  }
  error_number = ELOOP;
  return "";
}

bool close_checked(int& fd) {
  const int rc = ::close(fd);
  fd = -1;
  return rc == 0 || errno == EINTR;  // Linux releases the descriptor even on EINTR
}

/// Makes the rename durable; a folder that cannot be synced (some file systems) is not an error.
void sync_folder(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)::fsync(fd);
    (void)::close(fd);
  }
}

}  // namespace

OutputError::OutputError(std::string field,
                         std::string path,
                         const std::string& reason,
                         int error_number)
    : std::runtime_error(fmt::format("writing {}: {}", describe(path), reason)),
      field_(std::move(field)),
      path_(std::move(path)),
      error_number_(error_number) {}

// --- FdStreamBuf -------------------------------------------------------------------------------

FdStreamBuf::FdStreamBuf(int fd)
    : fd_(fd), line_buffered_(::isatty(fd) == 1), buffer_(kBufferBytes) {
  setp(buffer_.data(), buffer_.data() + buffer_.size());
}

bool FdStreamBuf::write_all(const char* data, std::size_t size) {
  while (size > 0 && error_ == 0) {
    const ssize_t n = ::write(fd_, data, size);
    if (n < 0) {
      if (errno != EINTR) {
        error_ = errno;
      }
      continue;
    }
    if (n == 0) {
      error_ = EIO;
      break;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return error_ == 0;
}

bool FdStreamBuf::flush_buffer() {
  const std::size_t pending = static_cast<std::size_t>(pptr() - pbase());
  setp(buffer_.data(), buffer_.data() + buffer_.size());
  if (error_ != 0) {
    return false;
  }
  return pending == 0 || write_all(buffer_.data(), pending);
}

FdStreamBuf::int_type FdStreamBuf::overflow(int_type ch) {
  if (!flush_buffer()) {
    return traits_type::eof();
  }
  if (traits_type::eq_int_type(ch, traits_type::eof())) {
    return traits_type::not_eof(ch);
  }
  *pptr() = traits_type::to_char_type(ch);
  pbump(1);
  if (line_buffered_ && traits_type::to_char_type(ch) == '\n' && !flush_buffer()) {
    return traits_type::eof();
  }
  return ch;
}

std::streamsize FdStreamBuf::xsputn(const char* data, std::streamsize size) {
  if (error_ != 0 || size <= 0) {
    return error_ != 0 ? 0 : size;
  }
  const auto bytes = static_cast<std::size_t>(size);
  if (bytes <= static_cast<std::size_t>(epptr() - pptr())) {
    std::memcpy(pptr(), data, bytes);
    pbump(static_cast<int>(bytes));
  } else {
    if (!flush_buffer()) {
      return 0;
    }
    if (bytes >= buffer_.size()) {
      return write_all(data, bytes) ? size : 0;
    }
    std::memcpy(pptr(), data, bytes);
    pbump(static_cast<int>(bytes));
  }
  if (line_buffered_ && std::memchr(data, '\n', bytes) != nullptr && !flush_buffer()) {
    return 0;
  }
  return size;
}

int FdStreamBuf::sync() {
  return flush_buffer() ? 0 : -1;
}

// --- OutputFile --------------------------------------------------------------------------------

OutputFile::OutputFile(const std::string& path, const std::string& field)
    : field_(field), path_(path) {
  require_path(path, field);
  if (path == "-") {
    mode_ = Mode::kStdout;
    path_ = kStdoutName;
    std::cout.flush();  // what the command printed before stays before
    fd_ = STDOUT_FILENO;
  } else {
    int error_number = 0;
    target_ = resolve_links(path, error_number);
    if (target_.empty()) {
      fail(error_number, "following the symbolic link");
    }
    struct stat st {};
    if (::stat(target_.c_str(), &st) != 0) {
      if (errno == ENOTDIR) {
        throw InputError(field_, fmt::format("the folder of '{}' does not exist", path_));
      }
      if (errno != ENOENT) {
        fail(errno);
      }
      open_staged(nullptr);
    } else if (S_ISDIR(st.st_mode)) {
      fail(EISDIR);
    } else if (S_ISREG(st.st_mode)) {
      open_staged(&st);
    } else {
      // Devices, FIFOs, sockets: never replaced. Opening a FIFO waits for its reader.
      mode_ = Mode::kDirect;
      fd_ = ::open(target_.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
      if (fd_ < 0) {
        fail(errno);
      }
    }
  }
  buf_ = std::make_unique<FdStreamBuf>(fd_);
  stream_.rdbuf(buf_.get());
}

/// Creates the staging file `TARGET.tmp`; `existing` is the regular file it replaces, if any.
void OutputFile::open_staged(const struct stat* existing) {
  mode_ = existing != nullptr && existing->st_nlink > 1 ? Mode::kInPlace : Mode::kReplace;
  if (mode_ == Mode::kInPlace) {
    target_fd_ = ::open(target_.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
    if (target_fd_ < 0) {
      fail(errno);
    }
  }
  temp_ = target_ + ".tmp";
  // A stale FILE.tmp (a killed run) or anything planted there is removed, never followed.
  if (::unlink(temp_.c_str()) != 0 && errno != ENOENT && errno != EACCES && errno != EROFS) {
    const int error_number = errno;
    temp_.clear();
    fail(error_number, fmt::format("cannot remove '{}'", target_ + ".tmp"));
  }
  fd_ = ::open(temp_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    const int error_number = errno;
    temp_.clear();  // not ours: never removed
    if (error_number == ENOENT || error_number == ENOTDIR) {
      discard();
      throw InputError(field_, fmt::format("the folder of '{}' does not exist", path_));
    }
    fail(error_number, fmt::format("cannot create '{}'", target_ + ".tmp"));
  }
  if (mode_ == Mode::kReplace && existing != nullptr) {
    // Keep the replaced file's owner where permitted (root, or a group of ours), then its mode.
    (void)::fchown(fd_, existing->st_uid, existing->st_gid);
    if (::fchmod(fd_, existing->st_mode & 07777) != 0) {
      fail(errno, "keeping the file mode");
    }
  }
}

OutputFile::~OutputFile() {
  if (!done_) {
    discard();
  }
  stream_.rdbuf(nullptr);
}

void OutputFile::discard() noexcept {
  done_ = true;
  if (mode_ != Mode::kStdout && fd_ >= 0) {
    (void)::close(fd_);
  }
  fd_ = -1;
  if (target_fd_ >= 0) {
    (void)::close(target_fd_);
    target_fd_ = -1;
  }
  if (!temp_.empty()) {
    (void)::unlink(temp_.c_str());
    temp_.clear();
  }
}

void OutputFile::fail(int error_number, const std::string& context) {
  discard();
  throw OutputError(field_, path_, reason_text(error_number, context), error_number);
}

void OutputFile::commit() {
  if (done_) {
    throw std::logic_error("OutputFile::commit called twice");
  }
  stream_.flush();
  if (!buf_->flush_buffer() || !stream_) {
    fail(buf_->error() != 0 ? buf_->error() : EIO);
  }
  switch (mode_) {
    case Mode::kStdout:
      done_ = true;
      return;
    case Mode::kDirect:
      if (!close_checked(fd_)) {
        fail(errno);
      }
      done_ = true;
      return;
    case Mode::kReplace:
      replace_target();
      return;
    case Mode::kInPlace:
      copy_into_target();
      return;
  }
}

void OutputFile::replace_target() {
  if (::fsync(fd_) != 0) {
    fail(errno);
  }
  if (!close_checked(fd_)) {
    fail(errno);
  }
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    fail(errno, fmt::format("renaming '{}' onto it", temp_));
  }
  temp_.clear();
  done_ = true;
  sync_folder(folder_of(target_));
}

/// A hard-linked file: the staged text is copied over the file itself, so every link sees it.
void OutputFile::copy_into_target() {
  if (::lseek(fd_, 0, SEEK_SET) != 0) {
    fail(errno);
  }
  FdStreamBuf copy(target_fd_);
  std::vector<char> chunk(kBufferBytes);
  off_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd_, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      fail(errno, fmt::format("reading back '{}'", temp_));
    }
    if (n == 0) {
      break;
    }
    if (copy.sputn(chunk.data(), n) != n) {
      fail(copy.error() != 0 ? copy.error() : EIO);
    }
    total += n;
  }
  if (!copy.flush_buffer()) {
    fail(copy.error());
  }
  if (::ftruncate(target_fd_, total) != 0 || ::fsync(target_fd_) != 0 ||
      !close_checked(target_fd_)) {
    fail(errno);
  }
  discard();  // closes and removes the staging file
}

// --- helpers -----------------------------------------------------------------------------------

void write_output(const std::string& path, const std::string& content, const std::string& field) {
  OutputFile out(path, field);
  out.stream().write(content.data(), static_cast<std::streamsize>(content.size()));
  out.commit();
}

void check_output_writable(const std::string& path, const std::string& field) {
  require_path(path, field);
  if (path == "-") {
    return;
  }
  int error_number = 0;
  const std::string target = resolve_links(path, error_number);
  if (target.empty()) {
    throw OutputError(field, path, reason_text(error_number, "following the symbolic link"),
                      error_number);
  }
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    const int error_number_special =
        S_ISDIR(st.st_mode) ? EISDIR : (::access(target.c_str(), W_OK) == 0 ? 0 : errno);
    if (error_number_special != 0) {
      throw OutputError(field, path, std::strerror(error_number_special), error_number_special);
    }
    return;
  }
  OutputFile probe(path, field);  // creates the staging file; removed when `probe` goes
}

CLI::Validator output_path_check() {
  return CLI::Validator(
      [](std::string& value) {
        return value.empty() ? std::string("empty path (use - for standard output)")
                             : std::string();
      },
      "", "output path");
}

// --- StdoutGuard -------------------------------------------------------------------------------

StdoutGuard::StdoutGuard() : buf_(STDOUT_FILENO), previous_(std::cout.rdbuf(&buf_)) {}

StdoutGuard::~StdoutGuard() {
  std::cout.rdbuf(previous_);
}

int StdoutGuard::finish() {
  std::cout.flush();
  if (!buf_.flush_buffer()) {
    return buf_.error();
  }
  return std::cout.fail() ? EIO : 0;
}

}  // namespace cpsim::cli
