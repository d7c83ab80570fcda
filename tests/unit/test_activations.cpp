// test_activations.cpp — unit tests for passes/Activations.cpp: the saved bytes of a GPT-3
// layer (Korthikanti et al. 2022, with and without tensor parallelism), how store-all, full and
// sqrt checkpointing scale with depth and what they recompute, the schedule, the memory plan
// (no two live buffers overlap, the arena holds the liveness peak), auto's choice, pipeline
// parallelism, plans without repeat blocks and infer plans. Plans are compiled from source
// through tally::Compilation, as the CLI does.
#include <catch.hpp>

#include "tests/unit/Support.h"

#include <algorithm>
#include <cmath>
#include <string>

using namespace tally;
using namespace tally::test;

namespace {

/// Replaces every `{NAME}` in `text`.
std::string fill(std::string text, const std::vector<std::pair<std::string, std::string>> &vars) {
  for (auto &v : vars) {
    std::string key = "{" + v.first + "}";
    for (size_t at; (at = text.find(key)) != std::string::npos;)
      text.replace(at, key.size(), v.second);
  }
  return text;
}

/// A GPT-3-style layer as Korthikanti et al. count it: dropout after the attention projection
/// and after the MLP, unfused attention with dropout on the probabilities, layer norms, GELU.
const char *kGpt3 = R"(
block Attention(d, heads, p) {
  qkv  = Linear(d, 3 * d)
  proj = Linear(d, d)
  forward(x) {
    q, k, v = split(qkv(x), 3, dim = -1)
    y = attention(q, k, v, heads = heads, causal = true, fused = false, dropout = p)
    return dropout(proj(y), p)
  }
}
block Mlp(d, p) {
  fc   = Linear(d, 4 * d)
  proj = Linear(4 * d, d)
  forward(x) { return dropout(proj(gelu(fc(x))), p) }
}
block Layer(d, heads, p) {
  ln1  = LayerNorm(d)
  attn = Attention(d, heads, p)
  ln2  = LayerNorm(d)
  mlp  = Mlp(d, p)
  forward(x) {
    x = x + attn(ln1(x))
    return x + mlp(ln2(x))
  }
}
model GPT3(vocab = 1000, d = 512, heads = 8, layers = 3, p = 0.1) {
  wte = Embedding(vocab, d)
  h   = repeat(layers) Layer(d, heads, p)
  lnf = LayerNorm(d)
  forward(tokens: i32[batch, seq]) {
    x = h(wte(tokens))
    return cross_entropy(lnf(x) @ transpose(wte.weight), next_tokens(tokens))
  }
}
train t {
  model       = GPT3({ARGS})
  batch       = 8
  seq         = 256
  micro_batch = 2
  optimizer   = AdamW(lr = 1e-4)
  precision   = bf16
  target      = {TARGET}
}
)";

/// A stack of residual MLP layers with a cheap loss: activation memory is all in the blocks.
const char *kStack = R"(
block Layer(d) {
  fc   = Linear(d, 4 * d)
  proj = Linear(4 * d, d)
  forward(x) { return x + proj(gelu(fc(x))) }
}
model Stack(d = 256, layers = 16) {
  h = repeat(layers) Layer(d)
  forward(x: f32[batch, d]) { return mean(h(x)) }
}
train t {
  model      = Stack(d = {D}, layers = {L})
  batch      = {BATCH}
  micro_batch = {MICRO}
  optimizer  = SGD(lr = 0.1)
  precision  = fp32
  checkpoint = {POLICY}
  target     = {TARGET}
}
)";

std::string stack(int L, const char *policy, const char *target = "H100_SXM", int batch = 8,
                  int micro = 8, int d = 256) {
  return fill(kStack, {{"L", std::to_string(L)},
                       {"D", std::to_string(d)},
                       {"POLICY", policy},
                       {"TARGET", target},
                       {"BATCH", std::to_string(batch)},
                       {"MICRO", std::to_string(micro)}});
}

double sumBlockFlops(const Analysis &a) {
  double f = 0;
  for (const Analysis::BlockActivations &b : a.blockActivations)
    f += b.forwardFlops;
  return f;
}

/// The memory plan's invariants: buffers whose lifetimes overlap never share bytes; the
/// arena holds every buffer and the liveness peak, which is the most bytes live at any step.
void checkMemoryPlan(const Analysis &a) {
  const std::vector<Buffer> &bs = a.buffers;
  REQUIRE(!bs.empty());
  int64_t end = 0;
  for (const Buffer &b : bs) {
    CHECK(b.bytes > 0);
    CHECK(b.first <= b.last);
    CHECK(b.last < a.schedule.size());
    CHECK(b.offset >= 0);
    CHECK(b.offset % 256 == 0); // every buffer starts aligned, and takes a multiple of 256
    end = std::max<int64_t>(end, b.offset + (b.bytes + 255) / 256 * 256);
  }
  CHECK(a.arenaBytes == end);
  size_t overlaps = 0;
  for (size_t i = 0; i < bs.size(); ++i)
    for (size_t j = i + 1; j < bs.size(); ++j) {
      bool live = bs[i].first <= bs[j].last && bs[j].first <= bs[i].last;
      bool share = bs[i].offset < bs[j].offset + bs[j].bytes &&
                   bs[j].offset < bs[i].offset + bs[i].bytes;
      overlaps += live && share;
    }
  CHECK(overlaps == 0);
  // The liveness peak is Activations' walk; the local gradients that MemoryPlan adds to the
  // arena (a broadcast input's gradient before its reduce_to, the loss gradient) are not in it
  // yet (docs/memory.md, "Open points").
  std::vector<double> live(a.schedule.size(), 0);
  for (const Buffer &b : bs)
    if (std::string(b.what) != "local gradient")
      for (uint32_t s = b.first; s <= b.last; ++s)
        live[s] += b.bytes;
  double peak = *std::max_element(live.begin(), live.end());
  CHECK(a.livePeakBytes == Approx(peak));
  CHECK(live[a.peakStep] == Approx(peak));
  CHECK(a.arenaBytes >= peak * (1 - 1e-12));
}

} // namespace

TEST_CASE("activations: a GPT-3 layer keeps s·b·h·(34 + 5·a·s/h) bytes plus layer-norm stats",
          "[activations]") {
  Compiled t(fill(kGpt3, {{"TARGET", "H100_SXM"}, {"ARGS", ""}}));
  const Analysis &a = *t.a;
  const double s = 256, b = 2, h = 512, heads = 8; // b: the micro-batch
  double korthikanti = s * b * h * (34 + 5 * heads * s / h);
  double stats = 2 * 8 * s * b; // two layer norms, mean and rstd in fp32 per row
  REQUIRE(a.blockActivations.size() == 3);
  for (const Analysis::BlockActivations &blk : a.blockActivations) {
    INFO(blk.path);
    CHECK(blk.savedBytes == korthikanti + stats);
    CHECK(blk.inputBytes == 2 * s * b * h);
  }
  CHECK(a.blockActivations[1].path == "h[1]");
  // With nothing checkpointed, every layer's saved bytes are live at the peak: one layer more
  // is exactly one layer's bytes more.
  Compiled two(fill(kGpt3, {{"TARGET", "H100_SXM"}, {"ARGS", "layers = 2"}}));
  CHECK(a.memory.activations - two.a->memory.activations == korthikanti + stats);
}

TEST_CASE("activations: tensor parallel splits attention and MLP activations (Korthikanti §4.2)",
          "[activations]") {
  Compiled t(fill(kGpt3, {{"TARGET", "2 x H100_SXM { tensor = 2 }"}, {"ARGS", ""}}));
  const Analysis &a = *t.a;
  const double s = 256, b = 2, h = 512, heads = 8, tp = 2;
  // Layer-norm inputs, their outputs (the qkv and fc inputs) and the two dropout masks are not
  // split (10·sbh); the rest is: sbh·(10 + 24/t + 5·a·s/(h·t)).
  double expected = s * b * h * (10 + 24 / tp + 5 * heads * s / (h * tp)) + 2 * 8 * s * b;
  for (const Analysis::BlockActivations &blk : a.blockActivations) {
    INFO(blk.path);
    CHECK(blk.savedBytes == expected);
  }
}

TEST_CASE("activations: store-all grows O(L); full keeps O(1) blocks and recomputes the forward",
          "[activations]") {
  Compiled none4(stack(4, "none")), none8(stack(8, "none")), none16(stack(16, "none"));
  Compiled full8(stack(8, "full")), full16(stack(16, "full"));
  const Analysis &n4 = *none4.a, &n8 = *none8.a, &n16 = *none16.a;
  const Analysis &f8 = *full8.a, &f16 = *full16.a;
  // h[0]'s input is x, input data and not an activation; later blocks keep their input.
  CHECK(n8.blockActivations[0].savedBytes == 8 * 256 * 4 * (4 + 4));
  CHECK(n8.blockActivations[0].inputBytes == 0);
  double layer = n8.blockActivations[1].savedBytes, input = n8.blockActivations[1].inputBytes;
  CHECK(layer == 8 * 256 * 4 * (1 + 4 + 4)); // fc input, gelu input, proj input, fp32
  CHECK(input == 8 * 256 * 4);
  // Store-all: exactly one layer's saved bytes more per layer.
  CHECK(n8.memory.activations - n4.memory.activations == 4 * layer);
  CHECK(n16.memory.activations - n8.memory.activations == 8 * layer);
  CHECK(n16.checkpoint.policy == "none");
  CHECK(n16.flops.recompute == 0);
  CHECK(n16.checkpoint.saved.empty());
  // Full: one block input more per layer, the rest independent of depth.
  CHECK(f16.memory.activations - f8.memory.activations == 8 * input);
  CHECK(f16.memory.activations < n16.memory.activations / 4);
  CHECK(f16.checkpoint.policy == "full");
  CHECK(f16.checkpoint.saved.size() == 16);
  CHECK(f16.checkpoint.saved[3] == "h[3]");
  // Recompute = one forward of every block, per step; and it is executed.
  CHECK(f16.flops.recompute == sumBlockFlops(f16));
  CHECK(f16.checkpoint.recomputeFlops == f16.flops.recompute);
  CHECK(f16.flops.recompute == Approx(f16.flops.forward).epsilon(1e-3)); // the loss is tiny
  CHECK(f16.flops.executed - n16.flops.executed == Approx(f16.flops.recompute));
  CHECK(f16.flops.step == n16.flops.step); // model FLOPs do not count recompute
}

TEST_CASE("activations: sqrt keeps O(√L) blocks and recomputes about one forward",
          "[activations]") {
  Compiled s16(stack(16, "sqrt")), s64(stack(64, "sqrt")), n64(stack(64, "none"));
  const Analysis &a16 = *s16.a, &a64 = *s64.a;
  CHECK(a16.checkpoint.policy == "sqrt");
  CHECK(a16.checkpoint.segment == 4);
  CHECK(a16.checkpoint.saved == std::vector<std::string>{"h[0]", "h[4]", "h[8]", "h[12]"});
  CHECK(a64.checkpoint.segment == 8);
  CHECK(a64.checkpoint.saved.size() == 8);
  // Kept inputs plus one segment's activations: doubling √L about doubles the memory.
  double ratio = a64.memory.activations / a16.memory.activations;
  CHECK(ratio > 1.5);
  CHECK(ratio < 2.5);
  CHECK(a64.memory.activations < n64.a->memory.activations / 4);
  CHECK(a64.flops.recompute == sumBlockFlops(a64));
  CHECK(a64.flops.recompute == Approx(a64.flops.forward).epsilon(1e-3));
  CHECK(a64.flops.executed - n64.a->flops.executed == Approx(a64.flops.recompute));
}

TEST_CASE("activations: the schedule runs forward, then recompute before each segment's backward",
          "[activations]") {
  Compiled none(stack(4, "none")), full(stack(4, "full"));
  const Analysis &n = *none.a, &f = *full.a;
  const Graph &g = *n.graph;
  size_t ops = g.ops.size(), backward = 0;
  for (const Op &op : g.ops) {
    bool any = false;
    for (TensorId t : op.inputs)
      any = any || g.tensors[t].requiresGrad;
    backward += any;
  }
  REQUIRE(n.schedule.size() == ops + backward);
  for (size_t i = 0; i < ops; ++i) {
    CHECK(n.schedule[i].kind == ScheduleStep::Forward);
    CHECK(n.schedule[i].op == i);
  }
  for (size_t i = ops + 1; i < n.schedule.size(); ++i) {
    CHECK(n.schedule[i].kind == ScheduleStep::Backward);
    CHECK(n.schedule[i].op < n.schedule[i - 1].op);
  }
  // Full: every op of every block is re-run once, before the backward of any op of its block.
  size_t blockOps = 0;
  for (const Op &op : g.ops)
    blockOps += op.path.rfind("h[", 0) == 0;
  size_t recompute = 0;
  std::vector<size_t> recomputedAt(ops, SIZE_MAX), backwardAt(ops, SIZE_MAX);
  for (size_t i = 0; i < f.schedule.size(); ++i) {
    const ScheduleStep &st = f.schedule[i];
    if (st.kind == ScheduleStep::Recompute)
      ++recompute, recomputedAt[st.op] = i;
    if (st.kind == ScheduleStep::Backward)
      backwardAt[st.op] = i;
  }
  CHECK(recompute == blockOps);
  CHECK(f.schedule.size() == ops + backward + blockOps);
  for (OpId o = 0; o < ops; ++o) {
    if (recomputedAt[o] == SIZE_MAX || backwardAt[o] == SIZE_MAX)
      continue;
    INFO(g.ops[o].path);
    CHECK(recomputedAt[o] < backwardAt[o]);
    // ... and after the backward of every op of later blocks.
    for (OpId later = o + 1; later < ops; ++later)
      if (backwardAt[later] != SIZE_MAX &&
          g.ops[later].path.substr(0, 4) != g.ops[o].path.substr(0, 4))
        CHECK(backwardAt[later] < recomputedAt[o]);
  }
}

TEST_CASE("activations: the memory plan never overlaps two live buffers", "[activations]") {
  for (const char *policy : {"none", "full", "sqrt"}) {
    INFO(policy);
    Compiled t(stack(9, policy));
    checkMemoryPlan(*t.a);
  }
  Compiled gpt(fill(kGpt3, {{"TARGET", "H100_SXM"}, {"ARGS", ""}}));
  checkMemoryPlan(*gpt.a);
  // Saved, transient and gradient buffers are all there, and the split at the peak adds up.
  const Analysis &a = *gpt.a;
  size_t kinds[3] = {0, 0, 0};
  double saved = 0, other = 0;
  for (const Buffer &b : a.buffers) {
    ++kinds[b.kind];
    if (b.first <= a.peakStep && a.peakStep <= b.last)
      (b.kind == Buffer::Saved ? saved : other) += b.bytes;
  }
  CHECK(kinds[Buffer::Saved] > 0);
  CHECK(kinds[Buffer::Transient] > 0);
  CHECK(kinds[Buffer::Gradient] > 0);
  CHECK(a.memory.activations == Approx(saved));
  CHECK(a.memory.workspace == Approx(other));
  CHECK(a.memory.peak == Approx(a.memory.params + a.memory.grads + a.memory.master +
                                a.memory.optimizer + a.memory.activations + a.memory.workspace));
}

TEST_CASE("activations: auto takes the least recompute that fits", "[activations]") {
  // A device of 64 MiB: store-all (about 150 MB) does not fit a 16-layer stack of width 64 at
  // micro-batch 4096, full checkpointing (about 30 MB) does.
  std::string src = stack(16, "auto", "Small", 4096, 4096, 64) + R"(
target Small {
  memory    = 64 MiB
  bandwidth = 1 TB/s
  peak { fp32 = 10 TFLOP/s }
}
)";
  Compiled t(src);
  const Analysis &a = *t.a;
  REQUIRE(a.checkpoint.options.size() == 16 + 2); // none, 1..16 blocks, sqrt
  CHECK(a.checkpoint.requested == "auto");
  double states = a.memory.params + a.memory.grads + a.memory.master + a.memory.optimizer;
  CHECK(a.checkpoint.limitBytes == 64.0 * 1024 * 1024 - states);
  // The options' recompute grows with the blocks checkpointed; memory does not grow.
  for (size_t i = 1; i + 1 < a.checkpoint.options.size(); ++i) {
    CHECK(a.checkpoint.options[i].recomputeFlops > a.checkpoint.options[i - 1].recomputeFlops);
    CHECK(a.checkpoint.options[i].bytes <= a.checkpoint.options[i - 1].bytes);
  }
  CHECK(a.checkpoint.options[16].policy == "full");
  CHECK(a.checkpoint.options[16].bytes < a.checkpoint.options[0].bytes / 4);
  // The choice is the first option that fits, and it fits.
  size_t first = 0;
  while (first < a.checkpoint.options.size() &&
         a.checkpoint.options[first].bytes > a.checkpoint.limitBytes)
    ++first;
  REQUIRE(first > 0);
  REQUIRE(first < 16);
  CHECK(a.checkpoint.policy == "partial");
  CHECK(a.checkpoint.checkpointed == static_cast<int64_t>(first));
  CHECK(a.checkpoint.saved.size() == first);
  CHECK(a.flops.recompute == a.checkpoint.options[first].recomputeFlops);
  CHECK(a.memory.activations + a.memory.workspace == Approx(a.checkpoint.options[first].bytes));
  CHECK(a.memory.peak <= 64.0 * 1024 * 1024);
  // Plenty of memory: auto keeps everything.
  Compiled roomy(stack(16, "auto"));
  CHECK(roomy.a->checkpoint.policy == "none");
  CHECK(roomy.a->flops.recompute == 0);
}

TEST_CASE("activations: pipeline parallel holds min(pp, micro-batches) micro-batches of 1/pp "
          "of the layers", "[activations]") {
  Compiled one(stack(8, "none", "H100_SXM", 32, 8));
  Compiled pp2(stack(8, "none", "2 x H100_SXM { pipeline = 2 }", 32, 8));
  Compiled pp2single(stack(8, "none", "2 x H100_SXM { pipeline = 2 }", 8, 8));
  CHECK(pp2.a->memory.activations == one.a->memory.activations); // 4 micro-batches ≥ 2 stages
  CHECK(pp2single.a->memory.activations == one.a->memory.activations / 2); // one in flight
  CHECK(pp2single.a->memory.workspace == one.a->memory.workspace);
}

TEST_CASE("activations: full or sqrt without repeat blocks checkpoints nothing, and says so",
          "[activations]") {
  const char *src = R"(
model Flat(D = 64) {
  param w1: [D, D]
  param w2: [D, D]
  forward(x: f32[batch, D]) { return mean(gelu(x @ w1) @ w2) }
}
train t { model = Flat()  batch = 16  optimizer = SGD(lr = 0.1)  checkpoint = full  target = H100_SXM }
)";
  Compiled t(src);
  const Analysis &a = *t.a;
  CHECK(a.checkpoint.requested == "full");
  CHECK(a.checkpoint.policy == "none");
  CHECK(a.checkpoint.note.find("no repeat blocks") != std::string::npos);
  CHECK(a.checkpoint.blocks == 0);
  CHECK(a.flops.recompute == 0);
  CHECK(a.memory.activations > 0);
  checkMemoryPlan(a);
}

TEST_CASE("activations: infer plans keep nothing for a backward", "[activations]") {
  Compiled t(std::string(R"(
model M(D = 64) {
  param w1: [D, D]
  forward(x: f32[batch, D]) { return mean(gelu(x @ w1)) }
}
infer i { model = M()  batch = 4  prompt = 8  generate = 2  target = H100_SXM }
)"));
  const Analysis &a = *t.a;
  CHECK(a.memory.activations == 0);
  CHECK(a.memory.workspace > 0);
  for (const ScheduleStep &s : a.schedule)
    CHECK(s.kind == ScheduleStep::Forward);
  for (const Buffer &b : a.buffers)
    CHECK(b.kind == Buffer::Transient);
}

TEST_CASE("activations: sequence parallelism splits the rest over the tensor group (Korthikanti §4.2.2)",
          "[activations]") {
  Compiled t(fill(kGpt3, {{"TARGET", "2 x H100_SXM { tensor = 2, sequence_parallel = true }"},
                          {"ARGS", ""}}));
  const Analysis &a = *t.a;
  const double s = 256, b = 2, h = 512, heads = 8, tp = 2;
  // The layer norms, their inputs and outputs and the dropouts now work on s/t tokens, so the
  // whole layer is split: sbh·(34 + 5·a·s/h)/t, and the norms' statistics (8 bytes a token
  // each) with it.
  double expected = s * b * h * (34 + 5 * heads * s / h) / tp + 2 * 8 * s * b / tp;
  for (const Analysis::BlockActivations &blk : a.blockActivations) {
    INFO(blk.path);
    CHECK(blk.savedBytes == expected);
  }
}
