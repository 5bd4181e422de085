#!/usr/bin/env bash
# Measure one GPU node with everything cpsim has that needs a GPU, each step under its own time
# limit so that one failure or overrun leaves the others' results:
#   1. the GPU tests (the own attention kernel against its reference, the timing harness);
#   2. `cpsim calibrate run` (launch, HBM, GEMM, attention, host copies; collectives with 2+ GPUs);
#   3. the attention kernels of the local PyTorch (calibrate/scripts/torch_attention_timing.py);
#   4. the Linear layers' GEMMs through PyTorch, forward, dgrad and wgrad
#      (calibrate/scripts/torch_gemm_timing.py);
#   5. the memory of a Hugging Face model's training step (calibrate/scripts/hf_memory_snapshot.py).
#
#   scripts/gpu-check.sh OUT_DIR [BIN_DIR]     (BIN_DIR: a CUDA build folder, default build-cuda/,
#                                               or one holding cpsim, libcpsim_calibrate_cuda.so
#                                               and cpsim_calibrate_gpu_tests)
# Limits per step (seconds) come from GPU_CHECK_LIMITS="tests calibrate attention gemm memory".
# Writes OUT_DIR/env.txt, log.txt, gpu_tests.json, calibrate_raw.json, attention_torch.json,
# gemm_torch.json, hf_memory.json. Exit status 0 whatever the steps did: log.txt says which failed.
set -u
out=${1:?usage: scripts/gpu-check.sh OUT_DIR [BIN_DIR]}
read -r t_tests t_cal t_attn t_gemm t_mem <<<"${GPU_CHECK_LIMITS:-60 140 100 100 140}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
bin=$(cd "${2:-$(dirname "$0")/../build-cuda}" && pwd) || exit 2
cd "$(dirname "$0")/.."  # the repository root: data/ and calibrate/scripts/ are read from it
export CPSIM_DATA_DIR=$PWD/data PYTHONUNBUFFERED=1

# The CUDA runtime, cuBLASLt and NCCL cpsim's module links: the toolkit's, else the ones that
# PyTorch's wheels bring. Only cpsim's own programs get this path: a system folder in it can hand
# PyTorch another cuDNN than the one it was built with (seen: 9.14 loaded for 9.19), so the Python
# steps run with the environment as it was.
libdirs=$bin
for lib in libcudart.so.13 libcublasLt.so.13 libnccl.so.2; do
  found=$(find /usr/local/cuda/ /usr/local/cuda/lib64/ /usr/lib/x86_64-linux-gnu/ /opt/ -name "$lib" 2>/dev/null | head -1)
  [ -n "$found" ] && libdirs=$libdirs:$(dirname "$found")
done
cpsim_env=(env "LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "== $(date -u +%H:%M:%S) $name (limit ${limit} s): $*"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@"
  echo "== $name: exit $? after $((SECONDS - t0)) s"
}

{
  date -u
  nvidia-smi
  nvidia-smi -q -d CLOCK,PERFORMANCE,TEMPERATURE,POWER
  grep -m1 "model name" /proc/cpuinfo
  nproc
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "transformers", transformers.__version__)'
  python3 -c 'import flash_attn; print("flash_attn", flash_attn.__version__)' 2>&1 | tail -1
  python3 -c 'import flash_attn_interface; print("flash_attn_interface present")' 2>&1 | tail -1
  echo "cpsim's library path: $libdirs"
  "${cpsim_env[@]}" ldd "$bin/libcpsim_calibrate_cuda.so"
} >"$out/env.txt" 2>&1

{
  gpu_tests=$bin/cpsim_calibrate_gpu_tests
  [ -x "$gpu_tests" ] || gpu_tests=$bin/calibrate/cpsim_calibrate_gpu_tests  # a build folder
  step tests "$t_tests" "${cpsim_env[@]}" "$gpu_tests" --gtest_output="json:$out/gpu_tests.json"
  step calibrate "$t_cal" "${cpsim_env[@]}" "$bin/cpsim" calibrate run --quick --out "$out/calibrate_raw.json"
  step attention "$t_attn" python3 calibrate/scripts/torch_attention_timing.py --quick \
    --max-seq 131072 --kernels sdpa,cudnn,sdpa-flash,sdpa-efficient --out "$out/attention_torch.json"
  step gemm "$t_gemm" python3 calibrate/scripts/torch_gemm_timing.py --quick \
    --models data/models/llama3-8b.json,data/models/qwen3-32b.json --out "$out/gemm_torch.json"
  step memory "$t_mem" python3 calibrate/scripts/hf_memory_snapshot.py \
    --model data/models/llama3-8b.json --lens 8K,16K,32K,48K,64K --snapshot-len 16K \
    --profile-len 8K --out "$out/hf_memory.json"
  nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv
} >"$out/log.txt" 2>&1
rm -f "$out"/.cpsim-*.tmp
exit 0
