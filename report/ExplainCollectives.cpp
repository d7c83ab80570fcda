// `tally explain FILE --collectives`: every collective one device runs in a step, as the step
// time priced it (passes/Collectives.cpp): the framework stack and its buckets, then per kind of
// collective its group's placement, the algorithm and protocol NCCL would pick, its steps,
// latency, bandwidths and time, and how often it runs. Like every report it only formats what
// the pass stored (Analysis::stack, Analysis::collectives); the one sum shown, latency +
// transfer, is the pass's own time written out.
#include "report/Explain.h"

#include "ir/Units.h"
#include "passes/Collectives.h"

#include "llvm/Support/FormatVariadic.h"

namespace tally {

namespace {

const char *groupName(char g) {
  switch (g) {
  case 't': return "tensor";
  case 'c': return "context";
  case 'p': return "pipeline";
  case 'e': return "expert";
  case 'x': return "expert-data";
  default: return "data";
  }
}

std::string count(double v) {
  return v == static_cast<double>(static_cast<int64_t>(v)) && v < 1e15
             ? std::to_string(static_cast<int64_t>(v))
             : llvm::formatv("{0:f2}", v).str();
}

std::string placement(const Placement &g) {
  std::string s = count(g.n) + " members";
  if (g.r > 1)
    s += ", " + count(g.k) + " per node on " + count(g.r) + " nodes";
  else
    s += " in one node";
  return s;
}

} // namespace

void explainCollectivesText(const Analysis &a, llvm::raw_ostream &os) {
  const StackFacts &s = a.stack;
  os << "Collectives of one optimizer step on one device (plan " << a.plan->name << ")\n";
  os << "  stack " << s.name;
  if (s.chosen)
    os << " (chosen from the layout: " << s.why << "; `stack = ...` in the target record says otherwise)";
  os << "\n  gradient messages: "
     << (s.gradientBucket > 0 ? formatBytes(s.gradientBucket) + " each" : std::string("one per repeated block"))
     << " (" << s.bucketSource << ")\n";
  os << "  overlap with compute: " << (s.overlap ? "yes" : "no") << " (" << s.overlapSource << ")\n";
  os << "  gradients reduced: " << (s.reduceEveryMicroBatch ? "after every micro-batch" : "once per step, after the last micro-batch")
     << " (" << s.reduceSource << ")\n";
  if (a.plan->parallel.zero >= 3)
    os << "  ZeRO 3 parameters: "
       << (s.reshardAfterForward ? "freed after each block's forward, gathered again for its backward"
                                 : "kept from each block's forward to its backward (reshard_after_forward = false)")
       << (s.prefetch ? "; each gather prefetched under the previous block's compute"
                      : "; nothing prefetched: each gather waits (prefetch = false)")
       << "\n";
  os << "  attention kernel: " << s.attentionKernel << "\n";
  os << "  kernels: "
     << (s.compiled ? "compiled (elementwise chains fused, as --fuse prices them)"
                    : "eager, one kernel per op (`compiled = true` fuses elementwise chains)")
     << "\n";
  os << "  loss: cross_entropy " << s.crossEntropy << " ("
     << (s.crossEntropy == "eager"      ? "PyTorch's F.cross_entropy on an fp32 copy of the logits"
         : s.crossEntropy == "megatron" ? "Megatron's fp32 copy, softmax in place"
                                        : "one kernel on the logits as they are")
     << "; " << s.crossEntropySource << ")\n";
  os << "  rms_norm: " << s.normKernel << " ("
     << (s.normKernel == "eager" ? "PyTorch model code: cast, pow, mean, rsqrt, multiply, cast back, weight"
                                 : "one kernel forward, one backward")
     << "; " << s.normKernelSource << ")\n";
  if (a.collectives.empty()) {
    os << "\n  no collectives: one device, or no group of more than one member\n";
    return;
  }
  for (const Analysis::CollectiveUse &u : a.collectives) {
    const CollectiveCost &c = u.cost;
    os << "\n" << u.what << " over the " << groupName(u.group) << " group ("
       << placement(c.group) << "): " << collectiveName(c.kind) << " of "
       << formatBytes(c.bytes) << ", " << count(u.perStep) << " per step"
       << (u.overlapped ? ", beside compute" : ", exposed") << "\n";
    os << "  algorithm " << algorithmName(c.algorithm);
    if (c.algorithm != CollAlgorithm::Direct)
      os << ", protocol " << protocolName(c.protocol);
    os << ": " << count(c.intraSteps) << " steps inside a node, " << count(c.interSteps)
       << " across nodes\n";
    os << "  latency   " << formatDuration(c.latency) << "\n";
    os << "  bandwidth " << formatRate(c.busBandwidth, UnitDim::ByteRate) << " bus, "
       << formatRate(c.algBandwidth, UnitDim::ByteRate) << " of the buffer\n";
    os << "  time      " << formatDuration(c.latency) << " + " << formatBytes(c.bytes) << " / "
       << formatRate(c.algBandwidth, UnitDim::ByteRate) << " = " << formatDuration(c.time)
       << " each, " << formatDuration(c.time * u.perStep) << " per step\n";
  }
  os << "\nWhat the step exposes of them: data parallel " << formatDuration(a.time.dataParallelComm)
     << ", tensor parallel " << formatDuration(a.time.tensorParallelComm) << ", pipeline "
     << formatDuration(a.time.pipelineComm) << ", context parallel "
     << formatDuration(a.time.contextParallelComm) << ", expert parallel "
     << formatDuration(a.time.expertParallelComm) << "\n";
  if (a.time.overlapInterference > 0)
    os << "  of the data-parallel time, " << formatDuration(a.time.overlapInterference)
       << " is compute slowed beside the hidden collectives: NCCL's blocks hold one "
          "multiprocessor per channel while they run"
       << (persistentGemms(a.plan->target)
               ? ", and a persistent matmul's blocks that find none free run as a second wave"
               : "")
       << " (docs/time.md, \"Overlap is not free\")\n";
}

llvm::json::Value collectivesJson(const Analysis &a) {
  llvm::json::Array list;
  for (const Analysis::CollectiveUse &u : a.collectives) {
    const CollectiveCost &c = u.cost;
    list.push_back(llvm::json::Object{{"what", u.what},
                                      {"group", groupName(u.group)},
                                      {"kind", collectiveName(c.kind)},
                                      {"algorithm", algorithmName(c.algorithm)},
                                      {"protocol", protocolName(c.protocol)},
                                      {"members", c.group.n},
                                      {"per_node", c.group.k},
                                      {"nodes", c.group.r},
                                      {"bytes", c.bytes},
                                      {"intra_steps", c.intraSteps},
                                      {"inter_steps", c.interSteps},
                                      {"latency_s", c.latency},
                                      {"bus_bandwidth", c.busBandwidth},
                                      {"alg_bandwidth", c.algBandwidth},
                                      {"transfer_s", c.transfer},
                                      {"time_s", c.time},
                                      {"per_step", u.perStep},
                                      {"overlapped", u.overlapped}});
  }
  return list;
}

llvm::json::Value stackJson(const Analysis &a) {
  const StackFacts &s = a.stack;
  return llvm::json::Object{{"name", s.name},
                            {"chosen", s.chosen},
                            {"why", s.why},
                            {"gradient_bucket_bytes", s.gradientBucket},
                            {"bucket_source", s.bucketSource},
                            {"gather_bucket_bytes", s.gatherBucket},
                            {"overlap", s.overlap},
                            {"overlap_source", s.overlapSource},
                            {"reshard_after_forward", s.reshardAfterForward},
                            {"prefetch", s.prefetch},
                            {"reduce_every_micro_batch", s.reduceEveryMicroBatch},
                            {"reduce_source", s.reduceSource},
                            {"attention_kernel", s.attentionKernel},
                            {"native_attention", s.nativeAttention},
                            {"compiled", s.compiled},
                            {"cross_entropy", s.crossEntropy},
                            {"cross_entropy_source", s.crossEntropySource},
                            {"norm_kernel", s.normKernel},
                            {"norm_kernel_source", s.normKernelSource}};
}

void explainCollectivesJson(const Analysis &a, llvm::raw_ostream &os) {
  llvm::json::Object o{{"plan", a.plan->name},
                       {"stack", stackJson(a)},
                       {"collectives", collectivesJson(a)},
                       {"data_parallel_comm_s", a.time.dataParallelComm},
                       {"tensor_parallel_comm_s", a.time.tensorParallelComm},
                       {"pipeline_comm_s", a.time.pipelineComm},
                       {"context_parallel_comm_s", a.time.contextParallelComm},
                       {"expert_parallel_comm_s", a.time.expertParallelComm}};
  os << llvm::formatv("{0:2}", llvm::json::Value(std::move(o))) << "\n";
}

} // namespace tally
