// Launcher emitters: every emitted file is read back with a real parser (Python's tomllib, json,
// yaml.safe_load, shlex and bash itself), and its keys and values are checked against the
// launchers' sources (REFERENCES.md [TorchTitan], [UPipe-code], [DeepSpeed], [Megatron-DeepSpeed],
// [Accelerate], [Megatron-LM], [ArcticTraining]). Refusals must name a launcher that can run the
// method.
#include "cpsim/planner/emit.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <spawn.h>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <tuple>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"

namespace cpsim::planner {
namespace {

using models::CheckpointMode;
using models::CpMethod;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

namespace fs = std::filesystem;

constexpr const char* kPython = CPSIM_PYTHON;  // the project venv's (tests/CMakeLists.txt)
constexpr std::int64_t kK = 1024;
constexpr std::int64_t kM = 1024 * 1024;

constexpr std::array kAllMethods = {CpMethod::kUlysses,   CpMethod::kUPipe, CpMethod::kRing,
                                    CpMethod::kAllGather, CpMethod::kFpdt,  CpMethod::kUsp};
constexpr std::array kAllFormats = {LauncherFormat::kTorchTitan,    LauncherFormat::kTorchTitan022,
                                    LauncherFormat::kTorchTitan021, LauncherFormat::kTorchTitanMain,
                                    LauncherFormat::kUntiedUlysses, LauncherFormat::kDeepSpeed,
                                    LauncherFormat::kAccelerate,    LauncherFormat::kMegatron,
                                    LauncherFormat::kArctic,        LauncherFormat::kNeMo};

const models::DataDir& data() {
  static const models::DataDir d{CPSIM_TEST_DATA_DIR};
  return d;
}

/// Built-in model, H100 profile and recipe; C = gpus / dp, ring part `ring`.
sim::ScheduleInputs inputs(CpMethod method,
                           int gpus,
                           int cp,
                           int ring,
                           std::int64_t seq,
                           const char* model = "llama3-8b",
                           const char* recipe = "alst") {
  sim::ScheduleInputs in;
  in.model = models::load_model(model, data());
  in.hardware = models::load_hardware("h100-sxm-80g", data());
  in.recipe = models::load_recipe(recipe, data());
  in.parallel.method = method;
  in.parallel.gpus = gpus;
  in.parallel.gpus_per_node = 8;
  in.parallel.cp_degree = cp;
  in.parallel.ring_degree = ring;
  in.parallel.seq_len = seq;
  return in;
}

/// A default valid layout per method on 8 GPUs (16 for usp, to have both parts).
sim::ScheduleInputs default_inputs(CpMethod m) {
  switch (m) {
    case CpMethod::kRing:
    case CpMethod::kAllGather:
      return inputs(m, 8, 8, 8, 256 * kK);
    case CpMethod::kUsp:
      return inputs(m, 16, 16, 2, 512 * kK);
    case CpMethod::kFpdt:
      return inputs(m, 8, 8, 1, 256 * kK, "llama3-8b", "deepspeed-fpdt");
    default:
      return inputs(m, 8, 8, 1, 256 * kK);
  }
}

// ---- Running the real parsers -------------------------------------------------------------------

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) {
    out += l;
    out += '\n';
  }
  return out;
}

bool have_python() {
  return ::access(kPython, X_OK) == 0;
}

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            fmt::format("cpsim_emit_test_{}_{}", ::getpid(), counter.fetch_add(1));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// Runs `python3 -c script args...` (no shell in between) and parses its stdout as JSON.
json run_python(const std::string& script, const std::string& text, const std::string& extra = "") {
  const TempDir dir;
  const fs::path input = dir.path() / "input";
  const fs::path out = dir.path() / "stdout";
  const fs::path err = dir.path() / "stderr";
  {
    std::ofstream f(input);
    f << text;
  }
  std::vector<std::string> args = {kPython, "-c", script, input.string()};
  if (!extra.empty()) {
    args.push_back(extra);
  }
  std::vector<char*> argv;
  for (auto& a : args) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int spawn_rc = posix_spawn(&pid, kPython, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawn_rc != 0) {
    ADD_FAILURE() << "cannot start " << kPython;
    return json();
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ADD_FAILURE() << "parser failed:\n" << read_file(err) << "\non input:\n" << text;
    return json();
  }
  return json::parse(read_file(out));
}

json parse_toml(const std::string& text) {
  return run_python(
      "import json, sys, tomllib\n"
      "with open(sys.argv[1], 'rb') as f:\n"
      "    print(json.dumps(tomllib.load(f)))\n",
      text);
}

/// The assignments of function `name` of a Python module, read with Python's ast (the module is
/// not imported), by target ("config.training.max_context_length"): a literal as its value,
/// anything else (a call, an enum member) as its source text; a call's keyword arguments also as
/// "<target>(<keyword>)".
json parse_function_assignments(const std::string& text, const std::string& name) {
  return run_python(
      "import ast, json, sys\n"
      "with open(sys.argv[1]) as f:\n"
      "    tree = ast.parse(f.read())\n"
      "fn = next(n for n in tree.body\n"
      "          if isinstance(n, ast.FunctionDef) and n.name == '" +
          name +
          "')\n"
          "out = {}\n"
          "for st in fn.body:\n"
          "    if isinstance(st, ast.Assign):\n"
          "        target = ast.unparse(st.targets[0])\n"
          "        try:\n"
          "            out[target] = ast.literal_eval(st.value)\n"
          "        except ValueError:\n"
          "            out[target] = ast.unparse(st.value)\n"
          "        for k in getattr(st.value, 'keywords', []):\n"
          "            try:\n"
          "                out[target + '(' + k.arg + ')'] = ast.literal_eval(k.value)\n"
          "            except ValueError:\n"
          "                out[target + '(' + k.arg + ')'] = ast.unparse(k.value)\n"
          "print(json.dumps(out))\n",
      text);
}

/// A TorchTitan main config module: its cpsim_config function's assignments.
json parse_config_function(const std::string& text) {
  return parse_function_assignments(text, "cpsim_config");
}

/// A NeMo recipe module: its cpsim_recipe function's assignments ("recipe" is the pretrain
/// recipe it starts from, "recipe(num_nodes)" its arguments, "recipe.data.seq_length" a field).
json parse_recipe_function(const std::string& text) {
  return parse_function_assignments(text, "cpsim_recipe");
}

json parse_json(const std::string& text) {
  return run_python(
      "import json, sys\n"
      "with open(sys.argv[1]) as f:\n"
      "    print(json.dumps(json.load(f)))\n",
      text);
}

json parse_yaml(const std::string& text) {
  return run_python(
      "import json, sys, yaml\n"
      "with open(sys.argv[1]) as f:\n"
      "    print(json.dumps(yaml.safe_load(f)))\n",
      text);
}

/// A shell file holding `export VAR=...` lines and one array `NAME=( ... )`: shlex tokens, the
/// array as bash itself sees it after `source`, and the exported variables.
json parse_shell(const std::string& text, const std::string& array_name) {
  return run_python(
      "import json, shlex, subprocess, sys\n"
      "path, name = sys.argv[1], sys.argv[2]\n"
      "with open(path) as f:\n"
      "    tokens = shlex.split(f.read(), comments=True)\n"
      "def bash(expr):\n"
      "    r = subprocess.run(['bash', '-c', 'set -eu; source \"$1\"; printf \"%s\\\\0\" ' + "
      "expr,\n"
      "                        '_', path], check=True, capture_output=True, text=True)\n"
      "    return r.stdout.split('\\0')[:-1]\n"
      "array = bash('\"${' + name + '[@]}\"')\n"
      "env = bash('\"${PYTORCH_CUDA_ALLOC_CONF-}\" \"${INP_PIN_MEMORY-}\"')\n"
      "print(json.dumps({'tokens': tokens, 'array': array,\n"
      "                  'env': {'PYTORCH_CUDA_ALLOC_CONF': env[0], 'INP_PIN_MEMORY': env[1]}}))\n",
      text, array_name);
}

/// Flags of an argument list: each `--flag` with the values that follow it.
using Flags = std::map<std::string, std::vector<std::string>>;
Flags flags_of(const json& words) {
  Flags f;
  std::string last;
  for (const auto& w : words) {
    const std::string s = w.get<std::string>();
    if (s.rfind("--", 0) == 0) {
      last = s;
      f[s];
    } else if (!last.empty()) {
      f[last].push_back(s);
    }
  }
  return f;
}

std::string value(const Flags& f, const std::string& flag) {
  const auto it = f.find(flag);
  if (it == f.end() || it->second.size() != 1) {
    return "<missing or not one value>";
  }
  return it->second[0];
}

/// The argument array as bash sees it, checked against the shlex tokens between `NAME=(` and `)`.
Flags shell_flags(const std::string& text, const std::string& array_name, json* env = nullptr) {
  const json parsed = parse_shell(text, array_name);
  if (parsed.is_null()) {
    return {};
  }
  const json& tokens = parsed["tokens"];
  json inner = json::array();
  bool inside = false;
  for (const auto& t : tokens) {
    const std::string s = t.get<std::string>();
    if (s == array_name + "=(") {
      inside = true;
    } else if (inside && s == ")") {
      inside = false;
    } else if (inside) {
      inner.push_back(s);
    }
  }
  EXPECT_EQ(inner, parsed["array"]) << "shlex and bash disagree";
  if (env != nullptr) {
    *env = parsed["env"];
  }
  return flags_of(parsed["array"]);
}

/// Expects emit_launcher_config to refuse with field --emit, naming `launcher` in the message.
void expect_refusal(LauncherFormat f,
                    const sim::ScheduleInputs& in,
                    const std::string& launcher,
                    const std::string& also = "") {
  try {
    (void)emit_launcher_config(f, in);
    ADD_FAILURE() << to_string(f) << " accepted " << models::to_string(in.parallel.method);
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--emit");
    EXPECT_THAT(e.what(), HasSubstr(launcher));
    if (!also.empty()) {
      EXPECT_THAT(e.what(), HasSubstr(also));
    }
  }
}

// ---- Format names -------------------------------------------------------------------------------

TEST(LauncherFormat, NamesRoundTrip) {
  for (const LauncherFormat f : kAllFormats) {
    EXPECT_EQ(parse_launcher_format(to_string(f), "--emit"), f);
  }
  EXPECT_STREQ(to_string(LauncherFormat::kUntiedUlysses), "untied-ulysses");
}

TEST(LauncherFormat, UnknownNameListsTheKnownOnes) {
  try {
    (void)parse_launcher_format("titan", "--emit");
    FAIL() << "accepted an unknown format";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--emit");
    EXPECT_THAT(e.what(), HasSubstr("titan"));
    for (const LauncherFormat f : kAllFormats) {
      EXPECT_THAT(e.what(), HasSubstr(to_string(f)));
    }
  }
  EXPECT_THROW((void)parse_launcher_format("", "--emit"), InputError);
  EXPECT_THROW((void)parse_launcher_format("TorchTitan", "--emit"), InputError);
}

// ---- TorchTitan ---------------------------------------------------------------------------------

class EmitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_python()) {
      GTEST_SKIP() << kPython << " is missing";
    }
  }
};

TEST_F(EmitTest, TorchTitanRing) {
  const EmittedConfig e =
      emit_launcher_config(LauncherFormat::kTorchTitan021, default_inputs(CpMethod::kRing));
  EXPECT_EQ(e.suggested_filename, "cpsim_torchtitan-0.2.1.toml");
  EXPECT_THAT(e.text, StartsWith("# generated by cpsim"));
  const json t = parse_toml(e.text);
  EXPECT_EQ(t["training"]["seq_len"], 256 * kK);
  EXPECT_EQ(t["training"]["local_batch_size"], 1);
  EXPECT_EQ(t["training"]["mixed_precision_param"], "bfloat16");
  EXPECT_EQ(t["training"]["mixed_precision_reduce"], "float32");
  EXPECT_FALSE(t["training"].contains("enable_cpu_offload"));
  EXPECT_EQ(t["parallelism"]["data_parallel_shard_degree"], -1);
  EXPECT_EQ(t["parallelism"]["context_parallel_degree"], 8);
  EXPECT_EQ(t["parallelism"]["context_parallel_rotate_method"], "alltoall");
  // v0.2.1 has no balancer key (it balances head and tail itself); the key is new in v0.2.2.
  EXPECT_FALSE(t["parallelism"].contains("context_parallel_load_balancer"));
  EXPECT_FALSE(t["parallelism"].contains("fsdp_reshard_after_forward"));  // ZeRO-3
  EXPECT_EQ(t["activation_checkpoint"]["mode"], "full");
  EXPECT_EQ(t["model"]["name"], "llama3");
  EXPECT_EQ(t["model"]["flavor"], "8B");
  // What the TOML cannot hold is said, in notes and in comments.
  const std::string notes = joined(e.notes);
  EXPECT_THAT(notes, HasSubstr("tiled MLP"));
  EXPECT_THAT(notes, HasSubstr("checkpoint offload"));
  EXPECT_THAT(notes, HasSubstr("fused linear cross-entropy"));
  EXPECT_THAT(e.text, HasSubstr("# note: tiled MLP"));
  EXPECT_THAT(e.text, HasSubstr("expandable_segments:True"));
}

// Pipeline stages in TorchTitan's keys (distributed/pipeline_parallel.py @73a0e69 splits
// L + first_less + last_less blocks evenly over the stages, the first and last giving up theirs):
// 32 blocks as 7/9/9/7 over 4 stages are 36 = 4 x 9 with 2 blocks off each end; an even split
// interleaved sets both to 0 and the blocks per virtual stage 32/(2·4) = 4. What the split cannot
// produce is refused, naming Megatron-LM.
TEST_F(EmitTest, TorchTitanPipelineStages) {
  sim::ScheduleInputs in = inputs(CpMethod::kRing, 16, 4, 4, 64 * kK);
  in.parallel.pp_degree = 4;
  in.parallel.micro_batches = 8;
  in.parallel.pp_first_stage_layers = 7;
  in.parallel.pp_last_stage_layers = 7;
  json t = parse_toml(emit_launcher_config(LauncherFormat::kTorchTitan021, in).text);
  EXPECT_EQ(t["parallelism"]["pipeline_parallel_degree"], 4);
  EXPECT_EQ(t["parallelism"]["pipeline_parallel_schedule"], "1F1B");
  EXPECT_EQ(t["parallelism"]["pipeline_parallel_first_stage_less_layers"], 2);
  EXPECT_EQ(t["parallelism"]["pipeline_parallel_last_stage_less_layers"], 2);
  EXPECT_FALSE(t["parallelism"].contains("pipeline_parallel_layers_per_stage"));
  EXPECT_EQ(t["training"]["local_batch_size"], 8);  // the pipeline's micro-batches
  sim::ScheduleInputs even = in;
  even.parallel.pp_degree = 2;
  even.parallel.cp_degree = 8;
  even.parallel.ring_degree = 8;
  even.parallel.pp_first_stage_layers = 0;
  even.parallel.pp_last_stage_layers = 0;
  even.parallel.pp_schedule = models::PipelineSchedule::kInterleaved;
  even.parallel.virtual_stages = 4;
  t = parse_toml(emit_launcher_config(LauncherFormat::kTorchTitan021, even).text);
  EXPECT_EQ(t["parallelism"]["pipeline_parallel_schedule"], "Interleaved1F1B");
  EXPECT_EQ(t["parallelism"]["pipeline_parallel_first_stage_less_layers"], 0);
  EXPECT_EQ(t["parallelism"]["pipeline_parallel_last_stage_less_layers"], 0);
  EXPECT_EQ(t["parallelism"]["pipeline_parallel_layers_per_stage"], 4);
  sim::ScheduleInputs heavy_ends = in;  // 10/6/6/10: more blocks on the ends than the middle
  heavy_ends.parallel.pp_first_stage_layers = 10;
  heavy_ends.parallel.pp_last_stage_layers = 10;
  expect_refusal(LauncherFormat::kTorchTitan021, heavy_ends, "megatron");
  sim::ScheduleInputs uneven_interleaved = in;  // 8/8/8/8 given as uneven, V = 2
  uneven_interleaved.parallel.pp_first_stage_layers = 6;
  uneven_interleaved.parallel.pp_last_stage_layers = 6;
  uneven_interleaved.parallel.pp_schedule = models::PipelineSchedule::kInterleaved;
  uneven_interleaved.parallel.virtual_stages = 2;
  expect_refusal(LauncherFormat::kTorchTitanMain, uneven_interleaved, "megatron");
  // Launchers without pipeline keys refuse it, naming those with them.
  expect_refusal(LauncherFormat::kAccelerate, in, "megatron", "pipeline parallelism");
}

// TorchTitan main: a config function from the llama3_8b baseline setting what cpsim simulated
// (hand-checked against torchtitan/config/configs.py @ b5bcd76).
TEST_F(EmitTest, TorchTitanMainAllGatherConfigFunction) {
  sim::ScheduleInputs in = inputs(CpMethod::kAllGather, 16, 4, 4, 128 * kK);
  in.parallel.tp_degree = 2;
  in.parallel.micro_batches = 2;
  in.parallel.ring_layout = models::RingLayout::kContiguous;
  in.recipe.checkpointing = CheckpointMode::kNone;
  const EmittedConfig e = emit_launcher_config(LauncherFormat::kTorchTitanMain, in,
                                               {.main_path = "runs/long_ctx.py", .dataset = ""});
  EXPECT_EQ(e.suggested_filename, "cpsim_torchtitan_main.py");
  EXPECT_THAT(e.text, HasSubstr("NGPU=16 MODULE=long_ctx CONFIG=cpsim_config ./run_train.sh"));
  EXPECT_THAT(e.text, HasSubstr("from torchtitan.models.llama3.config_registry import llama3_8b"));
  const json c = parse_config_function(e.text);
  EXPECT_EQ(c["config"], "llama3_8b()");
  EXPECT_EQ(c["config.training.max_context_length"], 128 * kK);
  EXPECT_EQ(c["config.training.num_tokens_per_microbatch_per_dp_rank"], 128 * kK);
  // 2 micro-batches x dp 16 / (tp 2 x cp 4) = 2 x 2 sequences of 128K.
  EXPECT_EQ(c["config.training.num_tokens_per_train_step"], 4 * 128 * kK);
  EXPECT_EQ(c["config.parallelism.tensor_parallel_degree"], 2);
  EXPECT_EQ(c["config.parallelism.context_parallel_degree"], 4);
  EXPECT_EQ(c["config.parallelism.data_parallel_shard_degree"], -1);
  EXPECT_TRUE(c["config.parallelism.context_parallel_load_balancer"].is_null());
  EXPECT_TRUE(c["config.activation_checkpoint"].is_null());
  // Ring has no rotate key on main: refused, naming the launchers that run it.
  try {
    (void)emit_launcher_config(LauncherFormat::kTorchTitanMain, default_inputs(CpMethod::kRing));
    FAIL() << "torchtitan-main emitted ring";
  } catch (const InputError& err) {
    EXPECT_THAT(err.what(), HasSubstr("FlexAttention"));
  }
  // Qwen3-8B has no baseline function at b5bcd76.
  EXPECT_THROW(
      (void)emit_launcher_config(LauncherFormat::kTorchTitanMain,
                                 inputs(CpMethod::kAllGather, 8, 8, 8, 128 * kK, "qwen3-8b")),
      InputError);
}

TEST_F(EmitTest, TorchTitanAllGatherContiguousSelectiveOffload) {
  sim::ScheduleInputs in = inputs(CpMethod::kAllGather, 16, 8, 8, 128 * kK, "qwen3-8b");
  in.parallel.ring_layout = models::RingLayout::kContiguous;
  in.recipe.checkpointing = CheckpointMode::kSelective;
  in.recipe.optimizer_offload = true;
  in.recipe.zero_stage = 2;
  const EmittedConfig e = emit_launcher_config(LauncherFormat::kTorchTitan021, in);
  const json t = parse_toml(e.text);
  EXPECT_EQ(t["parallelism"]["context_parallel_degree"], 8);
  EXPECT_EQ(t["parallelism"]["context_parallel_rotate_method"], "allgather");
  EXPECT_FALSE(t["parallelism"].contains("context_parallel_load_balancer"));
  EXPECT_EQ(t["parallelism"]["fsdp_reshard_after_forward"], "never");
  EXPECT_EQ(t["activation_checkpoint"]["mode"], "selective");
  EXPECT_EQ(t["training"]["enable_cpu_offload"], true);
  // TorchTitan v0.2.x's qwen3 model (torchtitan/models/qwen3/__init__.py) has this flavor.
  EXPECT_EQ(t["model"]["name"], "qwen3");
  EXPECT_EQ(t["model"]["flavor"], "8B");
  const std::string notes = joined(e.notes);
  EXPECT_THAT(notes, HasSubstr("parameters, gradients and optimizer states"));
  EXPECT_THAT(notes, HasSubstr("contiguous"));
  EXPECT_THAT(notes, Not(HasSubstr("flavor")));
}

// Every built-in model has its TorchTitan v0.2.x flavor (name and flavor as upstream spells them);
// a shape that differs in one field (the embeddings untied) has none and says so.
TEST_F(EmitTest, TorchTitanModelFlavorForEveryBuiltInModel) {
  const std::vector<std::tuple<std::string, std::string, std::string>> expected = {
      {"llama3-8b", "llama3", "8B"}, {"llama3-70b", "llama3", "70B"},
      {"qwen3-4b", "qwen3", "4B"},   {"qwen3-8b", "qwen3", "8B"},
      {"qwen3-14b", "qwen3", "14B"}, {"qwen3-32b", "qwen3", "32B"}};
  for (const auto& [model, name, flavor] : expected) {
    const sim::ScheduleInputs in = inputs(CpMethod::kRing, 8, 8, 8, 128 * kK, model.c_str());
    const json t = parse_toml(emit_launcher_config(LauncherFormat::kTorchTitan021, in).text);
    EXPECT_EQ(t["model"]["name"], name) << model;
    EXPECT_EQ(t["model"]["flavor"], flavor) << model;
  }
  // A shape no flavor matches is refused: a TOML without [model] trains TorchTitan's default
  // (debug) model.
  sim::ScheduleInputs untied = inputs(CpMethod::kRing, 8, 8, 8, 128 * kK, "qwen3-4b");
  untied.model.tied_embeddings = false;
  try {
    (void)emit_launcher_config(LauncherFormat::kTorchTitan021, untied);
    ADD_FAILURE() << "a TOML without [model] was written";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--model");
    EXPECT_THAT(e.what(), HasSubstr("no TorchTitan llama3 or qwen3 flavor matches"));
  }
}

// TorchTitan v0.2.2's training ignores context_parallel_rotate_method (validate.py alone reads
// it), so its TOML cannot run the ring; 0.3.0 and main run CP only as FlexAttention's all-gather.
TEST_F(EmitTest, TorchTitanRingOnlyWhereTrainingReadsTheRotateMethod) {
  for (const LauncherFormat f : {LauncherFormat::kTorchTitan, LauncherFormat::kTorchTitan022,
                                 LauncherFormat::kTorchTitanMain}) {
    SCOPED_TRACE(to_string(f));
    expect_refusal(f, default_inputs(CpMethod::kRing), "torchtitan-0.2.1");
    const EmittedConfig e = emit_launcher_config(f, default_inputs(CpMethod::kAllGather));
    EXPECT_THAT(e.text, HasSubstr(fmt::format("# written for {}", launcher_target(f))));
  }
  const json t = parse_toml(
      emit_launcher_config(LauncherFormat::kTorchTitan022, default_inputs(CpMethod::kAllGather))
          .text);
  EXPECT_EQ(t["parallelism"]["context_parallel_load_balancer"], "headtail");
}

// TorchTitan 0.3.0 refuses a training length past the model registry's RoPE maximum
// (update_from_config, "exceeds attention RoPE maximum"): the file raises it in every block, and
// the RoPE tables it then holds are in the recipe as run.
TEST_F(EmitTest, TorchTitanRaisesTheRopeMaximumPastTheRegistry) {
  const sim::ScheduleInputs longer = inputs(CpMethod::kAllGather, 8, 8, 8, 512 * kK);
  const std::string text = emit_launcher_config(LauncherFormat::kTorchTitan, longer).text;
  EXPECT_THAT(text, HasSubstr("config.training.seq_len = 524288"));
  EXPECT_THAT(text, HasSubstr("dataclasses.replace(layer.attention.rope, max_seq_len=524288)"));
  const std::string main = emit_launcher_config(LauncherFormat::kTorchTitanMain, longer).text;
  EXPECT_THAT(main, HasSubstr("max_context_length=524288"));
  const sim::ScheduleInputs shorter = inputs(CpMethod::kAllGather, 8, 8, 8, 128 * kK);
  EXPECT_THAT(emit_launcher_config(LauncherFormat::kTorchTitan, shorter).text,
              Not(HasSubstr("dataclasses")));
  // Llama's complex64 [S, d/2] table, once per block: 4 bytes per position and head dim.
  const RecipeAsRun r = recipe_as_run(LauncherFormat::kTorchTitan, longer);
  EXPECT_EQ(r.recipe.rope_cache_bytes_per_head_dim, 4);
  EXPECT_TRUE(r.recipe.rope_cache_per_layer);
  sim::ScheduleInputs as_run = longer;
  as_run.recipe = r.recipe;
  EXPECT_EQ(sim::model_states(as_run).gpu_bytes - sim::model_states(longer).gpu_bytes,
            std::int64_t{4} * 128 * 512 * kK * 32);
}

TEST_F(EmitTest, TorchTitanRefusesUlyssesFamilyNamingOtherLaunchers) {
  expect_refusal(LauncherFormat::kTorchTitan021, default_inputs(CpMethod::kUlysses), "deepspeed",
                 "TorchTitan 0.2.1 cannot run ulysses");
  expect_refusal(LauncherFormat::kTorchTitan021, default_inputs(CpMethod::kUPipe), "untied-ulysses",
                 "TorchTitan 0.2.1 cannot run upipe");
  expect_refusal(LauncherFormat::kTorchTitan021, default_inputs(CpMethod::kUsp), "untied-ulysses",
                 "TorchTitan 0.2.1 cannot run usp");
  expect_refusal(LauncherFormat::kTorchTitan021, default_inputs(CpMethod::kFpdt), "no launcher",
                 "TorchTitan 0.2.1 cannot run fpdt");
}

TEST_F(EmitTest, TorchTitanNeedsSeqDivisibleByTwiceCp) {
  sim::ScheduleInputs in = inputs(CpMethod::kRing, 8, 8, 8, 8 * 32769);  // divisible by 8, not 16
  in.parallel.ring_layout = models::RingLayout::kContiguous;
  expect_refusal(LauncherFormat::kTorchTitan021, in, "2 x CP = 16");
}

// ---- UPipe reference code (Untied-Ulysses fork) -------------------------------------------------

TEST_F(EmitTest, UntiedUlyssesUPipe) {
  const EmittedConfig e =
      emit_launcher_config(LauncherFormat::kUntiedUlysses, default_inputs(CpMethod::kUPipe));
  EXPECT_EQ(e.suggested_filename, "cpsim_untied-ulysses.sh");
  EXPECT_THAT(e.text, StartsWith("# generated by cpsim"));
  json env;
  const Flags f = shell_flags(e.text, "UNTIED_ULYSSES_ARGS", &env);
  EXPECT_EQ(value(f, "--parallelism.context_parallel_ulysses_degree"), "8");
  EXPECT_EQ(value(f, "--parallelism.context_parallel_degree"), "1");
  EXPECT_EQ(value(f, "--model.attn_impl"), "upipe_fa3_offload_tiled_mlp");
  EXPECT_EQ(value(f, "--model.ring_comm_heads"), "gqa_kv");
  EXPECT_EQ(value(f, "--model.flavor"), "8B");
  EXPECT_EQ(value(f, "--activation_checkpoint.mode"), "full");
  EXPECT_EQ(value(f, "--training.seq_len"), "262144");
  EXPECT_EQ(value(f, "--training.batch_size"), "1");
  EXPECT_EQ(f.count("--training.enable_cpu_offload"), 0U);
  EXPECT_EQ(f.count("--parallelism.context_parallel_rotate_method"), 0U);
  EXPECT_EQ(env["PYTORCH_CUDA_ALLOC_CONF"], "expandable_segments:True");
  EXPECT_EQ(env["INP_PIN_MEMORY"], "");  // only above 4M tokens
}

TEST_F(EmitTest, UntiedUlyssesLongSequenceTurnsInputPinningOff) {
  sim::ScheduleInputs in = inputs(CpMethod::kUPipe, 8, 8, 1, 8 * kM);
  in.recipe.attention_kernel = "fa2";
  in.recipe.tiled_mlp = false;
  in.recipe.tiled_norm = false;
  in.recipe.checkpoint_offload = false;
  in.recipe.optimizer_offload = true;
  json env;
  const Flags f = shell_flags(emit_launcher_config(LauncherFormat::kUntiedUlysses, in).text,
                              "UNTIED_ULYSSES_ARGS", &env);
  EXPECT_EQ(value(f, "--model.attn_impl"), "upipe_fa2");
  EXPECT_EQ(value(f, "--training.seq_len"), "8388608");
  EXPECT_EQ(f.count("--training.enable_cpu_offload"), 1U);
  EXPECT_EQ(env["INP_PIN_MEMORY"], "False");
}

TEST_F(EmitTest, UntiedUlyssesUspUlyssesAndRing) {
  {
    const Flags f = shell_flags(
        emit_launcher_config(LauncherFormat::kUntiedUlysses, default_inputs(CpMethod::kUsp)).text,
        "UNTIED_ULYSSES_ARGS");
    EXPECT_EQ(value(f, "--parallelism.context_parallel_ulysses_degree"), "8");
    EXPECT_EQ(value(f, "--parallelism.context_parallel_degree"), "2");
    EXPECT_EQ(value(f, "--model.attn_impl"), "usp_fa3_offload_tiled_mlp");
    EXPECT_EQ(value(f, "--model.flavor"), "8B");
  }
  {
    // Qwen3-32B runs as the fork's llama3 "32B" flavor (its shape as a Llama block).
    const EmittedConfig e = emit_launcher_config(
        LauncherFormat::kUntiedUlysses, inputs(CpMethod::kUsp, 16, 16, 2, 512 * kK, "qwen3-32b"));
    const Flags f = shell_flags(e.text, "UNTIED_ULYSSES_ARGS");
    EXPECT_EQ(value(f, "--model.name"), "llama3");
    EXPECT_EQ(value(f, "--model.flavor"), "32B");
    EXPECT_THAT(joined(e.notes), HasSubstr("q/k RMSNorm"));
  }
  {
    const Flags f = shell_flags(
        emit_launcher_config(LauncherFormat::kUntiedUlysses, default_inputs(CpMethod::kUlysses))
            .text,
        "UNTIED_ULYSSES_ARGS");
    EXPECT_EQ(value(f, "--parallelism.context_parallel_ulysses_degree"), "8");
    EXPECT_EQ(value(f, "--parallelism.context_parallel_degree"), "1");
    EXPECT_EQ(value(f, "--model.attn_impl"), "usp_fa3_offload_tiled_mlp");
  }
  {
    const Flags f = shell_flags(
        emit_launcher_config(LauncherFormat::kUntiedUlysses, default_inputs(CpMethod::kRing)).text,
        "UNTIED_ULYSSES_ARGS");
    EXPECT_EQ(value(f, "--parallelism.context_parallel_ulysses_degree"), "1");
    EXPECT_EQ(value(f, "--parallelism.context_parallel_degree"), "8");
    EXPECT_EQ(value(f, "--model.attn_impl"), "usp_fa3_offload_tiled_mlp");
  }
  {
    sim::ScheduleInputs in = default_inputs(CpMethod::kRing);
    in.recipe.attention_kernel = "sdpa";
    in.recipe.checkpointing = CheckpointMode::kNone;
    const Flags f = shell_flags(emit_launcher_config(LauncherFormat::kUntiedUlysses, in).text,
                                "UNTIED_ULYSSES_ARGS");
    EXPECT_EQ(value(f, "--model.attn_impl"), "torch_ring_alltoall_tiled_mlp");
    EXPECT_EQ(value(f, "--parallelism.context_parallel_rotate_method"), "alltoall");
    EXPECT_EQ(value(f, "--activation_checkpoint.mode"), "none");
  }
}

TEST_F(EmitTest, UntiedUlyssesStageSizeIsTheUlyssesDegree) {
  sim::ScheduleInputs in = default_inputs(CpMethod::kUPipe);
  in.parallel.heads_per_stage = 8;  // == Ulysses degree: fine
  EXPECT_NO_THROW((void)emit_launcher_config(LauncherFormat::kUntiedUlysses, in));
  in.parallel.heads_per_stage = 16;
  // The fork's UPipe op (the recipe's default implementation) refuses it first ...
  try {
    (void)emit_launcher_config(LauncherFormat::kUntiedUlysses, in);
    FAIL() << "accepted U = 16 with Ulysses degree 8";
  } catch (const sim::ConfigError& e) {
    EXPECT_EQ(e.quantity(), sim::Quantity::kHeadsPerStage);
    EXPECT_THAT(e.what(), HasSubstr("Ulysses degree 8"));
  }
  // ... and the launcher's emitter when the method's scheme alone is simulated.
  in.parallel.implementation = "none";
  try {
    (void)emit_launcher_config(LauncherFormat::kUntiedUlysses, in);
    FAIL() << "accepted U = 16 with Ulysses degree 8";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--emit");
    EXPECT_THAT(e.what(), HasSubstr("--heads-per-stage 16"));
    EXPECT_THAT(e.what(), HasSubstr("Ulysses degree"));
  }
}

TEST_F(EmitTest, UntiedUlyssesRefusesAllGatherAndFpdt) {
  expect_refusal(LauncherFormat::kUntiedUlysses, default_inputs(CpMethod::kAllGather),
                 "torchtitan");
  expect_refusal(LauncherFormat::kUntiedUlysses, default_inputs(CpMethod::kFpdt), "no launcher");
}

// ---- DeepSpeed ----------------------------------------------------------------------------------

TEST_F(EmitTest, DeepSpeedUlysses) {
  const EmittedConfig e =
      emit_launcher_config(LauncherFormat::kDeepSpeed, default_inputs(CpMethod::kUlysses));
  EXPECT_EQ(e.suggested_filename, "cpsim_deepspeed.json");
  ASSERT_FALSE(e.notes.empty());
  EXPECT_THAT(e.notes[0], StartsWith("generated by cpsim"));
  const json j = parse_json(e.text);
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"], 1);
  EXPECT_EQ(j["bf16"]["enabled"], true);
  EXPECT_EQ(j["zero_optimization"]["stage"], 3);
  EXPECT_FALSE(j["zero_optimization"].contains("offload_optimizer"));
  EXPECT_EQ(j["sequence_parallel_size"], 8);
  EXPECT_EQ(j["seq_parallel_communication_data_type"], "bf16");
  EXPECT_EQ(j["activation_checkpointing"]["cpu_checkpointing"], true);
  for (const auto& n : e.notes) {
    EXPECT_THAT(n, ::testing::Not(StartsWith("Megatron-DeepSpeed flags: ")));
  }
}

TEST_F(EmitTest, DeepSpeedOffloadAndFp32Communication) {
  sim::ScheduleInputs in = default_inputs(CpMethod::kUlysses);
  in.recipe.optimizer_offload = true;
  in.recipe.cp_comm_bytes = 4;
  in.recipe.checkpoint_offload = false;
  const json j = parse_json(emit_launcher_config(LauncherFormat::kDeepSpeed, in).text);
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  EXPECT_EQ(j["seq_parallel_communication_data_type"], "fp32");
  EXPECT_EQ(j["activation_checkpointing"]["cpu_checkpointing"], false);

  in.recipe.zero_stage = 0;  // no ZeRO, no optimizer offload
  expect_refusal(LauncherFormat::kDeepSpeed, in, "--zero");
}

// Megatron-DeepSpeed's FPDT layers add a qkv bias and a plain GELU MLP (deepspeed 0.19.8
// fpdt_layer.py:208, :1196-1197; tests/launchers/deepspeed_launcher.py runs them): the file it
// wrote for a bias-free SwiGLU model crashed at its first forward. No launcher runs FPDT now.
TEST_F(EmitTest, DeepSpeedRefusesFpdtItCannotTrain) {
  expect_refusal(LauncherFormat::kDeepSpeed, default_inputs(CpMethod::kFpdt),
                 "FPDT layers add biases and a plain GELU MLP");
}

TEST_F(EmitTest, DeepSpeedRefusesRingFamily) {
  expect_refusal(LauncherFormat::kDeepSpeed, default_inputs(CpMethod::kRing), "megatron");
  expect_refusal(LauncherFormat::kDeepSpeed, default_inputs(CpMethod::kAllGather), "torchtitan");
  expect_refusal(LauncherFormat::kDeepSpeed, default_inputs(CpMethod::kUsp), "untied-ulysses");
  expect_refusal(LauncherFormat::kDeepSpeed, default_inputs(CpMethod::kUPipe), "untied-ulysses");
}

// ---- HF Accelerate ------------------------------------------------------------------------------

TEST_F(EmitTest, AccelerateUlysses) {
  const EmittedConfig e = emit_launcher_config(LauncherFormat::kAccelerate,
                                               inputs(CpMethod::kUlysses, 16, 8, 1, 256 * kK));
  EXPECT_EQ(e.suggested_filename, "cpsim_accelerate.yaml");
  EXPECT_THAT(e.text, StartsWith("# generated by cpsim"));
  const json y = parse_yaml(e.text);
  EXPECT_EQ(y["distributed_type"], "DEEPSPEED");
  // The DeepSpeed keys are in the JSON that deepspeed_config_file names, as Accelerate's ALST
  // example has them; Accelerate refuses zero_stage, offload and mixed_precision beside it.
  ASSERT_EQ(e.companions.size(), 2U);
  EXPECT_EQ(e.companions[0].path, "cpsim_accelerate.ds_config.json");
  // Hugging Face checkpointing and Liger's fused loss in the trainer's arguments, which the
  // recipe as run keeps (they are not accelerate keys).
  EXPECT_EQ(e.companions[1].path, "cpsim_accelerate.training_args.json");
  const json trainer = json::parse(e.companions[1].text);
  EXPECT_EQ(trainer["gradient_checkpointing"], true);
  EXPECT_EQ(trainer["use_liger_kernel"], true);
  EXPECT_EQ(trainer["per_device_train_batch_size"], 1);
  EXPECT_EQ(y["deepspeed_config"]["deepspeed_config_file"], "cpsim_accelerate.ds_config.json");
  for (const char* key :
       {"zero_stage", "offload_optimizer_device", "seq_parallel_communication_data_type"}) {
    EXPECT_FALSE(y["deepspeed_config"].contains(key)) << key;
  }
  EXPECT_FALSE(y.contains("mixed_precision"));
  const json ds = json::parse(e.companions[0].text);
  EXPECT_EQ(ds["zero_optimization"]["stage"], 3);
  EXPECT_FALSE(ds["zero_optimization"].contains("offload_optimizer"));
  EXPECT_EQ(ds["seq_parallel_communication_data_type"], "bf16");
  EXPECT_EQ(ds["bf16"]["enabled"], true);
  EXPECT_EQ(ds["train_micro_batch_size_per_gpu"], "auto");
  EXPECT_EQ(y["num_processes"], 16);
  EXPECT_EQ(y["num_machines"], 2);
  const json& pc = y["parallelism_config"];
  EXPECT_EQ(pc["parallelism_config_sp_size"], 8);
  EXPECT_EQ(pc["parallelism_config_sp_backend"], "deepspeed");
  EXPECT_EQ(pc["parallelism_config_dp_shard_size"], 2);
  EXPECT_EQ(pc["parallelism_config_sp_seq_length_is_variable"], true);
  EXPECT_EQ(pc["parallelism_config_sp_attn_implementation"], "flash_attention_3");
  EXPECT_FALSE(pc.contains("parallelism_config_cp_size"));
  const std::string notes = joined(e.notes);
  EXPECT_THAT(notes, HasSubstr("tiled MLP is not available"));
  EXPECT_THAT(notes, HasSubstr("checkpoint offload to host is not available"));

  sim::ScheduleInputs in = default_inputs(CpMethod::kUlysses);
  in.recipe.optimizer_offload = true;
  in.recipe.attention_kernel = "sdpa";
  const EmittedConfig offload = emit_launcher_config(LauncherFormat::kAccelerate, in,
                                                     {.main_path = "run/acc.yaml", .dataset = ""});
  const json z = parse_yaml(offload.text);
  EXPECT_EQ(z["deepspeed_config"]["deepspeed_config_file"], "run/acc.ds_config.json");
  ASSERT_EQ(offload.companions.size(), 2U);
  EXPECT_EQ(offload.companions[0].path, "run/acc.ds_config.json");
  EXPECT_EQ(offload.companions[1].path, "run/acc.training_args.json");
  EXPECT_EQ(
      json::parse(offload.companions[0].text)["zero_optimization"]["offload_optimizer"]["device"],
      "cpu");
  EXPECT_EQ(z["parallelism_config"]["parallelism_config_sp_attn_implementation"], "sdpa");
}

TEST_F(EmitTest, AccelerateTorchCp) {
  const json ring = parse_yaml(
      emit_launcher_config(LauncherFormat::kAccelerate, default_inputs(CpMethod::kRing)).text);
  EXPECT_EQ(ring["distributed_type"], "FSDP");
  EXPECT_EQ(ring["fsdp_config"]["fsdp_version"], 2);
  EXPECT_EQ(ring["fsdp_config"]["fsdp_activation_checkpointing"], true);
  EXPECT_EQ(ring["fsdp_config"]["fsdp_reshard_after_forward"], true);
  EXPECT_EQ(ring["fsdp_config"]["fsdp_offload_params"], false);
  EXPECT_EQ(ring["parallelism_config"]["parallelism_config_cp_size"], 8);
  EXPECT_EQ(ring["parallelism_config"]["parallelism_config_dp_shard_size"], 1);
  EXPECT_EQ(ring["parallelism_config"]["parallelism_config_cp_comm_strategy"], "alltoall");
  EXPECT_FALSE(ring["parallelism_config"].contains("parallelism_config_sp_size"));
  EXPECT_FALSE(ring.contains("deepspeed_config"));

  const EmittedConfig ag =
      emit_launcher_config(LauncherFormat::kAccelerate, default_inputs(CpMethod::kAllGather));
  const json a = parse_yaml(ag.text);
  EXPECT_EQ(a["parallelism_config"]["parallelism_config_cp_comm_strategy"], "allgather");
  EXPECT_THAT(joined(ag.notes), HasSubstr("SDPA only"));
}

TEST_F(EmitTest, AccelerateRefusals) {
  expect_refusal(LauncherFormat::kAccelerate, default_inputs(CpMethod::kUPipe), "untied-ulysses");
  expect_refusal(LauncherFormat::kAccelerate, default_inputs(CpMethod::kFpdt), "no launcher");
  expect_refusal(LauncherFormat::kAccelerate, default_inputs(CpMethod::kUsp), "megatron");
}

// ---- Megatron-LM --------------------------------------------------------------------------------

TEST_F(EmitTest, MegatronRing) {
  const EmittedConfig e =
      emit_launcher_config(LauncherFormat::kMegatron, default_inputs(CpMethod::kRing));
  EXPECT_EQ(e.suggested_filename, "cpsim_megatron.sh");
  EXPECT_THAT(e.text, StartsWith("# generated by cpsim"));
  json env;
  const Flags f = shell_flags(e.text, "MEGATRON_ARGS", &env);
  EXPECT_EQ(env["PYTORCH_CUDA_ALLOC_CONF"], "expandable_segments:True");
  EXPECT_EQ(value(f, "--num-layers"), "32");
  EXPECT_EQ(value(f, "--hidden-size"), "4096");
  EXPECT_EQ(value(f, "--ffn-hidden-size"), "14336");
  EXPECT_EQ(value(f, "--num-attention-heads"), "32");
  EXPECT_EQ(f.count("--group-query-attention"), 1U);
  EXPECT_EQ(value(f, "--num-query-groups"), "8");
  EXPECT_EQ(value(f, "--kv-channels"), "128");
  EXPECT_EQ(value(f, "--seq-length"), "262144");
  EXPECT_EQ(value(f, "--max-position-embeddings"), "262144");  // raised to the sequence
  EXPECT_EQ(value(f, "--position-embedding-type"), "rope");
  EXPECT_EQ(value(f, "--rotary-base"), "500000");
  EXPECT_EQ(value(f, "--normalization"), "RMSNorm");
  EXPECT_EQ(f.count("--swiglu"), 1U);
  EXPECT_EQ(f.count("--disable-bias-linear"), 1U);
  EXPECT_EQ(f.count("--untie-embeddings-and-output-weights"), 1U);
  EXPECT_EQ(f.count("--qk-layernorm"), 0U);
  EXPECT_EQ(value(f, "--context-parallel-size"), "8");
  EXPECT_EQ(value(f, "--cp-comm-type"), "p2p");
  EXPECT_EQ(f.count("--hierarchical-context-parallel-sizes"), 0U);
  EXPECT_EQ(value(f, "--recompute-granularity"), "full");
  EXPECT_EQ(value(f, "--recompute-method"), "uniform");
  EXPECT_EQ(value(f, "--recompute-num-layers"), "1");
  EXPECT_EQ(f.count("--bf16"), 1U);
  EXPECT_EQ(f.count("--use-distributed-optimizer"), 1U);
  EXPECT_EQ(value(f, "--attention-backend"), "flash");
  // Fewer GPUs than a node holds: torchrun starts those.
  EXPECT_THAT(
      emit_launcher_config(LauncherFormat::kMegatron, inputs(CpMethod::kRing, 4, 4, 4, 128 * kK))
          .text,
      HasSubstr("torchrun --nnodes 1 --nproc_per_node 4 "));
}

TEST_F(EmitTest, MegatronCommTypes) {
  {
    const Flags f = shell_flags(
        emit_launcher_config(LauncherFormat::kMegatron, default_inputs(CpMethod::kAllGather)).text,
        "MEGATRON_ARGS");
    EXPECT_EQ(value(f, "--cp-comm-type"), "all_gather");  // not "allgather": TE rejects that
  }
  {
    const Flags f = shell_flags(
        emit_launcher_config(LauncherFormat::kMegatron, default_inputs(CpMethod::kUlysses)).text,
        "MEGATRON_ARGS");
    EXPECT_EQ(value(f, "--cp-comm-type"), "a2a");
    EXPECT_EQ(value(f, "--context-parallel-size"), "8");
  }
  {
    const Flags f = shell_flags(
        emit_launcher_config(LauncherFormat::kMegatron, default_inputs(CpMethod::kUsp)).text,
        "MEGATRON_ARGS");
    EXPECT_EQ(value(f, "--cp-comm-type"), "a2a+p2p");
    EXPECT_EQ(value(f, "--context-parallel-size"), "16");
    EXPECT_EQ(f.at("--hierarchical-context-parallel-sizes"), (std::vector<std::string>{"8", "2"}));
  }
}

TEST_F(EmitTest, MegatronQwenSelective) {
  sim::ScheduleInputs in = inputs(CpMethod::kRing, 8, 8, 8, 128 * kK, "qwen3-8b");
  in.recipe.checkpointing = CheckpointMode::kSelective;
  in.recipe.zero_stage = 0;
  const Flags f =
      shell_flags(emit_launcher_config(LauncherFormat::kMegatron, in).text, "MEGATRON_ARGS");
  EXPECT_EQ(f.count("--qk-layernorm"), 1U);
  EXPECT_EQ(value(f, "--rotary-base"), "1000000");
  EXPECT_EQ(value(f, "--num-layers"), "36");
  EXPECT_EQ(value(f, "--recompute-granularity"), "selective");
  EXPECT_EQ(value(f, "--recompute-modules"), "core_attn");
  EXPECT_EQ(f.count("--recompute-method"), 0U);
  EXPECT_EQ(f.count("--recompute-num-layers"), 0U);
  EXPECT_EQ(f.count("--use-distributed-optimizer"), 0U);
}

// Megatron-LM's and NeMo's (both Megatron-Core through Transformer Engine).
TEST_F(EmitTest, MegatronConstraints) {
  for (const LauncherFormat f : {LauncherFormat::kMegatron, LauncherFormat::kNeMo}) {
    SCOPED_TRACE(to_string(f));
    // a2a splits KV heads: 16 ranks over Llama-3-8B's 8 KV heads cannot work in TE.
    expect_refusal(f, inputs(CpMethod::kUlysses, 16, 16, 1, 256 * kK), "deepspeed", "8 KV heads");
    // seq divisible by C (Ulysses) but not by 2C.
    expect_refusal(f, inputs(CpMethod::kUlysses, 8, 8, 1, 8 * 32769), "2 x CP = 16");
    expect_refusal(f, default_inputs(CpMethod::kUPipe), "untied-ulysses");
    expect_refusal(f, default_inputs(CpMethod::kFpdt), "no launcher");
  }
}

// ---- NeMo ---------------------------------------------------------------------------------------

// The pretrain recipe of the model's shape, every parallel size, the sequence length on both the
// data and the model config, the batch, Megatron-Core's recompute and CP communication type,
// the distributed optimizer and the gradient reduction dtype, all set explicitly.
TEST_F(EmitTest, NeMoRing) {
  const EmittedConfig e =
      emit_launcher_config(LauncherFormat::kNeMo, default_inputs(CpMethod::kRing));
  EXPECT_EQ(e.suggested_filename, "cpsim_nemo.py");
  EXPECT_THAT(e.text, StartsWith("# generated by cpsim"));
  EXPECT_THAT(e.text, HasSubstr("# environment: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"));
  EXPECT_THAT(e.text, HasSubstr("run.cli.main(llm.pretrain, default_factory=cpsim_recipe)"));
  const json r = parse_recipe_function(e.text);
  EXPECT_EQ(r["recipe"],
            "llama3_8b.pretrain_recipe(name='cpsim', num_nodes=1, num_gpus_per_node=8)");
  EXPECT_EQ(r["recipe(num_nodes)"], 1);
  EXPECT_EQ(r["recipe.trainer.strategy.tensor_model_parallel_size"], 1);
  EXPECT_EQ(r["recipe.trainer.strategy.sequence_parallel"], false);
  EXPECT_EQ(r["recipe.trainer.strategy.pipeline_model_parallel_size"], 1);
  EXPECT_TRUE(r["recipe.trainer.strategy.pipeline_dtype"].is_null());
  EXPECT_TRUE(r["recipe.trainer.strategy.virtual_pipeline_model_parallel_size"].is_null());
  EXPECT_EQ(r["recipe.trainer.strategy.context_parallel_size"], 8);
  EXPECT_EQ(r["recipe.data.seq_length"], 262144);
  EXPECT_EQ(r["recipe.model.config.seq_length"], 262144);
  EXPECT_EQ(r["recipe.data.micro_batch_size"], 1);
  EXPECT_EQ(r["recipe.data.global_batch_size"], 1);
  EXPECT_EQ(r["recipe.model.config.cp_comm_type"], "p2p");
  EXPECT_EQ(r["recipe.model.config.recompute_granularity"], "full");
  EXPECT_EQ(r["recipe.model.config.recompute_method"], "uniform");
  EXPECT_EQ(r["recipe.model.config.recompute_num_layers"], 1);
  EXPECT_EQ(r["recipe.model.config.attention_backend"], "AttnBackend.flash");
  EXPECT_EQ(r["recipe.model.config.apply_rope_fusion"], true);
  EXPECT_EQ(r["recipe.optim.config.use_distributed_optimizer"], true);
  EXPECT_EQ(r["recipe.trainer.plugins.grad_reduce_in_fp32"], true);
  EXPECT_EQ(r["recipe.trainer.strategy.ddp.grad_reduce_in_fp32"], true);
  EXPECT_FALSE(r.contains("recipe.trainer.plugins.fp8"));
  // Fewer GPUs than a node holds: the trainer's devices are those GPUs.
  const json four = parse_recipe_function(
      emit_launcher_config(LauncherFormat::kNeMo, inputs(CpMethod::kRing, 4, 4, 4, 128 * kK)).text);
  EXPECT_EQ(four["recipe(num_nodes)"], 1);
  EXPECT_EQ(four["recipe(num_gpus_per_node)"], 4);
  // What the recipe cannot say, in the notes: ZeRO-3 parameter sharding, checkpoint offload.
  EXPECT_THAT(joined(e.notes), HasSubstr("ZeRO-3 parameter sharding needs Megatron FSDP"));
  EXPECT_THAT(joined(e.notes), HasSubstr("checkpoint offload is not set"));
}

// Ulysses as a2a, tensor and pipeline parallelism (interleaved, uneven first/last stages), FP8
// with TransformerEngine's delayed scaling, no recompute; a Qwen3 recipe.
TEST_F(EmitTest, NeMoPipelineFp8AndQwen) {
  sim::ScheduleInputs in = inputs(CpMethod::kUlysses, 32, 4, 1, 32 * kK);
  in.parallel.tp_degree = 2;
  in.parallel.pp_degree = 4;
  in.parallel.pp_schedule = models::PipelineSchedule::kInterleaved;
  in.parallel.virtual_stages = 2;
  in.parallel.pp_first_stage_layers = 6;  // 6 + 10 + 10 + 6 blocks
  in.parallel.pp_last_stage_layers = 6;
  in.parallel.micro_batches = 16;
  in.recipe.fp8 = true;
  in.recipe.tiled_mlp = false;
  in.recipe.zero_stage = 1;
  in.recipe.checkpointing = CheckpointMode::kNone;
  const json r = parse_recipe_function(emit_launcher_config(LauncherFormat::kNeMo, in).text);
  EXPECT_EQ(r["recipe(num_nodes)"], 4);
  EXPECT_EQ(r["recipe.model.config.cp_comm_type"], "a2a");
  EXPECT_EQ(r["recipe.trainer.strategy.tensor_model_parallel_size"], 2);
  EXPECT_EQ(r["recipe.trainer.strategy.sequence_parallel"], true);
  EXPECT_EQ(r["recipe.trainer.strategy.pipeline_model_parallel_size"], 4);
  EXPECT_EQ(r["recipe.trainer.strategy.pipeline_dtype"], "torch.bfloat16");
  EXPECT_EQ(r["recipe.trainer.strategy.virtual_pipeline_model_parallel_size"], 2);
  EXPECT_EQ(r["recipe.trainer.strategy.num_layers_in_first_pipeline_stage"], 6);
  EXPECT_EQ(r["recipe.trainer.strategy.num_layers_in_last_pipeline_stage"], 6);
  EXPECT_EQ(r["recipe.data.global_batch_size"], 16);  // 16 micro-batches x data parallel 1
  EXPECT_TRUE(r["recipe.model.config.recompute_granularity"].is_null());
  EXPECT_EQ(r["recipe.trainer.plugins.fp8"], "hybrid");
  EXPECT_EQ(r["recipe.trainer.plugins.fp8_recipe"], "delayed");
  EXPECT_EQ(r["recipe.trainer.plugins.fp8_amax_history_len"], 1024);
  EXPECT_EQ(r["recipe.trainer.plugins.fp8_amax_compute_algo"], "max");
  EXPECT_EQ(r["recipe.trainer.plugins.fp8_param_gather"], false);

  sim::ScheduleInputs qwen = inputs(CpMethod::kRing, 8, 8, 8, 128 * kK, "qwen3-8b");
  qwen.recipe.checkpointing = CheckpointMode::kSelective;
  const json q = parse_recipe_function(emit_launcher_config(LauncherFormat::kNeMo, qwen).text);
  EXPECT_THAT(q["recipe"].get<std::string>(), StartsWith("qwen3_8b.pretrain_recipe("));
  EXPECT_EQ(q["recipe.model.config.recompute_granularity"], "selective");
  EXPECT_TRUE(q["recipe.model.config.recompute_num_layers"].is_null());
}

// NeMo's own (the Transformer Engine constraints: MegatronConstraints).
TEST_F(EmitTest, NeMoRefusals) {
  // No NeMo pretrain recipe has Llama-2-13B's shape: Megatron-LM's arguments set it.
  expect_refusal(LauncherFormat::kNeMo, inputs(CpMethod::kRing, 8, 8, 8, 128 * kK, "llama2-13b"),
                 "megatron", "no pretrain recipe");
  // No hierarchical a2a+p2p sizes in NeMo's strategy.
  expect_refusal(LauncherFormat::kNeMo, default_inputs(CpMethod::kUsp), "megatron");
}

// ---- ArcticTraining -----------------------------------------------------------------------------

TEST_F(EmitTest, ArcticUlysses) {
  sim::ScheduleInputs in = inputs(CpMethod::kUlysses, 8, 8, 1, 3 * kM);
  in.recipe.optimizer_offload = true;
  const EmitOptions data{.main_path = "", .dataset = "HuggingFaceH4/ultrachat_200k:train_sft"};
  const EmittedConfig e = emit_launcher_config(LauncherFormat::kArctic, in, data);
  EXPECT_EQ(e.suggested_filename, "cpsim_arctic.yaml");
  EXPECT_THAT(e.text, StartsWith("# generated by cpsim"));
  const json y = parse_yaml(e.text);
  EXPECT_EQ(y["type"], "sft");
  EXPECT_EQ(y["micro_batch_size"], 1);
  EXPECT_EQ(y["sequence_parallel_size"], 8);
  EXPECT_EQ(y["activation_checkpoint_cpu_offload"], true);
  EXPECT_EQ(y["tiled_mlp_compute"], true);
  EXPECT_EQ(y["model"]["type"], "liger");
  // The built-in model's Hugging Face id (its _name_or_path), the data source as given: the
  // two keys transformers and arctic_training/config/data.py need.
  EXPECT_EQ(y["model"]["name_or_path"], "meta-llama/Meta-Llama-3-8B");
  EXPECT_EQ(y["data"]["sources"], json::array({"HuggingFaceH4/ultrachat_200k:train_sft"}));
  EXPECT_EQ(y["model"]["attn_implementation"], "flash_attention_2");
  EXPECT_FALSE(y["model"].contains("disable_activation_checkpoint"));
  EXPECT_EQ(y["data"]["max_length"], 3 * kM);
  EXPECT_EQ(y["deepspeed"]["zero_optimization"]["stage"], 3);
  EXPECT_EQ(y["deepspeed"]["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  EXPECT_EQ(y["deepspeed"]["seq_parallel_communication_data_type"], "bf16");
  EXPECT_EQ(y["optimizer"]["type"], "cpu_adam");

  in.recipe.optimizer_offload = false;
  in.recipe.checkpointing = CheckpointMode::kNone;
  in.recipe.tiled_mlp = false;
  in.recipe.attention_kernel = "sdpa";
  const json z = parse_yaml(emit_launcher_config(LauncherFormat::kArctic, in, data).text);
  EXPECT_EQ(z["activation_checkpoint_cpu_offload"], false);
  EXPECT_EQ(z["tiled_mlp_compute"], false);
  EXPECT_EQ(z["model"]["disable_activation_checkpoint"], true);
  EXPECT_EQ(z["model"]["attn_implementation"], "sdpa");
  EXPECT_FALSE(z["deepspeed"]["zero_optimization"].contains("offload_optimizer"));
  EXPECT_FALSE(z.contains("optimizer"));

  // Without a data source, or for a config file that names no model, the refusal names the
  // option to give rather than writing a file that does not load.
  try {
    (void)emit_launcher_config(LauncherFormat::kArctic, in);
    ADD_FAILURE() << "emitted without a dataset";
  } catch (const InputError& error) {
    EXPECT_EQ(error.field(), "--dataset");
  }
  in.model.hf_name_or_path.clear();
  try {
    (void)emit_launcher_config(LauncherFormat::kArctic, in, data);
    ADD_FAILURE() << "emitted without a model id";
  } catch (const InputError& error) {
    EXPECT_EQ(error.field(), "--model");
  }
}

TEST_F(EmitTest, ArcticRefusesAllButUlysses) {
  expect_refusal(LauncherFormat::kArctic, default_inputs(CpMethod::kRing), "torchtitan");
  expect_refusal(LauncherFormat::kArctic, default_inputs(CpMethod::kAllGather), "megatron");
  expect_refusal(LauncherFormat::kArctic, default_inputs(CpMethod::kUPipe), "untied-ulysses");
  expect_refusal(LauncherFormat::kArctic, default_inputs(CpMethod::kUsp), "untied-ulysses");
  expect_refusal(LauncherFormat::kArctic, default_inputs(CpMethod::kFpdt), "no launcher");
}

// ---- Every format x every method ----------------------------------------------------------------

/// Parses one emitted config with the parser of its format; returns false on parse failure.
bool parses(LauncherFormat f, const EmittedConfig& e) {
  switch (f) {
    case LauncherFormat::kTorchTitan022:
    case LauncherFormat::kTorchTitan021:
      return parse_toml(e.text).is_object();
    case LauncherFormat::kTorchTitan:
    case LauncherFormat::kTorchTitanMain:
      return parse_config_function(e.text).contains("config");
    case LauncherFormat::kDeepSpeed:
      return parse_json(e.text).is_object();
    case LauncherFormat::kAccelerate:
    case LauncherFormat::kArctic:
      return parse_yaml(e.text).is_object();
    case LauncherFormat::kUntiedUlysses:
      return !shell_flags(e.text, "UNTIED_ULYSSES_ARGS").empty();
    case LauncherFormat::kMegatron:
      return !shell_flags(e.text, "MEGATRON_ARGS").empty();
    case LauncherFormat::kNeMo:
      return parse_recipe_function(e.text).contains("recipe");
  }
  return false;
}

TEST_F(EmitTest, EveryFormatEitherParsesOrRefusesNamingAnotherLauncher) {
  const std::regex exponent("[0-9]e[+-]?[0-9]");
  int emitted = 0;
  for (const LauncherFormat f : kAllFormats) {
    for (const CpMethod m : kAllMethods) {
      SCOPED_TRACE(fmt::format("{} / {}", to_string(f), models::to_string(m)));
      const sim::ScheduleInputs in = default_inputs(m);
      const EmitOptions options{.main_path = "", .dataset = "org/data"};
      try {
        const EmittedConfig e = emit_launcher_config(f, in, options);
        ++emitted;
        EXPECT_TRUE(parses(f, e));
        std::string stem = to_string(f);
        std::replace(stem.begin(), stem.end(), '-', '_');  // a Python module name for main
        EXPECT_THAT(e.suggested_filename,
                    StartsWith(fmt::format("cpsim_{}.", f == LauncherFormat::kTorchTitanMain
                                                            ? stem
                                                            : std::string(to_string(f)))));
        EXPECT_FALSE(std::regex_search(e.text, exponent)) << e.text;
        for (const auto& n : e.notes) {
          EXPECT_FALSE(std::regex_search(n, exponent)) << n;
        }
        const std::string provenance =
            f == LauncherFormat::kDeepSpeed ? e.notes.at(0) : e.text.substr(0, e.text.find('\n'));
        EXPECT_THAT(provenance, HasSubstr("generated by cpsim"));
        EXPECT_THAT(provenance, HasSubstr(fmt::format("method {}", models::to_string(m))));
        // Deterministic.
        const EmittedConfig again = emit_launcher_config(f, in, options);
        EXPECT_EQ(again.text, e.text);
        EXPECT_EQ(again.notes, e.notes);
      } catch (const InputError& e) {
        EXPECT_EQ(e.field(), "--emit") << e.what();
        const std::string msg = e.what();
        EXPECT_THAT(msg, HasSubstr(fmt::format("cannot run {}", models::to_string(m))));
        if (m == CpMethod::kFpdt) {
          EXPECT_THAT(msg, HasSubstr("no launcher"));  // none runs it: nothing else to name
          continue;
        }
        bool names_other = false;
        for (const LauncherFormat g : kAllFormats) {
          names_other = names_other || (g != f && msg.find(to_string(g)) != std::string::npos);
        }
        EXPECT_TRUE(names_other) << msg;
      }
    }
  }
  // Methods per launcher (launchers_for): torchtitan 0.3.0, 0.2.2, 0.2.1, main, untied-ulysses,
  // deepspeed, accelerate, megatron, arctic, nemo.
  EXPECT_EQ(emitted, 1 + 1 + 2 + 1 + 4 + 1 + 3 + 4 + 1 + 3);
}

TEST_F(EmitTest, InvalidConfigurationsKeepTheirOwnQuantity) {
  sim::ScheduleInputs in = default_inputs(CpMethod::kUlysses);
  in.parallel.ring_degree = 2;  // Ulysses has no ring
  try {
    (void)emit_launcher_config(LauncherFormat::kDeepSpeed, in);
    FAIL() << "accepted a ring degree for Ulysses";
  } catch (const sim::ConfigError& e) {
    EXPECT_EQ(e.quantity(), sim::Quantity::kRingDegree);
  }
  in = default_inputs(CpMethod::kRing);
  in.parallel.seq_len = 1000;
  try {
    (void)emit_launcher_config(LauncherFormat::kMegatron, in);
    FAIL() << "accepted seq 1000 for CP 8";
  } catch (const sim::ConfigError& e) {
    EXPECT_EQ(e.quantity(), sim::Quantity::kSeqLenMultiple);
  }
}

}  // namespace
}  // namespace cpsim::planner
