#!/usr/bin/env bash
# ctest cuda-step-compiles: the generated CUDA training step compiles and links with nvcc.
#   cuda_step_compiles.sh TALLY SOURCE_DIR OUT_DIR [NVCC]
# For each model (TALLY_CUDA_STEP_MODELS, default "gpt dp:dp2": tests/step/e2e/<m>.tally, with
# `:plan` a plan of it): `tally build --backend cuda -o OUT_DIR/<m>`, then the folder's own
# CMakeLists.txt configured with that nvcc and built (step.cu and driver_cuda.cu, -arch=sm_90,
# cuBLASLt; dp2 is data parallel: MPI and NCCL, which the binary must link). The steps fuse their
# elementwise runs (the CUDA default). Nothing is run: this machine has no GPU. Exit 77
# (skipped) with the reason where nvcc is absent.
# TALLY_CUDA_RT_LIB (ctest sets it: the fixture cuda-runtime-lib, tests/step/cuda_rt_lib.sh): the
# prebuilt CUDA runtime, libtally_rt_cuda.a. Each step's CMakeLists.txt is then configured with
# tests/step/cuda_rt_prebuilt.cmake as its project include: step.cu and driver_cuda.cu are still
# compiled by nvcc, but with the runtime's explicit instantiation declarations
# (cuda_rt_extern.cuh), so only the step's own (fused) kernels are compiled there, and the
# runtime's come from the library at the link. Unset: the step builds exactly as a user's does.
# Then the steps whose folder equals one of those (TALLY_CUDA_STEP_SWAPS, default "llama dp:dp2o
# dp:dp2z dp:tp2 dp:pp2": the Llama block; dp2o overlapping the reduction with the backward, dp2z
# with ZeRO-1; tensor and pipeline parallelism, issue 39 item 7, tensor built with --fuse=false as
# it requires, TALLY_CUDA_STEP_UNFUSED, the pipeline with the default fused kernels): each is generated into its own folder, whose
# CMakeLists.txt and runtime must equal a configured model's (the same build), and its step.cu is
# swapped into that model's configured build, which recompiles step.cu alone and relinks (not a
# second CMake configure, ~4 s of CPU each, or driver); the binary is copied back to its folder.
set -euo pipefail
tally=$1 src=$2 out=$3 nvcc=${4:-}
if [[ -z "$nvcc" || ! -x "$nvcc" ]]; then
  nvcc=$(command -v nvcc || true)
  [[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
fi
if [[ -z "$nvcc" ]]; then
  echo "skipped: nvcc not found (the CUDA toolkit is not installed); the CUDA step cannot be compiled here"
  exit 77
fi
prebuilt=()
if [[ -n "${TALLY_CUDA_RT_LIB:-}" ]]; then
  if [[ ! -f "$TALLY_CUDA_RT_LIB" ]]; then
    echo "FAIL: TALLY_CUDA_RT_LIB=$TALLY_CUDA_RT_LIB: no such library (ctest cuda-runtime-lib builds it)"
    exit 1
  fi
  prebuilt=(-DCMAKE_PROJECT_INCLUDE="$src/tests/step/cuda_rt_prebuilt.cmake"
            -DTALLY_RT_PREBUILT_LIB="$TALLY_CUDA_RT_LIB")
fi
mkdir -p "$out"
# generate ENTRY [FLAG...]: `tally build --backend cuda` of tests/step/e2e/<m>.tally (with
# --plan P for m:P) into OUT_DIR/<m>[_P]; sets m and dir.
generate() {
  local entry=$1 plan=()
  shift
  m=${entry%%:*} dir=$out/${entry//:/_}
  [[ "$entry" == *:* ]] && plan=(--plan "${entry#*:}")
  rm -rf "$dir"
  "$tally" build "$src/tests/step/e2e/$m.tally" "${plan[@]}" --backend cuda "$@" -o "$dir"
}
# links_nccl ENTRY DIR BINARY: a step whose CMakeLists.txt builds with NCCL links it.
links_nccl() {
  # ldd's output captured first: `ldd | grep -q` under pipefail fails when grep stops reading early.
  local libs
  libs=$(ldd "$3")
  if grep -q "TALLY_NCCL" "$2/CMakeLists.txt" && [[ "$libs" != *libnccl* ]]; then
    echo "FAIL: $1: a multi-process step that does not link NCCL"
    exit 1
  fi
}
built=()
for entry in ${TALLY_CUDA_STEP_MODELS:-gpt dp:dp2}; do
  generate "$entry"
  built+=("$dir")
  start=$(date +%s)
  if ! cmake -S "$dir" -B "$dir/build" -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_BUILD_TYPE=Release \
       "${prebuilt[@]}" > "$dir/configure.log" 2>&1; then
    tail -n 40 "$dir/configure.log"
    echo "FAIL: $m: configuring the generated CUDA step"
    exit 1
  fi
  if ! cmake --build "$dir/build" -j 2 > "$dir/build.log" 2>&1; then
    grep -m 20 -E "error|undefined" "$dir/build.log" || tail -n 40 "$dir/build.log"
    echo "FAIL: $m: building the generated CUDA step"
    exit 1
  fi
  if [[ ! -x "$dir/build/tally_step" ]]; then
    echo "FAIL: $m: no tally_step binary after the build"
    exit 1
  fi
  grep -q "sm_90" "$dir/build/CMakeFiles/tally_step.dir/flags.make" || {
    echo "FAIL: $m: not compiled for sm_90"; exit 1; }
  # With the prebuilt runtime: its declarations in the compiles, the library on the link line
  # (CMake may put the libraries in a response file beside link.txt).
  if (( ${#prebuilt[@]} )); then
    tdir=$dir/build/CMakeFiles/tally_step.dir
    grep -q "cuda_rt_extern.cuh" "$tdir/flags.make" || {
      echo "FAIL: $entry: not compiled with the prebuilt runtime's declarations"; exit 1; }
    cat "$tdir/link.txt" "$tdir"/*.rsp 2>/dev/null | grep -q "libtally_rt_cuda.a" || {
      echo "FAIL: $entry: the prebuilt CUDA runtime was not linked"; exit 1; }
  fi
  links_nccl "$entry" "$dir" "$dir/build/tally_step"
  how="the runtime compiled in"
  (( ${#prebuilt[@]} )) && how="linking the prebuilt runtime"
  echo "$entry: step.cu and driver_cuda.cu compiled and linked for sm_90, $how, in $(( $(date +%s) - start )) s (not run: no GPU)"
done

unfused=" ${TALLY_CUDA_STEP_UNFUSED-dp:tp2} "
for entry in ${TALLY_CUDA_STEP_SWAPS-llama dp:dp2o dp:dp2z dp:tp2 dp:pp2}; do
  fuse=()
  [[ "$unfused" == *" $entry "* ]] && fuse=(--fuse=false)
  generate "$entry" "${fuse[@]}"
  start=$(date +%s)
  host=""
  for b in "${built[@]}"; do
    if [[ -x "$b/build/tally_step" ]] && cmp -s "$dir/CMakeLists.txt" "$b/CMakeLists.txt" &&
       diff -rq "$dir/runtime" "$b/runtime" > /dev/null; then
      host=$b
      break
    fi
  done
  [[ -n "$host" ]] || {
    echo "FAIL: $entry: its CMakeLists.txt and runtime equal no configured model's (TALLY_CUDA_STEP_MODELS); it cannot reuse a build"; exit 1; }
  if [[ $m == dp ]] && ! grep -q "TALLY_NCCL" "$dir/CMakeLists.txt"; then
    echo "FAIL: $entry: a multi-process step without NCCL"; exit 1
  fi
  cp "$dir/step.cu" "$host/step.cu"
  if ! cmake --build "$host/build" -j 2 > "$dir/build.log" 2>&1; then
    grep -m 20 -E "error|undefined" "$dir/build.log" || tail -n 40 "$dir/build.log"
    echo "FAIL: $entry: building the generated CUDA step"
    exit 1
  fi
  if grep -q "Building CUDA object.*driver_cuda" "$dir/build.log"; then
    echo "FAIL: $entry: the swap recompiled the driver (${host##*/}'s build is not reused)"; exit 1
  fi
  cp "$host/build/tally_step" "$dir/tally_step"
  links_nccl "$entry" "$dir" "$dir/tally_step"
  echo "$entry: step.cu compiled for sm_90 and linked with ${host##*/}'s driver in $(( $(date +%s) - start )) s (not run: no GPU)"
done
