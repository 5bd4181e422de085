#include "cpsim/calibrate/raw.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpsim/calibrate/run_control.hpp"
#include "cpsim/models/error.hpp"
#include "cpsim/models/json_io.hpp"

namespace cpsim::calibrate {
namespace {

using Node = models::JsonNode;
using OrderedJson = nlohmann::ordered_json;

constexpr std::uintmax_t kMaxRawFileBytes = 256 * 1024 * 1024;

constexpr std::array<std::pair<models::Collective, std::string_view>, 5> kCollectiveNames = {{
    {models::Collective::kAllToAll, "all_to_all"},
    {models::Collective::kAllGather, "all_gather"},
    {models::Collective::kReduceScatter, "reduce_scatter"},
    {models::Collective::kAllReduce, "all_reduce"},
    {models::Collective::kSendRecv, "send_recv"},
}};

/// Kernel and label names: printable, no control characters, at most 200 characters.
std::string name_string(const Node& node) {
  std::string s = node.non_empty_string();
  if (s.size() > 200) {
    node.fail("must be at most 200 characters");
  }
  for (const char c : s) {
    if (static_cast<unsigned char>(c) < 0x20) {
      node.fail("must not contain control characters");
    }
  }
  return s;
}

/// Kernel names become JSON path components of the profile: letters, digits, '_' and '-'.
std::string kernel_name(const Node& node) {
  std::string s = name_string(node);
  for (const char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) {
      node.fail(fmt::format("kernel name '{}' may use only letters, digits, '_' and '-'", s));
    }
  }
  return s;
}

RawMethod parse_method(const Node& node) {
  node.expect_object({"timer", "statistic", "warmup", "repetitions", "rotation_bytes"});
  RawMethod m;
  m.timer = name_string(node.at("timer"));
  m.statistic = name_string(node.at("statistic"));
  m.warmup = node.at("warmup").small_int();
  if (m.warmup < 0) {
    node.at("warmup").fail(fmt::format("must not be negative, got {}", m.warmup));
  }
  m.repetitions = node.at("repetitions").small_int();
  if (m.repetitions < 1) {
    node.at("repetitions").fail(fmt::format("must be at least 1, got {}", m.repetitions));
  }
  m.rotation_bytes = node.at("rotation_bytes").non_negative_integer();
  return m;
}

std::vector<std::string> parse_strings(const Node& node) {
  node.expect_array();
  std::vector<std::string> out;
  out.reserve(node.size());
  for (std::size_t i = 0; i < node.size(); ++i) {
    out.push_back(node.at(i).string());
  }
  return out;
}

SweepRecord parse_sweep(const Node& node) {
  node.expect_object({"name", "status", "date", "notes"});
  SweepRecord r;
  const Node name = node.at("name");
  r.name = name.string();
  if (std::find(kSweepNames.begin(), kSweepNames.end(), r.name) == kSweepNames.end()) {
    name.fail(fmt::format("unknown sweep {}", models::describe_json(name.json())));
  }
  const Node status = node.at("status");
  r.status = status.string();
  if (r.status != "done" && r.status != "failed" && r.status != "timed_out" &&
      r.status != "skipped") {
    status.fail(fmt::format("must be \"done\", \"failed\", \"timed_out\" or \"skipped\", got {}",
                            models::describe_json(status.json())));
  }
  r.date = name_string(node.at("date"));
  r.notes = parse_strings(node.at("notes"));
  return r;
}

GpuCheck parse_check(const Node& node) {
  node.expect_object({"gpu", "source", "memory_used_bytes", "memory_total_bytes", "other_processes",
                      "sm_clock_mhz", "sm_clock_max_mhz", "throttle_reasons"});
  GpuCheck c;
  c.gpu = node.at("gpu").small_int();
  if (c.gpu < 0) {
    node.at("gpu").fail(fmt::format("must not be negative, got {}", c.gpu));
  }
  c.source = name_string(node.at("source"));
  c.memory_used_bytes = node.at("memory_used_bytes").integer();
  c.memory_total_bytes = node.at("memory_total_bytes").integer();
  c.other_processes = node.at("other_processes").small_int();
  for (const char* key : {"memory_used_bytes", "memory_total_bytes", "other_processes"}) {
    if (node.at(key).integer() < -1) {
      node.at(key).fail("must be -1 (unknown) or not negative");
    }
  }
  c.sm_clock_mhz = node.at("sm_clock_mhz").non_negative_number();
  c.sm_clock_max_mhz = node.at("sm_clock_max_mhz").non_negative_number();
  // null: the reasons could not be read; an array: the active ones (possibly none).
  const Node reasons = node.at("throttle_reasons");
  if (!reasons.json().is_null()) {
    c.throttle_reasons = parse_strings(reasons);
    c.throttle_known = true;
  }
  return c;
}

RawMpi parse_mpi(const Node& node, int gpu_count) {
  node.expect_object({"ranks", "nodes", "ranks_per_node", "hosts"});
  RawMpi m;
  m.ranks = node.at("ranks").small_int();
  m.nodes = node.at("nodes").small_int();
  m.ranks_per_node = node.at("ranks_per_node").small_int();
  for (const char* key : {"ranks", "nodes", "ranks_per_node"}) {
    if (node.at(key).small_int() < 1) {
      node.at(key).fail("must be at least 1");
    }
  }
  if (m.ranks != m.nodes * m.ranks_per_node) {
    node.at("ranks").fail(fmt::format("must be nodes x ranks_per_node ({} x {}), got {}", m.nodes,
                                      m.ranks_per_node, m.ranks));
  }
  if (m.ranks > gpu_count) {
    node.at("ranks").fail(fmt::format("more than gpu_count ({}), got {}", gpu_count, m.ranks));
  }
  m.hosts = parse_strings(node.at("hosts"));
  if (static_cast<int>(m.hosts.size()) != m.nodes) {
    node.at("hosts").fail(fmt::format("must name {} nodes, got {}", m.nodes, m.hosts.size()));
  }
  return m;
}

RawContext parse_context(const Node& node) {
  node.expect_object({"device",
                      "gpu_count",
                      "device_count",
                      "driver_version",
                      "cuda_driver_version",
                      "cuda_runtime_version",
                      "nccl_version",
                      "cublaslt_version",
                      "sm_count",
                      "hbm_capacity_bytes",
                      "l2_cache_bytes",
                      "sm_clock_max_mhz",
                      "memory_clock_max_mhz",
                      "sm_clock_measured_mhz",
                      "date",
                      "cpsim_version",
                      "argv",
                      "quick",
                      "method",
                      "notes",
                      "sweeps",
                      "checks",
                      "mpi"});
  RawContext c;
  c.device = name_string(node.at("device"));
  c.gpu_count = node.at("gpu_count").small_int();
  if (c.gpu_count < 1) {
    node.at("gpu_count").fail(fmt::format("must be at least 1, got {}", c.gpu_count));
  }
  c.device_count = node.at("device_count").small_int();
  if (c.device_count < c.gpu_count) {
    node.at("device_count")
        .fail(fmt::format("must be at least gpu_count ({}), got {}", c.gpu_count, c.device_count));
  }
  c.driver_version = name_string(node.at("driver_version"));
  c.cuda_driver_version = name_string(node.at("cuda_driver_version"));
  c.cuda_runtime_version = name_string(node.at("cuda_runtime_version"));
  c.nccl_version = name_string(node.at("nccl_version"));
  c.cublaslt_version = name_string(node.at("cublaslt_version"));
  c.sm_count = node.at("sm_count").non_negative_integer();
  c.hbm_capacity_bytes = node.at("hbm_capacity_bytes").non_negative_integer();
  c.l2_cache_bytes = node.at("l2_cache_bytes").non_negative_integer();
  c.sm_clock_max_mhz = node.at("sm_clock_max_mhz").non_negative_number();
  c.memory_clock_max_mhz = node.at("memory_clock_max_mhz").non_negative_number();
  c.sm_clock_measured_mhz = node.at("sm_clock_measured_mhz").non_negative_number();
  c.date = name_string(node.at("date"));
  c.cpsim_version = name_string(node.at("cpsim_version"));
  c.argv = parse_strings(node.at("argv"));
  c.quick = node.at("quick").boolean();
  c.method = parse_method(node.at("method"));
  c.notes = parse_strings(node.at("notes"));
  if (node.has("sweeps")) {
    const Node sweeps = node.at("sweeps");
    sweeps.expect_array();
    for (std::size_t i = 0; i < sweeps.size(); ++i) {
      c.sweeps.push_back(parse_sweep(sweeps.at(i)));
    }
  }
  if (node.has("checks")) {
    const Node checks = node.at("checks");
    checks.expect_array();
    for (std::size_t i = 0; i < checks.size(); ++i) {
      c.checks.push_back(parse_check(checks.at(i)));
    }
  }
  if (node.has("mpi")) {
    c.mpi = parse_mpi(node.at("mpi"), c.gpu_count);
  }
  return c;
}

/// Calls `parse_one` on every element of the array `key` of `samples`, if present.
template <typename T, typename F>
std::vector<T> parse_array(const Node& samples, std::string_view key, F&& parse_one) {
  std::vector<T> out;
  if (!samples.has(key)) {
    return out;
  }
  const Node array = samples.at(key);
  array.expect_array();
  out.reserve(array.size());
  for (std::size_t i = 0; i < array.size(); ++i) {
    out.push_back(parse_one(array.at(i)));
  }
  return out;
}

GemmSample parse_gemm(const Node& node) {
  node.expect_object({"m", "n", "k", "time_s", "layout"});
  GemmSample g{node.at("m").positive_integer(), node.at("n").positive_integer(),
               node.at("k").positive_integer(), node.at("time_s").positive_number()};
  if (node.has("layout")) {
    const Node layout = node.at("layout");
    const std::string text = layout.string();
    if (text == "dgrad") {
      g.layout = GemmLayout::kDgrad;
    } else if (text == "wgrad") {
      g.layout = GemmLayout::kWgrad;
    } else if (text != "fwd") {
      layout.fail(fmt::format("must be \"fwd\", \"dgrad\" or \"wgrad\", got {}",
                              models::describe_json(layout.json())));
    }
  }
  return g;
}

AttentionSample parse_attention(const Node& node) {
  node.expect_object(
      {"kernel", "pass", "causal", "head_dim", "heads", "q_len", "kv_len", "time_s"});
  AttentionSample s;
  s.kernel = kernel_name(node.at("kernel"));
  const Node pass = node.at("pass");
  const std::string pass_text = pass.string();
  if (pass_text == "fwd") {
    s.pass = AttentionPass::kForward;
  } else if (pass_text == "bwd") {
    s.pass = AttentionPass::kBackward;
  } else {
    pass.fail(
        fmt::format("must be \"fwd\" or \"bwd\", got {}", models::describe_json(pass.json())));
  }
  s.causal = node.at("causal").boolean();
  s.head_dim = node.at("head_dim").positive_integer();
  s.heads = node.at("heads").positive_integer();
  s.q_len = node.at("q_len").positive_integer();
  s.kv_len = node.at("kv_len").positive_integer();
  s.time_s = node.at("time_s").positive_number();
  return s;
}

MemorySample parse_memory(const Node& node) {
  node.expect_object({"kernel", "bytes", "time_s"});
  return MemorySample{kernel_name(node.at("kernel")), node.at("bytes").positive_integer(),
                      node.at("time_s").positive_number()};
}

CollectiveSample parse_collective(const Node& node) {
  node.expect_object({"op", "ranks", "nodes", "in_place", "size_bytes", "time_s",
                      "algbw_bytes_per_s", "busbw_bytes_per_s"});
  CollectiveSample s;
  const Node op = node.at("op");
  const std::string op_text = op.string();
  bool known = false;
  std::string list;
  for (const auto& [value, name] : kCollectiveNames) {
    list += list.empty() ? std::string(name) : fmt::format(", {}", name);
    if (op_text == name) {
      s.op = value;
      known = true;
    }
  }
  if (!known) {
    op.fail(
        fmt::format("unknown collective {}; known: {}", models::describe_json(op.json()), list));
  }
  s.ranks = node.at("ranks").small_int();
  if (s.ranks < 2) {
    node.at("ranks").fail(fmt::format("must be at least 2, got {}", s.ranks));
  }
  if (node.has("nodes")) {
    s.nodes = node.at("nodes").small_int();
    if (s.nodes < 1 || s.nodes > s.ranks) {
      node.at("nodes").fail(fmt::format("must be 1..ranks ({}), got {}", s.ranks, s.nodes));
    }
  }
  if (node.has("in_place")) {
    s.in_place = node.at("in_place").boolean();
  }
  s.size_bytes = node.at("size_bytes").positive_integer();
  s.time_s = node.at("time_s").positive_number();
  s.algbw_bytes_per_s = node.at("algbw_bytes_per_s").positive_number();
  s.busbw_bytes_per_s = node.at("busbw_bytes_per_s").positive_number();
  return s;
}

HostCopySample parse_host_copy(const Node& node) {
  node.expect_object({"direction", "gpu", "gpus", "bytes", "time_s"});
  HostCopySample s;
  const Node direction = node.at("direction");
  const std::string text = direction.string();
  if (text == "h2d") {
    s.direction = CopyDirection::kHostToDevice;
  } else if (text == "d2h") {
    s.direction = CopyDirection::kDeviceToHost;
  } else if (text == "duplex") {
    s.direction = CopyDirection::kDuplex;
  } else {
    direction.fail(fmt::format("must be \"h2d\", \"d2h\" or \"duplex\", got {}",
                               models::describe_json(direction.json())));
  }
  s.gpu = node.at("gpu").small_int();
  s.gpus = node.at("gpus").small_int();
  if (s.gpus < 1) {
    node.at("gpus").fail(fmt::format("must be at least 1, got {}", s.gpus));
  }
  if (s.gpus == 1 && s.gpu < 0) {
    node.at("gpu").fail(fmt::format("must be a device index for a single-GPU copy, got {}", s.gpu));
  }
  if (s.gpus > 1 && s.gpu != -1) {
    node.at("gpu").fail(fmt::format("must be -1 when {} GPUs copy at once, got {}", s.gpus, s.gpu));
  }
  s.bytes = node.at("bytes").positive_integer();
  s.time_s = node.at("time_s").positive_number();
  return s;
}

InterferenceSample parse_interference(const Node& node) {
  node.expect_object({"background", "foreground", "gpus", "time_alone_s", "time_concurrent_s"});
  InterferenceSample s;
  const Node background = node.at("background");
  s.background = background.string();
  if (s.background != "all_to_all" && s.background != "host_copies") {
    background.fail(fmt::format("must be \"all_to_all\" or \"host_copies\", got {}",
                                models::describe_json(background.json())));
  }
  s.foreground = name_string(node.at("foreground"));
  s.gpus = node.at("gpus").small_int();
  if (s.gpus < 1) {
    node.at("gpus").fail(fmt::format("must be at least 1, got {}", s.gpus));
  }
  s.time_alone_s = node.at("time_alone_s").positive_number();
  s.time_concurrent_s = node.at("time_concurrent_s").positive_number();
  return s;
}

LaunchSample parse_launch(const Node& node) {
  node.expect_object({"kernels", "device_time_s", "host_time_s"});
  return LaunchSample{node.at("kernels").positive_integer(),
                      node.at("device_time_s").positive_number(),
                      node.at("host_time_s").positive_number()};
}

}  // namespace

RawCalibration parse_raw(const std::string& json_text, const std::string& origin) {
  const models::Json root_json = models::parse_json(json_text, origin);
  const Node root(root_json, origin, "");
  root.expect_object({"schema", "context", "samples"});
  const Node schema = root.at("schema");
  if (const std::string s = schema.string(); s != kRawSchema) {
    schema.fail(fmt::format("unknown schema '{}'; expected \"{}\"", s, kRawSchema));
  }
  RawCalibration raw;
  raw.context = parse_context(root.at("context"));
  const Node samples = root.at("samples");
  samples.expect_object(
      {"gemm", "attention", "memory", "collectives", "host_copies", "interference", "launch"});
  raw.samples.gemm = parse_array<GemmSample>(samples, "gemm", parse_gemm);
  raw.samples.attention = parse_array<AttentionSample>(samples, "attention", parse_attention);
  raw.samples.memory = parse_array<MemorySample>(samples, "memory", parse_memory);
  raw.samples.collectives = parse_array<CollectiveSample>(samples, "collectives", parse_collective);
  raw.samples.host_copies = parse_array<HostCopySample>(samples, "host_copies", parse_host_copy);
  raw.samples.interference =
      parse_array<InterferenceSample>(samples, "interference", parse_interference);
  raw.samples.launch = parse_array<LaunchSample>(samples, "launch", parse_launch);

  // Cross-field checks that name the sample.
  for (std::size_t i = 0; i < raw.samples.collectives.size(); ++i) {
    if (raw.samples.collectives[i].ranks > raw.context.gpu_count) {
      throw InputError(fmt::format("{}:samples.collectives[{}].ranks", origin, i),
                       fmt::format("{} ranks but context.gpu_count is {}",
                                   raw.samples.collectives[i].ranks, raw.context.gpu_count));
    }
  }
  for (std::size_t i = 0; i < raw.samples.host_copies.size(); ++i) {
    const HostCopySample& s = raw.samples.host_copies[i];
    if (s.gpus > raw.context.gpu_count || s.gpu >= raw.context.device_count) {
      throw InputError(fmt::format("{}:samples.host_copies[{}].{}", origin, i,
                                   s.gpus > raw.context.gpu_count ? "gpus" : "gpu"),
                       fmt::format("outside the {} GPUs of the context", raw.context.gpu_count));
    }
  }
  return raw;
}

RawCalibration load_raw(const std::filesystem::path& path, const std::string& field) {
  return parse_raw(models::read_text_file(path, field, kMaxRawFileBytes), path.string());
}

namespace {

// The context's runs: sweeps, GPU checks, MPI layout (written only when present).
void add_context_runs(const RawContext& c, OrderedJson& context) {
  if (!c.sweeps.empty()) {
    OrderedJson& sweeps = context["sweeps"] = OrderedJson::array();
    for (const SweepRecord& r : c.sweeps) {
      sweeps.push_back(OrderedJson{
          {"name", r.name}, {"status", r.status}, {"date", r.date}, {"notes", r.notes}});
    }
  }
  if (!c.checks.empty()) {
    OrderedJson& checks = context["checks"] = OrderedJson::array();
    for (const GpuCheck& g : c.checks) {
      checks.push_back(
          OrderedJson{{"gpu", g.gpu},
                      {"source", g.source},
                      {"memory_used_bytes", g.memory_used_bytes},
                      {"memory_total_bytes", g.memory_total_bytes},
                      {"other_processes", g.other_processes},
                      {"sm_clock_mhz", g.sm_clock_mhz},
                      {"sm_clock_max_mhz", g.sm_clock_max_mhz},
                      {"throttle_reasons",
                       g.throttle_known ? OrderedJson(g.throttle_reasons) : OrderedJson(nullptr)}});
    }
  }
  if (c.mpi.ranks > 0) {
    context["mpi"] = OrderedJson{{"ranks", c.mpi.ranks},
                                 {"nodes", c.mpi.nodes},
                                 {"ranks_per_node", c.mpi.ranks_per_node},
                                 {"hosts", c.mpi.hosts}};
  }
}

OrderedJson context_json(const RawContext& c) {
  OrderedJson context;
  context["device"] = c.device;
  context["gpu_count"] = c.gpu_count;
  context["device_count"] = c.device_count;
  context["driver_version"] = c.driver_version;
  context["cuda_driver_version"] = c.cuda_driver_version;
  context["cuda_runtime_version"] = c.cuda_runtime_version;
  context["nccl_version"] = c.nccl_version;
  context["cublaslt_version"] = c.cublaslt_version;
  context["sm_count"] = c.sm_count;
  context["hbm_capacity_bytes"] = c.hbm_capacity_bytes;
  context["l2_cache_bytes"] = c.l2_cache_bytes;
  context["sm_clock_max_mhz"] = c.sm_clock_max_mhz;
  context["memory_clock_max_mhz"] = c.memory_clock_max_mhz;
  context["sm_clock_measured_mhz"] = c.sm_clock_measured_mhz;
  context["date"] = c.date;
  context["cpsim_version"] = c.cpsim_version;
  context["argv"] = c.argv;
  context["quick"] = c.quick;
  context["method"] = OrderedJson{{"timer", c.method.timer},
                                  {"statistic", c.method.statistic},
                                  {"warmup", c.method.warmup},
                                  {"repetitions", c.method.repetitions},
                                  {"rotation_bytes", c.method.rotation_bytes}};
  context["notes"] = c.notes;
  add_context_runs(c, context);
  return context;
}

// The compute samples: GEMM, attention, memory, in this order.
void add_compute_samples(const RawSamples& s, OrderedJson& samples) {
  OrderedJson& gemm = samples["gemm"] = OrderedJson::array();
  for (const GemmSample& g : s.gemm) {
    OrderedJson sample{{"m", g.m}, {"n", g.n}, {"k", g.k}, {"time_s", g.time_s}};
    if (g.layout != GemmLayout::kForward) {
      sample["layout"] = to_string(g.layout);
    }
    gemm.push_back(std::move(sample));
  }
  OrderedJson& attention = samples["attention"] = OrderedJson::array();
  for (const AttentionSample& a : s.attention) {
    attention.push_back(OrderedJson{{"kernel", a.kernel},
                                    {"pass", to_string(a.pass)},
                                    {"causal", a.causal},
                                    {"head_dim", a.head_dim},
                                    {"heads", a.heads},
                                    {"q_len", a.q_len},
                                    {"kv_len", a.kv_len},
                                    {"time_s", a.time_s}});
  }
  OrderedJson& memory = samples["memory"] = OrderedJson::array();
  for (const MemorySample& m : s.memory) {
    memory.push_back(OrderedJson{{"kernel", m.kernel}, {"bytes", m.bytes}, {"time_s", m.time_s}});
  }
}

// Collectives, host copies, interference and launches, in this order.
void add_transfer_samples(const RawSamples& s, OrderedJson& samples) {
  OrderedJson& collectives = samples["collectives"] = OrderedJson::array();
  for (const CollectiveSample& col : s.collectives) {
    OrderedJson entry{{"op", models::to_string(col.op)}, {"ranks", col.ranks}};
    if (col.nodes != 1) {
      entry["nodes"] = col.nodes;
    }
    if (col.in_place) {
      entry["in_place"] = true;
    }
    entry["size_bytes"] = col.size_bytes;
    entry["time_s"] = col.time_s;
    entry["algbw_bytes_per_s"] = col.algbw_bytes_per_s;
    entry["busbw_bytes_per_s"] = col.busbw_bytes_per_s;
    collectives.push_back(std::move(entry));
  }
  OrderedJson& copies = samples["host_copies"] = OrderedJson::array();
  for (const HostCopySample& h : s.host_copies) {
    copies.push_back(OrderedJson{{"direction", to_string(h.direction)},
                                 {"gpu", h.gpu},
                                 {"gpus", h.gpus},
                                 {"bytes", h.bytes},
                                 {"time_s", h.time_s}});
  }
  OrderedJson& interference = samples["interference"] = OrderedJson::array();
  for (const InterferenceSample& i : s.interference) {
    interference.push_back(OrderedJson{{"background", i.background},
                                       {"foreground", i.foreground},
                                       {"gpus", i.gpus},
                                       {"time_alone_s", i.time_alone_s},
                                       {"time_concurrent_s", i.time_concurrent_s}});
  }
  OrderedJson& launch = samples["launch"] = OrderedJson::array();
  for (const LaunchSample& l : s.launch) {
    launch.push_back(OrderedJson{{"kernels", l.kernels},
                                 {"device_time_s", l.device_time_s},
                                 {"host_time_s", l.host_time_s}});
  }
}

}  // namespace

std::string write_raw(const RawCalibration& raw) {
  OrderedJson samples = OrderedJson::object();
  add_compute_samples(raw.samples, samples);
  add_transfer_samples(raw.samples, samples);
  OrderedJson root;
  root["schema"] = kRawSchema;
  root["context"] = context_json(raw.context);
  root["samples"] = std::move(samples);
  return root.dump(2) + "\n";
}

}  // namespace cpsim::calibrate
