// `tally report FILE --emit=memory-plan [--format json]`: the training step's schedule, the
// arena's buffers and the flat regions (schema in docs/ir.md). A renderer: every number comes
// from passes/Activations.cpp and passes/MemoryPlan.cpp.
#include "report/Report.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

namespace tally {

namespace {

const char *entryKind(StepEntry::Kind k) {
  switch (k) {
  case StepEntry::Forward: return "forward";
  case StepEntry::Backward: return "backward";
  case StepEntry::Recompute: return "recompute";
  case StepEntry::Optimizer: return "optimizer";
  }
  return "forward";
}

const char *bufferKind(Buffer::Kind k) {
  switch (k) {
  case Buffer::Saved: return "saved";
  case Buffer::Transient: return "transient";
  case Buffer::Gradient: return "gradient";
  }
  return "saved";
}

/// A buffer's tensor in the step graph: a gradient buffer holds the gradient tensor.
TensorId stepTensor(const Analysis &a, const Buffer &b) {
  if (b.kind == Buffer::Gradient && b.tensor < a.step->gradient.size() &&
      a.step->gradient[b.tensor] != kNone)
    return a.step->gradient[b.tensor];
  return b.tensor;
}

/// A buffer's lifetime in stepSchedule indexes: from the first entry of its first schedule
/// step to the last entry of its last one.
std::pair<uint32_t, uint32_t> span(const Analysis &a, const Buffer &b) {
  uint32_t first = a.stepIndexOf[b.first];
  uint32_t next = a.stepIndexOf[std::min<size_t>(b.last + 1, a.stepIndexOf.size() - 1)];
  return {first, next > first ? next - 1 : first};
}

llvm::json::Object regionJson(const Region &r) {
  llvm::json::Array ts;
  for (const Region::Entry &e : r.tensors) {
    llvm::json::Object o{{"tensor", static_cast<int64_t>(e.tensor)}, {"offset", e.offset}, {"bytes", e.bytes}};
    if (e.state)
      o["state"] = static_cast<int64_t>(e.state);
    ts.push_back(std::move(o));
  }
  return llvm::json::Object{{"bytes", r.bytes}, {"dtype", nameOf(r.dtype)}, {"tensors", std::move(ts)}};
}

} // namespace

void renderMemoryPlan(const Analysis &a, llvm::raw_ostream &os, bool json) {
  const Graph &s = *a.step;
  // A plan whose sizes or offsets do not fit int64 has no offsets to print: only why.
  if (!a.planOverflow.empty()) {
    if (json)
      printJson(os, llvm::json::Object{{"alignment", kAlignment}, {"overflow", a.planOverflow}});
    else
      os << "memory plan @" << s.model
         << ": not representable: it does not fit in 64-bit byte offsets (" << a.planOverflow
         << ")\n";
    return;
  }
  if (json) {
    llvm::json::Array schedule, buffers;
    for (size_t i = 0; i < a.stepSchedule.size(); ++i)
      schedule.push_back(llvm::json::Object{{"step", static_cast<int64_t>(i)},
                                            {"op", static_cast<int64_t>(a.stepSchedule[i].op)},
                                            {"kind", entryKind(a.stepSchedule[i].kind)}});
    for (const Buffer &b : a.buffers) {
      auto [first, last] = span(a, b);
      TensorId t = stepTensor(a, b);
      buffers.push_back(llvm::json::Object{
          {"tensor", t == kNone ? llvm::json::Value(nullptr) : llvm::json::Value(static_cast<int64_t>(t))},
          {"offset", b.offset},
          {"bytes", b.bytes},
          {"first", static_cast<int64_t>(first)},
          {"last", static_cast<int64_t>(last)},
          {"kind", bufferKind(b.kind)},
          {"what", b.what.c_str()}});
    }
    llvm::json::Object root{
        {"alignment", kAlignment},
        {"arena_bytes", a.arenaBytes},
        {"schedule", std::move(schedule)},
        {"buffers", std::move(buffers)},
        {"regions", llvm::json::Object{{"params", regionJson(a.regions.params)},
                                       {"grads", regionJson(a.regions.grads)},
                                       {"master", regionJson(a.regions.master)},
                                       {"optimizer", regionJson(a.regions.optimizer)}}},
        {"shard_elements", a.regions.shard}};
    printJson(os, std::move(root));
    return;
  }
  os << "memory plan @" << s.model << ": arena " << a.arenaBytes << " bytes, alignment "
     << kAlignment << "\n";
  os << "schedule:\n";
  for (size_t i = 0; i < a.stepSchedule.size(); ++i) {
    const StepEntry &e = a.stepSchedule[i];
    os << llvm::formatv("  {0,5} {1,-9} %", i, entryKind(e.kind)) << e.op << " "
       << opName(s.ops[e.op].kind) << "  // " << s.opPath(e.op) << "\n";
  }
  os << "buffers (offset, bytes, steps, kind):\n";
  for (const Buffer &b : a.buffers) {
    auto [first, last] = span(a, b);
    TensorId t = stepTensor(a, b);
    os << llvm::formatv("  {0,12} {1,12} [{2}, {3}] {4} ", b.offset, b.bytes, first, last,
                        bufferKind(b.kind))
       << (t == kNone ? std::string("-") : "%" + std::to_string(t)) << " " << b.what << "\n";
  }
  auto region = [&](const char *name, const Region &r) {
    os << name << ": " << r.bytes << " bytes, " << nameOf(r.dtype) << ", " << r.tensors.size()
       << " tensors\n";
    for (const Region::Entry &e : r.tensors) {
      os << llvm::formatv("  {0,12} {1,12} %", e.offset, e.bytes) << e.tensor;
      const Tensor &x = s.tensors[e.tensor];
      if (x.role == TensorRole::Param && x.param < s.params.size())
        os << " " << s.paramPath(x.param);
      if (e.state)
        os << " (state " << e.state << ")";
      os << "\n";
    }
  };
  region("params", a.regions.params);
  region("grads", a.regions.grads);
  region("master", a.regions.master);
  region("optimizer", a.regions.optimizer);
  if (a.regions.shard > 0)
    os << "ZeRO shard: master and optimizer hold " << a.regions.shard
       << " elements of the grads region per rank (rank r from element r x " << a.regions.shard << ")\n";
  if (a.regions.tensorShards > 0)
    os << "ZeRO " << a.regions.tensorShards << " pieces: grads, master and optimizer"
       << (a.regions.tensorShards >= 3 ? " and params" : "") << " hold one piece of ceil(n / "
       << a.plan->parallel.data << ") elements of each tensor per rank (rank r from element r x the piece)\n";
}

} // namespace tally
