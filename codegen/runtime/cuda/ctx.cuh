// The CUDA runtime's context and error checking: the stream every kernel runs on, the cuBLASLt
// handle and workspace, the op path of the current call (for error messages), optional
// per-kernel timing with CUDA events, and the launch helper that checks every launch.
//
// The context type is rt::cu::Ctx, spelled rt::Ctx through an alias: the CPU runtime has its own
// rt::Ctx, and because the runtime functions' mangled names include the context's real type, a
// program may link a translation unit built on each runtime (tests/step/cuda_check does).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "../common/tally_common.h"
#include "launch.h"

namespace rt {
namespace cu {

/// A failed CUDA or cuBLASLt call, a failed launch, or bad arguments: the message names the
/// kernel, the op path the generated code was running (Ctx::where) and the CUDA error.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One timed kernel: its name, the op path, and its two events (indices into Ctx's event pool).
struct TimedKernel {
  const char* kernel;
  const char* where;
  int startEvent;
  int stopEvent;
};

/// A measured kernel time (see Ctx::collectTimes).
struct KernelTime {
  std::string kernel;
  std::string where;
  float ms;
};

/// A cached cuBLASLt plan for one matmul shape (descriptors and the heuristic's algorithm).
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

struct DnnPlan;  // a built cuDNN attention graph (cudnn_attention.cuh)

/// The CUDA runtime's context: create with init(), release with destroy() (or the destructor).
struct Ctx {
  cudaStream_t stream = nullptr;       ///< every kernel and matmul runs on this stream
  cublasLtHandle_t lt = nullptr;       ///< cuBLASLt handle
  void* workspace = nullptr;           ///< cuBLASLt workspace and kernel scratch (device)
  size_t workspaceBytes = 0;
  const char* where = "";              ///< op path of the current call (the generated code sets it)
  bool timing = false;                 ///< record CUDA events around every kernel
  bool syncEach = false;               ///< synchronise after every launch (debugging: exact error site)
  /// Attention forward on tensor cores (WMMA) for bf16/fp16 and head sizes 64 and 128. Off by
  /// default until tests/step/cuda_check has compared it with the CPU on a GPU.
  bool attentionTensorCores = false;
  std::vector<cudaEvent_t> events;     ///< event pool, reused across steps
  std::vector<TimedKernel> timed;      ///< kernels recorded since resetTimes()
  std::map<std::string, LtPlan> plans; ///< cuBLASLt plans by shape
  bool owned = false;                  ///< init() created the stream/handle/workspace
  /// cuDNN fused attention (cudnn_attention.cuh): the handle (created at the first call), the
  /// built graphs by shape, and their workspace (grown to the largest graph's need: the
  /// backward's D and fp32 dQ accumulator, then the plan's own), reported as its own memory line.
  cudnnHandle_t dnn = nullptr;
  std::map<std::string, std::shared_ptr<DnnPlan>> dnnPlans;
  void* dnnWorkspace = nullptr;
  size_t dnnWorkspaceBytes = 0;

  Ctx() = default;
  Ctx(const Ctx&) = delete;
  Ctx& operator=(const Ctx&) = delete;
  ~Ctx() { destroy(); }

  /// Creates a stream, a cuBLASLt handle and a workspace of `bytes` on the current device.
  void init(size_t bytes = static_cast<size_t>(cuda_plan::kDefaultWorkspaceBytes));
  /// Releases what init() created (idempotent; errors are ignored at teardown).
  void destroy();
  /// Forgets the recorded kernels (call at the start of a timed step).
  void resetTimes() { timed.clear(); }
  /// Waits for the stream and returns the time of every kernel recorded since resetTimes().
  std::vector<KernelTime> collectTimes();
};

/// Throws Error("<what> failed in <kernel> at <where>: <cuda error>") when e is not cudaSuccess.
inline void check(cudaError_t e, const char* what, const char* kernel, const char* where) {
  if (e == cudaSuccess) return;
  throw Error(std::string("tally cuda runtime: ") + what + " failed in " + kernel + " at '" +
              (where ? where : "") + "': " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

/// As check(), for cuBLASLt status codes.
inline void checkLt(cublasStatus_t s, const char* what, const char* kernel, const char* where) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw Error(std::string("tally cuda runtime: ") + what + " failed in " + kernel + " at '" +
              (where ? where : "") + "': cuBLAS status " + std::to_string(static_cast<int>(s)));
}

/// Throws Error for bad arguments found on the host (shape checks).
[[noreturn]] inline void fail(const char* kernel, const char* where, const std::string& why) {
  throw Error(std::string("tally cuda runtime: ") + kernel + " at '" + (where ? where : "") +
              "': " + why);
}

inline void Ctx::init(size_t bytes) {
  destroy();
  // A blocking stream: it stays ordered with cudaMemcpy/cudaMemset on the legacy default stream.
  check(cudaStreamCreate(&stream), "cudaStreamCreate", "Ctx::init", where);
  checkLt(cublasLtCreate(&lt), "cublasLtCreate", "Ctx::init", where);
  if (bytes) check(cudaMalloc(&workspace, bytes), "cudaMalloc(workspace)", "Ctx::init", where);
  workspaceBytes = bytes;
  owned = true;
}

inline void Ctx::destroy() {
  for (auto& kv : plans) {
    cublasLtMatmulDescDestroy(kv.second.op);
    cublasLtMatrixLayoutDestroy(kv.second.a);
    cublasLtMatrixLayoutDestroy(kv.second.b);
    cublasLtMatrixLayoutDestroy(kv.second.c);
  }
  plans.clear();
  dnnPlans.clear();
  if (dnn) cudnnDestroy(dnn);
  dnn = nullptr;
  if (dnnWorkspace) cudaFree(dnnWorkspace);
  dnnWorkspace = nullptr;
  dnnWorkspaceBytes = 0;
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  events.clear();
  timed.clear();
  if (owned) {
    if (workspace) cudaFree(workspace);
    if (lt) cublasLtDestroy(lt);
    if (stream) cudaStreamDestroy(stream);
  }
  workspace = nullptr;
  workspaceBytes = 0;
  lt = nullptr;
  stream = nullptr;
  owned = false;
}

inline std::vector<KernelTime> Ctx::collectTimes() {
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", "Ctx::collectTimes", where);
  std::vector<KernelTime> out;
  out.reserve(timed.size());
  for (const TimedKernel& t : timed) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, events[t.startEvent], events[t.stopEvent]),
          "cudaEventElapsedTime", t.kernel, t.where);
    out.push_back({t.kernel, t.where ? t.where : "", ms});
  }
  return out;
}

/// Records the start of a timed kernel; returns the index into Ctx::timed, or -1 when not timing.
inline int timeBegin(Ctx& ctx, const char* kernel) {
  if (!ctx.timing) return -1;
  const int need = static_cast<int>(ctx.timed.size()) * 2 + 2;
  while (static_cast<int>(ctx.events.size()) < need) {
    cudaEvent_t e;
    check(cudaEventCreate(&e), "cudaEventCreate", kernel, ctx.where);
    ctx.events.push_back(e);
  }
  TimedKernel t{kernel, ctx.where, need - 2, need - 1};
  check(cudaEventRecord(ctx.events[t.startEvent], ctx.stream), "cudaEventRecord", kernel, ctx.where);
  ctx.timed.push_back(t);
  return static_cast<int>(ctx.timed.size()) - 1;
}

/// Records the end of the timed kernel `index` (from timeBegin).
inline void timeEnd(Ctx& ctx, int index, const char* kernel) {
  if (index < 0) return;
  check(cudaEventRecord(ctx.events[ctx.timed[index].stopEvent], ctx.stream), "cudaEventRecord",
        kernel, ctx.where);
}

/// Checks the launch just made (and, with syncEach, its execution).
inline void checkLaunch(Ctx& ctx, const char* kernel) {
  check(cudaGetLastError(), "launch", kernel, ctx.where);
  if (ctx.syncEach) check(cudaStreamSynchronize(ctx.stream), "execution", kernel, ctx.where);
}

/// Launches `kernel` on the context's stream with a checked launch and optional timing.
/// Nothing is launched for an empty grid.
template <class... KArgs, class... Args>
inline void launch(Ctx& ctx, const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                   size_t shared, Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  const int t = timeBegin(ctx, name);
  kernel<<<grid, block, shared, ctx.stream>>>(static_cast<KArgs>(args)...);
  checkLaunch(ctx, name);
  timeEnd(ctx, t, name);
}

/// Allows `kernel` dynamic shared memory up to `bytes` (needed above 48 KiB).
template <class... KArgs>
inline void allowShared(Ctx& ctx, const char* name, void (*kernel)(KArgs...), int64_t bytes) {
  if (bytes <= 48 * 1024) return;
  check(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
        "cudaFuncSetAttribute(shared memory)", name, ctx.where);
}

/// The context's workspace as scratch of at least `bytes`, or an error naming the kernel.
inline void* scratch(Ctx& ctx, const char* kernel, int64_t bytes) {
  if (bytes > static_cast<int64_t>(ctx.workspaceBytes) || (bytes > 0 && !ctx.workspace))
    fail(kernel, ctx.where, "needs " + std::to_string(bytes) + " bytes of workspace, the context has " +
                                std::to_string(ctx.workspaceBytes));
  return ctx.workspace;
}

}  // namespace cu

/// The CUDA runtime's context (see rt::cu::Ctx).
using Ctx = cu::Ctx;

}  // namespace rt
