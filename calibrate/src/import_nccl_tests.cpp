#include "cpsim/calibrate/import_nccl_tests.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim::calibrate {
namespace {

using models::Collective;

constexpr std::uintmax_t kMaxLogBytes = 64ull << 20;

constexpr std::array<std::pair<std::string_view, Collective>, 5> kPrograms = {{
    {"all_reduce_perf", Collective::kAllReduce},
    {"all_gather_perf", Collective::kAllGather},
    {"reduce_scatter_perf", Collective::kReduceScatter},
    {"alltoall_perf", Collective::kAllToAll},
    {"sendrecv_perf", Collective::kSendRecv},
}};

std::vector<std::string_view> split_ws(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) {
      ++i;
    }
    std::size_t j = i;
    while (j < s.size() && s[j] != ' ' && s[j] != '\t' && s[j] != '\r') {
      ++j;
    }
    if (j > i) {
      out.push_back(s.substr(i, j - i));
    }
    i = j;
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

/// Removes what a launcher puts before every line: "  0: " (srun --label) or "[1,0]<stdout>:"
/// (mpirun --tag-output).
std::string_view strip_launcher_prefix(std::string_view s) {
  const std::string_view t = trim(s);
  if (const std::size_t colon = t.find(':');
      colon != std::string_view::npos && colon > 0 && all_digits(t.substr(0, colon))) {
    return t.substr(colon + 1);
  }
  if (!t.empty() && t.front() == '[') {
    const std::size_t close = t.find("]<std");
    const std::size_t colon = t.find(">:");
    if (close != std::string_view::npos && colon != std::string_view::npos && close < colon) {
      return t.substr(colon + 2);
    }
  }
  return s;
}

bool parse_int64(std::string_view s, std::int64_t& out) {
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

bool parse_double(std::string_view s, double& out) {
  const std::string text(s);
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  return !text.empty() && end == text.c_str() + text.size() && std::isfinite(out);
}

/// "/path/build/all_gather_perf_mpi," -> "all_gather_perf"; empty when `token` names no *_perf
/// program.
std::string program_in_token(std::string_view token) {
  if (const std::size_t slash = token.rfind('/'); slash != std::string_view::npos) {
    token.remove_prefix(slash + 1);
  }
  auto word_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  };
  while (!token.empty() && !word_char(token.front())) {
    token.remove_prefix(1);
  }
  while (!token.empty() && !word_char(token.back())) {
    token.remove_suffix(1);
  }
  if (token.size() > 4 && token.substr(token.size() - 4) == "_mpi") {
    token.remove_suffix(4);
  }
  const std::string_view suffix = "_perf";
  if (token.size() <= suffix.size() || token.substr(token.size() - suffix.size()) != suffix ||
      !std::all_of(token.begin(), token.end(), word_char)) {
    return {};
  }
  return std::string(token);
}

/// "2.26.2" from "NCCL version 2.26.2+cuda12.8" or "nccl-library=22807" (2.28.7); empty if none.
std::string nccl_version_in_line(std::string_view line) {
  const std::vector<std::string_view> t = split_ws(line);
  for (std::size_t i = 0; i + 2 < t.size(); ++i) {
    if (t[i] == "NCCL" && t[i + 1] == "version") {
      std::string_view v = t[i + 2];
      v = v.substr(0, std::min(v.find('+'), v.size()));
      if (!v.empty() && v.front() >= '0' && v.front() <= '9') {
        return std::string(v);
      }
    }
  }
  for (const std::string_view token : t) {
    std::int64_t code = 0;
    const std::string_view key = "nccl-library=";
    if (token.substr(0, key.size()) == key && parse_int64(token.substr(key.size()), code) &&
        code >= 20900) {
      return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
    }
  }
  return {};
}

struct RankLine {
  std::int64_t rank = 0;
  std::string host;
  std::string device;
};

/// "#  Rank  0 Group  0 Pid 295203 on node005 device  0 [0x18] NVIDIA H100 80GB HBM3" (Group is
/// absent in older versions).
std::optional<RankLine> parse_rank_line(std::string_view line) {
  const std::vector<std::string_view> t = split_ws(line);
  if (t.size() < 8 || t[0] != "#" || t[1] != "Rank") {
    return std::nullopt;
  }
  RankLine r;
  if (!parse_int64(t[2], r.rank)) {
    return std::nullopt;
  }
  std::size_t i = 3;
  while (i + 1 < t.size() && t[i] != "on") {
    ++i;
  }
  if (i + 1 >= t.size()) {
    return std::nullopt;
  }
  r.host = std::string(t[i + 1]);
  const std::size_t device_at = line.find(" device ");
  const std::size_t close =
      device_at == std::string_view::npos ? device_at : line.find(']', device_at);
  if (close == std::string_view::npos) {
    return std::nullopt;
  }
  r.device = std::string(trim(line.substr(close + 1)));
  return r;
}

/// Column positions of the results table, from its header line.
struct TableHeader {
  std::size_t columns = 0;
  std::array<std::size_t, 2> time{};
  std::array<std::size_t, 2> algbw{};
  std::array<std::size_t, 2> busbw{};
  std::array<std::optional<std::size_t>, 2> wrong;
};

/// "#  size  count  type  redop  root  time  algbw  busbw  #wrong  time ..." (redop and root are
/// absent in older versions, "#wrong" is "error" there); nullopt for other lines.
std::optional<TableHeader> parse_table_header(std::string_view line) {
  std::vector<std::string_view> t = split_ws(line);
  while (!t.empty() && t.front() == "#") {
    t.erase(t.begin());
  }
  if (!t.empty() && t.front().size() > 1 && t.front().front() == '#') {
    t.front().remove_prefix(1);
  }
  if (t.size() < 2 || t[0] != "size" || t[1] != "count") {
    return std::nullopt;
  }
  std::vector<std::size_t> time, algbw, busbw, wrong;
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (t[i] == "time") {
      time.push_back(i);
    } else if (t[i] == "algbw") {
      algbw.push_back(i);
    } else if (t[i] == "busbw") {
      busbw.push_back(i);
    } else if (t[i] == "#wrong" || t[i] == "error" || t[i] == "wrong") {
      wrong.push_back(i);
    }
  }
  if (time.size() != 2 || algbw.size() != 2 || busbw.size() != 2 || wrong.size() > 2) {
    return std::nullopt;
  }
  TableHeader h;
  h.columns = t.size();
  for (std::size_t half = 0; half < 2; ++half) {
    h.time[half] = time[half];
    h.algbw[half] = algbw[half];
    h.busbw[half] = busbw[half];
    if (half < wrong.size()) {
      h.wrong[half] = wrong[half];
    }
  }
  return h;
}

/// What a log says, collected line by line.
class LogReader {
 public:
  LogReader(std::string origin, std::optional<Collective> op)
      : origin_(std::move(origin)), option_op_(op) {}

  void read(const std::string& text) {
    std::istringstream in(text);
    std::string raw_line;
    std::size_t number = 0;
    while (std::getline(in, raw_line)) {
      ++number;
      read_line(strip_launcher_prefix(raw_line), number);
    }
  }

  NcclTestsRun finish();

 private:
  std::string where(std::size_t line) const { return fmt::format("{}:{}", origin_, line); }
  void read_line(std::string_view line, std::size_t number);
  void read_preamble_line(std::string_view line, const std::vector<std::string_view>& tokens);
  void read_row(const std::vector<std::string_view>& tokens, std::size_t number);
  Collective decide_op() const;
  void check_bandwidths(std::size_t rank_count);

  struct Row {
    std::size_t line = 0;
    std::int64_t size = 0;
    std::array<double, 2> time_us{};
    std::array<double, 2> algbw_gb_s{};
    std::array<double, 2> busbw_gb_s{};
  };

  std::string origin_;
  std::optional<Collective> option_op_;
  std::set<std::string> programs_;
  std::map<std::int64_t, RankLine> ranks_;
  std::string nccl_version_;
  int warmup_iters_ = 0;
  int iters_ = 0;
  std::optional<TableHeader> header_;
  std::size_t header_line_ = 0;
  bool table_done_ = false;
  std::vector<Row> rows_;
  std::size_t skipped_rows_ = 0;
  double avg_busbw_ = 0.0;
};

void LogReader::read_line(std::string_view line, std::size_t number) {
  const std::vector<std::string_view> tokens = split_ws(line);
  if (tokens.empty()) {
    return;
  }
  if (std::string v = nccl_version_in_line(line); !v.empty() && nccl_version_.empty()) {
    nccl_version_ = std::move(v);
  }
  if (auto h = parse_table_header(line)) {
    if (header_) {
      throw InputError(where(number),
                       fmt::format("a second results table (the first starts at line {}); "
                                   "give one nccl-tests run per file",
                                   header_line_));
    }
    header_ = *h;
    header_line_ = number;
    return;
  }
  if (!header_) {
    read_preamble_line(line, tokens);
    return;
  }
  if (tokens[0] == "#" && tokens.size() >= 6 && tokens[1] == "Avg" && tokens[2] == "bus") {
    table_done_ = true;
    if (!parse_double(tokens.back(), avg_busbw_)) {
      avg_busbw_ = 0.0;
    }
    return;
  }
  if (tokens[0].front() == '#') {
    if (tokens.size() >= 3 && tokens[1] == "Out" && tokens[2] == "of") {
      table_done_ = true;
    }
    return;  // units line, "# Truncated ..." and other comments
  }
  if (all_digits(tokens[0]) && !table_done_) {
    read_row(tokens, number);
  }
  // Anything else inside or after the table (NCCL INFO lines, launcher messages) is not data.
}

void LogReader::read_preamble_line(std::string_view line,
                                   const std::vector<std::string_view>& tokens) {
  if (auto rank = parse_rank_line(line)) {
    ranks_.emplace(rank->rank, std::move(*rank));
    return;
  }
  for (std::size_t i = 0; i + 1 < tokens.size(); ++i) {
    std::int64_t value = 0;
    if (tokens[i] == "iters:" && parse_int64(tokens[i + 1], value) && i > 0) {
      if (tokens[i - 1] == "warmup") {
        warmup_iters_ = static_cast<int>(std::min<std::int64_t>(value, 1 << 30));
      } else if (tokens[i - 1] != "agg") {
        iters_ = static_cast<int>(std::min<std::int64_t>(value, 1 << 30));
      }
    }
  }
  for (const std::string_view token : tokens) {
    if (std::string program = program_in_token(token); !program.empty()) {
      programs_.insert(std::move(program));
    }
  }
}

void LogReader::read_row(const std::vector<std::string_view>& tokens, std::size_t number) {
  const TableHeader& h = *header_;
  if (tokens.size() != h.columns) {
    throw InputError(where(number),
                     fmt::format("malformed row: {} fields, the table header (line {}) has {}",
                                 tokens.size(), header_line_, h.columns));
  }
  Row row;
  row.line = number;
  if (!parse_int64(tokens[0], row.size) || row.size < 0) {
    throw InputError(where(number), fmt::format("malformed row: size '{}'", tokens[0]));
  }
  for (std::size_t half = 0; half < 2; ++half) {
    const char* name = half == 0 ? "out-of-place" : "in-place";
    if (!parse_double(tokens[h.time[half]], row.time_us[half]) ||
        !parse_double(tokens[h.algbw[half]], row.algbw_gb_s[half]) ||
        !parse_double(tokens[h.busbw[half]], row.busbw_gb_s[half])) {
      throw InputError(where(number), fmt::format("malformed row: {} time, algbw or busbw "
                                                  "('{}', '{}', '{}') is not a number",
                                                  name, tokens[h.time[half]], tokens[h.algbw[half]],
                                                  tokens[h.busbw[half]]));
    }
    if (h.wrong[half]) {
      const std::string_view wrong = tokens[*h.wrong[half]];
      double count = 0.0;
      if (wrong != "N/A" && (!parse_double(wrong, count) || count != 0.0)) {
        throw InputError(where(number),
                         fmt::format("{} results are wrong (#wrong = '{}'); a run that fails "
                                     "validation does not calibrate anything",
                                     name, wrong));
      }
    }
  }
  if (row.size == 0) {
    ++skipped_rows_;  // fewer elements than ranks: nccl-tests prints a row of size 0
    return;
  }
  if (!(row.time_us[0] > 0.0 && row.time_us[1] > 0.0)) {
    throw InputError(where(number), "malformed row: time must be positive");
  }
  if (!rows_.empty() && row.size <= rows_.back().size) {
    throw InputError(where(number),
                     fmt::format("size {} does not grow (previous row: {}); one run per file",
                                 row.size, rows_.back().size));
  }
  rows_.push_back(row);
}

Collective LogReader::decide_op() const {
  std::vector<std::pair<std::string, std::optional<Collective>>> named;
  for (const std::string& program : programs_) {
    named.emplace_back(program, collective_of_nccl_tests_program(program));
  }
  if (named.size() > 1) {
    std::string list;
    for (const auto& [program, op] : named) {
      list += list.empty() ? program : ", " + program;
    }
    if (option_op_) {
      for (const auto& [program, op] : named) {
        if (op == option_op_) {
          return *op;
        }
      }
    }
    throw InputError("--op", fmt::format("{} names several programs ({}); say which collective "
                                         "its table measures with --op",
                                         origin_, list));
  }
  if (named.empty()) {
    if (!option_op_) {
      throw InputError("--op",
                       fmt::format("{} does not name its nccl-tests program; give the collective "
                                   "with --op (all_to_all, all_gather, reduce_scatter, "
                                   "all_reduce, send_recv)",
                                   origin_));
    }
    return *option_op_;
  }
  const auto& [program, op] = named.front();
  if (!op) {
    throw InputError(origin_, fmt::format("{} measures a collective cpsim does not model "
                                          "(known: all_reduce_perf, all_gather_perf, "
                                          "reduce_scatter_perf, alltoall_perf, sendrecv_perf)",
                                          program));
  }
  if (option_op_ && *option_op_ != *op) {
    throw InputError("--op", fmt::format("{} but {} is a {} log", models::to_string(*option_op_),
                                         origin_, program));
  }
  return *op;
}

/// The printed bandwidths must be size / time (algbw) and algbw × the bus factor of the rank
/// count (busbw): this catches a column read from the wrong place and a rank count that is not the
/// one the test ran with.
void LogReader::check_bandwidths(std::size_t rank_count) {
  const Collective op = decide_op();
  const double factor = busbw_factor(op, static_cast<int>(rank_count));
  for (const Row& row : rows_) {
    for (std::size_t half = 0; half < 2; ++half) {
      const double algbw = static_cast<double>(row.size) / (row.time_us[half] * 1e-6) / 1e9;
      auto close = [](double printed, double computed) {
        return std::abs(printed - computed) <= 0.006 + 0.01 * computed;
      };
      if (!close(row.algbw_gb_s[half], algbw)) {
        throw InputError(where(row.line),
                         fmt::format("algbw {} GB/s is not size / time = {:.2f} GB/s",
                                     row.algbw_gb_s[half], algbw));
      }
      if (!close(row.busbw_gb_s[half], row.algbw_gb_s[half] * factor) &&
          !close(row.busbw_gb_s[half], algbw * factor)) {
        throw InputError(
            where(row.line),
            fmt::format("busbw {} GB/s is not algbw x {:.3f} (the {} factor of the {} "
                        "rank lines); the rank lines do not match the run",
                        row.busbw_gb_s[half], factor, models::to_string(op), rank_count));
      }
    }
  }
}

NcclTestsRun LogReader::finish() {
  if (!header_) {
    throw InputError(origin_, "no nccl-tests results table (a '#  size  count  type ...' header)");
  }
  if (rows_.empty()) {
    throw InputError(where(header_line_), "the results table has no rows of positive size");
  }
  if (ranks_.size() < 2) {
    throw InputError(origin_, fmt::format("{} '#  Rank N ... device' line(s) before the table; the "
                                          "rank count cannot be told (need at least 2 ranks)",
                                          ranks_.size()));
  }
  check_bandwidths(ranks_.size());
  NcclTestsRun run;
  run.source = origin_;
  run.program = programs_.size() == 1 ? *programs_.begin() : std::string();
  run.op = decide_op();
  run.ranks = static_cast<int>(ranks_.size());
  std::set<std::string> hosts;
  std::set<std::string> devices;
  for (const auto& [rank, line] : ranks_) {
    hosts.insert(line.host);
    devices.insert(line.device.empty() ? "unknown" : line.device);
  }
  run.nodes = static_cast<int>(hosts.size());
  for (const std::string& d : devices) {
    run.device += run.device.empty() ? d : " + " + d;
  }
  run.nccl_version = nccl_version_.empty() ? "unknown" : nccl_version_;
  run.warmup_iters = warmup_iters_;
  run.iters = iters_;
  run.avg_busbw_gb_s = avg_busbw_;
  run.skipped_rows = skipped_rows_;
  const double factor = busbw_factor(run.op, run.ranks);
  for (const bool in_place : {false, true}) {
    for (const Row& row : rows_) {
      const std::size_t half = in_place ? 1 : 0;
      CollectiveSample s;
      s.op = run.op;
      s.ranks = run.ranks;
      s.nodes = run.nodes;
      s.in_place = in_place;
      s.size_bytes = row.size;
      s.time_s = row.time_us[half] * 1e-6;
      s.algbw_bytes_per_s = static_cast<double>(row.size) / s.time_s;
      s.busbw_bytes_per_s = s.algbw_bytes_per_s * factor;
      run.samples.push_back(s);
    }
  }
  return run;
}

}  // namespace

std::optional<Collective> collective_of_nccl_tests_program(std::string_view program) {
  std::string name = program_in_token(program);
  for (const auto& [known, op] : kPrograms) {
    if (name == known) {
      return op;
    }
  }
  return std::nullopt;
}

NcclTestsRun parse_nccl_tests_log(const std::string& text,
                                  const std::string& origin,
                                  std::optional<Collective> op) {
  LogReader reader(origin, op);
  reader.read(text);
  return reader.finish();
}

NcclTestsRun load_nccl_tests_log(const std::filesystem::path& path, std::optional<Collective> op) {
  const std::string origin = path.string();
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxLogBytes) {
    throw InputError(origin, fmt::format("too large for an nccl-tests log ({} bytes)", size));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(origin, "cannot open for reading");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    throw InputError(origin, "read error");
  }
  return parse_nccl_tests_log(text.str(), origin, op);
}

RawCalibration raw_from_nccl_tests(const std::vector<NcclTestsRun>& runs,
                                   const std::vector<std::string>& argv,
                                   const std::string& cpsim_version) {
  RawCalibration raw;
  RawContext& c = raw.context;
  std::set<std::string> devices;
  std::set<std::string> versions;
  int iters = 0;
  int warmup = 0;
  for (const NcclTestsRun& run : runs) {
    devices.insert(run.device);
    versions.insert(run.nccl_version);
    c.gpu_count = std::max(c.gpu_count, run.ranks);
    iters = iters == 0 ? run.iters : std::min(iters, run.iters > 0 ? run.iters : iters);
    warmup = warmup == 0 ? run.warmup_iters : std::min(warmup, run.warmup_iters);
    c.notes.push_back(fmt::format(
        "imported from nccl-tests log {}: {} ({}), {} ranks on {} node(s), {} sizes x "
        "(out-of-place "
        "+ in-place){}, NCCL {}, printed avg busbw {} GB/s",
        run.source, models::to_string(run.op),
        run.program.empty() ? "program given by --op" : run.program, run.ranks, run.nodes,
        run.samples.size() / 2,
        run.skipped_rows > 0 ? fmt::format(" ({} rows of size 0 skipped)", run.skipped_rows) : "",
        run.nccl_version, run.avg_busbw_gb_s));
    raw.samples.collectives.insert(raw.samples.collectives.end(), run.samples.begin(),
                                   run.samples.end());
  }
  auto join = [](const std::set<std::string>& values) {
    std::string out;
    for (const std::string& v : values) {
      out += out.empty() ? v : " + " + v;
    }
    return out.empty() ? std::string("unknown") : out;
  };
  c.device = join(devices);
  c.nccl_version = join(versions);
  c.device_count = c.gpu_count;
  c.driver_version = "unknown";
  c.cuda_driver_version = "unknown";
  c.cuda_runtime_version = "unknown";
  c.cublaslt_version = "none";
  c.date = "unknown";
  c.cpsim_version = cpsim_version;
  c.argv = argv;
  c.method.timer = "nccl-tests";
  c.method.statistic = "mean";
  c.method.warmup = warmup;
  c.method.repetitions = std::max(1, iters);
  if (devices.size() > 1 || versions.size() > 1) {
    c.notes.push_back(fmt::format("the logs differ in device ({}) or NCCL version ({})",
                                  join(devices), join(versions)));
  }
  return raw;
}

}  // namespace cpsim::calibrate
