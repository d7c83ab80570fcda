// The driver of a generated CUDA training step (the same file for every model; `tally build
// --backend cuda` copies it next to step.cu). It allocates exactly the regions of the step's
// memory plan (kLayout) with one cudaMalloc each, fills the parameters on the host (--init, or
// the CPU driver's default initialisation from the same Philox seeds) and copies them over,
// reads the batch (--data, or random data from the same seeds), runs --steps steps (the first
// --warmup untimed), timed with CUDA events (each step, and each kernel through the runtime's event pool), and
// prints the CPU driver's JSON object plus the device's memory: the peak in use
// (cudaMemGetInfo), the CUDA context and the runtime's cuBLASLt/scratch workspace on their own
// lines. After the warm-up the step's forward and backward replay as a CUDA graph (step_graph,
// driver/tally_step_cuda.h; --no-graph turns it off); the batch is uploaded to a staging buffer
// before each step and copied from it inside the graph. Every CUDA call here is checked; the
// runtime checks its own (the op path in ctx.where).
// The host-side helpers (flags, safetensors, initialisation, data) are driver_host.h's, shared
// with the CPU driver, given the host copies of the regions.
//
// Data parallel (kLayout.ranks > 1): one process per GPU under `mpirun -np N`
// (driver/tally_comm_nccl.h: MPI starts the ranks, NCCL sums the gradients), each on the GPU of
// its rank within its node. As on the CPU, rank r trains on its rows of every batch (the global
// micro-batches r·microSteps …, with their dropout seeds), every rank starts from the same
// initialisation (under ZeRO-1 its shard of the master cut from it), and rank 0 writes --save
// (ZeRO: the shards summed over the ranks first), --dump-grads (the averaged gradients, the same
// on every rank) and the JSON, with the loss of the whole batch.
//
// Tensor and pipeline parallel (issue 39 item 7; kLayout.tensor, kLayout.pipeline > 1): as the
// CPU driver, data × tensor × pipeline processes in the plan's rank order, the tensor group split
// from the world (split_groups); rank s of a pipeline runs stage s (select_stage: its regions and
// arena). Each rank's regions hold its tensor cuts or its stage's parameters, cut from the whole
// initialisation on the host (driver_host.h initialiseRank) and, for --save and --dump-grads,
// assembled from every rank's host copy (WholeModel::merge, an MPI bitwise or). The JSON has
// `tensor`, `pipeline` and each rank's sent bytes by group, counted in tally_comm_nccl.h.
// Compiled and linked here (ctest cuda-step-compiles); never run: no machine here has a GPU.
#include "cuda/tally_rt.cuh"

#include "common/tally_driver.h"
#include "common/tally_safetensors.h"
#include "driver/tally_step.h"
#include "driver/tally_step_cuda.h"
#include "driver/driver_host.h"
#include "driver/tally_comm_nccl.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

using namespace tally_step;

namespace tally_step {
float *device_scalars = nullptr;
uint8_t *device_losses = nullptr;
StepGraph step_graph;
} // namespace tally_step

namespace {

/// Where the driver writes and reads tensors: host copies of the params, master and grads
/// regions (the device regions are filled from them and read back into them).
Memory host;
int rank = 0; ///< this process's rank: its tensor and data ranks by the plan's order, or its stage
int64_t world() { return kLayout.ranks * kLayout.tensor * kLayout.pipeline; }
/// The parameters of each rank are a part of the model (tensor cuts, pipeline stages).
bool partedModel() { return kLayout.zero >= 2 || kLayout.tensor > 1 || kLayout.pipeline > 1; }

/// The bytes of a region as allocated: at least 1, rounded up to 256.
size_t regionBytes(int64_t bytes) { return static_cast<size_t>((std::max<int64_t>(bytes, 1) + 255) / 256 * 256); }

uint8_t *hostRegion(int64_t bytes) { return static_cast<uint8_t *>(std::calloc(regionBytes(bytes), 1)); }

/// Every CUDA call of the driver is checked: a failure ends the run naming the call.
void check(cudaError_t e, const char *what) {
  if (e != cudaSuccess)
    die(std::string("CUDA: ") + what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

/// One region of device memory: one cudaMalloc of the planned bytes (rounded up to 256), zeroed.
uint8_t *deviceRegion(int64_t bytes, const char *name) {
  void *p = nullptr;
  check(cudaMalloc(&p, regionBytes(bytes)), (std::string("cudaMalloc(") + name + ")").c_str());
  check(cudaMemset(p, 0, regionBytes(bytes)), (std::string("cudaMemset(") + name + ")").c_str());
  return static_cast<uint8_t *>(p);
}

/// The step's micro-batches in device memory: per input, this rank's micro-batches of the step
/// (one for an unbatched input), uploaded before each step, outside the graph region.
uint8_t *staging = nullptr;
std::vector<size_t> stagingAt; ///< each input's offset in staging
cudaStream_t stepStream = nullptr;

size_t inputBytes(const InputInfo &in) { return static_cast<size_t>(in.t.numel) * dtypeBytes(in.t.dtype); }

void allocateStaging() {
  size_t total = 0;
  for (int i = 0; i < kLayout.ninputs; ++i) {
    stagingAt.push_back(total);
    const InputInfo &in = kLayout.inputs[i];
    size_t bytes = inputBytes(in) * static_cast<size_t>(in.batched ? kLayout.microSteps : 1);
    total += (bytes + 255) / 256 * 256;
  }
  check(cudaMalloc(reinterpret_cast<void **>(&staging), std::max<size_t>(total, 256)), "cudaMalloc(staging)");
}

/// This step's micro-batches of every input to the staging buffer (host to device, then waited for).
void uploadBatch() {
  for (int i = 0; i < kLayout.ninputs; ++i) {
    const InputInfo &in = kLayout.inputs[i];
    size_t bytes = inputBytes(in);
    int64_t first = (currentBatch * kLayout.ranks + dataRankOf(rank)) * kLayout.microSteps; // micro-batch 0's
    size_t from = in.batched ? static_cast<size_t>(first) * bytes : 0;
    size_t count = in.batched ? bytes * static_cast<size_t>(kLayout.microSteps) : bytes;
    check(cudaMemcpyAsync(staging + stagingAt[i], batchData[i].data() + from, count, cudaMemcpyHostToDevice,
                          stepStream),
          "cudaMemcpyAsync(batch to staging)");
  }
  check(cudaStreamSynchronize(stepStream), "cudaStreamSynchronize(batch to staging)");
}

/// Micro-batch m into the data region: device to device on the step's stream (graph-capturable).
void loadMicroBatch(int64_t m) {
  for (int i = 0; i < kLayout.ninputs; ++i) {
    const InputInfo &in = kLayout.inputs[i];
    size_t bytes = inputBytes(in);
    size_t from = in.batched ? static_cast<size_t>(m) * bytes : 0;
    check(cudaMemcpyAsync(mem.data + in.offset, staging + stagingAt[i] + from, bytes, cudaMemcpyDeviceToDevice,
                          stepStream),
          "cudaMemcpyAsync(data)");
  }
}

/// Kernel milliseconds and calls by (op class, kernel), summed over the timed steps.
std::map<std::pair<std::string, std::string>, std::pair<int64_t, double>> profile;
std::map<std::string, std::string> classOfPath;

void record(const std::vector<rt::cu::KernelTime> &times) {
  for (const rt::cu::KernelTime &t : times) {
    auto c = classOfPath.find(t.where);
    auto &e = profile[{c == classOfPath.end() ? std::string("other") : c->second, t.kernel}];
    e.first += 1;
    e.second += t.ms / 1000.0;
  }
}

Args args;

/// Device memory in use now (total - free, every process on the device); the least free seen.
size_t deviceTotal = 0, leastFree = SIZE_MAX;
size_t deviceUsed() {
  size_t freeBytes = 0, total = 0;
  check(cudaMemGetInfo(&freeBytes, &total), "cudaMemGetInfo");
  deviceTotal = total;
  leastFree = std::min(leastFree, freeBytes);
  return total - freeBytes;
}

void download(uint8_t *dst, const uint8_t *src, int64_t bytes, const char *what) {
  if (bytes > 0)
    check(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost), what);
}

/// Why the step's graph region is not replayed ("" when it is, from step graphFrom + 1 on);
/// rank 0 prints it, and what runs outside the region, on stderr.
std::string graphPlan(bool useGraph, int64_t graphFrom) {
  std::string why = !kGraph.captured       ? std::string(kGraph.why_not)
                    : !useGraph              ? std::string("--no-graph")
                    : args.steps <= graphFrom ? "no step after the eager warm-up"
                                              : "";
  if (rank != 0)
    return why;
  if (why.empty())
    std::fprintf(stderr, "tally_step: CUDA graph: forward_backward() captured in step %lld, replayed after\n",
                 static_cast<long long>(graphFrom + 1));
  else
    std::fprintf(stderr, "tally_step: CUDA graph: not captured: %s\n", why.c_str());
  for (const GraphPlan::Outside *o = kGraph.outside; why.empty() && o->what; ++o)
    std::fprintf(stderr, "tally_step: CUDA graph: outside: %s (%s)\n", o->what, o->why);
  return why;
}

/// The regions of the memory plan, the scalars, the loss slots and the staging buffer on the device.
void allocateRegions() {
  mem.arena = deviceRegion(kLayout.arenaBytes, "arena");
  mem.params = deviceRegion(kLayout.paramsBytes, "params");
  mem.grads = deviceRegion(kLayout.gradsBytes, "grads");
  mem.master = deviceRegion(kLayout.masterBytes, "master");
  mem.optimizer = deviceRegion(kLayout.optimizerBytes, "optimizer");
  mem.data = deviceRegion(kLayout.dataBytes, "data");
  check(cudaMalloc(reinterpret_cast<void **>(&device_scalars), 256), "cudaMalloc(scalars)");
  check(cudaMalloc(reinterpret_cast<void **>(&device_losses), regionBytes(8 * kLayout.microSteps)),
        "cudaMalloc(losses)");
  // Zero: a pipeline's stages before the last store no loss, and read 0.
  check(cudaMemset(device_losses, 0, regionBytes(8 * kLayout.microSteps)), "cudaMemset(losses)");
  allocateStaging();
}

/// The report's "graph" object: whether the region was replayed, from which step, its nodes.
std::string graphJson(const std::string &why, int64_t graphFrom) {
  return "  \"graph\": {\"captured\": " + std::string(why.empty() ? "true" : "false") + ", \"from_step\": " +
         std::to_string(why.empty() ? graphFrom + 1 : 0) + ", \"nodes\": " + std::to_string(step_graph.nodes) +
         ", \"why_not\": \"" + rt::json_escape(why) + "\"},\n";
}

/// The gradient check (issue 43), as the CPU driver's (driver_cpu.cpp): once the step's
/// gradients are complete and before the update, the gradients this rank holds must all be
/// finite. On the device: Σg² of the gradient region (rt::sum_squares; a NaN or an infinity
/// makes it non-finite) and one 4-byte read back; only when that is not finite is the region
/// copied to the host, where the bit test (firstNonfiniteGradient) decides — a sum that merely
/// overflowed is no error — and names the first bad gradient. Every rank stops at the same step.
/// Its time, between two events on the step's stream, is not the step's. Not for fp16 loss
/// scaling (whose own Σg² check skips the step) nor --allow-nonfinite.
struct GradientCheck {
  rt::Ctx *ctx = nullptr;
  cudaEvent_t begin = nullptr, end = nullptr;
  bool ran = false, bad = false;
  std::string where;
} gradientCheck;

template <class T> void gradientSumSquares(rt::Ctx &ctx, int64_t n) {
  rt::sum_squares<T>(ctx, reinterpret_cast<const T *>(mem.grads), n, device_scalars);
}

void checkGradients() {
  rt::Ctx &ctx = *gradientCheck.ctx;
  check(cudaEventRecord(gradientCheck.begin, ctx.stream), "cudaEventRecord(gradient check)");
  const std::string d = kLayout.gradsDtype;
  const int64_t n = kLayout.gradsBytes / static_cast<int64_t>(dtypeBytes(d));
  if (d == "F32")
    gradientSumSquares<float>(ctx, n);
  else if (d == "BF16")
    gradientSumSquares<rt::bf16>(ctx, n);
  else
    gradientSumSquares<rt::f16>(ctx, n);
  float sumsq = 0;
  check(cudaMemcpyAsync(&sumsq, device_scalars, sizeof sumsq, cudaMemcpyDeviceToHost, ctx.stream),
        "cudaMemcpyAsync(gradient check)");
  check(cudaStreamSynchronize(ctx.stream), "cudaStreamSynchronize(gradient check)");
  int64_t first = -1;
  if (!std::isfinite(sumsq)) {
    download(host.grads, mem.grads, kLayout.gradsBytes, "cudaMemcpy(grads to host, gradient check)");
    first = firstNonfiniteGradient(host.grads, n);
  }
  double bad = first >= 0 ? 1 : 0;
  if (world() > 1)
    bad = tally_comm::sum(bad);
  gradientCheck.bad = bad > 0;
  const bool whole = kLayout.zero == 0 && kLayout.tensor == 1; // kLayout.params' offsets hold
  gradientCheck.where = first >= 0 && whole ? gradientAt(host.grads, first) : "";
  check(cudaEventRecord(gradientCheck.end, ctx.stream), "cudaEventRecord(gradient check)");
  gradientCheck.ran = true;
}

/// Readies the gradient check on the step's context; whether it runs (not under fp16 loss
/// scaling or --allow-nonfinite).
bool startGradientCheck(rt::Ctx &ctx) {
  gradientCheck.ctx = &ctx;
  check(cudaEventCreate(&gradientCheck.begin), "cudaEventCreate");
  check(cudaEventCreate(&gradientCheck.end), "cudaEventCreate");
  return kLayout.lossScale == 1 && !args.allowNonfinite;
}

/// The step's milliseconds between its two events, less the gradient check's.
float stepMilliseconds(cudaEvent_t start, cudaEvent_t stop) {
  float ms = 0, checkMs = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime(step)");
  if (gradientCheck.ran) // the check's time is not the step's
    check(cudaEventElapsedTime(&checkMs, gradientCheck.begin, gradientCheck.end), "cudaEventElapsedTime(gradient check)");
  return ms - checkMs;
}

/// Ends the run after step `step` (1-based) on a non-finite loss or gradient (rank 0 says why).
void stopIfNonfinite(int64_t step, double loss) {
  if (!std::isfinite(loss) && !args.allowNonfinite)
    die(nonfiniteLoss(step, loss));
  if (gradientCheck.ran && gradientCheck.bad) {
    if (rank != 0)
      std::exit(1);
    die(nonfiniteGradients(step, gradientCheck.where));
  }
}

void dumpGradients() {
  if (args.dumpGrads.empty() || (rank != 0 && !partedModel()))
    return;
  download(host.grads, mem.grads, kLayout.gradsBytes, "cudaMemcpy(grads to host)");
  if (partedModel()) // each rank holds its cuts or its stage's: assembled over the ranks
    dumpPieces(args.dumpGrads, host, rank, tally_comm::merge);
  else
    writeTensors(args.dumpGrads, true, host);
}

/// This process's GPU (its rank among its node's processes), or the run ends saying why not.
int findDevice() {
  int devices = 0;
  cudaError_t probe = cudaGetDeviceCount(&devices);
  if (probe != cudaSuccess || devices == 0)
    die(std::string("no CUDA device found (cudaGetDeviceCount: ") +
        (probe != cudaSuccess ? std::string(cudaGetErrorName(probe)) + ": " + cudaGetErrorString(probe)
                              : std::string("0 devices")) +
        "); the CUDA step needs an NVIDIA GPU");
  const int device = tally_comm::device();
  if (device >= devices)
    die("rank " + std::to_string(rank) + " is process " + std::to_string(device) + " of its node, which has " +
        std::to_string(devices) + " CUDA device(s): start at most one process per GPU");
  return device;
}

/// NCCL's communicator (several processes only); under data × tensor this rank's tensor and
/// data groups (one kind alone: the world). A graph replay counts its collectives' bytes again.
void startGroups() {
  tally_comm::start();
  tally_comm::split_groups(tensorRankOf(rank), static_cast<int>(kLayout.tensor), dataRankOf(rank),
                           static_cast<int>(kLayout.ranks));
  step_graph.on_replay = tally_comm::count_replay;
}

/// The bytes this rank sent in the last step, in all and by group (tally_comm_nccl.h's counts),
/// and every rank's, gathered after the steps.
struct SentBytes {
  int64_t all = 0, by[tally_comm::kKinds] = {0, 0, 0};
  std::vector<int64_t> ranks, groups[tally_comm::kKinds];
  void step() {
    all = tally_comm::sent_bytes();
    for (int k = 0; k < tally_comm::kKinds; ++k)
      by[k] = tally_comm::sent_bytes(static_cast<tally_comm::SentKind>(k));
  }
  void gather() {
    ranks = tally_comm::gather_counts(all);
    for (int k = 0; k < tally_comm::kKinds; ++k)
      groups[k] = tally_comm::gather_counts(by[k]);
  }
  /// The "sent_bytes" and "sent_bytes_by_group" lines (driver_host.h), for a parted model.
  std::string json() const {
    static_assert(tally_comm::kKinds == 3, "sentBytesJson names three kinds of counts");
    return partedModel() ? sentBytesJson(ranks, groups) : "";
  }
};

} // namespace

int main(int argc, char **argv) {
  tally_comm::init(&argc, &argv);
  args = parse(argc, argv);
  if (!args.trace.empty())
    usage("--trace: the CUDA step does not trace its kernels yet (the CPU step does: `tally run --backend cpu "
          "--trace FILE`)");
  rank = tally_comm::rank();
  select_stage(rank); // pipeline parallel: this rank's regions and arena
  if (tally_comm::size() != world())
    die("this step runs on " + std::to_string(world()) + " processes, one per GPU (data = " +
        std::to_string(kLayout.ranks) + ", tensor = " + std::to_string(kLayout.tensor) + ", pipeline = " +
        std::to_string(kLayout.pipeline) + "; `mpirun -np " + std::to_string(world()) + "`), not " +
        std::to_string(tally_comm::size()));
  const int device = findDevice();
  try {
    check(cudaSetDevice(device), "cudaSetDevice");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    check(cudaFree(nullptr), "cudaFree(nullptr) (creating the context)");
    const size_t contextBytes = deviceUsed(); // the context, and whatever other processes hold
    startGroups();

    allocateRegions();
    host.params = hostRegion(kLayout.paramsBytes);
    host.master = hostRegion(kLayout.masterBytes);
    host.grads = hostRegion(kLayout.gradsBytes);
    if (!host.params || !host.master || !host.grads)
      die("cannot allocate the host copies of the regions");
    initialiseRank(args, host, rank); // under ZeRO, this rank's master shard
    check(cudaMemcpy(mem.params, host.params, regionBytes(kLayout.paramsBytes), cudaMemcpyHostToDevice),
          "cudaMemcpy(params)");
    check(cudaMemcpy(mem.master, host.master, regionBytes(kLayout.masterBytes), cudaMemcpyHostToDevice),
          "cudaMemcpy(master)");
    loadData(args);
    for (int i = 0; i < kNumOpSites; ++i)
      classOfPath[kOpSites[i].path] = kOpSites[i].op_class;

    rt::Ctx ctx;
    ctx.init();
    stepStream = ctx.stream;
    deviceUsed();
    // The CUDA graph: from step graphFrom on (at least one eager step first, so cuBLASLt's
    // algorithms, cuDNN's graphs, the workspace and the overlap stream exist before the capture;
    // the capture in the last warm-up step when there are two), the region is replayed.
    const bool useGraph = args.graph && kGraph.captured;  // --no-graph turns it off
    const int64_t graphFrom = std::max<int64_t>(1, args.warmup - 1);
    const std::string graphWhy = graphPlan(useGraph, graphFrom);
    int64_t kernelSteps = 0;
    cudaEvent_t start = nullptr, stop = nullptr;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    const bool checks = startGradientCheck(ctx);

    std::vector<double> losses, times;
    SentBytes sent;
    int64_t skipped = 0, total = args.steps; // the first args.warmup untimed
    Progress progress;
    progress.on = progress.on && rank == 0;
    for (int64_t i = 0; i < total; ++i) {
      const bool timed = timedStep(args, i);
      progress.step(args, i);
      step_graph.on = useGraph && i >= graphFrom;
      // Kernel times: from the timed steps; under the graph (whose kernels record no events),
      // from the eager steps before it.
      ctx.timing = step_graph.on ? false : useGraph ? true : timed;
      ctx.resetTimes();
      currentBatch = i % batches;
      uploadBatch();
      bool last = i + 1 == total, updated = true;
      // Micro-batch m of rank r is the step's global micro-batch r·microSteps + m: its seed too.
      uint64_t seed = (args.seed << 32) + static_cast<uint64_t>((i * kLayout.ranks + dataRankOf(rank)) * kLayout.microSteps);
      tally_comm::reset_sent_bytes();
      check(cudaEventRecord(start, ctx.stream), "cudaEventRecord(step start)");
      gradientCheck.ran = false;
      double loss = train_step(ctx, i + 1, seed, loadMicroBatch, last ? dumpGradients : nullptr, &updated,
                               checks ? checkGradients : nullptr);
      check(cudaEventRecord(stop, ctx.stream), "cudaEventRecord(step stop)");
      check(cudaEventSynchronize(stop), "cudaEventSynchronize(step stop)");
      const float ms = stepMilliseconds(start, stop);
      sent.step(); // this step's tensor-parallel and pipeline transfers
      // The whole batch's loss: the mean of the data ranks' (a tensor group's are equal; only a
      // pipeline's last stage has one, the others 0).
      if (world() > 1)
        loss = tally_comm::sum(loss) / static_cast<double>(kLayout.ranks * kLayout.tensor);
      losses.push_back(loss);
      stopIfNonfinite(i + 1, loss);
      if (timed)
        times.push_back(ms / 1000.0);
      if (ctx.timing) {
        record(ctx.collectTimes());
        ++kernelSteps;
      }
      skipped += updated ? 0 : 1;
      deviceUsed();
    }
    progress.done();
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (!args.save.empty()) { // every rank: under ZeRO the master shards are summed first
      download(host.params, mem.params, kLayout.paramsBytes, "cudaMemcpy(params to host)");
      download(host.master, mem.master, kLayout.masterBytes, "cudaMemcpy(master to host)");
      saveRank(args, host, rank, tally_comm::sum, tally_comm::merge);
    }
    sent.gather();
    const size_t workspace = ctx.workspaceBytes;
    check(cudaEventDestroy(start), "cudaEventDestroy");
    check(cudaEventDestroy(stop), "cudaEventDestroy");
    tally_comm::finalize();
    if (rank != 0)
      return 0;

    std::string out = "{\n  \"backend\": \"cuda\",\n";
    out += "  \"model\": \"" + rt::json_escape(kLayout.model) + "\",\n";
    out += "  \"plan\": \"" + rt::json_escape(kLayout.plan) + "\",\n";
    out += "  \"device\": \"" + rt::json_escape(prop.name) + "\",\n";
    out += "  \"ranks\": " + std::to_string(world()) + ",\n  \"tensor\": " + std::to_string(kLayout.tensor) +
           ",\n  \"pipeline\": " + std::to_string(kLayout.pipeline) + ",\n  \"zero\": " + std::to_string(kLayout.zero) + ",\n";
    out += "  \"steps\": " + std::to_string(args.steps) + ",\n  \"warmup\": " + std::to_string(args.warmup) + ",\n";
    out += timingJson(times);
    out += "  \"arena_bytes\": " + std::to_string(kLayout.arenaBytes) + ",\n";
    out += "  \"regions\": {\"params\": " + std::to_string(kLayout.paramsBytes) + ", \"grads\": " +
           std::to_string(kLayout.gradsBytes) + ", \"master\": " + std::to_string(kLayout.masterBytes) +
           ", \"optimizer\": " + std::to_string(kLayout.optimizerBytes) + ", \"data\": " + std::to_string(kLayout.dataBytes) +
           "},\n";
    out += "  \"peak_bytes\": " + std::to_string(deviceTotal - leastFree) + ",\n";
    out += "  \"device_total_bytes\": " + std::to_string(deviceTotal) + ",\n";
    out += "  \"context_bytes\": " + std::to_string(contextBytes) + ",\n";
    out += "  \"workspace_bytes\": " + std::to_string(workspace) + ",\n";
    out += "  \"host_peak_bytes\": " + std::to_string(peakResidentBytes()) + ",\n";
    out += sent.json(); // the bytes each rank sent in the last step (a parted model)
    out += "  \"model_flops\": " + num(kLayout.modelFlops) + ",\n";
    out += graphJson(graphWhy, graphFrom);
    out += "  \"kernel_steps\": " + std::to_string(kernelSteps) + ",\n";
    out += "  \"skipped_steps\": " + std::to_string(skipped) + ",\n  \"kernels\": [";
    bool first = true;
    for (const auto &[key, v] : profile) {
      out += std::string(first ? "\n" : ",\n") + "    {\"name\": \"" + rt::json_escape(key.second) +
             "\", \"op_class\": \"" + rt::json_escape(key.first) + "\", \"calls\": " + std::to_string(v.first) +
             ", \"total_s\": " + num(v.second) + "}";
      first = false;
    }
    out += "\n  ],\n  \"loss\": [";
    for (size_t i = 0; i < losses.size(); ++i)
      out += (i ? ", " : "") + num(losses[i]);
    out += "]\n}\n";
    std::fputs(out.c_str(), stdout);
    return 0;
  } catch (const std::exception &e) {
    die(e.what());
  }
}
