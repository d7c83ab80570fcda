// test_moe.cpp — the mixture-of-experts primitives and expert parallelism: the moe op's shapes,
// FLOPs (only the routed rows), capacity factor and saved buffers by hand; topk and gather and
// their scatter_add backward; the training step's FLOP oracle on an MoE model; the experts'
// weights split over the expert group in memory and in the data-parallel reduction; the
// all-to-all of routed tokens priced on the tier it crosses.
#include "Support.h"

#include "ir/OpRules.h"
#include "passes/Collectives.h"
#include "passes/Passes.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

using namespace tally;
using namespace tally::test;

namespace {

/// Two MoE layers of 8 experts (d = 64, hidden = 128, top 2) on fp32 data, with MOEARGS
/// after the MoE block's top_k argument and EXTRA in the plan.
std::string moeModel(const std::string &target) {
  return R"(
block Layer(d, hidden, experts, top_k) {
  norm = RMSNorm(d)
  moe  = MoE(d, hidden, experts, top_kMOEARGS)
  forward(x) { return x + moe(norm(x)) }
}
model M(d = 64, hidden = 128, experts = 8, top_k = 2, n = 2) {
  layers = repeat(n) Layer(d, hidden, experts, top_k)
  forward(x: f32[batch, seq, d]) { return mean(layers(x)) }
}
train t {
  model = M() batch = 16 seq = 32 micro_batch = 1 optimizer = AdamW(lr = 1e-3)
  precision = fp32 checkpoint = none EXTRA
  target = )" + target + "\n}\n";
}

std::string withArgs(std::string text, const std::string &moeArgs, const std::string &extra) {
  auto put = [&](const std::string &key, const std::string &value) {
    size_t at = text.find(key);
    text.replace(at, key.size(), value);
  };
  put("MOEARGS", moeArgs);
  put("EXTRA", extra);
  return text;
}

std::string model(const std::string &target, const std::string &moeArgs = "",
                  const std::string &extra = "") {
  return withArgs(moeModel(target), moeArgs, extra);
}

const Op &opAt(const Compiled &t, const std::string &path) { return t.g().ops[t.op(path)]; }

// Per layer: router 64·8 = 512, experts 3·8·64·128 = 196,608, norm 64.
constexpr double kExperts = 2 * 196608.0;
constexpr double kTotal = 2 * (64 + 512 + 196608.0);

} // namespace

TEST_CASE("moe: the MoE block's parameters, shapes and FLOPs by hand", "[moe]") {
  Compiled t(model("H100_SXM"));
  CHECK(t.a->params.total == kTotal);
  CHECK(t.a->params.expert == kExperts);
  CHECK(t.a->params.expertTrainable == kExperts);
  // T = batch·seq = 1·32 tokens per micro-batch, R = T·k = 64 routed rows.
  const Op &moe = opAt(t, "layers[0].moe.moe");
  REQUIRE(moe.outputs.size() == 5);
  CHECK(Graph::formatSizes(t.g().tensors[moe.outputs[0]].shape) == "[1, 32, 64]");
  CHECK(Graph::formatSizes(t.g().tensors[moe.outputs[1]].shape) == "[64, 128]");
  CHECK(Graph::formatSizes(t.g().tensors[moe.outputs[4]].shape) == "[64, 64]");
  ForwardCost c = ruleFor(OpKind::Moe).forward(t.g(), moe);
  // 6·R·d·H + 5·R·H + 2·R·d = 3,145,728 + 40,960 + 8,192.
  CHECK(c.flops == 3194880);
  CHECK(c.matmulFlops == 3145728);
  CHECK(c.executedFlops == c.flops);
  // Gradients: x 6·R·d·H + 12·R·H + 2·R·d; gates 2·R·d; indices none; each weight 2·R·d·H.
  CHECK(ruleFor(OpKind::Moe).gradFlops(t.g(), moe, 0) == 3145728 + 98304 + 8192);
  CHECK(ruleFor(OpKind::Moe).gradFlops(t.g(), moe, 1) == 8192);
  CHECK(ruleFor(OpKind::Moe).gradFlops(t.g(), moe, 2) == 0);
  for (unsigned w = 3; w < 6; ++w)
    CHECK(ruleFor(OpKind::Moe).gradFlops(t.g(), moe, w) == 1048576);
  // The router is a [1, 32, 64] @ [64, 8] matmul; topk compares each of the 32·8 logits once.
  CHECK(ruleFor(OpKind::Matmul).forward(t.g(), opAt(t, "layers[0].moe.router.matmul")).flops ==
        2 * 32 * 64 * 8);
  const Op &topk = opAt(t, "layers[0].moe.topk");
  CHECK(ruleFor(OpKind::TopK).forward(t.g(), topk).flops == 256);
  CHECK(t.g().tensors[topk.outputs[1]].dtype == Dtype::I32);
  CHECK(Graph::formatSizes(t.g().tensors[topk.outputs[0]].shape) == "[1, 32, 2]");
}

TEST_CASE("moe: the capacity factor caps the rows each expert runs", "[moe]") {
  // cf = 0.5: C = ⌈0.5·64/8⌉ = 4 rows per expert, 32 in all: half the tokens' slots dropped.
  std::string text = model("H100_SXM", ", capacity_factor = 0.5");
  Compiled t(text);
  const Op &moe = opAt(t, "layers[0].moe.moe");
  CHECK(Graph::formatSizes(t.g().tensors[moe.outputs[1]].shape) == "[32, 128]");
  ForwardCost c = ruleFor(OpKind::Moe).forward(t.g(), moe);
  CHECK(c.flops == 6.0 * 32 * 64 * 128 + 5.0 * 32 * 128 + 2.0 * 32 * 64);
  CHECK(c.executedFlops == c.flops);
  // cf = 1.25: C = ⌈1.25·64/8⌉ = 10 rows per expert, 80 buffered: no token dropped (the model
  // FLOPs count the 64 routed rows) but the kernels run 80 padded rows.
  text.replace(text.find("= 0.5"), 5, "= 1.25");
  Compiled u(text);
  const Op &m2 = opAt(u, "layers[0].moe.moe");
  CHECK(Graph::formatSizes(u.g().tensors[m2.outputs[1]].shape) == "[80, 128]");
  ForwardCost c2 = ruleFor(OpKind::Moe).forward(u.g(), m2);
  CHECK(c2.flops == 3194880);
  CHECK(c2.executedFlops == 6.0 * 80 * 64 * 128 + 5.0 * 80 * 128 + 2.0 * 80 * 64);
}

TEST_CASE("moe: the training step matches the FLOP oracle and keeps the routed buffers",
          "[moe]") {
  Compiled t(model("H100_SXM"));
  const Graph &s = *t.a->step;
  CHECK(verifyGraph(s) == "");
  CHECK(verifyOpTypes(s) == "");
  const Graph &g = t.g();
  // Each forward op's backward ops sum to the gradient formulas of its rule.
  std::vector<double> fromOps(g.ops.size(), 0);
  unsigned moeBackward = 0, scatter = 0;
  for (OpId i = static_cast<OpId>(g.ops.size()); i < s.ops.size(); ++i) {
    const Op &op = s.ops[i];
    moeBackward += op.kind == OpKind::MoeBackward;
    scatter += op.kind == OpKind::ScatterAdd;
    if (op.phase == Phase::Backward && op.forwardOp != kNone)
      fromOps[op.forwardOp] += ruleFor(op.kind).forward(s, op).flops;
  }
  CHECK(moeBackward == 2);
  CHECK(scatter == 2); // topk's gradient back into the router logits
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const Op &op = g.ops[i];
    double oracle = 0;
    for (unsigned k = 0; k < op.inputs.size(); ++k)
      if (g.tensors[op.inputs[k]].requiresGrad && isFloat(g.tensors[op.inputs[k]].dtype))
        oracle += ruleFor(op.kind).gradFlops(g, op, k);
    INFO(g.opPath(op));
    CHECK(fromOps[i] == oracle);
  }
  // moe's weight gradients count as weight gradients: 3 · 2·R·d·H per layer.
  const OpAnalysis &oa = t.at("layers[0].moe.moe");
  CHECK(oa.weightGradFlops == 3 * 1048576.0);
  CHECK(oa.inputGradFlops == 3145728 + 98304 + 8192 + 8192);
  // Saved: x, gates, indices, the gate and up pre-activations, the hidden, the expert outputs.
  double saved = 0;
  for (const SavedTensor &st : t.a->savedOf(t.op("layers[0].moe.moe")))
    saved += st.bytes;
  double expected = 32 * 64 * 4 + 32 * 2 * 4 + 32 * 2 * 4 + 3 * 64 * 128 * 4 + 64 * 64 * 4;
  CHECK(saved == expected);
}

TEST_CASE("moe: expert parallelism splits the experts' states over the expert group", "[moe]") {
  // 16 data ranks, experts over 8 of them, ZeRO 1: params and grads hold the dense part and
  // 1/8 of the experts; the optimizer state shards the dense part over 16 and the experts'
  // eighth over the 2 replicas that hold the same experts.
  Compiled t(model("16 x H100_SXM { data = 16, expert = 8, zero = 1 }"));
  double dense = kTotal - kExperts; // 1,152
  CHECK(t.a->memory.params == (dense + kExperts / 8) * 4);
  CHECK(t.a->memory.grads == (dense + kExperts / 8) * 4);
  CHECK(t.a->memory.optimizer == (dense / 16 + kExperts / 8 / 2) * 2 * 4);
  Compiled dp(model("16 x H100_SXM { data = 16, zero = 1 }"));
  CHECK(dp.a->memory.params == kTotal * 4);
  CHECK(dp.a->time.expertParallelComm == 0);
}

TEST_CASE("moe: two all-to-alls forward and two backward per moe op, on the tier crossed",
          "[moe]") {
  // m = 16 / (1 · 16) = 1 micro-batch per step; each moe op's routed rows are [64, 64] fp32 =
  // 16,384 bytes per all-to-all, 2 layers × (2 + 2) all-to-alls.
  double bytes = 64 * 64 * 4;
  Compiled in(model("16 x H100_SXM { data = 16, expert = 8 }"));
  const Target &tg = in.a->plan->target;
  REQUIRE(tg.gpusPerNode == 8);
  double link = tg.interconnect * tg.efficiency.communication;
  double net = tg.network * tg.efficiency.communication;
  // expert = 8: the 8 innermost data ranks, one node: 7/8 of the buffer over the link.
  double inside = tg.linkLatency + 7.0 / 8 * bytes / link;
  CHECK(in.a->time.expertParallelComm == Approx(8 * inside).epsilon(1e-12));
  // expert = 16 spans two nodes: 7/16 over the link and 8/16 over the network, in parallel.
  Compiled across(model("16 x H100_SXM { data = 16, expert = 16 }"));
  double two = tg.networkLatency + std::max(7.0 / 16 * bytes / link, 8.0 / 16 * bytes / net);
  CHECK(across.a->time.expertParallelComm == Approx(8 * two).epsilon(1e-12));
  CHECK(across.a->time.communication >= across.a->time.expertParallelComm);
}

TEST_CASE("moe: gather picks elements along a dim and scatter-adds its gradient", "[moe]") {
  Compiled t(R"(
model G(d = 16, k = 4) {
  param w: [d, d]
  forward(x: f32[batch, d]) {
    y = x @ w
    v, i = topk(y, k)
    return mean(gather(y, i, dim = -1) * v)
  }
}
train t { model = G() batch = 8 precision = fp32 target = H100_SXM }
)");
  const Op &g = opAt(t, "gather");
  CHECK(Graph::formatSizes(t.g().tensors[g.outputs[0]].shape) == "[8, 4]");
  ForwardCost c = ruleFor(OpKind::Gather).forward(t.g(), g);
  CHECK(c.flops == 0);
  CHECK(c.bytesRead == 8 * 4 * 4 + 8 * 4 * 4); // the i32 indices and the 32 gathered floats
  CHECK(ruleFor(OpKind::Gather).gradFlops(t.g(), g, 0) == 32);
  const Graph &s = *t.a->step;
  CHECK(verifyGraph(s) == "");
  CHECK(verifyOpTypes(s) == "");
  unsigned scatters = 0;
  for (const Op &op : s.ops)
    if (op.kind == OpKind::ScatterAdd) {
      ++scatters;
      CHECK(Graph::formatSizes(s.tensors[op.outputs[0]].shape) == "[8, 16]");
    }
  CHECK(scatters == 2); // gather's and topk's, both into y's gradient
}

TEST_CASE("moe: expert gradients reduce over the replicas that share them, the rest over all",
          "[moe]") {
  // ZeRO 0, no overlap: every collective is exposed. 16 data ranks over two nodes of 8.
  Compiled t(model("16 x H100_SXM { data = 16, expert = 8, overlap = false }"));
  const Plan &plan = *t.a->plan;
  // The dense 1,152 gradients (fp32, 4,608 bytes, one bucket) all-reduce over all 16 ranks,
  // 8 per node on 2 nodes.
  Placement all = place(plan, 'd');
  CHECK(all.n == 16);
  CHECK(all.k == 8);
  double dense = collectiveTime(plan.target, all, Collective::AllReduce, 4608);
  // Each rank's 393,216 / 8 expert gradients (196,608 bytes) all-reduce over the 2 ranks that
  // hold the same experts, 8 ranks apart: one per node, over the network.
  Placement same = place(plan, 'x');
  CHECK(same.n == 2);
  CHECK(same.k == 1);
  double experts = collectiveTime(plan.target, same, Collective::AllReduce, 196608);
  CHECK(t.a->time.dataParallelComm == Approx(dense + experts).epsilon(1e-12));
}

TEST_CASE("moe: parallel folding draws the expert group from the tensor and data ranks", "[moe]") {
  // Megatron-Core's MoE parallel folding (expert_tensor = 1): 16 ranks as tensor 2 × data 8;
  // the attention's weights split over the tensor pair, the experts whole on each rank and
  // split over an expert group of 16 drawn from all of them (tensor innermost), so the expert
  // group holds one copy: no expert-data replicas to shard or reduce over.
  Compiled f(model("16 x H100_SXM { data = 8, tensor = 2, expert = 16, expert_tensor = 1, "
                   "sequence_parallel = true, zero = 1 }"));
  const Plan &plan = *f.a->plan;
  ExpertLayout l = expertLayout(plan.parallel);
  CHECK(l.folded);
  CHECK(l.etp == 1);
  CHECK(l.ep == 16);
  CHECK(l.edp == 1);
  double dense = kTotal - kExperts;
  CHECK(f.a->memory.params == Approx((dense / 2 + kExperts / 16) * 4));
  CHECK(f.a->memory.optimizer == Approx((dense / 2 / 8 + kExperts / 16) * 2 * 4));
  // The expert group: 16 consecutive ranks from the innermost tensor rank, over 2 nodes.
  Placement e = place(plan, 'e');
  CHECK(e.n == 16);
  CHECK(e.k == 8);
  CHECK(place(plan, 'x').n == 1);
  // The moe op runs whole on its rank: no tensor-parallel collective of its own. The
  // unfolded layout (expert 8 over the data ranks, the experts split over the tensor pair)
  // reduce-scatters each moe op's output over the tensor pair forward and backward.
  Compiled u(model("16 x H100_SXM { data = 8, tensor = 2, expert = 8, sequence_parallel = true, zero = 1 }"));
  CHECK_FALSE(expertLayout(u.a->plan->parallel).folded);
  CHECK(u.a->memory.params == Approx((dense / 2 + kExperts / 2 / 8) * 4));
  CHECK(f.a->time.tensorParallelComm < u.a->time.tensorParallelComm);
  // The moe ops' work per device is the same: the t ranks share the tokens either way.
  CHECK(f.a->time.forward == Approx(u.a->time.forward).epsilon(1e-9));
  // The expert_tensor the JSON report states: the MoE layers' tensor degree.
  CHECK(expertLayout(u.a->plan->parallel).etp == 2);
}

TEST_CASE("moe: combined 1F1B hides the expert all-to-alls up to the paired compute", "[moe]") {
  // expert_overlap (Megatron-Core's --overlap-moe-expert-parallel-comm): the forward of
  // micro-batch i+1 runs beside the backward of micro-batch i. Batch 16 over 16 data ranks at
  // micro-batch 1 is one micro-batch per step: nothing pairs, everything stays exposed.
  Compiled one(model("16 x H100_SXM { data = 16, expert = 8 }"));
  Compiled oneOverlap(model("16 x H100_SXM { data = 16, expert = 8, expert_overlap = true }"));
  CHECK(oneOverlap.a->time.expertParallelComm == Approx(one.a->time.expertParallelComm));
  // 4 data ranks: 4 micro-batches per step; the first forward and the last backward are the
  // fill and drain (u = 1/4), the three pairs hide their all-to-alls up to their compute.
  Compiled four(model("4 x H100_SXM { data = 4, expert = 4 }"));
  Compiled fourOverlap(model("4 x H100_SXM { data = 4, expert = 4, expert_overlap = true }"));
  const double all = four.a->time.expertParallelComm;
  const double compute = four.a->time.forward + four.a->time.backward + four.a->time.recompute;
  REQUIRE(all > 0);
  CHECK(fourOverlap.a->time.expertParallelComm ==
        Approx(all / 4 + std::max(0.0, 3.0 / 4 * (all - compute))));
  CHECK(fourOverlap.a->time.expertParallelComm < all);
  CHECK(fourOverlap.a->time.step < four.a->time.step);
  // The formula under an interleaved pipeline: p 8, v 4, 512 micro-batches: the warm-up's
  // 2·7 + 3·8 + 1 = 39 chunk forwards of 2,048 are unpaired.
  Plan p = *four.a->plan;
  p.parallel.pipeline = 8, p.parallel.interleave = 4, p.parallel.expertOverlap = true;
  const double u = 39.0 / 2048;
  CHECK(exposedExpertComm(p, 60, 512, 44) == Approx(u * 60 + (1 - u) * 16));
  CHECK(exposedExpertComm(p, 30, 512, 44) == Approx(u * 30)); // hidden but for the warm-up
  p.parallel.expertOverlap = false;
  CHECK(exposedExpertComm(p, 60, 512, 44) == 60);
}
