#!/usr/bin/env bash
# Builds tests/step/cuda_check (the CUDA runtime against the CPU runtime) with nvcc: five
# translation units compiled in parallel, then linked. Used by ctest (cuda-check-compiles, on
# machines without a GPU too) and by scripts/gpu-validate.
#   tests/step/cuda_check_build.sh OUT_DIR [NVCC]     (from anywhere; writes OUT_DIR/cuda_check)
# Environment: CUDA_ARCH (default sm_90), CUDA_CHECK_JOBS (parallel compiles, default: all at once),
# CUDA_CHECK_NAIVE_BLAS=1 (use the reference GEMM even where OpenBLAS is installed).
# Without OpenBLAS (pkg-config openblas) the CPU runtime's GEMM calls go to the plain reference
# GEMM of cuda_check_blas.cpp (tests/step/cuda_blas_shim/cblas.h), so a GPU machine needs only
# the CUDA toolkit. Exit 77 (ctest's skip code) with a printed reason when nvcc is missing.
# TALLY_CUDA_RT_LIB=libtally_rt_cuda.a (ctest sets it: the fixture cuda-runtime-lib,
# tests/step/cuda_rt_lib.sh): link the CUDA runtime prebuilt for every storage type instead of
# compiling it here: the .cu files get its explicit instantiation declarations
# (-include tests/step/cuda_rt_extern.cuh), and cuda_instantiate.cu, whose instantiations the
# library holds, is left out. Unset (scripts/gpu-validate): everything compiled here, as before.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:?usage: cuda_check_build.sh OUT_DIR [NVCC]}"
nvcc="${2:-}"
if [[ -z "$nvcc" ]]; then
  nvcc="$(command -v nvcc || true)"
  [[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
fi
if [[ -z "$nvcc" || ! -x "$nvcc" ]]; then
  echo "skipped: nvcc not found (install the CUDA toolkit to build the CUDA runtime)"
  exit 77
fi
arch="${CUDA_ARCH:-sm_90}"
mkdir -p "$out"
srcs=(cuda_check.cu cuda_check_f32.cu cuda_check_bf16.cu cuda_instantiate.cu cuda_check_cpu.cpp)
if [[ "${CUDA_CHECK_NAIVE_BLAS:-0}" != 1 ]] && pkg-config --exists openblas 2>/dev/null; then
  blas_cflags="$(pkg-config --cflags openblas)"
  blas_libs="$(pkg-config --libs openblas)"
else
  echo "OpenBLAS not used: the CPU reference's GEMM is tests/step/cuda_check_blas.cpp"
  blas_cflags="-I$root/tests/step/cuda_blas_shim"
  blas_libs=""
  srcs+=(cuda_check_blas.cpp)
fi
common=(-std=c++17 -O2 "-arch=$arch" -I"$root" -Xcompiler -fopenmp)
cu_flags=()
rt_lib=()
if [[ -n "${TALLY_CUDA_RT_LIB:-}" ]]; then
  if [[ ! -f "$TALLY_CUDA_RT_LIB" ]]; then
    echo "cuda_check_build: TALLY_CUDA_RT_LIB=$TALLY_CUDA_RT_LIB: no such library (ctest cuda-runtime-lib builds it)"
    exit 1
  fi
  kept=()
  for s in "${srcs[@]}"; do [[ "$s" != cuda_instantiate.cu ]] && kept+=("$s"); done
  srcs=("${kept[@]}")
  cu_flags=(-I"$root/codegen/runtime" -include "$root/tests/step/cuda_rt_extern.cuh")
  rt_lib=("$TALLY_CUDA_RT_LIB")
  echo "linking the prebuilt CUDA runtime $TALLY_CUDA_RT_LIB (cuda_instantiate.cu's instances are in it)"
fi
jobs="${CUDA_CHECK_JOBS:-${#srcs[@]}}"
pids=()
fail=0
start=$(date +%s)
for s in "${srcs[@]}"; do
  while (( $(jobs -rp | wc -l) >= jobs )); do sleep 1; done
  extra=()
  [[ "$s" == *.cu ]] && extra=("${cu_flags[@]}")
  # shellcheck disable=SC2086
  "$nvcc" "${common[@]}" "${extra[@]}" $blas_cflags -c "$root/tests/step/$s" -o "$out/${s%.*}.o" > "$out/${s%.*}.log" 2>&1 &
  pids+=("$!:$s")
done
for p in "${pids[@]}"; do
  if ! wait "${p%%:*}"; then
    echo "cuda_check_build: compiling ${p#*:} failed:"
    cat "$out/$(basename "${p#*:}" | sed 's/\.[^.]*$//').log"
    fail=1
  fi
done
(( fail )) && exit 1
# shellcheck disable=SC2086
objs=()
for s in "${srcs[@]}"; do objs+=("$out/${s%.*}.o"); done
"$nvcc" "-arch=$arch" "${objs[@]}" "${rt_lib[@]}" -Xcompiler -fopenmp $blas_libs -lcublasLt -lcudnn -o "$out/cuda_check" || exit 1
echo "built $out/cuda_check with $nvcc for $arch in $(( $(date +%s) - start )) s"
