// The trace of `tally run --trace` (report/ChromeTrace.h). Times in the Trace Event Format are
// microseconds; "X" events are complete slices (ts, dur), "M" events name processes and threads.
#include "report/ChromeTrace.h"

#include "ir/OpRules.h"
#include "passes/StepTimeline.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace tally {

using llvm::json::Array;
using llvm::json::Object;
using llvm::json::Value;

namespace {

double number(const Object *o, llvm::StringRef key, double otherwise = NAN) {
  if (!o)
    return otherwise;
  if (auto v = o->getNumber(key))
    return *v;
  return otherwise;
}

Object meta(const char *what, int64_t pid, int64_t tid, Object args) {
  Object m{{"name", what}, {"ph", "M"}, {"pid", pid}, {"args", std::move(args)}};
  if (tid >= 0)
    m["tid"] = tid;
  return m;
}

/// The FLOPs and bytes of the step's kernel calls: op index → (FLOPs, executed FLOPs, bytes or
/// NaN where unknown, ops fused), from the op rules of the step graph.
struct StepCosts {
  const Analysis &a;
  const Graph &s;
  std::map<uint32_t, const Analysis::FusedKernel *> fusedAt; ///< first op of a fused run
  std::map<std::string, int64_t> byPath;                      ///< paths of exactly one op (else -2)
  explicit StepCosts(const Analysis &an) : a(an), s(*an.step) {
    for (const Analysis::FusedKernel &k : a.fusion.kernels)
      if (k.first < a.stepSchedule.size())
        fusedAt[a.stepSchedule[k.first].op] = &k;
  }
  /// The op a kernel call ran: its op_id when that op has op_path, else the one op of that path.
  int64_t resolve(int64_t id, const std::string &path) {
    if (id >= 0 && static_cast<size_t>(id) < s.ops.size() && s.opPath(static_cast<OpId>(id)) == path)
      return id;
    if (byPath.empty())
      for (OpId i = 0; i < s.ops.size(); ++i) {
        auto [it, fresh] = byPath.emplace(s.opPath(i), static_cast<int64_t>(i));
        if (!fresh)
          it->second = -2;
      }
    auto it = byPath.find(path);
    return it == byPath.end() ? -1 : it->second;
  }
  void add(Object &args, int64_t id, int64_t calls) {
    if (id < 0)
      return;
    double flops = 0, executed = 0, bytes = 0;
    int64_t ops = 1;
    auto cost = [&](OpId i) {
      ForwardCost c = ruleFor(s.ops[i].kind).forward(s, s.ops[i]);
      flops += c.flops;
      executed += c.executedFlops;
      bytes += c.bytesRead + c.bytesWritten;
    };
    auto f = fusedAt.find(static_cast<uint32_t>(id));
    if (f != fusedAt.end()) {
      for (uint32_t e = f->second->first; e < f->second->first + f->second->count && e < a.stepSchedule.size(); ++e)
        cost(a.stepSchedule[e].op);
      bytes = std::max(0.0, bytes - f->second->bytesSaved);
      ops = f->second->count;
    } else {
      cost(static_cast<OpId>(id));
    }
    const char *pre = calls > 1 ? "op_" : "";
    args[std::string(pre) + "flops"] = flops;
    if (executed != flops)
      args[std::string(pre) + "executed_flops"] = executed;
    args[std::string(pre) + "bytes"] = bytes;
    if (calls > 1)
      args["op_calls"] = calls;
    if (ops > 1)
      args["fused_ops"] = ops;
  }
};

/// The measured ranks' events into `events`, shifted onto one axis and given their ops' costs.
bool measuredEvents(const Analysis &a, std::vector<Value> &ranks, Array &events, std::string &error) {
  double first = INFINITY;
  for (Value &r : ranks) {
    const Object *o = r.getAsObject();
    const Object *other = o ? o->getObject("otherData") : nullptr;
    if (!o || !o->getArray("traceEvents") || !std::isfinite(number(other, "step_start_s"))) {
      error = "the generated step's trace has no traceEvents and otherData.step_start_s";
      return false;
    }
    first = std::min(first, number(other, "step_start_s"));
  }
  StepCosts costs(a);
  for (Value &r : ranks) {
    Object *o = r.getAsObject();
    double shift = (number(o->getObject("otherData"), "step_start_s") - first) * 1e6;
    Array &ev = *o->getArray("traceEvents");
    // The calls of one op in a row (the same op, path and micro-batch) share its cost: runs[i]
    // is the length of the run event i is in.
    auto key = [&](size_t j) {
      const Object *e = ev[j].getAsObject();
      const Object *x = e ? e->getObject("args") : nullptr;
      return std::make_tuple(x ? x->getInteger("op_id") : llvm::None, x ? x->getString("op_path") : llvm::None,
                             x ? x->getInteger("micro_batch") : llvm::None);
    };
    std::vector<int64_t> runs(ev.size(), 1);
    for (size_t i = 0, j = 0; i < ev.size(); i = j) {
      for (j = i + 1; j < ev.size() && key(j) == key(i);)
        ++j;
      std::fill(runs.begin() + static_cast<std::ptrdiff_t>(i), runs.begin() + static_cast<std::ptrdiff_t>(j),
                static_cast<int64_t>(j - i));
    }
    for (size_t i = 0; i < ev.size(); ++i) {
      Object *e = ev[i].getAsObject();
      if (!e)
        continue;
      if (auto ts = e->getNumber("ts"))
        (*e)["ts"] = *ts + shift;
      Object *args = e->getObject("args");
      auto id = args ? args->getInteger("op_id") : llvm::None;
      auto path = args ? args->getString("op_path") : llvm::None;
      if (id && path && a.step)
        costs.add(*args, costs.resolve(*id, path->str()), runs[i]);
      events.push_back(std::move(ev[i]));
    }
  }
  return true;
}

/// The estimate as process `pid`, a thread per track in the order the tracks first appear.
void estimateEvents(const Analysis &a, int64_t pid, Array &events) {
  events.push_back(meta("process_name", pid, -1, Object{{"name", "tally estimate"}}));
  events.push_back(meta("process_sort_index", pid, -1, Object{{"sort_index", pid}}));
  std::map<std::string, int64_t> tids;
  for (const TimelineSlice &s : estimatedTimeline(a)) {
    auto [it, fresh] = tids.emplace(s.track, static_cast<int64_t>(tids.size()) + 1);
    if (fresh)
      events.push_back(meta("thread_name", pid, it->second, Object{{"name", s.track}}));
    Object args{{"phase", s.phase}};
    if (s.op != kNone) {
      const Op &op = a.graph->ops[s.op];
      const OpAnalysis &c = a.ops[s.op];
      args["op_path"] = a.graph->opPath(s.op);
      args["op_class"] = opClassName(opClass(op.kind)).str();
      bool backward = s.phase == "backward";
      args["flops"] = backward ? c.inputGradFlops + c.weightGradFlops : c.forward.flops;
      args["bytes"] = backward ? c.backwardBytes : c.forward.bytesRead + c.forward.bytesWritten;
      args["seconds"] = s.seconds;
    }
    if (s.microBatch >= 0)
      args["micro_batch"] = s.microBatch;
    events.push_back(Object{{"name", s.name}, {"cat", s.phase}, {"ph", "X"}, {"ts", s.start * 1e6},
                            {"dur", s.seconds * 1e6}, {"pid", pid}, {"tid", it->second}, {"args", std::move(args)}});
  }
}

} // namespace

bool runTrace(const Analysis &a, std::vector<Value> &ranks, double medianS, Object &out, std::string &error) {
  Array events;
  if (!measuredEvents(a, ranks, events, error))
    return false;
  int64_t ranksN = static_cast<int64_t>(ranks.size());
  estimateEvents(a, ranksN + 1, events);
  const auto &t = a.time;
  Object estimate{{"step_s", t.step},
                  {"compute_s", t.forward + t.backward + t.recompute},
                  {"forward_s", t.forward},
                  {"backward_s", t.backward},
                  {"recompute_s", t.recompute},
                  {"optimizer_s", t.optimizer},
                  {"communication_s", t.communication},
                  {"bubble_s", t.bubble},
                  {"host_transfer_s", t.hostTransfer},
                  {"target", a.plan->target.name}};
  Object measured{{"median_step_s", medianS}, {"ranks", ranksN}};
  if (const Object *o = ranks.empty() ? nullptr : ranks[0].getAsObject())
    if (const Object *other = o->getObject("otherData")) {
      measured["traced_step_s"] = number(other, "step_s", 0);
      measured["step"] = number(other, "step", 0);
    }
  out = Object{{"traceEvents", std::move(events)},
               {"displayTimeUnit", "ms"},
               {"otherData", Object{{"model", a.graph->model},
                                    {"plan", a.plan->name},
                                    {"measured", std::move(measured)},
                                    {"estimate", std::move(estimate)}}}};
  return true;
}

} // namespace tally
