// MFU by convention (issue 45): the FLOPs per optimizer step each published convention counts,
// each over the same step time × peak × devices, so a user can compare tally's MFU with the
// number a paper or a framework prints. docs/time.md §5 states each with its source.
//
// N is the parameters that matrix products read (all but those only an embedding lookup
// reads: an untied embedding table; a head tied to it counts), D = batch × seq tokens per
// step. From the graph, per attention op of a micro-batch (q [b, s, H·Q], keys s_kv): the
// dense products QKᵀ and P·V, 4·b·s·s_kv·H·Q, taken × 3 for forward and backward and scaled
// to the step like the model FLOPs (batch / micro_batch).
//
//   graph        flops.forward + flops.backward (tally's count: every op of the graph,
//                attention dense; a.time.mfu)
//   six_nd       6·N·D (Kaplan et al. 2020, eq. 2.1; Hoffmann et al. 2022)
//   palm         6·N·D + 12·L·H·Q·T·D: the attention products, all s·s_kv scores (Chowdhery
//                et al. 2022, PaLM, Appendix B)
//   palm_causal  the same with a causal attention's products halved (the lower triangle:
//                Dao 2023, FlashAttention-2, §4 "for causal masks we divide by 2")
//   megatron     Narayanan et al. 2021, eq. 3: 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) counts
//                the layers 4 times (forward, backward = 2 forwards, and full recomputation's
//                forward) and the logit layer 3 times; a plan without full recomputation takes
//                the same derivation with 3 passes, 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)).
//                B = batch, l attention layers, h their query width, s their query length,
//                V the cross entropy's classes (0 if none). Only for a model with attention.
//   hfu          flops.executed − flops.optimizer: what the kernels run, causal skipping and
//                recompute included (a.time.hfu)
//
// The peak is utilizationPeak's: the dense datasheet rate of the matmuls' dtype (ir/Target.h:
// catalogue rates are dense; no convention here uses a 2:4-sparse peak).
#include "passes/Passes.h"

namespace tally {

struct MfuGraphFacts {
  const Graph *graph = nullptr;  ///< the graph they were read from
  double nonEmbedding = 0;       ///< N: parameters some op other than an embedding reads
  double attention = 0;          ///< dense QKᵀ + PV forward FLOPs per micro-batch
  double causalAttention = 0;    ///< of those, the causal ops'
  double layers = 0, width = 0, seq = 0, vocab = 0; ///< Megatron's l, h, s, V
};

std::shared_ptr<const MfuGraphFacts> mfuGraphFacts(const Graph &g) {
  auto made = std::make_shared<MfuGraphFacts>();
  MfuGraphFacts &f = *made;
  f.graph = &g;
  std::vector<uint8_t> multiplied(g.tensors.size(), 0), read(g.tensors.size(), 0);
  for (const Op &op : g.ops) {
    for (TensorId x : op.inputs) {
      TensorId s = g.storageOf(x);
      read[s] = 1;
      if (op.kind != OpKind::Embedding)
        multiplied[s] = 1;
    }
    if (op.kind == OpKind::Attention && op.inputs.size() >= 2) {
      const Shape &q = g.tensors[op.inputs[0]].shape, &k = g.tensors[op.inputs[1]].shape;
      if (q.size() != 3 || k.size() != 3)
        continue;
      double b = static_cast<double>(q[0].size), s = static_cast<double>(q[1].size);
      double skv = static_cast<double>(k[1].size), hq = static_cast<double>(q[2].size);
      // QKᵀ over q's width and P·V over the output's (h·dv: MLA's value heads differ from q's)
      double ho = op.outputs.empty() ? hq : static_cast<double>(g.tensors[op.outputs[0]].shape[2].size);
      double products = 2 * b * s * skv * (hq + ho);
      f.attention += products;
      if (op.attrs->causal)
        f.causalAttention += products;
      if (f.layers == 0) {
        f.width = hq;
        f.seq = s;
      }
      f.layers += 1;
    }
    if (op.kind == OpKind::CrossEntropy && !op.inputs.empty() && f.vocab == 0) {
      const Shape &logits = g.tensors[op.inputs[0]].shape;
      if (!logits.empty())
        f.vocab = static_cast<double>(logits.back().size);
    }
  }
  for (const ParamInfo &p : g.params)
    if (multiplied[p.tensor] || !read[p.tensor])
      f.nonEmbedding += numel(g.tensors[p.tensor].shape);
  return made;
}

void mfuConventions(Analysis &a) {
  a.time.mfuConventions.clear();
  const Plan &plan = *a.plan;
  if (!plan.isTrain || !a.graph)
    return;
  // The graph part's (analyzeGraph), else made here: O(ops), once per graph part, not per
  // candidate (a 10,000-layer layout search times hundreds).
  std::shared_ptr<const MfuGraphFacts> facts =
      a.time.mfuFacts && a.time.mfuFacts->graph == a.graph ? a.time.mfuFacts : mfuGraphFacts(*a.graph);
  const MfuGraphFacts &f = *facts;
  double peak = utilizationPeak(a);
  a.time.mfuPeak = peak;
  double capacity = a.time.step * peak * degree(plan.parallel.devices);
  double microSteps = static_cast<double>(plan.batch) / static_cast<double>(plan.microBatch);
  double D = a.flops.tokensPerStep;
  double dense = 3 * f.attention * microSteps;
  double causal = 3 * (f.attention - f.causalAttention / 2) * microSteps;
  auto add = [&](const char *name, const char *formula, const char *source, double flops) {
    Analysis::MfuConvention e;
    e.name = name;
    e.formula = formula;
    e.source = source;
    e.flops = flops;
    e.mfu = capacity > 0 ? flops / capacity : 0;
    a.time.mfuConventions.push_back(e);
  };
  add("graph", "forward + backward FLOPs of every op of the graph, attention dense",
      "tally (docs/counting.md); Narayanan et al. 2021 count attention so",
      a.flops.forward + a.flops.backward);
  add("six_nd", "6·N·D", "Kaplan et al. 2020, eq. 2.1", 6 * f.nonEmbedding * D);
  add("palm", "6·N·D + 12·L·H·Q·T·D", "Chowdhery et al. 2022 (PaLM), Appendix B",
      6 * f.nonEmbedding * D + dense);
  add("palm_causal", "6·N·D + 12·L·H·Q·T·D, causal attention halved",
      "Dao 2023 (FlashAttention-2), section 4", 6 * f.nonEmbedding * D + causal);
  if (f.layers > 0 && f.width > 0) {
    double k = plan.checkpoint == "full" ? 4 : 3;
    double B = static_cast<double>(plan.batch), s = f.seq, l = f.layers, h = f.width;
    // The layers run k passes (forward, twice the forward backward, and the recompute's
    // forward when k = 4); the logit layer 3 (it is not recomputed): 6·B·s·h·V.
    double F = 24 * k * B * s * l * h * h * (1 + s / (6 * h)) + 6 * B * s * h * f.vocab;
    add("megatron", k == 4 ? "96·B·s·l·h²·(1 + s/6h + V/16lh), full recompute"
                           : "72·B·s·l·h²·(1 + s/6h + V/12lh), no full recompute",
        "Narayanan et al. 2021, eq. 3", F);
  }
  add("hfu", "executed FLOPs without the optimizer", "Chowdhery et al. 2022 (PaLM), Appendix B",
      a.flops.executed - a.flops.optimizer);
}

} // namespace tally
