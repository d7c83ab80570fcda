// The driver of a generated CPU training step (the same file for every model; `tally build`
// copies it next to step.cpp). It allocates exactly the regions of the step's memory plan
// (kLayout), fills the parameters (--init, or the default initialisation) and the batch
// (--data, or random data), runs --steps steps (the first --warmup untimed), and prints one
// JSON object: the median step time (with min, max and the load average), per-kernel times by op class, the bytes it allocated, the peak resident
// memory and the loss of every step. `tally run` reads that object; docs/runtime.md documents
// the flags.
//
// Data parallel (kLayout.ranks > 1): one process per rank under `mpirun -np N`
// (driver/tally_comm.h). Rank r trains on its rows of every batch (its micro-batches are the
// global micro-batches r·microSteps …, with their dropout seeds), the step averages the
// gradients, and rank 0 prints the JSON: its own times and memory, and the loss of the whole
// batch (the ranks' losses averaged, outside the timed step). Under ZeRO the master shard is
// initialised from the whole initialisation, and --save gathers it first; under ZeRO 2 and 3
// every tensor's pieces so (driver_host.h, WholeModel), and the JSON has `sent_bytes`: what
// each rank sent in the last step, counted by the collectives.
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

#include <sys/mman.h>
#include <unistd.h>

using namespace tally_step;

namespace {

/// A zeroed region of `bytes`, 256-byte aligned. Regions of 2 MiB or more are anonymous mappings
/// in transparent huge pages where the kernel allows them (madvise): the kernel zeroes each
/// page as it is first touched, so there is no memset pass, and 2 MiB pages fault ~500 times
/// less often (GPT-2 124M's 2.2 GB of regions: ~1,100 faults instead of ~540,000, and 1.7 s
/// of memset and faults before the first step gone). Regions live until the process exits.
uint8_t *region(int64_t bytes) {
  size_t n = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 255) / 256 * 256);
  const size_t kHuge = size_t(1) << 21;
  if (n >= kHuge) {
    size_t m = (n + kHuge - 1) / kHuge * kHuge;
    void *p = mmap(nullptr, m + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      die("cannot map " + std::to_string(m) + " bytes");
    uint8_t *a = reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1));
    madvise(a, m, MADV_HUGEPAGE); // advice: without huge pages it is ordinary zeroed memory
    return a;
  }
  void *p = std::aligned_alloc(256, n);
  if (!p)
    die("cannot allocate " + std::to_string(n) + " bytes");
  std::memset(p, 0, n);
  return static_cast<uint8_t *>(p);
}

int rank = 0; ///< this process's rank: tensor rank rank % tensor of data rank rank / tensor
int64_t world() { return kLayout.ranks * kLayout.tensor; }
int64_t dataRank() { return rank / kLayout.tensor; }

void loadMicroBatch(int64_t m) {
  for (int i = 0; i < kLayout.ninputs; ++i) {
    const InputInfo &in = kLayout.inputs[i];
    size_t bytes = static_cast<size_t>(in.t.numel) * dtypeBytes(in.t.dtype);
    int64_t global = (currentBatch * kLayout.ranks + dataRank()) * kLayout.microSteps + m;
    size_t from = in.batched ? static_cast<size_t>(global) * bytes : 0;
    std::memcpy(mem.data + in.offset, batchData[i].data() + from, bytes);
  }
}

/// Kernel seconds and calls, by (op class, kernel), while `timing` is set.
struct Profile {
  bool timing = false;
  std::map<std::pair<std::string, std::string>, std::pair<int64_t, double>> by;
  static void record(void *user, const char *kernel, double seconds) {
    Profile *p = static_cast<Profile *>(user);
    if (!p->timing)
      return;
    auto &e = p->by[{op_class, kernel}];
    e.first += 1;
    e.second += seconds;
  }
};

Args args;

void dumpGradients() {
  if (!args.dumpGrads.empty() && (kLayout.zero >= 2 || kLayout.tensor > 1)) // each rank holds its pieces
    dumpPieces(args.dumpGrads, mem, rank, tally_comm::merge);
  else if (!args.dumpGrads.empty() && rank == 0) // every rank holds the same averaged gradients
    writeTensors(args.dumpGrads, true, mem);
}

} // namespace

int main(int argc, char **argv) {
  rt::restart_with_single_threaded_blas(argv);
  const double started = rt::now_seconds();
  tally_comm::init(&argc, &argv);
  args = parse(argc, argv);
  rank = tally_comm::rank();
  if (tally_comm::size() != world())
    die("this step runs on " + std::to_string(world()) + " processes (data = " + std::to_string(kLayout.ranks) +
        ", tensor = " + std::to_string(kLayout.tensor) + "; `mpirun -np " + std::to_string(world()) + "`), not " +
        std::to_string(tally_comm::size()));
  try {
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
    Profile prof;
    ctx.timer = Profile::record;
    ctx.timer_user = &prof;

    const double start = rt::now_seconds() - started; // allocation, initialisation, data
    std::vector<double> losses, times;
    int64_t sent = 0;
    int64_t skipped = 0, total = args.steps; // the first args.warmup untimed
    Progress progress;
    progress.on = progress.on && rank == 0;
    for (int64_t i = 0; i < total; ++i) {
      prof.timing = timedStep(args, i);
      progress.step(args, i);
      currentBatch = i % batches;
      bool last = i + 1 == total, updated = true;
      // Micro-batch m of rank r is the step's global micro-batch r·microSteps + m: its seed too.
      uint64_t seed = (args.seed << 32) + static_cast<uint64_t>((i * kLayout.ranks + dataRank()) * kLayout.microSteps);
      tally_comm::reset_sent_bytes();
      double t0 = rt::now_seconds();
      double loss = train_step(ctx, i + 1, seed, loadMicroBatch, last ? dumpGradients : nullptr, &updated);
      double dt = rt::now_seconds() - t0;
      sent = tally_comm::sent_bytes(); // the ring collectives of this step (ZeRO 2 and 3, tensor parallel)
      if (world() > 1) // the whole batch's loss: the mean of the ranks' (equal shares; a tensor group's are equal)
        loss = tally_comm::sum(loss) / static_cast<double>(world());
      losses.push_back(loss);
      if (!std::isfinite(loss) && !args.allowNonfinite)
        die(nonfiniteLoss(i + 1, loss));
      if (timedStep(args, i))
        times.push_back(dt);
      skipped += updated ? 0 : 1;
    }
    progress.done();
    if (!args.save.empty())
      saveRank(args, mem, rank, tally_comm::sum, tally_comm::merge);
    std::vector<int64_t> sentByRank = tally_comm::gather_counts(sent);
    int64_t peak = peakResidentBytes();
    tally_comm::finalize();
    if (rank != 0)
      return 0;

    std::string out = "{\n  \"backend\": \"cpu\",\n";
    out += "  \"model\": \"" + rt::json_escape(kLayout.model) + "\",\n";
    out += "  \"plan\": \"" + rt::json_escape(kLayout.plan) + "\",\n";
    out += "  \"threads\": " + std::to_string(ctx.nthreads()) + ",\n";
    out += "  \"ranks\": " + std::to_string(world()) + ",\n  \"tensor\": " + std::to_string(kLayout.tensor) + ",\n  \"zero\": " + std::to_string(kLayout.zero) + ",\n";
    out += "  \"steps\": " + std::to_string(args.steps) + ",\n  \"warmup\": " + std::to_string(args.warmup) + ",\n";
    out += "  \"start_s\": " + num(start) + ",\n";
    out += timingJson(times);
    out += "  \"arena_bytes\": " + std::to_string(kLayout.arenaBytes) + ",\n";
    out += "  \"regions\": {\"params\": " + std::to_string(kLayout.paramsBytes) + ", \"grads\": " +
           std::to_string(kLayout.gradsBytes) + ", \"master\": " + std::to_string(kLayout.masterBytes) +
           ", \"optimizer\": " + std::to_string(kLayout.optimizerBytes) + ", \"data\": " + std::to_string(kLayout.dataBytes) +
           "},\n";
    out += "  \"peak_bytes\": " + std::to_string(peak) + ",\n";
    if (kLayout.zero >= 2 || kLayout.tensor > 1) { // the bytes each rank sent in the last step, counted in driver/tally_comm.h
      out += "  \"sent_bytes\": [";
      for (size_t r = 0; r < sentByRank.size(); ++r)
        out += (r ? ", " : "") + std::to_string(sentByRank[r]);
      out += "],\n";
    }
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
