// The text report: a budget statement for one plan — parameters, FLOPs with the 6ND
// comparison, memory per device by kind, the most expensive ops with their bound, step time,
// MFU and days.
#include "report/Report.h"

#include "ir/Units.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

namespace tally {

namespace {

std::string pct(double part, double whole) {
  return whole > 0 ? llvm::formatv("{0,5:f1}%", 100.0 * part / whole).str() : "     -";
}

void row(llvm::raw_ostream &os, llvm::StringRef label, const std::string &value,
         const std::string &extra = "") {
  os << llvm::formatv("  {0,-28} {1,16}", label, value);
  if (!extra.empty())
    os << "  " << extra;
  os << "\n";
}

std::string exact(double v) {
  // Integers below 2^53 print exactly with thousands separators; larger ones in e-notation.
  if (v >= 9007199254740992.0 || v != static_cast<double>(static_cast<int64_t>(v)))
    return llvm::formatv("{0:e3}", v).str();
  std::string digits = std::to_string(static_cast<int64_t>(v));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return out;
}

} // namespace

void renderText(const Analysis &a, llvm::raw_ostream &os) {
  const Graph &g = *a.graph;
  const Plan &p = *a.plan;
  const Parallelism &par = p.parallel;
  os << (p.isTrain ? "train " : "infer ") << p.name << ": model " << g.model << " on "
     << par.devices << " × " << p.target.name;
  if (par.devices > 1)
    os << " (data " << par.data << ", tensor " << par.tensor << ", pipeline " << par.pipeline
       << ", ZeRO " << par.zero << ")";
  os << "\n  batch " << p.batch << ", seq " << p.seq << ", micro-batch " << p.microBatch
     << ", precision " << p.precision.preset << ", optimizer " << p.optimizer.name << "\n\n";

  os << "Parameters\n";
  row(os, "total", exact(a.params.total), formatCount(a.params.total));
  if (a.params.trainable != a.params.total)
    row(os, "trainable", exact(a.params.trainable), formatCount(a.params.trainable));
  for (const Analysis::BlockCount &b : a.params.byBlock) {
    if (b.depth != 1 || b.count == 0)
      continue;
    row(os, "  " + b.path + " (" + b.block + ")", exact(b.count), pct(b.count, a.params.total));
  }

  os << "\nFLOPs per optimizer step\n";
  row(os, "forward", llvm::formatv("{0:e4}", a.flops.forward).str(),
      "matmul " + llvm::formatv("{0:e4}", a.flops.forwardMatmul).str());
  if (p.isTrain) {
    row(os, "backward", llvm::formatv("{0:e4}", a.flops.backward).str(),
        "weight grads " + llvm::formatv("{0:e4}", a.flops.backwardWeightGrad).str() +
            ", input grads " + llvm::formatv("{0:e4}", a.flops.backwardInputGrad).str());
    if (a.flops.recompute > 0)
      row(os, "recompute", llvm::formatv("{0:e4}", a.flops.recompute).str());
    row(os, "optimizer", llvm::formatv("{0:e4}", a.flops.optimizer).str());
    row(os, "step (model FLOPs)", llvm::formatv("{0:e4}", a.flops.step).str());
    row(os, "6·N·D", llvm::formatv("{0:e4}", a.flops.sixND).str(),
        llvm::formatv("exact / 6ND = {0:f4}", a.flops.ratioToSixND).str());
    row(os, "executed (kernels)", llvm::formatv("{0:e4}", a.flops.executed).str());
  }

  os << "\nMemory per device (capacity " << formatBytes(p.target.memoryBytes) << ")\n";
  auto mem = [&](llvm::StringRef label, double v) {
    row(os, label, formatBytes(v), pct(v, a.memory.peak));
  };
  mem("params", a.memory.params);
  if (p.isTrain) {
    mem("grads", a.memory.grads);
    mem("master weights", a.memory.master);
    mem("optimizer state", a.memory.optimizer);
  }
  mem("activations", a.memory.activations);
  if (a.memory.workspace > 0)
    mem("workspace", a.memory.workspace);
  row(os, "peak", formatBytes(a.memory.peak),
      p.target.memoryBytes > 0 ? pct(a.memory.peak, p.target.memoryBytes) + " of capacity"
                               : "");
  if (a.memory.hostTotal > 0)
    row(os, "host memory", formatBytes(a.memory.hostTotal));
  if (p.isTrain)
    row(os, "model-state bytes per param", llvm::formatv("{0:f2}", a.memory.bytesPerParam).str());

  // The ten most expensive ops by forward+backward time (or FLOPs when time is not known).
  std::vector<OpId> order(g.ops.size());
  for (OpId i = 0; i < order.size(); ++i)
    order[i] = i;
  auto cost = [&](OpId i) {
    const OpAnalysis &o = a.ops[i];
    return o.forwardTime + o.backwardTime > 0 ? o.forwardTime + o.backwardTime
                                              : o.forward.flops;
  };
  size_t top = std::min<size_t>(10, order.size());
  std::partial_sort(order.begin(), order.begin() + top, order.end(),
                    [&](OpId x, OpId y) { return cost(x) > cost(y); });
  os << "\nMost expensive ops (ridge " << llvm::formatv("{0:f2}", a.ridge) << " FLOP/byte)\n";
  os << llvm::formatv("  {0,-34} {1,-13} {2,12} {3,10} {4,-8} {5,10}\n", "op", "kind",
                      "FLOPs", "intensity", "bound", "time");
  for (size_t k = 0; k < top; ++k) {
    const Op &op = g.ops[order[k]];
    const OpAnalysis &o = a.ops[order[k]];
    os << llvm::formatv("  {0,-34} {1,-13} {2,12:e2} {3,10:f1} {4,-8} {5,10}\n", op.path,
                        opName(op.kind), o.forward.flops, o.intensity,
                        o.computeBound ? "compute" : "memory",
                        formatDuration(o.forwardTime + o.backwardTime));
  }

  if (a.time.step > 0) {
    os << "\nTime\n";
    row(os, "step", formatDuration(a.time.step),
        a.time.accumulationSteps > 1
            ? std::to_string(a.time.accumulationSteps) + " accumulation steps"
            : "");
    row(os, "MFU", formatPercent(a.time.mfu), "HFU " + formatPercent(a.time.hfu));
    if (a.time.run > 0)
      row(os, "run", formatDuration(a.time.run),
          llvm::formatv("{0:f0} steps", a.time.steps).str());
  }
}

} // namespace tally
