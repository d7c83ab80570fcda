// The driver of a generated CPU training step (the same file for every model; `tally build`
// copies it next to step.cpp). It allocates exactly the regions of the step's memory plan
// (kLayout), fills the parameters (--init, or the default initialisation) and the batch
// (--data, or random data), runs --steps steps (the first --warmup untimed), and prints one
// JSON object: the median step time (with min, max and the load average), per-kernel times by op class, the bytes it allocated, the peak resident
// memory and the loss of every step. `tally run` reads that object; docs/runtime.md documents
// the flags. --trace FILE writes the last step's kernel calls as a Chrome trace (writeTrace).
//
// Data parallel (kLayout.ranks > 1): one process per rank under `mpirun -np N`
// (driver/tally_comm.h). Rank r trains on its rows of every batch (its micro-batches are the
// global micro-batches r·microSteps …, with their dropout seeds), the step averages the
// gradients, and rank 0 prints the JSON: its own times and memory, and the loss of the whole
// batch (the ranks' losses averaged, outside the timed step). Under ZeRO the master shard is
// initialised from the whole initialisation, and --save gathers it first; under ZeRO 2 and 3
// every tensor's pieces so (driver_host.h, WholeModel), and the JSON has `sent_bytes`: what
// each rank sent in the last step, counted by the collectives. Pipeline parallel
// (kLayout.pipeline > 1): rank s runs stage s, with its own regions and arena (select_stage);
// only the last stage has a loss; with data = d > 1 too, each of the d pipelines trains on its
// data rank's rows and each stage's data group averages its gradients. On several processes the JSON has `per_rank`: each rank's
// median step, communication and idle time, peak memory, arena, regions and bytes sent.
#include "common/tally_driver.h"
#include "common/tally_safetensors.h"
#include "cpu/tally_rt.h"
#include "driver/tally_step.h"
#include "driver/driver_host.h"
#include "driver/tally_comm.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

using namespace tally_step;

namespace {

/// A zeroed region of `bytes` (rt::zeroed_region: huge pages from 2 MiB), or the run stops.
uint8_t *region(int64_t bytes) {
  uint8_t *p = rt::zeroed_region(bytes);
  if (!p)
    die("cannot allocate " + std::to_string(bytes) + " bytes");
  return p;
}

int rank = 0; ///< this process's rank: its tensor and data ranks by the plan's order (tensorRankOf), or pipeline stage
int64_t world() { return kLayout.ranks * kLayout.tensor * kLayout.pipeline; }
int64_t dataRank() { return dataRankOf(rank); }
/// The parameters of each rank are a part of the model (tensor cuts, ZeRO 2/3 pieces, stages).
bool partedModel() { return kLayout.zero >= 2 || kLayout.tensor > 1 || kLayout.pipeline > 1; }

/// One kernel call of the traced step (--trace): the op path and index the step set
/// (tally_step.h), its class, the kernel, the micro-batch, and its start (seconds from the
/// step's start) and duration.
struct TraceEvent {
  const char *path, *cls, *kernel;
  int op;
  int64_t micro;
  double start, seconds;
};

/// Kernel seconds and calls, by (op class, kernel), while `timing` is set; while `tracing` is
/// set too, every call (one more clock read per call, into a vector reserved beforehand).
struct Profile {
  bool timing = false, tracing = false;
  std::map<std::pair<std::string, std::string>, std::pair<int64_t, double>> by;
  int64_t calls = 0;   ///< kernel calls of the timed steps
  double t0 = 0;       ///< the traced step's start (rt::now_seconds)
  int64_t micro = 0;   ///< the micro-batch loaded last
  std::vector<TraceEvent> events;
  static void record(void *user, const char *kernel, double seconds) {
    Profile *p = static_cast<Profile *>(user);
    if (!p->timing)
      return;
    auto &e = p->by[{op_class, kernel}];
    e.first += 1;
    e.second += seconds;
    p->calls += 1;
    if (p->tracing) // the hook runs as the kernel returns: it started `seconds` ago
      p->events.push_back({op_path, op_class, kernel, op_id, p->micro, rt::now_seconds() - seconds - p->t0, seconds});
  }
};
Profile prof;

void loadMicroBatch(int64_t m) {
  prof.micro = m;
  for (int i = 0; i < kLayout.ninputs; ++i) {
    const InputInfo &in = kLayout.inputs[i];
    size_t bytes = static_cast<size_t>(in.t.numel) * dtypeBytes(in.t.dtype);
    int64_t global = (currentBatch * kLayout.ranks + dataRank()) * kLayout.microSteps + m;
    size_t from = in.batched ? static_cast<size_t>(global) * bytes : 0;
    std::memcpy(mem.data + in.offset, batchData[i].data() + from, bytes);
  }
}


Args args;

/// The gradient check (issue 43): once the step's gradients are complete and before the update,
/// the gradients this rank holds must all be finite. Set by checkGradients for the driver to
/// stop on after the step (a non-finite loss first): whether any rank found one, what rank 0's
/// first is (when it holds the gradients whole), and the check's seconds, which are not the
/// step's (subtracted from its time, and from its trace's later events). Not for fp16 loss
/// scaling, whose own Σg² check skips an overflowed step (skipped_steps), nor --allow-nonfinite.
struct GradientCheck {
  bool bad = false;
  std::string where;
  double seconds = 0;
} gradientCheck;

void checkGradients() {
  const double t0 = rt::now_seconds();
  const int64_t n = kLayout.gradsBytes / static_cast<int64_t>(dtypeBytes(kLayout.gradsDtype));
  const int64_t first = firstNonfiniteGradient(mem.grads, n);
  double bad = first >= 0 ? 1 : 0;
  if (world() > 1) // every rank stops at the same step
    bad = tally_comm::sum(bad);
  gradientCheck.bad = bad > 0;
  const bool whole = kLayout.zero == 0 && kLayout.tensor == 1; // kLayout.params' offsets hold
  gradientCheck.where = first >= 0 && whole ? gradientAt(mem.grads, first) : "";
  const double seconds = rt::now_seconds() - t0;
  gradientCheck.seconds += seconds;
  prof.t0 += seconds; // the traced step's later kernels start as if the check took no time
}

void dumpGradients() {
  if (!args.dumpGrads.empty() && partedModel()) // each rank holds its pieces
    dumpPieces(args.dumpGrads, mem, rank, tally_comm::merge);
  else if (!args.dumpGrads.empty() && rank == 0) // every rank holds the same averaged gradients
    writeTensors(args.dumpGrads, true, mem);
}

/// --trace FILE (rank r of several: FILE.rank<r>): the traced step's kernel calls in the Trace
/// Event Format (Chrome's JSON, which Perfetto and chrome://tracing open): process `rank + 1`
/// named "rank r (measured)", one thread (the step runs its kernels one after another; each
/// kernel's OpenMP threads work inside its slice), a slice for the whole step and one per
/// kernel call, named "op path (kernel)", in microseconds from the step's start; otherData
/// holds the step's start on the steady clock, which `tally run` aligns the ranks by.
void writeTrace(const std::string &path, int64_t step, double t0, double seconds) {
  std::vector<TraceEvent> &ev = prof.events;
  std::stable_sort(ev.begin(), ev.end(), [](const TraceEvent &a, const TraceEvent &b) { return a.start < b.start; });
  const std::string pid = std::to_string(rank + 1), where = "\"pid\": " + pid + ", \"tid\": 1";
  std::string out = "{\"traceEvents\": [\n";
  out += "  {\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + pid + ", \"args\": {\"name\": \"rank " +
         std::to_string(rank) + " (measured)\"}},\n";
  out += "  {\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " + pid + ", \"args\": {\"sort_index\": " + pid + "}},\n";
  out += "  {\"name\": \"thread_name\", \"ph\": \"M\", " + where + ", \"args\": {\"name\": \"step\"}},\n";
  out += "  {\"name\": \"step " + std::to_string(step) + "\", \"cat\": \"step\", \"ph\": \"X\", \"ts\": 0, \"dur\": " +
         num(seconds * 1e6) + ", " + where + "}";
  for (const TraceEvent &e : ev) {
    std::string p = rt::json_escape(e.path), k = rt::json_escape(e.kernel), c = rt::json_escape(e.cls);
    out += ",\n  {\"name\": \"" + p + " (" + k + ")\", \"cat\": \"" + c + "\", \"ph\": \"X\", \"ts\": " +
           num(e.start * 1e6) + ", \"dur\": " + num(e.seconds * 1e6) + ", " + where + ", \"args\": {\"op_path\": \"" + p +
           "\", \"op_id\": " + std::to_string(e.op) + ", \"op_class\": \"" + c + "\", \"kernel\": \"" + k +
           "\", \"micro_batch\": " + std::to_string(e.micro) + "}}";
  }
  out += "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {\"model\": \"" + rt::json_escape(kLayout.model) +
         "\", \"plan\": \"" + rt::json_escape(kLayout.plan) + "\", \"backend\": \"cpu\", \"rank\": " +
         std::to_string(rank) + ", \"ranks\": " + std::to_string(kLayout.ranks) + ", \"step\": " + std::to_string(step) +
         ", \"step_start_s\": " + num(t0) + ", \"step_s\": " + num(seconds) + ", \"kernel_calls\": " +
         std::to_string(ev.size()) + "}}\n";
  std::string file = kLayout.ranks > 1 ? path + ".rank" + std::to_string(rank) : path;
  std::ofstream f(file, std::ios::binary);
  if (!(f << out) || !f.flush())
    die("cannot write the trace " + file);
  ev.clear();
}

/// This rank's row of the per-rank table: median step seconds, communication and idle seconds
/// per timed step, peak resident bytes, arena bytes, regions bytes.
std::vector<double> rankRow(const std::vector<double> &times, int64_t kernelSteps, int64_t peak) {
  double median = times.empty() ? 0 : medianOf(times);
  double comm = 0, idle = 0, steps = std::max<double>(1, static_cast<double>(kernelSteps));
  for (const auto &[key, v] : prof.by) {
    if (key.first == "communication")
      comm += v.second / steps;
    if (key.first == "bubble")
      idle += v.second / steps;
  }
  double regions = static_cast<double>(kLayout.paramsBytes + kLayout.gradsBytes + kLayout.masterBytes +
                                       kLayout.optimizerBytes);
  return {median, comm, idle, static_cast<double>(peak), static_cast<double>(kLayout.arenaBytes), regions};
}

/// "per_rank": every rank's row (rankRow) and the bytes it sent in the last step.
std::string perRankJson(const std::vector<double> &rows, size_t k, const std::vector<int64_t> &sent) {
  std::string out = "  \"per_rank\": [";
  for (size_t r = 0; r * k < rows.size(); ++r) {
    const double *x = rows.data() + r * k;
    out += std::string(r ? ",\n    " : "\n    ") + "{\"rank\": " + std::to_string(r) + ", \"step_s\": " + num(x[0]) +
           ", \"communication_s\": " + num(x[1]) + ", \"idle_s\": " + num(x[2]) + ", \"peak_bytes\": " + num(x[3]) +
           ", \"arena_bytes\": " + num(x[4]) + ", \"regions_bytes\": " + num(x[5]) +
           // counted by the ring collectives and the pipeline's sends (not MPI's own all-reduce)
           (partedModel() && r < sent.size() ? ", \"sent_bytes\": " + std::to_string(sent[r]) : std::string()) + "}";
  }
  return out + "\n  ],\n";
}

} // namespace

int main(int argc, char **argv) {
  rt::restart_with_single_threaded_blas(argv);
  const double started = rt::now_seconds();
  tally_comm::init(&argc, &argv);
  args = parse(argc, argv);
  rank = tally_comm::rank();
  select_stage(rank); // pipeline parallel: this rank's regions and arena
  if (tally_comm::size() != world())
    die("this step runs on " + std::to_string(world()) + " processes (data = " + std::to_string(kLayout.ranks) +
        ", tensor = " + std::to_string(kLayout.tensor) + ", pipeline = " + std::to_string(kLayout.pipeline) +
        "; `mpirun -np " + std::to_string(world()) + "`), not " +
        std::to_string(tally_comm::size()));
  try {
    // Data × tensor, data × pipeline: this rank's tensor, data and pipeline groups (one kind
    // alone: the world); its stage is kLayout.stage (select_stage, by the plan's rank order).
    tally_comm::split_groups(tensorRankOf(rank), static_cast<int>(kLayout.tensor), dataRankOf(rank),
                             static_cast<int>(kLayout.ranks), static_cast<int>(kLayout.stage),
                             static_cast<int>(kLayout.pipeline));
    mem.arena = region(kLayout.arenaBytes);
    mem.params = region(kLayout.paramsBytes);
    mem.grads = region(kLayout.gradsBytes);
    mem.master = region(kLayout.masterBytes);
    mem.optimizer = region(kLayout.optimizerBytes);
    mem.data = region(kLayout.dataBytes);
    initialiseRank(args, mem, rank);
    loadData(args);

    rt::Ctx ctx;
    ctx.threads = static_cast<int>(args.threads);
    ctx.timer = Profile::record;
    ctx.timer_user = &prof;

    const double start = rt::now_seconds() - started; // allocation, initialisation, data
    std::vector<double> losses, times;
    int64_t sent = 0, sentBy[tally_comm::kKinds] = {0, 0, 0};
    int64_t skipped = 0, total = args.steps; // the first args.warmup untimed
    Progress progress;
    progress.on = progress.on && rank == 0;
    std::vector<double> unprofiled; // the times of the timed steps whose kernels were not timed
    int64_t kernelSteps = 0;
    for (int64_t i = 0; i < total; ++i) {
      prof.timing = profiledStep(args, i);
      kernelSteps += prof.timing ? 1 : 0;
      ctx.timer = prof.timing ? Profile::record : nullptr; // an untimed kernel reads no clock
      progress.step(args, i);
      currentBatch = i % batches;
      bool last = i + 1 == total, updated = true;
      prof.tracing = last && !args.trace.empty(); // the last step, which is timed
      if (prof.tracing) // the calls of a timed step so far, or a guess when it is the first
        prof.events.reserve(static_cast<size_t>(times.empty() ? 4096 : prof.calls / static_cast<int64_t>(times.size()) + 64));
      // Micro-batch m of rank r is the step's global micro-batch r·microSteps + m: its seed too.
      uint64_t seed = (args.seed << 32) + static_cast<uint64_t>((i * kLayout.ranks + dataRank()) * kLayout.microSteps);
      tally_comm::reset_sent_bytes();
      double t0 = rt::now_seconds();
      prof.t0 = t0;
      gradientCheck.seconds = 0;
      const bool checks = kLayout.lossScale == 1 && !args.allowNonfinite;
      double loss = train_step(ctx, i + 1, seed, loadMicroBatch, last ? dumpGradients : nullptr, &updated,
                               checks ? checkGradients : nullptr);
      double dt = rt::now_seconds() - t0 - gradientCheck.seconds;
      sent = tally_comm::sent_bytes(); // the ring collectives of this step (ZeRO 2 and 3, tensor parallel)
      for (int k = 0; k < tally_comm::kKinds; ++k)
        sentBy[k] = tally_comm::sent_bytes(static_cast<tally_comm::SentKind>(k));
      // The whole batch's loss: the mean of the data ranks' (a tensor group's are equal; only a
      // pipeline's last stage has one, the others 0).
      if (world() > 1)
        loss = tally_comm::sum(loss) / static_cast<double>(kLayout.ranks * kLayout.tensor);
      losses.push_back(loss);
      if (!std::isfinite(loss) && !args.allowNonfinite)
        die(nonfiniteLoss(i + 1, loss));
      if (gradientCheck.bad) {
        if (rank != 0) // rank 0 says why
          std::exit(1);
        die(nonfiniteGradients(i + 1, gradientCheck.where));
      }
      if (timedStep(args, i))
        times.push_back(dt);
      if (timedStep(args, i) && !prof.timing)
        unprofiled.push_back(dt);
      skipped += updated ? 0 : 1;
      if (prof.tracing)
        writeTrace(args.trace, total, t0, dt);
    }
    progress.done();
    if (!args.save.empty())
      saveRank(args, mem, rank, tally_comm::sum, tally_comm::merge);
    std::vector<int64_t> sentByRank = tally_comm::gather_counts(sent);
    std::vector<int64_t> sentByGroup[tally_comm::kKinds];
    for (int k = 0; k < tally_comm::kKinds; ++k)
      sentByGroup[k] = tally_comm::gather_counts(sentBy[k]);
    int64_t peak = peakResidentBytes();
    // Per rank (item 6 of issue 39): its median step, communication and idle time (receives
    // waited in: op class "bubble") per timed step, peak resident memory, arena and regions.
    std::vector<double> mine = rankRow(unprofiled.empty() ? times : unprofiled, kernelSteps, peak);
    std::vector<double> rows = tally_comm::gather_values(mine);
    tally_comm::finalize();
    if (rank != 0)
      return 0;

    std::string out = "{\n  \"backend\": \"cpu\",\n";
    out += "  \"model\": \"" + rt::json_escape(kLayout.model) + "\",\n";
    out += "  \"plan\": \"" + rt::json_escape(kLayout.plan) + "\",\n";
    out += "  \"threads\": " + std::to_string(ctx.nthreads()) + ",\n";
    out += "  \"ranks\": " + std::to_string(world()) + ",\n  \"tensor\": " + std::to_string(kLayout.tensor) +
           ",\n  \"pipeline\": " + std::to_string(kLayout.pipeline) + ",\n  \"zero\": " + std::to_string(kLayout.zero) + ",\n";
    out += "  \"steps\": " + std::to_string(args.steps) + ",\n  \"warmup\": " + std::to_string(args.warmup) + ",\n";
    out += "  \"start_s\": " + num(start) + ",\n";
    out += timingJson(times, &unprofiled);
    out += "  \"kernel_steps\": " + std::to_string(kernelSteps) + ",\n";
    out += "  \"arena_bytes\": " + std::to_string(kLayout.arenaBytes) + ",\n";
    out += "  \"regions\": {\"params\": " + std::to_string(kLayout.paramsBytes) + ", \"grads\": " +
           std::to_string(kLayout.gradsBytes) + ", \"master\": " + std::to_string(kLayout.masterBytes) +
           ", \"optimizer\": " + std::to_string(kLayout.optimizerBytes) + ", \"data\": " + std::to_string(kLayout.dataBytes) +
           "},\n";
    out += "  \"peak_bytes\": " + std::to_string(peak) + ",\n";
    if (world() > 1)
      out += perRankJson(rows, mine.size(), sentByRank);
    static_assert(tally_comm::kKinds == 3, "sentBytesJson names three kinds of counts");
    if (partedModel()) // the bytes each rank sent in the last step, counted in driver/tally_comm.h
      out += sentBytesJson(sentByRank, sentByGroup);
    out += "  \"model_flops\": " + num(kLayout.modelFlops) + ",\n";
    out += "  \"skipped_steps\": " + std::to_string(skipped) + ",\n  \"kernels\": [";
    bool first = true;
    for (const auto &[key, v] : prof.by) {
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
