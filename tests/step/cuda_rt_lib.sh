#!/usr/bin/env bash
# ctest cuda-runtime-lib: the CUDA runtime (codegen/runtime/cuda, header-only) compiled once into
# OUT_DIR/libtally_rt_cuda.a, which cuda-step-compiles and cuda-check-compiles link (a ctest
# fixture, cuda_rt, that both require) instead of compiling the runtime's kernels again in every
# generated step and check translation unit.
#   cuda_rt_lib.sh OUT_DIR [NVCC]
# tests/step/cuda_rt_lib.cu compiled once per storage type (float, bf16, fp16; in parallel) with
# the flags of a generated step's Release build (-O3 -DNDEBUG, -arch=sm_90, C++17): the explicit
# instantiations of tests/step/cuda_rt_instances.h. The users force-include
# tests/step/cuda_rt_extern.cuh, the matching explicit instantiation declarations.
# The 16-bit types are compiled to PTX only (code=compute_90, no ptxas): the C++ and the device
# code of every kernel are still checked for them, and the linked steps still link, but only the
# float instantiations are assembled into sm_90 machine code (ptxas took 24 of each type's ~51 s
# of CPU, 2026-12-07). The library exists for the compile checks; a step or cuda_check linked
# with it would JIT its 16-bit kernels on a GPU, so scripts/gpu-validate builds without it.
# Up to date (nothing compiled) when OUT_DIR/inputs.sha256 matches the hash of nvcc's version,
# the flags and every file the library is built from. Environment: CUDA_ARCH (default sm_90).
# Exit 77 (ctest's skip code) with the reason printed where nvcc is absent.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:?usage: cuda_rt_lib.sh OUT_DIR [NVCC]}"
nvcc="${2:-}"
if [[ -z "$nvcc" || ! -x "$nvcc" ]]; then
  nvcc="$(command -v nvcc || true)"
  [[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
fi
if [[ -z "$nvcc" ]]; then
  echo "skipped: nvcc not found (install the CUDA toolkit to build the CUDA runtime)"
  exit 77
fi
arch="${CUDA_ARCH:-sm_90}"
flags=(-std=c++17 -O3 -DNDEBUG -I"$root/codegen/runtime" -I"$here")
lib="$out/libtally_rt_cuda.a"
mkdir -p "$out"

ptx_only=(-gencode "arch=compute_${arch#sm_},code=compute_${arch#sm_}")
inputs="$( { echo "$nvcc ${flags[*]} -arch=$arch ${ptx_only[*]}"; "$nvcc" --version
             cat "$root"/codegen/runtime/cuda/* "$root"/codegen/runtime/common/* \
                 "$here/cuda_rt_lib.cu" "$here/cuda_rt_instances.h"; } | sha256sum | cut -d' ' -f1)"
if [[ -f "$lib" && -f "$out/inputs.sha256" && "$(cat "$out/inputs.sha256")" == "$inputs" ]]; then
  echo "up to date: $lib"
  exit 0
fi
rm -f "$lib" "$out/inputs.sha256"

start=$(date +%s)
pids=()
for t in float bf16 f16; do
  def=$t
  per_type=("-arch=$arch")   # float: sm_90 machine code (and its PTX)
  [[ $t != float ]] && def="rt::$t" && per_type=(-DTALLY_RT_LIB_HALF "${ptx_only[@]}")
  "$nvcc" "${flags[@]}" "-DTALLY_RT_LIB_T=$def" "${per_type[@]}" -c "$here/cuda_rt_lib.cu" -o "$out/rt_$t.o" \
    > "$out/rt_$t.log" 2>&1 &
  pids+=("$!:$t")
done
fail=0
for p in "${pids[@]}"; do
  if ! wait "${p%%:*}"; then
    echo "cuda_rt_lib: compiling the runtime for ${p#*:} failed:"
    cat "$out/rt_${p#*:}.log"
    fail=1
  fi
done
(( fail )) && exit 1
ar rcs "$lib" "$out/rt_float.o" "$out/rt_bf16.o" "$out/rt_f16.o"
echo "$inputs" > "$out/inputs.sha256"
echo "built $lib (the CUDA runtime for float, $arch, and bf16 and fp16 as PTX) in $(( $(date +%s) - start )) s"
