// The MPI side of `cpsim calibrate run --mpi`: ProcessGroup over MPI communicators. Built as the
// shared module libcpsim_calibrate_mpi.so, which calibrate/src/mpi_loader.cpp loads with dlopen
// only for --mpi, so the cpsim binary needs no MPI library to start (docs/CALIBRATION.md).
// Only the MPI C API is used.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mpi.h>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cpsim/calibrate/mpi_run.hpp"

namespace cpsim::calibrate {
namespace {

/// Throws when an MPI call fails (MPI_ERRORS_RETURN is set on every communicator).
void check(int rc, const char* call) {
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, text, &length);
    throw std::runtime_error(std::string(call) + " failed: " + std::string(text, length));
  }
}

class MpiGroup final : public ProcessGroup {
 public:
  /// Takes `comm` (freed on destruction unless it is MPI_COMM_WORLD, which finalises MPI).
  explicit MpiGroup(MPI_Comm comm) : comm_(comm) {
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  ~MpiGroup() override {
    if (comm_ == MPI_COMM_WORLD) {
      MPI_Finalize();
    } else {
      MPI_Comm_free(&comm_);
    }
  }
  MpiGroup(const MpiGroup&) = delete;
  MpiGroup& operator=(const MpiGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::string host() const override {
    char name[MPI_MAX_PROCESSOR_NAME];
    int length = 0;
    check(MPI_Get_processor_name(name, &length), "MPI_Get_processor_name");
    return std::string(name, static_cast<std::size_t>(length));
  }

  std::unique_ptr<ProcessGroup> split_shared() override {
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &out),
          "MPI_Comm_split_type");
    return std::make_unique<MpiGroup>(out);
  }

  std::unique_ptr<ProcessGroup> split(int color, int key) override {
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &out), "MPI_Comm_split");
    return std::make_unique<MpiGroup>(out);
  }

  void broadcast(std::vector<std::uint8_t>& bytes, int root) override {
    check(MPI_Bcast(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, root, comm_),
          "MPI_Bcast");
  }

  std::optional<std::vector<double>> max_all(const std::vector<double>& values,
                                             double timeout_s) override {
    std::vector<double> out(values.size(), 0.0);
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(values.data(), out.data(), static_cast<int>(values.size()), MPI_DOUBLE,
                         MPI_MAX, comm_, &request),
          "MPI_Iallreduce");
    // Poll, yielding the core between tests (ranks may share cores); a request that never
    // completes is left to MPI_Abort, which the caller issues.
    const auto start = std::chrono::steady_clock::now();
    auto interval = std::chrono::microseconds(1);
    while (true) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done != 0) {
        return out;
      }
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
          timeout_s) {
        return std::nullopt;
      }
      std::this_thread::sleep_for(interval);
      interval = std::min(interval * 2, std::chrono::microseconds(1000));
    }
  }

  std::vector<std::string> gather(const std::string& text, int root) override {
    const int length = static_cast<int>(text.size());
    std::vector<int> lengths(rank_ == root ? static_cast<std::size_t>(size_) : 0);
    check(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, comm_), "MPI_Gather");
    std::vector<int> offsets(lengths.size(), 0);
    int total = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      offsets[i] = total;
      total += lengths[i];
    }
    std::vector<char> all(static_cast<std::size_t>(std::max(total, 1)));
    check(MPI_Gatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                      MPI_CHAR, root, comm_),
          "MPI_Gatherv");
    std::vector<std::string> out;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      out.emplace_back(all.data() + offsets[i], static_cast<std::size_t>(lengths[i]));
    }
    return out;
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(comm_, code);
    std::terminate();  // MPI_Abort does not return; if it did, the process must still end
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace
}  // namespace cpsim::calibrate

/// The entry point calibrate/src/mpi_loader.cpp looks up after dlopen: MPI_Init_thread and the
/// world, owned by the caller (MPI_Finalize when it is destroyed). Errors are returned in
/// `error` (length `error_bytes`), nullptr then.
extern "C" cpsim::calibrate::ProcessGroup* cpsim_calibrate_mpi_new_world(char* error,
                                                                         int error_bytes) {
  try {
    int initialised = 0;
    cpsim::calibrate::check(MPI_Initialized(&initialised), "MPI_Initialized");
    if (initialised == 0) {
      int provided = 0;
      cpsim::calibrate::check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided),
                              "MPI_Init_thread");
    }
    return new cpsim::calibrate::MpiGroup(
        MPI_COMM_WORLD);  // NOLINT(cppcoreguidelines-owning-memory)
  } catch (const std::exception& e) {
    const std::string what = e.what();
    const auto n = std::min<std::size_t>(what.size(), static_cast<std::size_t>(error_bytes - 1));
    std::copy_n(what.data(), n, error);
    error[n] = '\0';
    return nullptr;
  }
}
