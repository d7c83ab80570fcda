//===- ir/Target.h - Hardware a plan runs on, and the built-in catalogue -===//
//
// A Target is one device: memory, bandwidth, dense peak FLOP/s per dtype,
// links to the host and to other devices, and the efficiency factors the time
// model applies. The built-in catalogue holds datasheet numbers for common
// NVIDIA GPUs; docs/targets.md gives the source of every number. A .tally file
// can declare its own `target` block, which Sema turns into the same struct.
//
//===----------------------------------------------------------------------===//
#ifndef TALLY_IR_TARGET_H
#define TALLY_IR_TARGET_H

#include "ir/Dtype.h"

#include "llvm/ADT/StringRef.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tally {

/// Efficiency factors: achieved fraction of peak by op class, used by the time
/// model (time = max(flops/peak, bytes/bw) / efficiency). Defaults are typical
/// measured fractions on current NVIDIA GPUs; docs/targets.md explains each.
struct Efficiency {
  double matmul = 0.7;        ///< Large GEMMs (cuBLAS) vs. dense tensor peak.
  double attention = 0.6;     ///< Fused (flash) attention vs. dense peak.
  double elementwise = 0.8;   ///< Bandwidth-bound kernels vs. memory bandwidth.
  double communication = 0.8; ///< Collective bus bandwidth vs. interconnect.
  double hostLink = 0.8;      ///< Pinned host<->device copies vs. PCIe peak.
};

/// One measured point of a matmul efficiency curve: a call of `flops` FLOPs ran at
/// `efficiency` of the target's peak for its dtype (as kernelTime defines it).
struct CurvePoint {
  double flops = 0;      ///< FLOPs of one matmul call (2·M·N·K·batch), > 0.
  double efficiency = 0; ///< In (0, 1].
};

/// The measured efficiency of matmuls in one dtype by size (`tally calibrate`): points in
/// strictly increasing `flops`. Used instead of Efficiency::matmul when present.
struct MatmulCurve {
  Dtype dtype = Dtype::F32;
  std::vector<CurvePoint> points;
};

/// The efficiency at `flops` FLOPs per call: linear in log(flops) between neighbouring
/// points, the end point's value outside the measured range. 0 when `points` is empty.
double interpolateCurve(const std::vector<CurvePoint> &points, double flops);

/// The elements above which the CPU runtime's kernels run on a team of OpenMP threads
/// (`detail::region(threads, n > 4096, ...)`, codegen/runtime/cpu); at or below it a call runs
/// on the calling thread and starts no team (Target::forkOverhead; passes/KernelTime.cpp,
/// forkingCalls; tally calibrate's samples, tools/calibrate).
constexpr double kForkElements = 4096;
/// The runtime's matmul starts its team above this many multiply-adds (batch·M·N·K, 128³; the
/// forward and both backward matmuls of an op have the same count) and its fused attention
/// above kForkAttentionWork (B·H·S·S_kv·hd): codegen/runtime/cpu/rt_matmul.h, rt_attention.h.
constexpr double kForkMatmulWork = 2097152;
constexpr double kForkAttentionWork = 65536;
/// The CPU runtime's fused attention takes queries and keys in tiles of this many
/// (codegen/runtime/cpu/rt_attention.h: kAttnQB, kAttnKB) and runs its two GEMMs on every tile
/// up to the diagonal whole, masking the scores above it after.
constexpr double kHostAttentionTile = 64;
/// The scores of one causal s × s matrix (one batch row and head) that a kernel taking tiles of
/// `tile` queries and keys computes: each query tile of q rows (the last may be short) sees the
/// keys up to its last row, q × (its first row + q); tile × tile · n(n+1)/2 for s = n · tile,
/// against the s(s+1)/2 of the triangle itself (12,288 against 8,256 at s = 128: 1.49×; 1.25× at
/// s = 256).
inline double tiledCausalScores(double s, double tile) {
  if (!(s > 0) || !(tile > 0))
    return 0;
  const double n = std::floor(s / tile), rest = s - n * tile;
  return tile * tile * n * (n + 1) / 2 + rest * s;
}

/// One device. Rates are per device, dense (no 2:4 sparsity), in base units.
struct Target {
  std::string name;         ///< Catalogue key, e.g. "H100_SXM".
  std::string description;  ///< e.g. "NVIDIA H100 SXM5 80GB".
  double memoryBytes = 0;   ///< Device memory in bytes as the driver reports it (a catalogue
                            ///< GPU: NVML's total; H100_SXM: 81,559 MiB = 85.52e9 B).
  double datasheetMemory = 0; ///< The vendor's rounded figure where it differs (H100_SXM:
                              ///< 80e9, "80GB"): the lecture's max-params arithmetic.
  /// The memory as the datasheet states it: datasheetMemory, else memoryBytes.
  double statedMemory() const { return datasheetMemory > 0 ? datasheetMemory : memoryBytes; }
  double bandwidth = 0;     ///< Device memory bandwidth, B/s.
  double peakF64 = 0;       ///< FP64 Tensor Core rate where the GPU has one
                            ///< (what DGEMM reaches), else the vector rate.
  double peakF32 = 0;       ///< Non-tensor FP32 (CUDA cores).
  double peakTF32 = 0;      ///< TF32 Tensor Core.
  double peakF16 = 0;       ///< FP16 Tensor Core, FP32 accumulate.
  double peakBF16 = 0;      ///< BF16 Tensor Core, FP32 accumulate.
  double peakFP8 = 0;       ///< FP8 Tensor Core, FP32 accumulate; 0 if none.
  double peakINT8 = 0;      ///< INT8 Tensor Core, OP/s.
  double hostLink = 0;      ///< Host<->device B/s per direction (PCIe).
  double interconnect = 0;  ///< Device<->device B/s per direction (NVLink, or
                            ///< PCIe where the GPU has no NVLink).
  double hostMemoryBytes = 0; ///< Host RAM per device assumed available for
                              ///< offload (e.g. 2 TB per 8-GPU node -> 256e9).
  /// The node the device sits in (docs/targets.md, "Nodes"): devices that share
  /// `interconnect` (one NVLink domain); traffic between nodes crosses `network`.
  int64_t gpusPerNode = 1;
  double network = 0;       ///< Inter-node B/s per device per direction (the
                            ///< node's NICs divided by its devices); 0: the
                            ///< host link.
  double linkLatency = 0;   ///< Seconds per step of a collective inside a node.
  double networkLatency = 0; ///< Seconds per step of a collective across nodes.
  /// linkLatency and networkLatency are the Simple protocol's ring step on each tier (NCCL's
  /// tuner: 3.4 us over NVLink, 5.7 us over PCIe, 14 us across nodes); passes/Collectives.cpp
  /// scales NCCL's other latencies (LL, LL128, trees, NVLS, PAT) by them.
  /// Compute capability × 10 (80 Ampere, 90 Hopper, 100 Blackwell; 0 not stated): which of
  /// NCCL's per-architecture constants apply (NVLS, the LL protocol's cap).
  int computeCapability = 0;
  /// The node's NVLink switch reduces and multicasts (NVLink SHARP, NCCL's NVLS algorithm):
  /// NVSwitch-connected Hopper and later (`nvls = true | false`).
  bool nvlinkSwitch = false;
  /// The network reduces in its switches (SHARP, NCCL's CollNet): no catalogue node says so;
  /// a plan may (`sharp = true`).
  bool collnet = false;
  /// The fused attention kernel written for this GPU (FlashAttention-3, cuDNN's through
  /// Transformer Engine on Hopper), which overlaps its exps with its matmuls: the efficiency of
  /// its matmul FLOPs (as efficiency.attention, which holds for FlashAttention-2), solved from a
  /// published rate (ir/Target.cpp, kernelRates); 0: none. The stack decides which runs
  /// (passes/Stack.cpp, runsNativeAttention).
  double nativeAttention = 0;
  /// Framework memory per device (docs/memory.md §9): the CUDA context, the communication
  /// buffers of one communicator (NCCL_BUFFSIZE × channels), and the caching allocator's
  /// reserve as a fraction of what it hands out. Catalogue GPUs have documented defaults;
  /// a declared target has none unless it says so (`cuda_context`, `comm_buffer`,
  /// `allocator_reserve`); the host target has none (no CUDA, no NCCL).
  double contextBytes = 0, commBufferBytes = 0, allocatorReserve = 0;
  Efficiency efficiency;
  /// The fixed cost of one kernel call: a host term, only the calibrated `host` sets it (0
  /// turns it off). With `forkOverhead` it is a call that runs on the calling thread alone (the
  /// runtime's kernels below their threading bound: kForkElements); without it (a host file of calibration
  /// protocol 5 or older) every call's, the OpenMP team's start and join included.
  double kernelOverhead = 0;     ///< seconds per kernel call (`kernel_overhead`)
  /// What a call that starts a team of OpenMP threads pays in place of kernelOverhead: the
  /// team's start and join (`fork_overhead`, an empty parallel region as `tally calibrate`
  /// measured it); 0: every call pays kernelOverhead.
  double forkOverhead = 0;       ///< seconds per threaded kernel call (`fork_overhead`)
  /// The optimizer update's bytes per second as `tally calibrate` measured the step's own loop
  /// (`optimizer_bandwidth`; 0: priced at the bandwidth and elementwise efficiency).
  double optimizerBandwidth = 0;
  /// The least time one kernel call takes on a device the host CPU launches kernels on: the
  /// CPU's cost of one launch (a stream cannot start kernels faster than they are launched),
  /// a floor under each call's time (docs/time.md §2). Catalogue GPUs have a documented
  /// default (ir/Target.cpp, KernelLaunch); a declared target none unless it says so
  /// (`kernel_launch`); a plan may override it (0: launches cost nothing, as under CUDA
  /// graphs); the host has none (its kernels run on the calling CPU: kernelOverhead).
  double kernelLaunch = 0;       ///< seconds per kernel call, a floor (`kernel_launch`)
  /// The time of one transcendental evaluation (exp, erf, tanh, sin, cos) with the whole
  /// device: on the host measured by `tally calibrate` on the CPU runtime's own kernels; on a
  /// catalogue GPU its special-function units' rate (16 per clock per multiprocessor,
  /// ir/Target.cpp); 0 turns the term off.
  double transcendentalTime = 0; ///< seconds per evaluation (`transcendental`)
  /// The arithmetic of the CPU runtime's unary elementwise kernels as `tally calibrate`
  /// measured each (`elementwise_time { gelu = 0.9 ns, gelu_grad = 1 ns, ... }`): seconds per
  /// element with the whole device, forward and gradient, the kernel's time less relu's (which
  /// moves the same bytes). A kind measured here is priced by it instead of its FLOPs at the
  /// peak and its transcendentals (kernelTimeTerms): GELU's erf is two polynomial fits and an
  /// exp, several times one exp's time once exp is vectorised. 0: not measured.
  /// The row kernels (layer_norm, rms_norm, softmax, cross_entropy: a reduction per row) also
  /// have seconds per row (`row_time { layer_norm = 15 ns, layer_norm_grad = 20 ns, ... }`):
  /// their arithmetic is per row + per element (rowKernelArithmetic).
  struct UnaryTime {
    std::string op;            ///< the op's name in the language (gelu, gelu_tanh, silu, ...)
    double forward = 0, gradient = 0;
    double forwardRow = 0, gradientRow = 0;
  };
  std::vector<UnaryTime> unaryTimes;
  /// The measured seconds per element of unary kind `op` (its gradient when `gradient`); 0
  /// when not measured.
  double unaryTime(llvm::StringRef op, bool gradient) const;
  /// The measured seconds per row of row kernel `op` (its gradient when `gradient`); 0 when not
  /// measured.
  double rowTime(llvm::StringRef op, bool gradient) const;
  /// The names `elementwise_time` and `row_time` accept for the row kernels.
  static const std::vector<std::string> &rowKernelNames();
  /// Streaming multiprocessors of a catalogue GPU (0 when not stated).
  int64_t multiprocessors = 0;
  /// The clock, Hz, at which the datasheet's peaks (and the special-function rate) are given:
  /// a catalogue GPU's boost clock; 0 when not stated. A plan's `clock = 1.6 GHz` runs the part
  /// at another clock (withClock).
  double clock = 0;
  /// The datasheet clock, which withClock leaves: MFU and HFU count against the datasheet's
  /// peak whatever clock the part runs at.
  double boostClock = 0;
  /// The cache the kernels' threads keep their data in (the L2 of each thread's core, summed)
  /// and its bandwidth: a kernel call moving at most `cacheBytes` reads what the previous
  /// kernel just wrote, from the cache (`cache`, `cache_bandwidth`; 0: every byte from memory).
  double cacheBytes = 0, cacheBandwidth = 0;
  /// Measured matmul efficiency by size and dtype (only the calibrated `host` target has
  /// them); a dtype without a curve uses efficiency.matmul.
  std::vector<MatmulCurve> matmulCurves;
  /// Measured efficiency of the runtime's fused attention by FLOPs per call (only the
  /// calibrated `host` has one): small heads pay fixed costs per (batch, head).
  std::vector<CurvePoint> attentionCurve;
  /// The tile of queries and keys the calibrated runtime's attention computes in
  /// (`attention_tile`, kHostAttentionTile): the curve's FLOPs are then of the scores those
  /// tiles compute (tiledCausalScores), and a causal call's FLOPs are priced so (passes/
  /// StepTime.cpp, asRun); 0 (a host file from before it was written): of the triangle.
  int64_t attentionTile = 0;
  /// The calibrated host only: the OpenMP threads its numbers were measured with (`threads`,
  /// written by `tally calibrate`); 0 when not said.
  int64_t threads = 0;
  /// The fraction of this target's machine that one rank has (shareHost); 1 for every GPU.
  double share = 1;
  /// The OpenMP threads each rank runs with, when the run says so (shareHost); 0: the default.
  int64_t threadsPerRank = 0;
  std::string source;       ///< Short citation of the datasheet.

  /// The calibrated `host` is one machine, and every rank of a plan on it runs on that
  /// machine's cores (`tally run` starts them all there under mpirun, each with cores / ranks
  /// OpenMP threads): each rank gets 1/ranks of its FLOP/s, memory bandwidth, cache, memory
  /// and transcendental rate, and no more than its threads' part of the `threads` measured
  /// (`tally run --threads T`: T / threads). Sets this target to what each of `ranks` ranks
  /// gets, with `runThreads` threads each (0: the default, cores / ranks, or the count given
  /// before); callable again (it rescales from the share it has). GPUs are devices of their
  /// own: for every other target this does nothing.
  void shareHost(int64_t ranks, int64_t runThreads = 0);
  /// The OpenMP threads one rank's kernels run a team of: the `threads` measured times this
  /// target's share of the machine, at least 1; 1 when `threads` is not said.
  double teamThreads() const {
    return threads > 0 ? std::max(1.0, std::round(double(threads) * share)) : 1;
  }
  /// Whether this is the calibrated `host` (this machine's CPU), not a GPU.
  bool isHost() const { return name == "host"; }

  /// The efficiency of a matmul of `flops` FLOPs per call computed in dtype d: the
  /// dtype's measured curve when there is one, else efficiency.matmul.
  double matmulEfficiency(Dtype d, double flops) const;
  /// Dtype d's measured matmul curve (matmulEfficiency reads it), or null.
  const MatmulCurve *matmulCurve(Dtype d) const;
  /// The efficiency of an attention call of `flops` FLOPs: the attention curve when there is
  /// one, else efficiency.attention.
  double attentionEfficiency(double flops) const;

  /// Peak FLOP/s for ops computed in dtype d (F64 -> peakF64, F32 -> peakF32,
  /// TF32 -> peakTF32, F16/BF16, FP8 both kinds, I8/U8 -> peakINT8). 0 if
  /// unsupported (other integer types, Bool, Invalid, or a zero field), so a
  /// caller can diagnose "this target cannot compute in d".
  double peakFor(Dtype d) const;

  /// Ridge point (FLOP/byte) = peakFor(d) / bandwidth: ops with a lower
  /// arithmetic intensity are memory-bound. 0 if either number is 0.
  double ridge(Dtype d) const;
};

/// The built-in catalogue: H100_SXM, H100_PCIe, H200, A100_80GB, A100_40GB,
/// B200, RTX_4090, in that order.
const std::vector<Target> &targetCatalogue();

/// The catalogue entry whose name matches exactly (case-sensitive), or nullptr
/// if unknown. Callers can suggest a name with closest-match over the
/// catalogue.
const Target *findTarget(llvm::StringRef name);

/// `t` run at `hz` instead of its datasheet clock (Target::clock, which must be set): every
/// arithmetic peak and the special-function rate scale by hz / clock — a GPU issues the same
/// instructions per clock at any clock — and memory, links and efficiencies stay (HBM runs on
/// its own clock; an efficiency is a fraction of the peak). For a part held below its boost
/// clock by a power cap (docs/targets.md, "Clocks and power caps").
void withClock(Target &t, double hz);

/// Loads a target that is not declared in the input or the catalogue: `host` (this
/// machine, calibrated) or a path ending in `.tally` whose file declares one target. The
/// core library cannot measure the machine (that needs OpenBLAS), so the tally binary
/// installs the loader (tools/tally/Calibrate.cpp); it returns nullopt with `error` set.
using ExternalTargetLoader =
    std::function<std::optional<Target>(llvm::StringRef name, std::string &error)>;

/// Installs the loader that loadExternalTarget calls (null to remove it).
void setExternalTargetLoader(ExternalTargetLoader loader);

/// True for the names loadExternalTarget handles: "host" and paths ending in ".tally".
bool isExternalTargetName(llvm::StringRef name);

/// Loads `name` through the installed loader; without one, nullopt and an error saying so.
std::optional<Target> loadExternalTarget(llvm::StringRef name, std::string &error);

} // namespace tally

#endif // TALLY_IR_TARGET_H
