// tally calibrate: what it measures and the target it writes. The measurements (measure():
// this machine's matmuls, fp32 and bf16, through the CPU runtime's own rt::matmul — OpenBLAS
// single-threaded per tile, tiles on OpenMP threads —, a STREAM-style triad, elementwise
// kernels, call and exp costs, attention) link OpenBLAS and OpenMP, so they run in an
// executable of their own, tally-measure (Measure.cpp, measure_main.cpp), which prints its
// Result as JSON on stdout (Protocol.cpp); tally runs it as a child process
// (tools/tally/CalibrateMeasure.cpp) and never loads BLAS. The rest — reading the protocol,
// the efficiency curves and the `.tally` target declaration (`target host { ... }`) that Sema
// loads like any user target — is library tallycalibrate (Target.cpp, Protocol.cpp), which
// the tally binary links.
#pragma once

#include "ir/Target.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace tally {
namespace calibrate {

/// How much to measure.
struct Options {
  /// Small sizes and short timings (well under 5 s): for tests, not for estimates.
  bool quick = false;
};

/// One timed matmul shape: C[M×N] = A[M×K] · B[K×N], one rt::matmul call.
struct MatmulSample {
  std::string dtype; ///< "fp32" or "bf16" (tally's dtype names)
  int64_t M = 0, N = 0, K = 0;
  double seconds = 0; ///< The median of the timed calls.
  /// 2·M·N·K.
  double flops() const { return 2.0 * double(M) * double(N) * double(K); }
  /// (M·K + K·N + M·N) × element bytes: what the time model counts for a matmul.
  double bytes() const;
  /// Whether the call starts a team of threads, as the runtime and the estimate decide
  /// (passes/KernelTime.cpp, forkingCalls: more than kForkMatmulWork multiply-adds).
  bool threaded() const { return double(M) * double(N) * double(K) > kForkMatmulWork; }
};

/// The runtime's fused causal attention (fp32, q = k = v [B, S, H·hd]), forward and backward.
struct AttentionSample {
  int64_t B = 0, H = 0, S = 0, hd = 0;
  double forwardSeconds = 0, backwardSeconds = 0; ///< The median call of each.
  /// The scores a causal kernel computes: B·H·S·S·(S + 1)/(2S) (ir/ops/Attention.cpp, computedFraction).
  double scores() const;
  /// The scores its tiles compute (ir/Target.h, tiledCausalScores with kHostAttentionTile):
  /// the GEMMs' work, which the curve's FLOPs count (attentionCurveOf).
  double tiledScores() const;
  /// Whether each call starts a team of threads, as the runtime and the estimate decide
  /// (forkingCalls: B·H·S·S·hd above kForkAttentionWork).
  bool threaded() const {
    return double(B) * double(H) * double(S) * double(S) * double(hd) > kForkAttentionWork;
  }
};

/// One measurement's timed calls as the robust statistics read them (Robust.cpp, issue 46):
/// calls that look like scheduler slices rejected, the median of the rest, and how far its
/// rounds' medians disagree.
struct Timing {
  std::string name;       ///< "matmul fp32 64x64x64", "triad", ...
  int rounds = 0;         ///< The rounds its calls were taken in (more when re-measured).
  int64_t calls = 0;      ///< Timed calls in all.
  int64_t rejected = 0;   ///< Calls rejected as scheduler slices (sliceThreshold).
  double median = 0;      ///< The median of the kept calls, seconds.
  double spread = 1;      ///< The largest ÷ the smallest per-round median of all its calls (≥ 1).
  bool remeasured = false; ///< Its first rounds disagreed (noisyReason), so it was timed again.
  /// The seconds its threads waited for a CPU (runnable while another task ran: Linux's
  /// /proc/self/task/*/schedstat) over its rounds' wall seconds × threads; -1 unknown.
  double waitShare = -1;
};

/// The largest share of a measurement's time its threads may wait for a CPU: a quarter. A call
/// descheduled for most of its time looks like any other when all its calls are (a 2-thread
/// 64³ matmul timed at 12 ms in every call under a load average of 5 on 2 cores, its threads
/// waiting half the time), so the call times alone cannot tell; on an idle machine the share
/// is about 0.

constexpr double kWaitBound = 0.25;

/// The most a measurement's per-round medians may disagree (largest ÷ smallest): 2. The rounds
/// are meant to meet the machine's phases, and the widest quiet phase-to-phase change recorded
/// on the 2-vCPU machine is 1.66× (a matmul alternating between 63 and 38 GFLOP/s), so 2×
/// leaves room for it; the calibration the issue reports was 3.6–620× off.
constexpr double kSpreadBound = 2.0;

/// The Linux scheduler's default minimum slice on `cores` CPUs: 0.75 ms × (1 + ⌊log₂ min(cores,
/// 8)⌋) (kernel/sched/fair.c: sysctl_sched_base_slice, formerly sched_min_granularity, scaled
/// by SCHED_TUNABLESCALING_LOG).
double defaultSchedulerSlice(int cores);

/// This machine's scheduler slice in seconds: read from the kernel's tunables where readable
/// (/sys/kernel/debug/sched/base_slice_ns or min_granularity_ns, /proc/sys/kernel/
/// sched_min_granularity_ns), else defaultSchedulerSlice; `source` says which.
double schedulerSlice(int cores, std::string &source);

/// The time above which a call of a measurement whose fastest call took `fastest` seconds
/// looks descheduled: fastest + max(fastest, slice / 2). A descheduled call waits for another
/// task's slice, so it is at least about a slice longer (half leaves room for a slice cut
/// short); and only a call more than twice the fastest is rejected, so a long kernel's ordinary
/// spread (a 200 ms matmul varies by more than a slice) is never taken for one.
inline double sliceThreshold(double fastest, double slice) {
  return fastest + (fastest > 0.5 * slice ? fastest : 0.5 * slice);
}

/// The statistics of one measurement from its call times, per round (seconds): calls above
/// sliceThreshold of the fastest call rejected, the median of the kept calls (of all its
/// calls when none is rejected, as before), and the spread of the per-round medians of all the
/// calls (a few slices do not move a round's median; a round mostly descheduled does).
Timing summarize(const std::string &name, const std::vector<std::vector<double>> &rounds, double slice);

/// Why a measurement's numbers cannot be trusted ("" when they can): its rounds' medians
/// disagree beyond kSpreadBound, more than half of its calls were rejected as slices, or its
/// threads waited for a CPU more than kWaitBound of its time.
std::string noisyReason(const Timing &t);

/// Everything one calibration measured.
struct Result {
  std::string cpuModel;       ///< /proc/cpuinfo "model name", or "unknown CPU"
  /// The kernels OpenBLAS runs (openblas_get_corename: "Haswell", "Cooperlake", ...) and the
  /// OPENBLAS_CORETYPE that chose them, "" when OpenBLAS chose them itself; whether the CPU has
  /// the AVX-512 (F, DQ, BW, VL) that OpenBLAS's SkylakeX and Cooperlake kernels run on.
  std::string blasCore, blasCoreEnv;
  bool avx512 = false;
  int cores = 0;              ///< Processors online.
  int threads = 0;            ///< OpenMP threads the runtime's kernels use.
  double memoryBytes = 0;     ///< Physical RAM.
  double triadBandwidth = 0;  ///< a[i] = b[i] + s·c[i], B/s counting 3 × 4 bytes per element.
  double cacheBytes = 0;      ///< The L2 of one core × the threads (0: unknown).
  double cacheBandwidth = 0;  ///< The same triad over arrays filling half of cacheBytes.
  double elementwiseBandwidth = 0; ///< rt::unary_fwd (relu) and rt::scale, fp32: B/s counting read + write.
  /// The step's optimizer loop, fp32 AdamW (rt::adam_update, then rt::fill of the gradients as
  /// zero_grad): B/s counting 2 × (param + grad + 2 states) × 4 bytes per element, as
  /// passes/StepTime.cpp counts an update's bytes (0: not measured).
  double optimizerBandwidth = 0;
  /// Seconds of fixed cost per runtime kernel call on the calling thread (rt::scale of 1 float,
  /// which enters no parallel region); 0: not measurable.
  double kernelOverhead = 0;
  /// Seconds of fixed cost per call that starts a team of the OpenMP threads (an empty parallel
  /// region), paid in place of kernelOverhead; 0: not measured (protocol 5 and older).
  double forkOverhead = 0;
  /// The fixed cost of one call, threaded or not, as kernelTime adds it back
  /// (passes/KernelTime.cpp, hostCallTime).
  double callSeconds(bool threaded) const {
    return threaded && forkOverhead > 0 ? forkOverhead : kernelOverhead;
  }
  double transcendentalTime = 0; ///< Seconds per exp with all threads (exp − relu per element).
  /// Each unary kernel with transcendentals (rt::unary_fwd and rt::unary_bwd of gelu,
  /// gelu_tanh, silu, tanh, sigmoid, exp), forward and gradient: seconds per element with all
  /// threads, the kernel less relu's in the same direction (the same loads, stores, call and
  /// threads); `op` is the op's name in the language.
  /// The row kernels (layer_norm, rms_norm, softmax, cross_entropy: a reduction per row) also
  /// state seconds per row, forward and gradient (5d): their time is a cost per row (its
  /// reductions and their setup) plus one per element.
  struct UnaryTiming {
    std::string op;
    double forward = 0, gradient = 0;
    double forwardRow = 0, gradientRow = 0;
  };
  std::vector<UnaryTiming> unary;

  std::vector<MatmulSample> matmuls;
  AttentionSample attention;
  /// Smaller attention shapes (a toy model's heads: S 16, hd 16; S 64, hd 32), for the
  /// attention curve: per (batch, head) the kernel stages its operands and calls OpenBLAS on
  /// small tiles, fixed costs that make small attention far less efficient than `attention`.
  std::vector<AttentionSample> attentionShapes;
  bool quick = false;
  double seconds = 0;         ///< Wall time of the whole calibration.
  double loadAverage = -1;    ///< /proc/loadavg's 1-minute figure before measuring; -1 unknown.
  /// The data-parallel interconnect (tools/tally/CalibrateLink.cpp): an MPI all-reduce of 2
  /// processes on this machine, as the time model's ring of 2 reads it: latency = the 8-byte
  /// call / 2, bandwidth = bytes / (the 25 MiB call − 2 × latency). 0 when not measured;
  /// linkNote says how it was measured, or why not.
  double linkBandwidth = 0, linkLatency = 0;
  std::string linkNote;
  /// Every measurement's statistics (summarize), in the order they were taken, and the
  /// scheduler slice their outlier rule used (seconds; where it was read).
  std::vector<Timing> timings;
  double sliceSeconds = 0;
  std::string sliceSource;
  /// Other processes were running: the load average exceeded half the cores.
  bool busy() const { return loadAverage > 0.5 * cores; }
};

/// Runs the measurements (a few seconds; Options::quick well under that). Only tally-measure
/// links it (Measure.cpp: OpenBLAS and OpenMP).
Result measure(const Options &options);

/// The version of tally-measure's output that this build writes and reads; a change of its
/// fields changes the number, and a tally refuses another version (the two are built together).
constexpr int kProtocolVersion = 8; // 2: attention_shapes; 3: timings, slice; 4: optimizer_bandwidth; 5: unary; 7: blas_core;
                                    // 8: the row kernels (unary forward_row, gradient_row)
                                    // 6: fork_overhead

/// tally-measure's output: every field of `r` the measurements set (not the interconnect, which
/// tally measures itself) as one JSON object, {"protocol": "tally-measure", "version": 2, ...};
/// numbers with 17 significant digits, so they read back exactly. Empty when a number is not
/// finite (JSON cannot say it).
std::string resultToJSON(const Result &r);

/// Reads resultToJSON's text into `r`; false with `error` set (what is missing or wrong, and
/// where) when it is not that object, is another version, or holds impossible values.
bool resultFromJSON(const std::string &text, Result &r, std::string &error);

/// /proc/cpuinfo's "model name", or "unknown CPU".
std::string cpuModelName();

/// One point of an efficiency curve (FLOPs per call, efficiency).
struct Point {
  double flops = 0, efficiency = 0;
};

/// The best achieved FLOP/s over the samples of `dtype`: the peak the host target states.
double peakOf(const Result &r, const std::string &dtype);

/// The efficiency curve of `dtype`: per sample max(flops / peak, bytes / bandwidth) / seconds
/// (so the time model's kernelTime reproduces the measured time), clamped to (0, 1], sorted by
/// FLOPs; samples within 2% of each other's FLOPs are merged (their mean).
std::vector<Point> curveOf(const Result &r, const std::string &dtype);

/// efficiency.attention: the attention sample's FLOPs (as ir/ops/Attention.cpp counts fused causal
/// attention, forward and backward) at the fp32 peak, divided by its time less its exps
/// (transcendentalTime) and two calls (kernelOverhead); in (0, 1], 0 when not measurable.
double attentionEfficiency(const Result &r);

/// attention_curve: for every attention sample (attentionShapes and attention), the forward
/// and the backward call each as a point (FLOPs of the call as the op rules count them,
/// FLOPs at the fp32 peak / (its time − its exps − its call's fixed cost)), clamped to (0, 1],
/// sorted by FLOPs, points within 2% merged; empty when not measurable.
std::vector<Point> attentionCurveOf(const Result &r);
/// Whether OPENBLAS_CORETYPE in the environment held OpenBLAS to its AVX2 kernels (Haswell, Zen)
/// on a CPU with AVX-512.
bool blasHeldToAvx2(const Result &r);
/// The host file's line on OpenBLAS's kernels when OPENBLAS_CORETYPE chose them ("" when
/// OpenBLAS did), saying so when blasHeldToAvx2.
std::string blasCoreNote(const Result &r);

/// The `target host { ... }` declaration, with the measurements as comments. `when` is the
/// date printed in the banner.
std::string renderTarget(const Result &r, const std::string &when);

/// The noisy measurements of `r` with their reasons (noisyReason), "; "-separated, the first
/// three named and the rest counted; "" when none.
std::string noisySummary(const Result &r);

/// "host-<hostname>-<8 hex digits of a hash of the CPU model and core count>.tally".
std::string cacheFileName();

/// The load average a calibration file's text records (renderTarget's "// Load average before
/// measuring: X" line), or -1 when it records none.
double recordedLoadAverage(const std::string &text);

/// Measured under load: the 1-minute load average exceeded the core count (issue 42).
inline bool underLoad(const Result &r) { return r.cores > 0 && r.loadAverage > static_cast<double>(r.cores); }

/// Why `tally calibrate` must not replace a calibration recorded at `oldLoad` with `r` (one
/// made under load, underLoad, when the old one was made at a lower load), naming both loads;
/// "" when it may (also when oldLoad is unknown, -1). --force overrides it.
std::string overwriteRefusal(const Result &r, double oldLoad);

} // namespace calibrate
} // namespace tally
