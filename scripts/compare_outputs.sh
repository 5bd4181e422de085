#!/usr/bin/env bash
# Byte-for-byte comparison of the CLI's outputs between a base revision and the working tree.
#
#   scripts/compare_outputs.sh [BASE_REV]      (default HEAD~)
#
# Builds BASE_REV in a temporary git worktree (ccache keeps it cheap) and the current tree in
# build/, runs both `cpsim` binaries over one matrix of commands and compares stdout, stderr, the
# exit status and every file a command writes. The matrix is representative, not a full cross
# product: every method, built-in recipe, AC mode, ZeRO stage and checkpoint-offload setting
# appears at least once, plus maxlen, plan, validate, report and sweep and a few refused inputs.
# Exits 1 on any difference, after a summary line: "N outputs compared, N identical".
set -euo pipefail

repo=$(git rev-parse --show-toplevel)
base_rev=${1:-HEAD~}
base_sha=$(git -C "$repo" rev-parse --verify "$base_rev^{commit}")
jobs=${JOBS:-2}
export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}

work=$(mktemp -d "${TMPDIR:-/tmp}/cpsim-compare.XXXXXX")
# BASE_TREE=DIR reuses a checkout of BASE_REV (its build/ is brought up to date); BASE_BIN=FILE
# uses a `cpsim` already built from BASE_REV as it is (a busy machine: no second build); otherwise
# a temporary worktree is added and removed again.
own_tree=false
if [[ -n "${BASE_BIN:-}" ]]; then
  base_tree=""
elif [[ -n "${BASE_TREE:-}" ]]; then
  base_tree=$BASE_TREE
  if [[ $(git -C "$base_tree" rev-parse HEAD) != "$base_sha" ]]; then
    echo "compare_outputs: $base_tree is not at $base_rev" >&2
    exit 2
  fi
else
  base_tree="$work/base"
  own_tree=true
fi
cleanup() {
  if $own_tree; then
    git -C "$repo" worktree remove --force "$base_tree" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

configure_and_build() {  # SOURCE BUILD_DIR
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCPSIM_WERROR=ON \
    -DCPSIM_ENABLE_CUDA=OFF >/dev/null
  cmake --build "$2" -j "$jobs" --target cpsim >/dev/null
}

echo "base: $base_rev ($base_sha)"
if $own_tree; then
  git -C "$repo" worktree add --detach "$base_tree" "$base_sha" >/dev/null 2>&1
fi
if [[ -n "$base_tree" ]]; then
  # build/ inside each tree: the same relative compiler arguments, so ccache serves both.
  configure_and_build "$base_tree" "$base_tree/build"
  base_bin="$base_tree/build/cpsim"
else
  base_bin=$BASE_BIN
  echo "base binary: $base_bin (not rebuilt)"
fi
# HEAD_BIN=FILE compares a `cpsim` already built from the working tree (edits may go on meanwhile).
if [[ -n "${HEAD_BIN:-}" ]]; then
  head_bin=$HEAD_BIN
  echo "head binary: $head_bin (not rebuilt)"
else
  configure_and_build "$repo" "$repo/build"
  head_bin="$repo/build/cpsim"
fi

# One command per line; OUT/ in a command is replaced by the run's output folder.
common="--model llama3-8b --gpus 8"
commands=(
  # Every method with its default recipe, as JSON.
  "simulate $common --seq 256K --method ulysses --json"
  "simulate $common --seq 256K --method upipe --json"
  "simulate $common --seq 256K --method ring --json"
  "simulate $common --seq 256K --method allgather --json"
  "simulate $common --seq 256K --method fpdt --fpdt-chunk 64K --json"
  "simulate $common --seq 256K --method usp --ulysses-degree 4 --ring-degree 2 --json"
  "simulate $common --seq 256K --method all"
  # Traces: every method once, across recipes, AC modes, ZeRO stages and checkpoint offload.
  "simulate $common --seq 128K --method ulysses --recipe alst --ac full --ac-offload on --zero 3 --trace OUT/t.json"
  "simulate $common --seq 128K --method upipe --heads-per-stage 16 --recipe alst-deepspeed --ac selective --zero 2 --trace OUT/t.json"
  "simulate $common --seq 128K --method ring --recipe torch-native --ac none --zero 1 --trace OUT/t.json"
  "simulate $common --seq 128K --method allgather --recipe torch-native --ac full --ac-offload off --zero 0 --trace OUT/t.json"
  "simulate $common --seq 128K --method fpdt --recipe deepspeed-fpdt --fpdt-chunk 32K --ac full --zero 3 --trace OUT/t.json"
  "simulate --model qwen3-32b --gpus 16 --seq 128K --method usp --recipe alst --ac selective --ac-offload off --zero 2 --trace OUT/t.json"
  # JSON over the remaining recipe x method x knob combinations.
  "simulate $common --seq 512K --method ulysses --recipe deepspeed-fpdt --ac selective --zero 0 --json"
  "simulate $common --seq 512K --method upipe --recipe torch-native --ac none --zero 3 --json"
  "simulate $common --seq 512K --method ring --recipe alst-deepspeed --ac full --ac-offload on --zero 2 --json"
  "simulate $common --seq 512K --method allgather --recipe alst --ac selective --zero 1 --json"
  "simulate $common --seq 512K --method fpdt --recipe alst --fpdt-chunk 64K --fpdt-offload on --ac none --zero 1 --json"
  "simulate --model qwen3-32b --gpus 16 --seq 512K --method upipe --ulysses-degree 8 --ring-degree 2 --recipe deepspeed-fpdt --ac full --ac-offload off --zero 0 --json"
  "simulate --model qwen3-32b --gpus 16 --seq 512K --method usp --ring-layout contiguous --recipe torch-native --ac full --ac-offload on --zero 3 --json"
  # Refused configurations (exit status and the one-line error are compared too).
  "simulate $common --seq 256K --method upipe --heads-per-stage 3"
  "simulate $common --seq 256K --method ulysses --ring-degree 2"
  "simulate $common --seq 256K --method ring --cp-degree 8 --ring-degree 4"
  "simulate $common --seq 256K --method upipe --heads-per-stage 12"
  "simulate --model llama3-8b --gpus 12 --seq 384K --method usp --ring-degree 1"
  "simulate $common --seq 1000 --method ulysses"
  "simulate $common --seq 256K --method fpdt --fpdt-chunk 1000"
  "simulate $common --seq 256K --method ulysses --cp-degree 3"
  "simulate --model llama3-8b --gpus 3 --seq 256K --method ulysses"
  "simulate --model llama3-8b --gpus 64 --seq 256K --method ulysses"
  "simulate $common --seq 100000M --method ulysses"
  "simulate $common --seq 1000 --method all"
  # Pipeline parallelism (even stages; a memory-bound one and an interleaved one).
  "simulate --model llama3-8b --gpus 16 --seq 256K --method allgather --impl none --pp 2 --micro-batches 4"
  "simulate --model llama3-8b --gpus 16 --seq 1M --method ring --impl megatron-core-cp --tp 2 --pp 4 --pp-schedule interleaved --virtual-stages 2 --micro-batches 8 --json"
  "simulate --model qwen3-8b --gpus 16 --seq 4M --method allgather --impl none --pp 2 --pp-schedule interleaved --virtual-stages 3 --micro-batches 4 --json"
  "maxlen --model llama3-8b --gpus 16 --method allgather --impl none --pp 2 --micro-batches 2"
  # Searches and reports.
  "maxlen $common --method all"
  "maxlen --model qwen3-32b --gpus 16 --method usp --json"
  "plan"
  "plan --json"
  "plan --seq 1M"
  "plan --seq 1M --emit torchtitan --out OUT/titan.toml"
  # Every launcher with every method it runs (and two it refuses): the emitters' method choices.
  "plan --seq 256K --methods ring --emit torchtitan"
  "plan --seq 256K --methods allgather --emit torchtitan"
  "plan --seq 256K --methods ring --emit megatron"
  "plan --seq 256K --methods allgather --emit megatron"
  "plan --seq 256K --methods ulysses --emit megatron"
  "plan --seq 256K --methods usp --emit megatron"
  "plan --seq 256K --methods usp --cp-degree 8 --ring-degree 1 --emit megatron --fixed-recipe"
  "plan --seq 256K --methods ring --emit accelerate"
  "plan --seq 256K --methods allgather --emit accelerate"
  "plan --seq 256K --methods ulysses --emit accelerate"
  "plan --seq 256K --methods ulysses --emit deepspeed"
  "plan --seq 256K --methods fpdt --emit deepspeed"
  "plan --seq 256K --methods ulysses --emit arctic"
  "plan --seq 256K --methods ulysses --emit untied-ulysses"
  "plan --seq 256K --methods upipe --emit untied-ulysses"
  "plan --seq 256K --methods usp --emit untied-ulysses"
  "plan --seq 256K --methods ring --emit untied-ulysses"
  "plan --seq 256K --methods ring --recipe torch-native --fixed-recipe --emit untied-ulysses"
  "plan --seq 256K --methods upipe --emit megatron"
  "plan --seq 256K --methods fpdt --emit torchtitan"
  "validate"
  "report --html OUT/report.html --sweep 128K..1M"
  "sweep --sweep 128K..2M --format csv"
)

normalise() {  # OUTDIR FILE
  sed -E -e "s#$1#OUT#g" -e 's/[0-9.]+ s, [0-9]+ simulations\/s/(wall time)/' "$2"
}

total=0
same=0
run_one() {  # BIN OUTDIR COMMAND
  local bin=$1 out=$2 cmd=$3
  mkdir -p "$out"
  local expanded=${cmd//OUT\//$out/}
  # shellcheck disable=SC2086
  (cd "$out" && set +e && "$bin" $expanded >"$out/stdout" 2>"$out/stderr"; echo $? >"$out/status")
}
for i in "${!commands[@]}"; do
  cmd=${commands[$i]}
  run_one "$base_bin" "$work/out/base/$i" "$cmd"
  run_one "$head_bin" "$work/out/head/$i" "$cmd"
  # Compared after two rewrites: the output folder's path (OUT), and the wall time `plan` prints
  # (the only output that is not deterministic).
  for f in $(cd "$work/out/base/$i" && find . -type f | sort); do
    total=$((total + 1))
    b="$work/out/base/$i/$f"
    h="$work/out/head/$i/$f"
    if [[ -f "$h" ]] && cmp -s <(normalise "$work/out/base/$i" "$b") \
      <(normalise "$work/out/head/$i" "$h"); then
      same=$((same + 1))
    else
      echo "DIFFERENT: cpsim $cmd  [$f]"
      diff <(normalise "$work/out/base/$i" "$b") <(normalise "$work/out/head/$i" "$h") \
        | head -20 || true
    fi
  done
  extra=$(comm -13 <(cd "$work/out/base/$i" && find . -type f | sort) \
    <(cd "$work/out/head/$i" && find . -type f | sort))
  if [[ -n "$extra" ]]; then
    total=$((total + 1))
    echo "DIFFERENT: cpsim $cmd  [only in the current tree: $extra]"
  fi
done
echo "${#commands[@]} commands, $total outputs compared, $same identical"
[[ $total -eq $same ]]
