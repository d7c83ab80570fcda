//===- ir/Target.cpp - The built-in hardware catalogue --------------------===//
//
// Datasheet numbers for the built-in targets. Every rate is dense: where a
// datasheet prints only the 2:4-sparse figure, the dense one is half of it.
// docs/targets.md lists the source of each number and the assumptions (host
// RAM per device, links) that are not on a datasheet.
//
//===----------------------------------------------------------------------===//
#include "ir/Target.h"

#include <cmath>

namespace tally {

double Target::peakFor(Dtype d) const {
  switch (d) {
  case Dtype::F64: return peakF64;
  case Dtype::F32: return peakF32;
  case Dtype::TF32: return peakTF32;
  case Dtype::F16: return peakF16;
  case Dtype::BF16: return peakBF16;
  case Dtype::FP8E4M3:
  case Dtype::FP8E5M2: return peakFP8;
  case Dtype::I8:
  case Dtype::U8: return peakINT8;
  default: return 0;
  }
}

double Target::ridge(Dtype d) const {
  double peak = peakFor(d);
  if (peak <= 0 || bandwidth <= 0)
    return 0;
  return peak / bandwidth;
}

double interpolateCurve(const std::vector<CurvePoint> &points, double flops) {
  if (points.empty())
    return 0;
  if (!(flops > points.front().flops))
    return points.front().efficiency;
  if (flops >= points.back().flops)
    return points.back().efficiency;
  size_t hi = 1;
  while (points[hi].flops < flops)
    ++hi;
  const CurvePoint &a = points[hi - 1], &b = points[hi];
  double f = (std::log(flops) - std::log(a.flops)) / (std::log(b.flops) - std::log(a.flops));
  return a.efficiency + f * (b.efficiency - a.efficiency);
}

void Target::shareHost(int64_t ranks, int64_t runThreads) {
  if (!isHost() || ranks < 1)
    return;
  if (runThreads > 0)
    threadsPerRank = runThreads;
  double next = 1.0 / double(ranks);
  if (threadsPerRank > 0 && threads > 0)
    next = std::min(next, double(threadsPerRank) / double(threads));
  if (next == share)
    return;
  // f = the share each rank gets now over the share it had.
  const double f = next / share;
  for (double *x : {&peakF64, &peakF32, &peakTF32, &peakF16, &peakBF16, &peakFP8, &peakINT8, &bandwidth,
                    &hostLink, &memoryBytes, &hostMemoryBytes, &cacheBytes, &cacheBandwidth,
                    &optimizerBandwidth})
    *x *= f;
  transcendentalTime /= f;
  for (UnaryTime &u : unaryTimes)
    u.forward /= f, u.gradient /= f, u.forwardRow /= f, u.gradientRow /= f;
  share = next;
}

double Target::unaryTime(llvm::StringRef op, bool gradient) const {
  for (const UnaryTime &u : unaryTimes)
    if (u.op == op)
      return gradient ? u.gradient : u.forward;
  return 0;
}

double Target::rowTime(llvm::StringRef op, bool gradient) const {
  for (const UnaryTime &u : unaryTimes)
    if (u.op == op)
      return gradient ? u.gradientRow : u.forwardRow;
  return 0;
}

const std::vector<std::string> &Target::rowKernelNames() {
  static const std::vector<std::string> names = {"layer_norm", "rms_norm", "softmax", "cross_entropy"};
  return names;
}

double Target::attentionEfficiency(double flops) const {
  return attentionCurve.empty() ? efficiency.attention : interpolateCurve(attentionCurve, flops);
}

const MatmulCurve *Target::matmulCurve(Dtype d) const {
  for (const MatmulCurve &c : matmulCurves)
    if (c.dtype == d && !c.points.empty())
      return &c;
  return nullptr;
}

double Target::matmulEfficiency(Dtype d, double flops) const {
  const MatmulCurve *c = matmulCurve(d);
  return c ? interpolateCurve(c->points, flops) : efficiency.matmul;
}

namespace {

ExternalTargetLoader &externalLoader() {
  static ExternalTargetLoader loader;
  return loader;
}

} // namespace

void setExternalTargetLoader(ExternalTargetLoader loader) {
  externalLoader() = std::move(loader);
}

bool isExternalTargetName(llvm::StringRef name) {
  return name == "host" || name.endswith(".tally");
}

std::optional<Target> loadExternalTarget(llvm::StringRef name, std::string &error) {
  if (!externalLoader()) {
    error = name == "host" ? "the host target is measured by `tally calibrate`, which this "
                             "program cannot run"
                           : "this program cannot load target files such as '" + name.str() + "'";
    return std::nullopt;
  }
  return externalLoader()(name, error);
}

void withClock(Target &t, double hz) {
  double f = hz / t.clock;
  for (double *peak : {&t.peakF64, &t.peakF32, &t.peakTF32, &t.peakF16, &t.peakBF16, &t.peakFP8,
                       &t.peakINT8})
    *peak *= f;
  t.transcendentalTime /= f;
  for (Target::UnaryTime &u : t.unaryTimes)
    u.forward /= f, u.gradient /= f, u.forwardRow /= f, u.gradientRow /= f;
  t.clock = hz;
}

namespace {

// Numbers are written as literals (989.5e12, not 989.5 * 1e12) so each one is
// the double nearest the datasheet figure and compares equal to it.

/// PCIe x16 per direction: Gen4 32 GB/s (64 GB/s both ways), Gen5 64 GB/s.
constexpr double PCIeGen4 = 32e9;
constexpr double PCIeGen5 = 64e9;

/// InfiniBand per port and direction: HDR 200 Gb/s, NDR 400 Gb/s (bits / 8).
constexpr double HDR = 200e9 / 8;
constexpr double NDR = 400e9 / 8;

/// Per-step latencies of a ring collective under NCCL's Simple protocol, from NCCL's tuning
/// model (src/graph/tuning.cc, hwLatencies): 3.4 us per step over NVLink, 5.7 us over PCIe and
/// 14 us over the network. passes/Collectives.cpp scales NCCL's other entries (LL, LL128,
/// trees, NVLS, PAT) by these, so a plan that overrides them scales them all.
constexpr double NVLinkStep = 3.4e-6;
constexpr double PCIeStep = 5.7e-6;
constexpr double NetworkStep = 14e-6;

/// Kernel rates of a GPU generation, from published measurements (docs/targets.md, "Kernel
/// rates"), never from validation rows.
///  - matmul: the default 0.7 (ir/Target.h) was set on A100 runs (docs/validation.md); another
///    GPU keeps it scaled by how the Maximum Achievable Matmul FLOPS (bf16, best shape; S.
///    Bekman, ml-engineering, compute/accelerator, "Maximum Achievable Matmul FLOPS comparison
///    table") compares with the A100's: A100 SXM 267.9 of 312 TFLOP/s (85.9%), H100 SXM 792.1
///    of 989 (80.1%), H100/H200 SXM 794.5 (80.3%), B200 1745 of 2250 (77.6%).
///  - flash attention as PyTorch and flash-attn run it (FlashAttention-2) keeps the default
///    efficiency: against the Triton FlashAttention-2 series on an H100 (pytorch/benchmark
///    #2370: 329 to 477 TFLOP/s from 512 to 16k tokens) tally is within 9%
///    (tests/unit/test_steptime.cpp). Dao's CUDA kernel reaches less there ("only 35%
///    utilization on the H100", Shah et al. 2024): the two published numbers disagree by 1.4x,
///    and docs/targets.md says so.
///  - the kernel written for Hopper (FlashAttention-3; cuDNN's, which FlashAttention-3 §4 puts
///    level with it): the efficiency at which tally's time of one forward (4·dh + 5 FLOPs per
///    score; Q, the output and the logsumexp outside the loop; the exps overlapped with the
///    matmuls, as its ping-pong schedule does) comes to 621 TFLOP/s at head size 128, 16 heads,
///    16k tokens, no mask (pytorch/benchmark #2391, bf16, 4·dh FLOPs per score).
///  - FlashAttention-2 on Hopper (Dao's CUDA kernel: what flash-attn 2 and PyTorch's
///    scaled_dot_product_attention run) does not use Hopper's asynchronous tensor-core
///    instructions and reaches "only 35% utilization on the H100" (Shah et al. 2024,
///    FlashAttention-3, §1). Its Figures 5 and 6 measure it at head size 128, 16k tokens, no
///    mask: 370 TFLOP/s forward and 322 backward (the backward counted as 2.5 forwards), 334
///    together — Dao 2023 (FlashAttention-2, §4.1) gives "up to 335 TFLOPs/s" forward and
///    backward on the H100. Its exps are not overlapped (they add, as KernelTimeTerms::total
///    prices them), and a training step runs both passes, so the efficiency of its matmul
///    FLOPs is solved for the forward and backward together. A Hopper part with another peak
///    keeps the fraction (the same GH100 kernel). The default 0.6 (FlashAttention-2 on an
///    A100, Dao 2023) stays for the other GPUs.
constexpr double A100Matmul = 0.859;
constexpr double FlashAttention2H100Forward = 370e12;
constexpr double FlashAttention2H100Backward = 322e12;
constexpr double H100SxmPeak = 989.5e12;
/// The efficiency at which tally's time of a FlashAttention kernel at the reference shape
/// (head size 128, 16 heads, 16k tokens, no mask) comes to the published `rate` (counted as
/// 4·dh FLOPs per score forward, 2.5 times that backward). Per score, as ir/OpRules.cpp and
/// passes/StepTime.cpp count them: forward 4·dh + 5 FLOPs and one exp, Q, the output and the
/// logsumexp outside the loop; backward 10·dh + 9 FLOPs (the recomputed scores included) and
/// one exp, K and V in and dK and dV out outside it. `expsOverlapped`: the kernel runs its exps
/// during its matmuls (FlashAttention-3) rather than after them (FlashAttention-2);
/// `withBackward`: `rate` is the forward and backward's together, else the forward's.
double flashEfficiency(const Target &t, double rate, bool expsOverlapped, bool withBackward) {
  const double dh = 128, heads = 16, s = 16384, scores = heads * s * s;
  const double exps = expsOverlapped ? 0 : t.transcendentalTime;
  double published = 4 * dh / rate;
  double flops = 4 * dh + 5;
  double other = (2 * s * dh * heads * 2 + heads * s * 4) / scores / t.bandwidth + exps;
  if (withBackward) {
    published = 3.5 * 4 * dh / rate;
    flops += 10 * dh + 9;
    other += 2 * (2 * s * dh * heads * 2) / scores / t.bandwidth + exps;
  }
  return flops / (t.peakBF16 * (published - other));
}
void kernelRates(Target &t, double mamf, double nativeRate) {
  t.efficiency.matmul = Efficiency().matmul * mamf / A100Matmul;
  if (nativeRate > 0) { // a Hopper part: FlashAttention-3 native, FlashAttention-2 as measured
    t.nativeAttention = flashEfficiency(t, nativeRate, true, false);
    double scale = t.peakBF16 / H100SxmPeak;
    double both = 3.5 / (1 / FlashAttention2H100Forward + 2.5 / FlashAttention2H100Backward);
    t.efficiency.attention = flashEfficiency(t, both * scale, false, true);
  }
}

/// Framework memory of a catalogue GPU (docs/targets.md, "Framework memory"): a CUDA context
/// as PyTorch creates it with lazy module loading (an assumption from reported measurements
/// on A100 and H100: 300-600 MiB), NCCL's default NCCL_BUFFSIZE (4 MiB) on each of an
/// assumed 16 channels per communicator, and 5% of the allocator's bytes for fragmentation.
constexpr double CudaContext = 512.0 * 1024 * 1024;
constexpr double NcclBuffSize = 4.0 * 1024 * 1024;
constexpr double NcclChannels = 16;
constexpr double AllocatorReserve = 0.05;

/// A GPU's memory as the driver reports it (NVML's total, nvidia-smi's "MiB" column; docs/targets.md,
/// "Memory capacity"): what a process can allocate from, of which the framework memory above is
/// taken. The datasheets' "80GB" is a rounded figure: an H100 80GB reports 81,559 MiB (85.52e9 B,
/// 79.65 GiB), an A100 80GB 81,920 MiB (80 GiB). A catalogue GPU's memoryBytes is the reported
/// total, so a run that fits on the device is not called too big by the 7% between the units.
constexpr double ReportedMiB = 1024.0 * 1024.0;

/// The CPU's cost of launching one kernel (docs/targets.md, "Kernel launches"): NVIDIA's
/// "Getting Started with CUDA Graphs" (A. Gray, 2019) times a kernel of 2.9 us launched back to
/// back into a stream at 3.8 us per kernel (the launches, not the kernels, set the pace; 3.4 us
/// once a CUDA graph launches them). A kernel call on a catalogue GPU takes at least this long.
constexpr double KernelLaunch = 3.8e-6;

/// Special-function units (docs/targets.md, "Special functions"): a GPU evaluates exp2 (what
/// exp and flash attention's softmax compile to), reciprocals, rsqrt, sin and cos at 16
/// results per clock per multiprocessor on compute capability 7.0 to 9.0 (CUDA C++
/// Programming Guide, "Arithmetic Instructions", throughput table). `clock` is the clock the
/// datasheet's rates are given at.
void specialFunctions(Target &t, int64_t multiprocessors, double clock) {
  constexpr double PerClock = 16;
  t.multiprocessors = multiprocessors;
  t.clock = t.boostClock = clock;
  t.transcendentalTime = 1.0 / (double(multiprocessors) * PerClock * clock);
}

/// Fills the node fields of a target, its framework memory and its kernel launch cost.
void node(Target &t, int64_t gpus, double network, double link, int computeCapability,
          bool nvlinkSwitch) {
  t.computeCapability = computeCapability;
  t.nvlinkSwitch = nvlinkSwitch;
  t.kernelLaunch = KernelLaunch;
  t.contextBytes = CudaContext;
  t.commBufferBytes = NcclChannels * NcclBuffSize;
  t.allocatorReserve = AllocatorReserve;
  t.gpusPerNode = gpus;
  t.network = network;
  t.linkLatency = link;
  t.networkLatency = NetworkStep;
}

/// Hopper (GH100): the H100 in its SXM and PCIe forms, and the H200.
void addHopper(std::vector<Target> &c) {
  Target h100;
  h100.name = "H100_SXM";
  h100.description = "NVIDIA H100 SXM5 80GB";
  h100.memoryBytes = 81559 * ReportedMiB;
  h100.datasheetMemory = 80e9;
  h100.bandwidth = 3.35e12;
  h100.peakF64 = 66.9e12; // FP64 Tensor Core (vector FP64: 33.5)
  h100.peakF32 = 66.9e12;
  h100.peakTF32 = 494.7e12;
  h100.peakF16 = 989.5e12;
  h100.peakBF16 = 989.5e12;
  h100.peakFP8 = 1979e12;
  h100.peakINT8 = 1979e12;
  h100.hostLink = PCIeGen5;
  h100.interconnect = 450e9; // NVLink 4: 900 GB/s total
  h100.hostMemoryBytes = 256e9; // DGX H100: 2 TB for 8 GPUs
  h100.source = "NVIDIA H100 Tensor Core GPU datasheet (SXM column); "
                "NVIDIA H100 Tensor Core GPU Architecture whitepaper, Table 3";
  node(h100, 8, NDR, NVLinkStep, 90, true); // DGX H100: 8 x ConnectX-7 NDR, one per GPU;
                                          // four NVSwitch chips with NVLink SHARP
  // 132 SMs; 989.5 TFLOP/s = 132 x 4,096 dense FP16 FLOPs per clock x 1.83 GHz, so 3.9e12
  // exps/s, the figure Shah et al. 2024 (FlashAttention-3) give for this part.
  specialFunctions(h100, 132, 1.83e9);
  kernelRates(h100, 0.801, 621e12);
  c.push_back(h100);

  Target h100p;
  h100p.name = "H100_PCIe";
  h100p.description = "NVIDIA H100 PCIe 80GB";
  h100p.memoryBytes = 81559 * ReportedMiB; // assumed: the SXM's (the same five stacks)
  h100p.datasheetMemory = 80e9;
  h100p.bandwidth = 2.0e12;
  h100p.peakF64 = 51e12; // FP64 Tensor Core (vector FP64: 26)
  h100p.peakF32 = 51e12;
  h100p.peakTF32 = 378e12;   // 756 sparse / 2
  h100p.peakF16 = 756.5e12;  // 1513 sparse / 2
  h100p.peakBF16 = 756.5e12; // 1513 sparse / 2
  h100p.peakFP8 = 1513e12;   // 3026 sparse / 2
  h100p.peakINT8 = 1513e12;  // 3026 sparse / 2
  h100p.hostLink = PCIeGen5;
  h100p.interconnect = 300e9; // NVLink bridge: 600 GB/s total
  h100p.hostMemoryBytes = 256e9; // assumed: 2 TB server with 8 cards
  h100p.source = "NVIDIA H100 Tensor Core GPU datasheet (PCIe column); "
                 "NVIDIA H100 PCIe product brief PB-11133-001";
  node(h100p, 2, NDR / 4, NVLinkStep, 90, false); // assumed: bridged pairs, 2 NDR NICs per 8 cards
  // 114 SMs; 756.5 TFLOP/s = 114 x 4,096 dense FP16 FLOPs per clock x 1.62 GHz.
  specialFunctions(h100p, 114, 1.62e9);
  kernelRates(h100p, 0.801, 621e12 * 756.5 / 989.5); // assumed: the SXM's, scaled
  c.push_back(h100p);

  Target h200;
  h200.name = "H200";
  h200.description = "NVIDIA H200 SXM 141GB";
  h200.memoryBytes = 143771 * ReportedMiB;
  h200.datasheetMemory = 141e9;
  h200.bandwidth = 4.8e12;
  // Same GH100 compute as H100 SXM; the H200 datasheet rounds the same rates
  // (67 / 67 / 989* / 1979* / 3958*, * = sparse).
  h200.peakF64 = 66.9e12;
  h200.peakF32 = 66.9e12;
  h200.peakTF32 = 494.7e12;
  h200.peakF16 = 989.5e12;
  h200.peakBF16 = 989.5e12;
  h200.peakFP8 = 1979e12;
  h200.peakINT8 = 1979e12;
  h200.hostLink = PCIeGen5;
  h200.interconnect = 450e9; // NVLink 4: 900 GB/s total
  h200.hostMemoryBytes = 256e9; // DGX H200: 2 TB for 8 GPUs
  h200.source = "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column)";
  node(h200, 8, NDR, NVLinkStep, 90, true); // DGX H200: 8 x ConnectX-7 NDR, one per GPU;
                                          // NVSwitch with NVLink SHARP, as DGX H100
  specialFunctions(h200, 132, 1.83e9); // the H100 SXM's GH100: 132 SMs at 1.83 GHz
  kernelRates(h200, 0.803, 621e12); // attention: the H100's (the same GH100 compute)
  c.push_back(h200);
}

/// Ampere (GA100): the A100 SXM4 with 80 GB and with 40 GB.
void addAmpere(std::vector<Target> &c) {
  Target a100;
  a100.name = "A100_80GB";
  a100.description = "NVIDIA A100 SXM4 80GB";
  a100.memoryBytes = 81920 * ReportedMiB;
  a100.datasheetMemory = 80e9;
  a100.bandwidth = 2.039e12;
  a100.peakF64 = 19.5e12; // FP64 Tensor Core (vector FP64: 9.7)
  a100.peakF32 = 19.5e12;
  a100.peakTF32 = 156e12;
  a100.peakF16 = 312e12;
  a100.peakBF16 = 312e12;
  a100.peakFP8 = 0; // Ampere has no FP8 tensor cores
  a100.peakINT8 = 624e12;
  a100.hostLink = PCIeGen4;
  a100.interconnect = 300e9; // NVLink 3: 600 GB/s total
  a100.hostMemoryBytes = 256e9; // DGX A100 640GB: 2 TB for 8 GPUs
  a100.source = "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column)";
  node(a100, 8, HDR, NVLinkStep, 80, false); // DGX A100: 8 x ConnectX-6 HDR, one per GPU
  // 108 SMs at the 1.41 GHz boost clock (A100 whitepaper, Table 1):
  // 312 TFLOP/s = 108 x 2,048 dense FP16 FLOPs per clock x 1.41 GHz.
  specialFunctions(a100, 108, 1.41e9);
  c.push_back(a100);

  Target a100s = a100;
  a100s.name = "A100_40GB";
  a100s.description = "NVIDIA A100 SXM4 40GB";
  a100s.memoryBytes = 40960 * ReportedMiB;
  a100s.datasheetMemory = 40e9;
  a100s.bandwidth = 1.555e12;
  a100s.hostMemoryBytes = 128e9; // DGX A100 320GB: 1 TB for 8 GPUs
  a100s.source = "NVIDIA A100 Tensor Core GPU datasheet (A100 40GB SXM column)";
  c.push_back(a100s);
}

/// Blackwell: the B200.
void addBlackwell(std::vector<Target> &c) {
  Target b200;
  b200.name = "B200";
  b200.description = "NVIDIA B200 (HGX B200, 1000 W) 180GB";
  b200.memoryBytes = 183359 * ReportedMiB;
  b200.datasheetMemory = 180e9;
  b200.bandwidth = 7.7e12; // earlier NVIDIA material: 8 TB/s
  b200.peakF64 = 37e12; // FP64 and FP64 Tensor Core are equal
  b200.peakF32 = 75e12;
  b200.peakTF32 = 1100e12;  // 2.2 PFLOPS sparse / 2
  b200.peakF16 = 2250e12;   // 4.5 PFLOPS sparse / 2
  b200.peakBF16 = 2250e12;  // 4.5 PFLOPS sparse / 2
  b200.peakFP8 = 4500e12;   // 9 PFLOPS sparse / 2
  b200.peakINT8 = 4500e12;  // 9 POPS sparse / 2
  b200.hostLink = PCIeGen5;
  b200.interconnect = 900e9; // NVLink 5: 1.8 TB/s total
  b200.hostMemoryBytes = 256e9; // DGX B200: 2 TB for 8 GPUs
  b200.source = "NVIDIA GB200 NVL72 / HGX B200 specifications table "
                "(HGX B200 column, per GPU); DGX B200 user guide";
  node(b200, 8, NDR, NVLinkStep, 100, true); // DGX B200: 8 x ConnectX-7 NDR, one per GPU
  // Not from NVIDIA (docs/targets.md, "Uncertain numbers"): 148 SMs as measured by Chips and
  // Cheese; the clock the datasheet's 2.25 PFLOP/s implies at Blackwell's 8,192 dense FP16
  // FLOPs per clock per SM (twice Hopper's), 1.856 GHz; and Hopper's 16 exps per clock per SM
  // (NVIDIA announced twice that for Blackwell Ultra's attention, not for the B200).
  specialFunctions(b200, 148, 1.856e9);
  kernelRates(b200, 0.776, 0); // attention: no published rate; the default stays
  c.push_back(b200);
}

/// Ada Lovelace: the GeForce RTX 4090.
void addAda(std::vector<Target> &c) {
  Target rtx;
  rtx.name = "RTX_4090";
  rtx.description = "NVIDIA GeForce RTX 4090 24GB";
  rtx.memoryBytes = 24564 * ReportedMiB;
  rtx.datasheetMemory = 24e9;
  rtx.bandwidth = 1.008e12;
  rtx.peakF64 = 1.29e12; // 1/64 of FP32: no FP64 tensor cores
  rtx.peakF32 = 82.6e12;
  rtx.peakTF32 = 82.6e12;
  rtx.peakF16 = 165.2e12;  // FP32 accumulate (FP16 accumulate: 330.3)
  rtx.peakBF16 = 165.2e12; // FP32 accumulate
  rtx.peakFP8 = 330.3e12;  // FP32 accumulate (FP16 accumulate: 660.6)
  rtx.peakINT8 = 660.6e12;
  rtx.hostLink = PCIeGen4;
  rtx.interconnect = PCIeGen4; // no NVLink: GPU-to-GPU traffic crosses PCIe
  rtx.hostMemoryBytes = 128e9; // assumed: a workstation with 128 GB
  rtx.source = "NVIDIA Ada GPU Architecture whitepaper v2.02, Appendix A, "
               "Table 2 (GeForce RTX 4090)";
  node(rtx, 4, 100e9 / 8 / 4, PCIeStep, 89, false); // assumed: 4 cards, one 100 Gb/s NIC
  specialFunctions(rtx, 128, 2.52e9); // 128 SMs, 2.52 GHz boost (same table)
  c.push_back(rtx);
}

/// The catalogue, by generation; `tally targets` and the solvers list it in this order.
std::vector<Target> buildCatalogue() {
  std::vector<Target> c;
  addHopper(c);
  addAmpere(c);
  addBlackwell(c);
  addAda(c);
  return c;
}

} // namespace

const std::vector<Target> &targetCatalogue() {
  static const std::vector<Target> catalogue = buildCatalogue();
  return catalogue;
}

const Target *findTarget(llvm::StringRef name) {
  for (const Target &t : targetCatalogue())
    if (name == t.name)
      return &t;
  return nullptr;
}

} // namespace tally
