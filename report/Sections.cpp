// Builds the people-facing report content from an Analysis: every cell is a number a pass
// computed, formatted here; nothing is derived beyond percentages of a whole.
#include "report/Sections.h"

#include "ir/Units.h"
#include "report/Copies.h"
#include "support/Format.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

namespace tally {

namespace {

std::string sci(double v) { return llvm::formatv("{0:e4}", v).str(); }

std::string share(double part, double whole) {
  return whole > 0 ? llvm::formatv("{0:f1}%", 100.0 * part / whole).str() : "-";
}

ReportTable paramsTable(const Analysis &a) {
  ReportTable t;
  t.title = "Parameters";
  t.header = {"block", "kind", "parameters", "share"};
  t.rows.push_back({"(total)", a.graph->model, groupDigits(a.params.total), "100.0%"});
  if (a.params.trainable != a.params.total)
    t.rows.push_back({"(trainable)", "", groupDigits(a.params.trainable),
                      share(a.params.trainable, a.params.total)});
  // A mixture of experts: what one token reads (ParamCount.cpp, step 3).
  if (a.params.active < a.params.total)
    t.rows.push_back({"(active)", "per token", groupDigits(a.params.active),
                      share(a.params.active, a.params.total)});
  for (const Analysis::BlockCount &b : a.params.byBlock) {
    const Instance &in = a.graph->instances[b.instance];
    if (in.depth == 1 && b.count > 0)
      t.rows.push_back({a.graph->instancePath(b.instance), *in.block, groupDigits(b.count), share(b.count, a.params.total)});
  }
  // Parameters the model declares itself (a class token, position embeddings), one row each,
  // so the rows below the total add up to it.
  const Graph &g = *a.graph;
  for (const ParamInfo &p : g.params)
    if (p.instance == 0) {
      double n = numel(g.tensors[p.tensor].shape);
      t.rows.push_back({g.paramPath(p), p.trainable ? "param" : "param (frozen)", groupDigits(n),
                        share(n, a.params.total)});
    }
  t.notes.push_back(formatCount(a.params.total) +
                    (a.params.tied > 0 ? " parameters; a tied weight is counted once." : " parameters."));
  if (a.params.active < a.params.total)
    t.notes.push_back(formatCount(a.params.active) +
                      " active: each token reads top_k of each MoE layer's experts and every "
                      "dense weight.");
  return t;
}

ReportTable flopsTable(const Analysis &a) {
  const Plan &p = *a.plan;
  ReportTable t;
  t.title = p.isTrain ? "FLOPs per optimizer step" : "FLOPs of the prefill";
  t.header = {"part", "FLOPs", "note"};
  t.rows.push_back({"forward", sci(a.flops.forward),
                    "matmul " + sci(a.flops.forwardMatmul)});
  if (p.isTrain) {
    t.rows.push_back({"backward", sci(a.flops.backward),
                      "weight grads " + sci(a.flops.backwardWeightGrad) + ", input grads " +
                          sci(a.flops.backwardInputGrad)});
    t.rows.push_back({"recompute", sci(a.flops.recompute), "checkpoint = " + a.checkpoint.policy});
    t.rows.push_back({"optimizer", sci(a.flops.optimizer), p.optimizer.name + " update"});
    t.rows.push_back({"step (model FLOPs)", sci(a.flops.step), "used for MFU"});
    t.rows.push_back({"executed", sci(a.flops.executed), "what kernels run; used for HFU"});
    // 6·N·D counts tokens: no comparison for a task without a sequence (images, vectors).
    if (a.flops.sequence) {
      t.rows.push_back({"6·N·D", sci(a.flops.sixND),
                        llvm::formatv("N = {0}, D = {1} tokens", formatCount(a.params.trainable),
                                      formatCount(a.flops.tokensPerStep))
                            .str()});
      t.notes.push_back(llvm::formatv("(forward + backward) / 6ND = {0:f4}", a.flops.ratioToSixND)
                            .str());
    }
    if (a.flops.attention)
      t.notes.push_back(std::string("Model FLOPs count attention densely (s²), as Narayanan et "
                                    "al. and PaLM do; executed FLOPs ") +
                        (a.flops.causalAttention ? "skip the masked half of causal attention and "
                                                   "add recompute."
                                                 : "add recompute."));
  }
  return t;
}

ReportTable blocksTable(const Analysis &a) {
  ReportTable t;
  bool train = a.plan->isTrain;
  t.title = train ? "FLOPs by block (per optimizer step)" : "FLOPs by block (prefill)";
  t.header = {"block", "kind", "forward", "backward", "share", "time"};
  const Analysis::BlockCount &model = a.params.byBlock.front();
  double whole = model.forwardFlops + model.backwardFlops;
  auto add = [&](const Analysis::BlockCount &b, const std::string &label, const std::string &kind) {
    t.rows.push_back({label, kind, llvm::formatv("{0:e3}", b.forwardFlops).str(),
                      llvm::formatv("{0:e3}", b.backwardFlops).str(),
                      share(b.forwardFlops + b.backwardFlops, whole), formatDuration(b.time)});
  };
  for (const Analysis::BlockCount &b : a.params.byBlock) {
    const Instance &in = a.graph->instances[b.instance];
    if (in.depth == 1)
      add(b, a.graph->instancePath(b.instance), *in.block);
  }
  Analysis::BlockCount own = model;
  own.forwardFlops = model.selfForwardFlops;
  own.backwardFlops = model.selfBackwardFlops;
  own.time = model.selfTime;
  if (own.forwardFlops + own.backwardFlops > 0)
    add(own, "(model's own ops)", "ops");
  add(model, "(total)", *a.graph->instances[model.instance].block);
  return t;
}

ReportTable memoryTable(const Analysis &a) {
  const Plan &p = *a.plan;
  ReportTable t;
  t.title = "Memory per device";
  t.header = {"kind", "bytes", "share of peak"};
  auto row = [&](const char *kind, double v) {
    t.rows.push_back({kind, formatBytes(v), share(v, a.memory.peak)});
  };
  row("params", a.memory.params);
  if (p.isTrain) {
    row("grads", a.memory.grads);
    if (a.memory.gradAccum > 0)
      row(p.precision.gradAccum == Dtype::F32 ? "grad accumulation (f32)" : "grad accumulation",
          a.memory.gradAccum);
    row("master weights", a.memory.master);
    row("optimizer state", a.memory.optimizer);
    // ZeRO's transients (docs/memory.md, "ZeRO's transients"): only under ZeRO 2 and 3.
    if (a.memory.zeroGathered > 0)
      row("ZeRO-3 gathered params", a.memory.zeroGathered);
    if (a.memory.unshardedGrads > 0)
      row("unsharded grads", a.memory.unshardedGrads);
  }
  if (a.fp8.active) {
    row("fp8 weight copies", a.memory.fp8Weights);
    if (a.memory.fp8Meta > 0)
      row("fp8 amax history", a.memory.fp8Meta);
  }
  row("activations", a.memory.activations);
  row("workspace", a.memory.workspace);
  // Framework memory (docs/memory.md §9): only where the target has it (not the host).
  if (a.memory.context > 0)
    row("CUDA context", a.memory.context);
  if (a.memory.commBuffers > 0)
    row("comm buffers", a.memory.commBuffers);
  if (a.memory.allocatorReserve > 0)
    row("allocator reserve", a.memory.allocatorReserve);
  if (a.memory.libraryWorkspace > 0)
    row("library workspace", a.memory.libraryWorkspace);
  if (a.memory.cudnnWorkspace > 0)
    row("cuDNN workspace", a.memory.cudnnWorkspace);
  t.rows.push_back({"peak", formatBytes(a.memory.peak),
                    share(a.memory.peak, p.target.memoryBytes) + " of " +
                        formatBytes(p.target.memoryBytes)});
  if (a.memory.hostTotal > 0)
    t.rows.push_back({"host memory", formatBytes(a.memory.hostTotal), ""});
  if (p.isTrain)
    t.notes.push_back(llvm::formatv("params + grads + {0}master + optimizer state: {1:f2} bytes "
                                    "per parameter on this device",
                                    a.memory.gradAccum > 0 ? "grad accumulation + " : "",
                                    a.memory.bytesPerParam)
                          .str());
  if (a.params.quantized > 0) {
    const QuantSpec &q = a.dequant.spec;
    double bits = quantBitsPerElement(q);
    t.notes.push_back(llvm::formatv("{0} frozen parameters stored in {1}, block {2}, {3} scales{4}: "
                                    "{5:f3} bits ({6:f3} bytes) per parameter; dequantized before "
                                    "each of {7:f0} matmuls, {8} forward and {9} backward per micro-batch",
                                    formatCount(a.params.quantized), nameOf(q.dtype), q.block,
                                    nameOf(q.scale),
                                    q.doubleBlock > 0
                                        ? llvm::formatv(" double-quantized to 8 bits in blocks of {0}",
                                                        q.doubleBlock)
                                              .str()
                                        : std::string(),
                                    bits, bits / 8, a.dequant.matmuls,
                                    formatDuration(a.dequant.forward),
                                    formatDuration(a.dequant.backward))
                          .str());
  }
  return t;
}

/// FP8 training (passes/Fp8.cpp): what the recipe keeps and why memory does not halve, and the
/// step's GEMMs, casts and other ops per micro-batch in fp8 against the same GEMMs in the
/// activation dtype: the speed-up op by op.
ReportTable fp8Table(const Analysis &a) {
  const Plan &p = *a.plan;
  const Fp8Recipe &r = p.precision.fp8;
  const auto &f = a.fp8;
  ReportTable t;
  t.title = "FP8 (Transformer Engine recipe; per micro-batch, one device)";
  t.header = {"part", "fp8", "in " + nameOf(p.precision.activations).str(), "note"};
  auto ratio = [](double slow, double fast) {
    return fast > 0 ? llvm::formatv("{0:f2}x", slow / fast).str() : std::string("-");
  };
  t.rows.push_back({"GEMM forward", formatDuration(f.gemmForward), formatDuration(f.gemmForwardBf16),
                    ratio(f.gemmForwardBf16, f.gemmForward) + " at the fp8 peak"});
  if (p.isTrain)
    t.rows.push_back({"GEMM backward", formatDuration(f.gemmBackward),
                      formatDuration(f.gemmBackwardBf16),
                      ratio(f.gemmBackwardBf16, f.gemmBackward) + " (dgrad and wgrad, " +
                          nameOf(r.gradDtype()).str() + " gradients)"});
  t.rows.push_back({"casts", formatDuration(f.castForward + f.castBackward), "0 s",
                    formatBytes(f.castBytes) + " memory-bound (inputs, output gradients, amax)"});
  if (p.isTrain)
    t.rows.push_back({"weight casts", formatDuration(f.weightCast), "0 s",
                      "once per step: " + formatBytes(f.weightCastBytes)});
  t.rows.push_back({"other ops", formatDuration(f.otherForward + f.otherBackward),
                    formatDuration(f.otherForward + f.otherBackward),
                    "norms, attention, activations, head: unchanged"});
  double fp8 = f.gemmForward + f.gemmBackward + f.castForward + f.castBackward + f.otherForward +
               f.otherBackward;
  double bf16 = f.gemmForwardBf16 + f.gemmBackwardBf16 + f.otherForward + f.otherBackward;
  t.rows.push_back({"compute", formatDuration(fp8), formatDuration(bf16),
                    "speed-up " + ratio(bf16, fp8) + " from the op mix"});
  t.notes.push_back(llvm::formatv("{0:f0} GEMMs in fp8 ({1} forward, {2} gradients), {3:f0} kept in "
                                  "bf16; {4} scaling{5}",
                                  f.gemms, nameOf(Dtype::FP8E4M3), nameOf(r.gradDtype()), f.keptBf16,
                                  r.scaling == Fp8Recipe::Scaling::Block     ? "MXFP8 block"
                                  : r.scaling == Fp8Recipe::Scaling::Current ? "current"
                                                                             : "delayed",
                                  r.scaling == Fp8Recipe::Scaling::Block
                                      ? std::string(" (an E8M0 scale per 32 elements)")
                                  : r.scaling == Fp8Recipe::Scaling::Current
                                      ? std::string(" (each tensor's amax read before its cast)")
                                      : llvm::formatv(", amax history {0}", r.amaxHistory).str())
                        .str());
  t.notes.push_back(
      std::string("memory does not halve: ") +
      (r.paramGather ? "the fp8 GEMMs' weights are held in fp8 only (param_gather: the fp8 weights, " +
                           formatBytes(a.memory.fp8Weights) + ", replace their bf16 copy), their gradients, "
                           "the master copy and the optimizer state stay as they were"
                     : "the bf16 weights, their gradients, the master copy and the optimizer state stay as "
                       "they were; the fp8 weight copies (" + formatBytes(a.memory.fp8Weights) + ") come on top") +
      ", and only the GEMM inputs kept for the backward shrink (" + formatBytes(f.savedBytesBf16) + " -> " +
      formatBytes(f.savedBytesFp8) + " per micro-batch, whole model)");
  t.notes.push_back("the speed-up is not 2x: only the GEMMs run at the fp8 peak; the casts add "
                    "memory-bound kernels and every other op keeps its time");
  return t;
}

ReportTable opsTable(const Analysis &a) {
  const Graph &g = *a.graph;
  ReportTable t;
  t.title = "Most expensive ops";
  t.header = {"op", "kind", "count", "FLOPs", "intensity", "bound", "time"};
  // The copies of a repeated block are one row (report/Copies.h).
  CopyGroups copies = opCopies(g, instanceCopies(g));
  struct Group {
    OpId first;
    unsigned count = 0;
    double flops = 0, time = 0;
  };
  std::vector<Group> groups;
  groups.reserve(copies.groups.size());
  for (const CopyGroups::Group &c : copies.groups)
    groups.push_back({c.first});
  for (OpId i = 0; i < g.ops.size(); ++i) {
    Group &gr = groups[copies.of[i]];
    ++gr.count;
    gr.flops += a.ops[i].forward.flops;
    gr.time += a.ops[i].forwardTime + a.ops[i].backwardTime;
  }
  std::stable_sort(groups.begin(), groups.end(), [](const Group &x, const Group &y) {
    double cx = x.time > 0 ? x.time : x.flops, cy = y.time > 0 ? y.time : y.flops;
    return cx > cy;
  });
  for (size_t k = 0; k < groups.size() && k < 10; ++k) {
    const Group &gr = groups[k];
    const OpAnalysis &o = a.ops[gr.first];
    t.rows.push_back({repeatPattern(g.opPath(gr.first)), opName(g.ops[gr.first].kind).str(),
                      std::to_string(gr.count),
                      llvm::formatv("{0:e2}", gr.flops), llvm::formatv("{0:f1}", o.intensity()),
                      o.computeBound ? "compute" : "memory", formatDuration(gr.time)});
  }
  t.notes.push_back(llvm::formatv("ridge point {0:f2} FLOP/byte on {1}: ops below it are "
                                  "memory-bound. FLOPs are forward, per {2}; time is "
                                  "{3}; [*] sums the copies of a repeated block.",
                                  a.ridge, a.plan->target.name,
                                  a.plan->isTrain ? "micro-batch" : "prefill",
                                  a.plan->isTrain ? "forward + backward per micro-batch"
                                                  : "the forward of the prefill")
                        .str());
  return t;
}

ReportTable timeTable(const Analysis &a) {
  const Plan &p = *a.plan;
  ReportTable t;
  t.title = "Time";
  t.header = {"part", "time", "note"};
  t.rows.push_back({"forward", formatDuration(a.time.forward), ""});
  if (p.isTrain) {
    t.rows.push_back({"backward", formatDuration(a.time.backward), ""});
    t.rows.push_back({"recompute", formatDuration(a.time.recompute), ""});
    t.rows.push_back({"optimizer", formatDuration(a.time.optimizer), ""});
    std::string stack;
    if (!a.collectives.empty())
      stack = "stack " + a.stack.name + (a.stack.chosen ? " (from the layout)" : "");
    t.rows.push_back({"communication", formatDuration(a.time.communication), stack});
    t.rows.push_back({"host transfers", formatDuration(a.time.hostTransfer), ""});
    t.rows.push_back({"pipeline bubble", formatDuration(a.time.bubble), ""});
    t.rows.push_back({"step", formatDuration(a.time.step),
                      std::to_string(a.time.accumulationSteps) + " accumulation step" +
                          (a.time.accumulationSteps == 1 ? "" : "s")});
    t.rows.push_back({"MFU", formatPercent(a.time.mfu), "HFU " + formatPercent(a.time.hfu)});
    if (!a.time.mfuConventions.empty()) {
      std::string others;
      for (const Analysis::MfuConvention &c : a.time.mfuConventions) {
        llvm::StringRef n = c.name;
        if (n == "graph" || n == "hfu")
          continue;
        others += (others.empty() ? "" : ", ") + n.str() + " " + formatPercent(c.mfu);
      }
      // The per-token conventions (6ND, PaLM, Megatron) are for a task with a sequence axis.
      t.rows.push_back({"MFU convention", a.time.mfuConventions.front().name,
                        std::string("model FLOPs of the graph") +
                            (a.flops.attention ? ", attention dense," : "") +
                            " over the dense peak" + (a.flops.sequence ? "; " + others : "")});
    }
    if (a.time.run > 0)
      t.rows.push_back({"run", formatDuration(a.time.run),
                        // Past 1e15 steps a whole number has more digits than the double.
                        (a.time.steps < 1e15 ? llvm::formatv("{0:f0}", a.time.steps).str()
                                             : formatCount(a.time.steps)) +
                            " steps for " + formatCount(p.tokens) +
                            (a.flops.sequence ? " tokens" : " samples")});
  } else {
    t.rows.push_back({"step", formatDuration(a.time.step), ""});
  }
  return t;
}

/// The applied plan per block, consecutive copies with the same plan on one line:
/// "h[0]-h[3]: keep 361.00 MiB each", "h[4]-h[11]: re-run once, keep their input".
std::vector<std::string> perBlockLines(const Analysis &a) {
  const auto &pb = a.checkpoint.perBlock;
  std::vector<std::string> lines;
  for (size_t i = 0; i < pb.size();) {
    size_t j = i + 1;
    while (j < pb.size() && pb[j].reruns == pb[i].reruns && pb[j].keptBytes == pb[i].keptBytes &&
           pb[j].reselected == pb[i].reselected)
      ++j;
    std::string who = pb[i].path + (j - i > 1 ? "-" + pb[j - 1].path : "");
    std::string what;
    if (pb[i].reruns == 0)
      what = "kept, " + formatBytes(pb[i].keptBytes) + (j - i > 1 ? " each" : "");
    else
      what = std::string("re-run ") +
             (pb[i].reruns == 1 ? "once" : pb[i].reruns == 2 ? "twice"
                                                             : std::to_string(pb[i].reruns) + " times") +
             (pb[i].keptBytes > 0 ? ", the forward keeps " + formatBytes(pb[i].keptBytes) +
                                        (j - i > 1 ? " each" : "")
                                  : "");
    if (pb[i].reselected > 0)
      what += ", " + std::to_string(pb[i].reselected) + " cheap op" +
              (pb[i].reselected == 1 ? "" : "s") + " re-run alone";
    lines.push_back("  " + who + ": " + what);
    i = j;
  }
  constexpr size_t kMaxLines = 16; // the JSON's per_block has every copy
  if (lines.size() > kMaxLines) {
    size_t more = lines.size() - (kMaxLines - 1);
    lines.resize(kMaxLines - 1);
    lines.push_back("  ... " + std::to_string(more) + " more lines (JSON: checkpoint.per_block)");
  }
  return lines;
}

ReportTable fusionTable(const Analysis &a) {
  ReportTable t;
  t.title = "Fused kernels (per micro-batch, one device)";
  t.header = {"", "value", "note"};
  t.rows.push_back({"fused kernels", groupDigits(static_cast<double>(a.fusion.kernels.size())),
                    "elementwise runs (alone or as a norm's prologue) and matmuls with a bias epilogue"});
  t.rows.push_back({"ops in them", groupDigits(a.fusion.ops),
                    "of " + groupDigits(a.fusion.elementwiseOps) + " elementwise ops run, with their matmuls and norms"});
  t.rows.push_back({"bias epilogues", groupDigits(a.fusion.epilogues), "matmuls that add their bias as they store"});
  t.rows.push_back({"launches saved", groupDigits(a.fusion.launchesSaved), ""});
  t.rows.push_back({"traffic saved", formatBytes(a.fusion.bytesSaved),
                    "values read from registers instead of memory; the step time prices it"});
  return t;
}

ReportTable checkpointTable(const Analysis &a) {
  const auto &c = a.checkpoint;
  ReportTable t;
  t.title = "Activation checkpointing";
  t.header = {"plan on the trade-off curve", "blocks recomputed", "recompute FLOPs",
              "recompute time", "peak memory"};
  for (const auto &pt : c.curve)
    t.rows.push_back({pt.policy, std::to_string(pt.checkpointed),
                      llvm::formatv("{0:e3}", pt.recomputeFlops).str(),
                      formatDuration(pt.recomputeSeconds), formatBytes(pt.peakBytes)});
  std::string chosen = "checkpoint = " + c.requested + ": " + c.policy + ", " +
                       std::to_string(c.checkpointed) + " of " + std::to_string(c.blocks) +
                       " blocks recomputed";
  if (c.requested == "auto")
    chosen += c.limitBytes > 0 ? ", the least recompute that fits " + formatBytes(c.limitBytes)
                               : ", nothing fits: the model states alone exceed the limit";
  t.notes.push_back(chosen + ".");
  if (!c.note.empty())
    t.notes.push_back(c.note);
  if (!c.perBlock.empty()) {
    t.notes.push_back("Per block:");
    for (const std::string &line : perBlockLines(a))
      t.notes.push_back(line);
  }
  return t;
}

/// An encoder's infer plan (passes/Inference.cpp step 8): its forward alone.
ReportTable encoderTable(const Analysis &a) {
  const auto &inf = a.inference;
  const Plan &p = *a.plan;
  const Parallelism &par = p.parallel;
  int64_t gpus = par.tensor * par.pipeline;
  ReportTable t;
  t.title = "Inference (encoder)";
  t.header = {"part", "value", "note"};
  t.rows.push_back({"forward", formatDuration(inf.prefillTime),
                    llvm::formatv("{0:e3} FLOPs over {1} × {2} tokens", inf.prefillFlops,
                                  p.batch, p.prompt)
                        .str()});
  t.rows.push_back({"tokens/s", llvm::formatv("{0:f1}", inf.forwardTokensPerSecond).str(),
                    "input tokens through the forward, all sequences"});
  t.rows.push_back({"tokens/s per GPU", llvm::formatv("{0:f1}", inf.forwardTokensPerSecondPerGpu).str(),
                    "over the " + std::to_string(gpus) + " GPU" + (gpus == 1 ? "" : "s") +
                        " of a replica"});
  t.rows.push_back({"KV cache", "none", "no decode steps"});
  t.notes.push_back("An encoder: none of its " + std::to_string(inf.bidirectionalLayers) +
                    " attention ops is causal (causal = false), so a new token would change every "
                    "earlier position's output. It keeps no KV cache and generates nothing; the "
                    "plan is one forward over the prompt.");
  return t;
}

ReportTable inferenceTable(const Analysis &a) {
  const auto &inf = a.inference;
  const Plan &p = *a.plan;
  if (inf.encoder)
    return encoderTable(a);
  ReportTable t;
  t.title = "Inference";
  t.header = {"part", "value", "note"};
  t.rows.push_back({"prefill", formatDuration(inf.prefillTime),
                    llvm::formatv("{0:e3} FLOPs over {1} prompt tokens", inf.prefillFlops,
                                  p.prompt)
                        .str()});
  t.rows.push_back({"decode step", formatDuration(inf.decodeTime),
                    llvm::formatv("mean over {0:f0} steps; first {1}, last {2}",
                                  inf.decodeSteps, formatDuration(inf.firstDecodeTime),
                                  formatDuration(inf.lastDecodeTime))
                        .str()});
  t.rows.push_back({"decode FLOPs", llvm::formatv("{0:e3}", inf.decodeFlops).str(),
                    llvm::formatv("2·N·batch = {0:e3}", inf.twoNFlops).str()});
  t.rows.push_back({"decode bytes", formatBytes(inf.decodeBytes),
                    llvm::formatv("intensity {0:f2} FLOP/byte: {1}", inf.decodeIntensity,
                                  inf.decodeMemoryBound ? "memory-bound" : "compute-bound")
                        .str()});
  t.rows.push_back({"KV cache", formatBytes(inf.kvCacheBytes),
                    formatBytes(inf.kvBytesPerToken) + " per token, " +
                        std::to_string(inf.layers) + " layers" +
                        (inf.windowedLayers > 0 ? " (" + std::to_string(inf.windowedLayers) +
                                                      " windowed: cached up to the window)"
                                                : std::string()) +
                        (inf.latentLayers > 0 ? " (" + std::to_string(inf.latentLayers) +
                                                    " latent: c_kv + RoPE key, " +
                                                    std::to_string(inf.latentWidth) + " values)"
                                              : std::string())});
  t.rows.push_back({"tokens/s", llvm::formatv("{0:f1}", inf.tokensPerSecond).str(),
                    "generated tokens, all sequences"});
  t.rows.push_back({"request", formatDuration(inf.totalTime), "prefill + every decode step"});
  return t;
}

/// Serving capacity (passes/Inference.cpp step 6, servingCapacity): the paged cache at
/// max_context and the sequences that fit, with the latencies at the plan's batch.
ReportTable servingTable(const Analysis &a) {
  const auto &inf = a.inference;
  const Plan &p = *a.plan;
  const Parallelism &par = p.parallel;
  ReportTable t;
  t.title = "Serving capacity";
  t.header = {"part", "value", "note"};
  std::string ctx = integerText(inf.maxContext);
  std::string kvHeads = std::to_string(inf.kvHeads) + " KV heads";
  if (par.tensor > 1)
    kvHeads += inf.kvReplication > 1
                   ? ", each kept on " + integerText(inf.kvReplication) + " of the " +
                         std::to_string(par.tensor) + " tensor ranks (replicated: fewer KV heads "
                         "than ranks)"
                   : " split over " + std::to_string(par.tensor) + " tensor ranks";
  t.rows.push_back({"context", ctx + " tokens",
                    "max_context; blocks of " + integerText(inf.kvBlock) + " tokens, " +
                        integerText(inf.kvBlocksPerSequence) + " per layer and sequence"});
  t.rows.push_back({"KV per token", formatBytes(inf.kvBytesPerToken),
                    groupDigits(inf.kvBytesPerToken) +
                        (inf.latentLayers > 0 ? " B: the latent (MLA) of " : " B: K and V of ") +
                        std::to_string(inf.layers) + " layers in " + nameOf(inf.kvDtype).str() +
                        ", " + kvHeads + "; per device"});
  t.rows.push_back({"KV per sequence", formatBytes(inf.kvBytesPerSequence),
                    groupDigits(inf.kvBytesPerSequence) + " B at " + ctx + " tokens in whole blocks" +
                        (inf.windowedLayers > 0 ? "; windowed layers hold their window's blocks"
                                                : std::string())});
  t.rows.push_back({"KV memory", formatBytes(inf.kvMemoryBytes),
                    "what the device's " + formatBytes(memoryLimit(p)) +
                        " leaves after weights, workspace, context and reserve"});
  t.rows.push_back({"KV blocks", groupDigits(inf.kvBlocksTotal),
                    "of " + formatBytes(inf.kvBlockBytes) + " each"});
  t.rows.push_back({"max concurrent",
                    inf.kvBytesPerSequence > 0 ? groupDigits(inf.maxConcurrent) : "-",
                    inf.kvBytesPerSequence > 0
                        ? "sequences of " + ctx + " tokens that fit; the plan runs " +
                              std::to_string(p.batch)
                        : "no KV cache: the model has no self-attention"});
  t.rows.push_back({"time to first token", formatDuration(inf.timeToFirstToken),
                    "the prefill of " + std::to_string(p.batch) +
                        (p.batch == 1 ? " prompt of " : " prompts of ") +
                        std::to_string(p.prompt) + " tokens"});
  t.rows.push_back({"inter-token latency", formatDuration(inf.interTokenLatency),
                    "a decode step with " + std::to_string(p.batch) +
                        (p.batch == 1 ? " sequence at " : " sequences at ") + ctx +
                        " tokens (the slowest)"});
  t.rows.push_back({"tokens/s per GPU", llvm::formatv("{0:f1}", inf.tokensPerSecondPerGpu).str(),
                    "at that step, over the " + std::to_string(par.tensor * par.pipeline) +
                        " GPU" + (par.tensor * par.pipeline == 1 ? "" : "s") + " of a replica"});
  if (inf.latentLayers > 0)
    t.notes.push_back("Latent attention (MLA): " + std::to_string(inf.latentLayers) +
                      (inf.latentLayers == 1 ? " layer caches" : " layers cache") +
                      " the compressed KV and the RoPE key, " + std::to_string(inf.latentWidth) +
                      " values per token each, not K and V per head (DeepSeek-V2, "
                      "arXiv:2405.04434); its decode attention is priced with the "
                      "up-projections absorbed.");
  return t;
}

} // namespace

std::string groupDigits(double v) {
  if (v >= 9007199254740992.0 || v <= -9007199254740992.0 ||
      v != static_cast<double>(static_cast<int64_t>(v)))
    return llvm::formatv("{0:e3}", v).str();
  std::string digits = std::to_string(static_cast<int64_t>(v));
  std::string out;
  size_t start = digits[0] == '-' ? 1 : 0;
  out = digits.substr(0, start);
  for (size_t i = start; i < digits.size(); ++i) {
    if (i > start && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return out;
}

ReportContent buildReport(const Analysis &a) {
  const Plan &p = *a.plan;
  const Parallelism &par = p.parallel;
  ReportContent c;
  c.headline = std::string(p.isTrain ? "train " : "infer ") + p.name + ": model " +
               a.graph->model + " on " + std::to_string(par.devices) + " × " + p.target.name;
  if (par.devices > 1)
    c.headline += " (data " + std::to_string(par.data) + ", tensor " +
                  std::to_string(par.tensor) + ", pipeline " + std::to_string(par.pipeline) +
                  ", ZeRO " + std::to_string(par.zero) +
                  (expertLayout(par).folded ? ", expert " + std::to_string(par.expert) +
                                                  " folded over tensor × data, expert tensor 1"
                                            : std::string()) +
                  ")";
  if (p.isTrain)
    c.settings.push_back("batch " + std::to_string(p.batch) +
                         (a.flops.sequence ? ", seq " + std::to_string(p.seq)
                                           : (p.batch == 1 ? " sample" : " samples") +
                                                 std::string(" (no sequence axis)")) +
                         ", micro-batch " + std::to_string(p.microBatch) + " per device");
  else
    c.settings.push_back("batch " + std::to_string(p.batch) + ", prompt " +
                         std::to_string(p.prompt) + ", generate " + std::to_string(p.generate));
  c.settings.push_back("precision " + p.precision.preset + " (params " +
                       nameOf(p.precision.params).str() + ", activations " +
                       nameOf(p.precision.activations).str() + ")" +
                       (p.isTrain ? ", optimizer " + p.optimizer.name : ""));
  c.tables.push_back(paramsTable(a));
  c.tables.push_back(flopsTable(a));
  c.tables.push_back(blocksTable(a));
  c.tables.push_back(memoryTable(a));
  if (p.isTrain && (a.checkpoint.requested != "none" || a.checkpoint.policy != "none"))
    c.tables.push_back(checkpointTable(a));
  c.tables.push_back(opsTable(a));
  if (a.inference.active) {
    c.tables.push_back(inferenceTable(a));
    if (!a.inference.encoder) // an encoder keeps no cache to serve from
      c.tables.push_back(servingTable(a));
  }
  else
    c.tables.push_back(timeTable(a));
  if (a.fp8.active)
    c.tables.push_back(fp8Table(a));
  if (a.fusion.enabled)
    c.tables.push_back(fusionTable(a));
  return c;
}

} // namespace tally
