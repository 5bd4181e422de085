#!/usr/bin/env bash
# The allocation tracer's GPU leg and the 1-GPU ALST baseline, for one lent H200 in at most 8
# minutes (each step under its own time limit inside one overall budget; a failed step does not
# stop the next). Writes everything under ${OUT:-out}/ and a manifest.json there (device, driver,
# CUDA, versions, date, each step's status and seconds).
#
#   scripts/gpu-trace.sh                  on the GPU machine, from the repository root
#   scripts/gpu-trace.sh --dry-run        the same steps on this machine's CPU with the project's
#                                         .venv: tiny shapes, no CUDA calls
#                                         (tests/tracer/test_gpu_leg.py runs it)
#   scripts/gpu-trace.sh --fetch-wheels   HERE (not on the GPU machine): makes .whl/ (see below)
#   options: --pack / --no-pack (default: pack on the GPU, not in a dry run)
#
# Steps:
#   wheels    (GPU) installs .whl/*.whl and .whl/pinned/*.whl (transformers 4.51.3 as
#             requirements.txt pins it, with the tokenizers and huggingface_hub it accepts, in
#             place of the machine's 5.17; GPU_TRACE_TRANSFORMERS=machine keeps 5.17) into
#             python3's own site-packages, else into /tmp/gpu-trace/site-packages on PYTHONPATH
#   list      calibrate/tracer/trace.py --list  -> traces/list.txt
#   traces    for each implementation and shape listed (the first shape only in a dry run):
#             calibrate/tracer/gpu_leg.py trace -> traces/IMPL--SHAPE.json (the recorder's trace
#             with CUDA tensors, the condensed CUDA allocator history joined to it, memory stats),
#             .log, .pickle.gz (the raw allocator snapshot); traces/status.tsv
#   baseline  calibrate/tracer/gpu_leg.py baseline: Llama-3-8B-shaped, ZeRO-3 with parameter and
#             optimizer offload, 32,000 tokens, forward/backward/optimizer step, twice
#             (GPU_TRACE_STEPS: DeepSpeed prefetches parameters only from the second step on) ->
#             baseline/baseline.json, baseline-history.json, baseline-snapshot.pickle.gz. The
#             host (128 GiB) cannot hold AdamW's host state for all 8.0e9 parameters (about
#             20 bytes each with offload), so only the last GPU_TRACE_TRAINABLE_LAYERS (8) layers,
#             the embedding, final norm and head train; all 32 layers run forward and backward.
#             AdamW runs through torch on the host partitions (DeepSpeed's torch_adam), not
#             DeepSpeedCPUAdam (a JIT build of cpu_adam, minutes); attention is SDPA (no
#             flash-attn there); the dry run: 2 layers, hidden 256, 256 tokens, gloo, on the CPU.
#   pack      (GPU) traces/ and baseline/ into traces.tar.gz and baseline.tar.gz: a lent GPU
#             machine hands back at most 8 files from $OUT
#
# Environment: OUT, GPU_TRACE_BUDGET (seconds for everything, 450), GPU_TRACE_JOBS (traces run
# at once: 8 on the GPU, 2 in a dry run), GPU_TRACE_LIMITS ("wheels list traces baseline pack",
# seconds: "60 45 150 240 30"), GPU_TRACE_TRACE_LIMIT (one trace, 90), GPU_TRACE_IMPLS
# (comma-separated subset), GPU_TRACE_TRAINABLE_LAYERS (8), GPU_TRACE_SEQ (32000),
# GPU_TRACE_STEPS (2), GPU_TRACE_TRANSFORMERS (pinned | machine), GPU_TRACE_ALLOC_CONF
# (expandable_segments:True), GPU_TRACE_SDPA (real | stand-in), GPU_TRACE_SDPA_BACKEND
# (flash | cudnn | efficient | auto),
# PYTHON (python3 on the GPU, .venv/bin/python in a dry run).
#
# The wheels (.whl/, ignored by git; at most 64 MiB with the rest of the working tree copied to
# the GPU machine, which has no network), made HERE by --fetch-wheels, which runs exactly:
#   P=.venv/bin/python
#   T="--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3
#      --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
#      --platform manylinux2014_x86_64 --platform any"
#   $P -m pip download --no-deps $T -d .whl hjson==3.1.0 pydantic==2.14.4 pydantic_core==2.50.5 \
#       annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 \
#       yunchang==0.6.4 ring-flash-attn==0.1.8
#   DS_BUILD_OPS=0 $P -m pip wheel --no-deps --no-build-isolation --no-cache-dir -w .whl \
#       deepspeed==0.19.8
#   $P -m pip download --no-deps $T -d .whl/pinned transformers==4.51.3 tokenizers==0.21.4 \
#       huggingface_hub==0.36.2
# (deepspeed 0.19.8 is an sdist: built here, without ops, as a py3-none-any wheel. DeepSpeed's
# other needs at import, einops, msgpack, ninja, numpy, packaging, psutil, py-cpuinfo, tqdm, are on
# the GPU machine.) On the GPU machine they install with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
# but the wheels step installs them itself, without --target (see "wheels" above).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2

fetch_wheels() {  # pip's warnings about this machine's local index folders are left out
  exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  local py=${PYTHON:-$root/.venv/bin/python} dir=$root/.whl
  local t=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3
           --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform any)
  rm -rf "$dir" && mkdir -p "$dir/pinned" || return 1
  "$py" -m pip download -q --no-deps "${t[@]}" -d "$dir" hjson==3.1.0 pydantic==2.14.4 \
    pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    typing_extensions==4.16.0 yunchang==0.6.4 ring-flash-attn==0.1.8 || return 1
  DS_BUILD_OPS=0 "$py" -m pip wheel -q --no-deps --no-build-isolation --no-cache-dir \
    -w "$dir" deepspeed==0.19.8 || return 1
  "$py" -m pip download -q --no-deps "${t[@]}" -d "$dir/pinned" transformers==4.51.3 \
    tokenizers==0.21.4 huggingface_hub==0.36.2 || return 1
  local bytes
  bytes=$(find "$dir" -type f -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  find "$dir" -type f -printf '%8s  %P\n' | sort -k2
  echo "total: $bytes bytes ($((bytes / 1048576)) MiB) in $dir"
  if ! git -C "$root" check-ignore -q .whl; then
    echo "note: .whl/ is not ignored: it travels with the working tree, and must not be committed"
  fi
  [ "$bytes" -lt $((64 * 1048576)) ] || { echo "over 64 MiB" >&2; return 1; }
}

mode=gpu
pack=
for arg in "$@"; do
  case $arg in
    --fetch-wheels) fetch_wheels; exit $? ;;
    --dry-run) mode=dry-run ;;
    --pack) pack=1 ;;
    --no-pack) pack=0 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-trace.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done

out=${OUT:-out}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
log=$out/gpu-trace.log
steps=$(mktemp)
traces_status=$(mktemp)
trap 'rm -f "$steps" "$traces_status"' EXIT
export PYTHONUNBUFFERED=1
read -r l_wheels l_list l_traces l_baseline l_pack <<<"${GPU_TRACE_LIMITS:-60 45 150 240 30}"
budget=${GPU_TRACE_BUDGET:-450}
reserve=15  # kept back for the manifest
if [ "$mode" = gpu ]; then
  PY=${PYTHON:-python3}
  dev=cuda
  jobs_max=${GPU_TRACE_JOBS:-8}
  pack=${pack:-1}
  export PYTORCH_CUDA_ALLOC_CONF=${GPU_TRACE_ALLOC_CONF:-expandable_segments:True}
else
  PY=${PYTHON:-$root/.venv/bin/python}
  dev=cpu
  jobs_max=${GPU_TRACE_JOBS:-2}
  pack=${pack:-0}
fi
trace_limit=${GPU_TRACE_TRACE_LIMIT:-90}

say() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$log"; }
record() {  # record NAME STATUS SECONDS [DETAIL]
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$steps"
  say "$1: $2 ($3 s)${4:+ $4}"
}
time_left() { echo $((budget - SECONDS - reserve)); }
limit_for() {  # the step's own limit, or less where the budget has less left
  local left
  left=$(time_left)
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
status_of() {  # exit code -> status word
  case $1 in 0) echo ok ;; 124|137) echo timeout ;; *) echo "failed (exit $1)" ;; esac
}

step() {  # step NAME LIMIT COMMAND... : runs it under `timeout`; output to the log (standard
  local name=$1 limit t0=$SECONDS rc  # output to $step_out instead, where that is set)
  limit=$(limit_for "$2")
  shift 2
  if [ "$limit" -lt 5 ]; then record "$name" "skipped" 0 "no time left in the budget"; return 1; fi
  say "$name (limit ${limit} s): $*"
  timeout -k 10 "$limit" "$@" >>"${step_out:-$log}" 2>>"$log"
  rc=$?
  record "$name" "$(status_of $rc)" $((SECONDS - t0))
  return $rc
}

# -- wheels ---------------------------------------------------------------------------------------
wheels() {
  local t0=$SECONDS detail rc=0 limit files=() site
  if [ "$mode" = dry-run ]; then record wheels skipped 0 "dry run: the project's .venv"; return; fi
  if ! compgen -G ".whl/*.whl" >/dev/null; then
    record wheels skipped 0 "no .whl/*.whl: the machine's own packages"
    return
  fi
  files=(.whl/*.whl)
  if [ "${GPU_TRACE_TRANSFORMERS:-pinned}" = pinned ] && compgen -G ".whl/pinned/*.whl" >/dev/null
  then
    files+=(.whl/pinned/*.whl)
  fi
  limit=$(limit_for "$l_wheels")
  # Into python3's own site-packages, beside torch: the recorder names a frame by its path under
  # site-packages, and the drivers read the source line there (a --target folder such as
  # /tmp/site has no site-packages in its path). An earlier /tmp/site on PYTHONPATH is dropped.
  say "wheels: ${files[*]} -> python3's site-packages"
  if timeout -k 5 "$limit" "$PY" -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade "${files[@]}" >>"$log" 2>&1; then
    PYTHONPATH=$(printf '%s' "${PYTHONPATH:-}" | tr ':' '\n' | grep -v '^/tmp/site/*$' | paste -sd:)
    export PYTHONPATH
    detail="installed into python3's site-packages"
  else
    site=/tmp/gpu-trace/site-packages
    say "wheels: not into python3's site-packages; into $site instead"
    limit=$(limit_for $((l_wheels - (SECONDS - t0))))
    timeout -k 5 "$limit" "$PY" -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target "$site" "${files[@]}" >>"$log" 2>&1 || rc=$?
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    detail="installed into $site (the drivers' source lookups miss these packages' lines)"
  fi
  "$PY" -c 'import deepspeed, transformers; print("deepspeed", deepspeed.__version__,
"transformers", transformers.__version__)' >>"$log" 2>&1 || rc=1
  [ "$rc" -eq 0 ] || rc=1
  record wheels "$(status_of $rc)" $((SECONDS - t0)) "$detail"
}

# -- traces ---------------------------------------------------------------------------------------
one_trace() {  # one_trace IMPL SHAPE LIMIT
  local t0=$SECONDS base=$out/traces/$1--$2 rc status left
  local extra=()
  if [ "$dev" = cuda ]; then
    extra=(--raw-snapshot "$base.pickle.gz" --sdpa "${GPU_TRACE_SDPA:-real}"
           --sdpa-backend "${GPU_TRACE_SDPA_BACKEND:-flash}")
  fi
  timeout -k 5 "$3" "$PY" calibrate/tracer/gpu_leg.py trace --impl "$1" --shape "$2" \
    --device "$dev" --out "$base.json" "${extra[@]}" >"$base.log" 2>&1
  rc=$?
  status=$(status_of $rc)
  left=$((stop - SECONDS))
  # DeepSpeed's code under its CUDA accelerator failed: once more under its CPU accelerator (as
  # the CPU traces run), the tensors still CUDA's.
  if [ $rc -ne 0 ] && [ "$dev" = cuda ] && [[ $1 == deepspeed-* ]] && [ "$left" -gt 20 ]; then
    [ "$left" -gt "$3" ] && left=$3
    timeout -k 5 "$left" "$PY" calibrate/tracer/gpu_leg.py trace --impl "$1" --shape "$2" \
      --device "$dev" --out "$base.json" "${extra[@]}" --ds-accelerator cpu \
      >"$base.retry.log" 2>&1
    rc=$?
    status="$(status_of $rc) (retried with DS_ACCELERATOR=cpu after: $status)"
  fi
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$status" $((SECONDS - t0)) >>"$out/traces/status.tsv"
}

traces() {
  local t0=$SECONDS list=$out/traces/list.txt impl shapes shape left n=0 bad=0 stop
  mkdir -p "$out/traces"
  : >"$out/traces/status.tsv"
  : >"$list"
  step_out=$list step list "$l_list" "$PY" calibrate/tracer/trace.py --list
  if [ ! -s "$list" ]; then record traces failed 0 "trace.py --list listed nothing"; return; fi
  stop=$((SECONDS + $(limit_for "$l_traces")))
  while IFS= read -r line; do
    impl=${line%%:*}
    shapes=${line#*:}
    if [ -n "${GPU_TRACE_IMPLS:-}" ] && [[ ",$GPU_TRACE_IMPLS," != *",$impl,"* ]]; then continue; fi
    read -ra shapes <<<"${shapes//,/ }"
    [ "$mode" = dry-run ] && shapes=("${shapes[0]}")
    for shape in "${shapes[@]}"; do
      while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
      left=$((stop - SECONDS))
      if [ "$left" -lt 10 ]; then
        printf '%s\t%s\tskipped: no time left\t0\n' "$impl" "$shape" >>"$out/traces/status.tsv"
        continue
      fi
      [ "$left" -gt "$trace_limit" ] && left=$trace_limit
      n=$((n + 1))
      one_trace "$impl" "$shape" "$left" &
    done
  done <"$list"
  wait
  bad=$(awk -F'\t' '$3 !~ /^ok/' "$out/traces/status.tsv" | wc -l)
  if [ "$bad" -eq 0 ]; then
    record traces ok $((SECONDS - t0)) "$n traces"
  else
    record traces partial $((SECONDS - t0)) "$bad of $(wc -l <"$out/traces/status.tsv") not ok"
  fi
}

# -- baseline -------------------------------------------------------------------------------------
baseline() {
  local args=(--out-dir "$out/baseline" --device "$dev" --steps "${GPU_TRACE_STEPS:-2}")
  if [ "$dev" = cuda ]; then
    args+=(--seq "${GPU_TRACE_SEQ:-32000}" --trainable-layers "${GPU_TRACE_TRAINABLE_LAYERS:-8}"
           --raw-snapshot)
  else  # Llama-3-8B's shape scaled down: 2 layers, hidden 256, GQA 4:1, vocab 1024, 256 tokens
    args+=(--layers 2 --hidden 256 --intermediate 896 --heads 4 --kv-heads 1 --vocab 1024
           --seq 256 --trainable-layers 1)
  fi
  step baseline "$l_baseline" "$PY" calibrate/tracer/gpu_leg.py baseline "${args[@]}"
}

# -- pack -----------------------------------------------------------------------------------------
pack_outputs() {
  local t0=$SECONDS rc=0 d
  [ -f "$out/traces/status.tsv" ] && cp "$out/traces/status.tsv" "$traces_status"
  if [ "$pack" != 1 ]; then record pack skipped 0 "not asked for"; return; fi
  for d in traces baseline; do
    [ -d "$out/$d" ] || continue
    if timeout -k 5 "$(limit_for "$l_pack")" tar -czf "$out/$d.tar.gz" -C "$out" "$d" 2>>"$log"
    then
      rm -rf "${out:?}/$d"
    else
      rc=1
      rm -f "$out/$d.tar.gz"
    fi
  done
  record pack "$(status_of $rc)" $((SECONDS - t0))
}

: >"$log"
say "gpu-trace.sh $mode into $out (budget ${budget} s, python $PY)"
if [ "$mode" = gpu ]; then
  { nvidia-smi; "$PY" -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'; } \
    >>"$log" 2>&1
fi
wheels
traces
baseline
pack_outputs
say "manifest"
[ -f "$out/traces/status.tsv" ] && cp "$out/traces/status.tsv" "$traces_status"
"$PY" calibrate/tracer/gpu_leg.py manifest --out-dir "$out" --steps "$steps" --mode "$mode" \
  --traces-status "$traces_status" >>"$log" 2>&1 ||
  echo "gpu-trace.sh: the manifest was not written (see $log)" >&2
say "done in $SECONDS s"
exit 0
