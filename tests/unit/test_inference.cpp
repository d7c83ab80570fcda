// test_inference.cpp — unit tests for passes/Inference.cpp on examples/gpt2.tally's
// gpt2_decode (a 512-token prompt, 256 generated tokens, bf16 on H100_SXM) and a small
// grouped-query Llama: the KV cache from the attention ops' k/v shapes, the decode step's FLOPs
// and bytes worked out by hand, memory-bound decode mat-vecs, tokens per second, the total,
// and tensor parallelism splitting the cache and the step; serving capacity (issue 45): the
// paged cache, what fits at a context, the latencies and `tally solve serve`.
#include <catch.hpp>

#include "passes/Solvers.h"
#include "tests/unit/Support.h"

#include <cmath>

#include <string>

using namespace tally;
using namespace tally::test;

namespace {

/// Llama blocks with grouped-query attention: 8 heads, 2 key/value heads of 64, so d_kv = 128.
const char *kLlama = R"(
block SwiGLU(d, hidden) {
  gate = Linear(d, hidden, bias = false)
  up   = Linear(d, hidden, bias = false)
  down = Linear(hidden, d, bias = false)
  forward(x) { return down(silu(gate(x)) * up(x)) }
}
block LlamaAttention(d, heads, kv_heads) {
  q = Linear(d, d, bias = false)
  k = Linear(d, d / heads * kv_heads, bias = false)
  v = Linear(d, d / heads * kv_heads, bias = false)
  o = Linear(d, d, bias = false)
  forward(x) {
    y = attention(rope(q(x)), rope(k(x)), v(x), heads = heads, kv_heads = kv_heads, causal = true)
    return o(y)
  }
}
block LlamaBlock(d, heads, kv_heads, hidden) {
  attn_norm = RMSNorm(d)
  attn      = LlamaAttention(d, heads, kv_heads)
  mlp_norm  = RMSNorm(d)
  mlp       = SwiGLU(d, hidden)
  forward(x) {
    x = x + attn(attn_norm(x))
    return x + mlp(mlp_norm(x))
  }
}
model Llama(vocab = 1000, d = 512, heads = 8, kv_heads = 2, hidden = 1024, layers = 2) {
  embed  = Embedding(vocab, d)
  blocks = repeat(layers) LlamaBlock(d, heads, kv_heads, hidden)
  norm   = RMSNorm(d)
  head   = Linear(d, vocab, bias = false)
  forward(tokens: i32[batch, seq]) {
    return head(norm(blocks(embed(tokens))))
  }
}
infer one { model = Llama() batch = 4 prompt = 100 generate = 50 precision = bf16 target = H100_SXM }
infer two {
  model = Llama() batch = 4 prompt = 100 generate = 50 precision = bf16
  target = 2 x H100_SXM { tensor = 2 }
}
infer one_graphed {
  model = Llama() batch = 4 prompt = 100 generate = 50 precision = bf16
  target = 1 x H100_SXM { kernel_launch = 0 us }
}
infer two_graphed {
  model = Llama() batch = 4 prompt = 100 generate = 50 precision = bf16
  target = 2 x H100_SXM { tensor = 2, kernel_launch = 0 us }
}
)";

} // namespace

TEST_CASE("inference: GPT-2 decode, by hand", "[inference]") {
  Compiled t(fromFile, example("gpt2.tally"), "gpt2_decode");
  const Analysis &a = *t.a;
  const auto &inf = a.inference;
  REQUIRE(inf.active);
  const double L = 12, d = 768, V = 50257, prompt = 512, generate = 256;

  // The cache: K and V of 768 values per layer in bf16, for 512 + 256 tokens.
  CHECK(inf.layers == 12);
  CHECK(inf.kvBytesPerToken == 2 * L * d * 2);
  CHECK(inf.kvCacheBytes == (prompt + generate) * 2 * L * d * 2);
  // Framework memory of one H100_SXM (docs/memory.md §9): the 512 MiB context, no
  // communicator, 5% allocator reserve on everything else.
  double allocated = a.memory.params + a.memory.activations + a.memory.workspace + inf.kvCacheBytes;
  CHECK(a.memory.context == 512.0 * 1024 * 1024);
  CHECK(a.memory.commBuffers == 0);
  CHECK(a.memory.allocatorReserve == Approx(0.05 * allocated));
  CHECK(a.memory.peak == Approx(allocated * 1.05 + 512.0 * 1024 * 1024));

  // The prefill yields the first token; 255 decode steps follow at contexts 513 … 767.
  CHECK(inf.decodeSteps == 255);
  CHECK(inf.meanContext == 640);
  CHECK(inf.prefillFlops == a.flops.forward);

  // A decode step at the mean context: weight mat-vecs 2 FLOPs per weight (the tied head
  // included), attention 4·d·c + 5·heads·c per layer, and the elementwise ops per token.
  double weights = L * (d * 3 * d + d * d + 2 * d * 4 * d) + V * d;
  double attention = L * (4 * d * 640 + 5 * 12 * 640);
  double perLayer = 3 * d + d + d + 2 * 8 * d + 4 * d + 8 * 4 * d + d + d; // biases, norms, gelu, adds
  double elementwise = L * perLayer + d + 8 * d;                        // + embeddings' add, lnf
  CHECK(inf.decodeFlops == Approx(2 * weights + attention + elementwise));
  CHECK(inf.twoNFlops == 2 * a.params.total);

  // Bytes: every weight read once per step (wpe only gathers one row), the cache read, plus a
  // little activation traffic.
  double weightBytes = (a.params.total - 1024 * d) * 2;
  double cacheRead = L * 2 * 640 * d * 2;
  CHECK(inf.decodeBytes > weightBytes + cacheRead);
  CHECK(inf.decodeBytes < (weightBytes + cacheRead) * 1.01);
  CHECK(inf.decodeMemoryBound);
  CHECK(inf.decodeIntensity == Approx(inf.decodeFlops / inf.decodeBytes));
  CHECK(inf.decodeIntensity < 1.01);

  // Every decode mat-vec is memory-bound.
  int matmuls = 0;
  double opTime = 0;
  for (const Analysis::DecodeOp &o : inf.ops) {
    opTime += o.time;
    if (a.graph->ops[o.op].kind != OpKind::Matmul)
      continue;
    ++matmuls;
    CHECK_FALSE(o.computeBound);
  }
  CHECK(matmuls == 12 * 4 + 1);

  // Each kernel of a batch-1 decode moves so little that it takes what launching it costs,
  // 3.8 us (docs/time.md §2), except the head's mat-vec over 768 × 50257 bf16 weights: a step
  // is 14 ops × 12 blocks + 5 others (the embeddings, positions, their add, ln_f) launches
  // and the head, the same at every context.
  double head = 0;
  for (const Analysis::DecodeOp &o : inf.ops)
    if (o.time > 3.8e-6 * (1 + 1e-12))
      head += o.time;
  CHECK(head == Approx(inf.ops.back().time));
  CHECK(head == Approx(inf.ops.back().bytes / 3.35e12 / findTarget("H100_SXM")->efficiency.matmul));
  CHECK(opTime == Approx((14 * 12 + 5) * 3.8e-6 + head));
  // The mean step is its ops plus its share of the prompt's upload.
  double perToken = (a.time.communication + a.time.hostTransfer) / prompt;
  CHECK(inf.decodeTime == Approx(opTime + perToken));
  CHECK(inf.firstDecodeTime == Approx(inf.decodeTime));
  CHECK(inf.lastDecodeTime == Approx(inf.decodeTime));
  CHECK(inf.tokensPerSecond == Approx(1 / inf.decodeTime));
  CHECK(inf.totalTime == Approx(inf.prefillTime + 255 * inf.decodeTime));
  CHECK(a.time.step == inf.decodeTime);
  CHECK(a.time.run == inf.totalTime);
  // The bandwidth bound: at most 3.35 TB/s × 0.8 of bytes per second.
  CHECK(inf.decodeTime >= inf.decodeBytes / (3.35e12 * 0.8));
}

TEST_CASE("inference: the KV cache of grouped-query attention", "[inference]") {
  std::string src = kLlama;
  SECTION("one device") {
    Compiled t(src, "one");
    const auto &inf = t.a->inference;
    // 2 layers × K and V × d_kv 128 × 2 bytes; 4 sequences of 100 + 50 tokens.
    CHECK(inf.layers == 2);
    CHECK(inf.kvBytesPerToken == 2 * 2 * 128 * 2);
    CHECK(inf.kvCacheBytes == 4 * 150 * 1024);
    CHECK(inf.decodeSteps == 49);
    CHECK(inf.meanContext == 125);
    CHECK(inf.decodeMemoryBound);
  }
  SECTION("tensor parallel: the heads, the cache and the step split over 2 devices") {
    // Launches taken as free (a CUDA graph), so each op's time is its roofline's.
    Compiled one(src, "one_graphed"), two(src, "two_graphed");
    const auto &a = one.a->inference, &b = two.a->inference;
    CHECK(b.kvCacheBytes == a.kvCacheBytes / 2);
    CHECK(b.decodeFlops == a.decodeFlops); // the whole model's FLOPs
    CHECK(two.a->time.tensorParallelComm > 0);
    CHECK(b.decodeTime < a.decodeTime);
    CHECK(b.decodeTime > a.decodeTime / 2);
  }
  SECTION("launch-bound: splitting kernels that wait for their launches gains nothing") {
    // Every decode kernel of this small model takes less than a launch (3.8 us), so halving
    // its work leaves its time, and the all-reduces come on top.
    Compiled one(src, "one"), two(src, "two");
    const auto &a = one.a->inference, &b = two.a->inference;
    for (const Analysis::DecodeOp &o : a.ops)
      CHECK(o.time == Approx(3.8e-6));
    CHECK(b.decodeTime >= a.decodeTime);
    CHECK(two.a->time.tensorParallelComm > 0);
  }
}

/// Two layers of d 64, 4 heads of 16, 2 kv heads (d_kv 32); the first has a window of `window`
/// keys (8 by default), the second none. Plans follow it.
static const std::string kWindowedModel = R"(
block Layer(d, window) {
  q = Linear(d, d, bias = false)
  kv = Linear(d, 64, bias = false)
  forward(x) {
    k, v = split(kv(x), 2)
    return x + attention(q(x), k, v, heads = 4, kv_heads = 2, causal = true, window = window)
  }
}
model M(d = 64, window = 8) {
  a = Layer(d, window)
  b = Layer(d, 0)
  forward(x: f32[batch, seq, d]) { return b(a(x)) }
}
)";

TEST_CASE("inference: a sliding window caches and reads only its window (issue 44)", "[inference]") {
  // Two layers of d 64, 4 heads of 16, 2 kv heads (d_kv 32), fp32; the first has a window of
  // 8 keys. 3 sequences, a 20-token prompt, 10 generated.
  const std::string src = kWindowedModel + R"(
infer w { model = M() batch = 3 prompt = 20 generate = 10 precision = fp32 target = H100_SXM }
infer long { model = M(window = 100) batch = 3 prompt = 20 generate = 10 precision = fp32 target = H100_SXM }
infer none { model = M(window = 0) batch = 3 prompt = 20 generate = 10 precision = fp32 target = H100_SXM }
)";
  Compiled w(src, "w"), longer(src, "long"), none(src, "none");
  const auto &a = w.a->inference, &l = longer.a->inference, &n = none.a->inference;
  const double perLayer = 2 * 32 * 4; // K and V of one token, fp32
  CHECK(a.layers == 2);
  CHECK(a.windowedLayers == 1);
  CHECK(n.windowedLayers == 0);
  CHECK(a.kvBytesPerToken == 2 * perLayer);
  CHECK(a.kvCacheBytes == 3 * (30 + 8) * perLayer);
  CHECK(n.kvCacheBytes == 3 * (30 + 30) * perLayer);
  // A window longer than prompt + generate changes nothing.
  CHECK(l.kvCacheBytes == n.kvCacheBytes);
  CHECK(l.decodeFlops == n.decodeFlops);
  // A decode step of the windowed layer attends to 8 keys at every step (contexts 21..29):
  // 4·b·d·8 + 5·b·h·8 against the mean over the steps without a window.
  double windowed = 4 * 3 * 64 * 8 + 5 * 3 * 4 * 8;
  double mean = 0;
  for (int c = 21; c <= 29; ++c)
    mean += 4 * 3 * 64 * c + 5 * 3 * 4 * c;
  mean /= 9;
  CHECK(n.decodeFlops - a.decodeFlops == Approx(mean - windowed).epsilon(1e-12));
  // The prefill counts each query's 8 window keys (S_w = b·h·s·8), not all 20.
  CHECK(a.prefillFlops < n.prefillFlops);
}

TEST_CASE("inference: train plans have no inference section", "[inference]") {
  Compiled t(fromFile, example("gpt2.tally"), "gpt2_124M");
  CHECK_FALSE(t.a->inference.active);
  CHECK(t.a->inference.ops.empty());
}

TEST_CASE("inference: a decode step's attention pays an exp per score, its other ops the "
          "prefill's per token",
          "[inference]") {
  // A target whose exps cost 1 ns each and whose memory and arithmetic are fast: every op's
  // time is its exps (and a call), so the count shows.
  std::string src = std::string(kLlama) + R"(
target SlowExp {
  memory = 80 GB
  bandwidth = 1000 TB/s
  peak { bf16 = 1000000 TFLOP/s, fp32 = 1000000 TFLOP/s }
  transcendental = 1 ns
}
infer exps { model = Llama() batch = 4 prompt = 100 generate = 50 precision = bf16 target = SlowExp }
)";
  Compiled t(src, "exps");
  const Graph &g = t.g();
  const auto &inf = t.a->inference;
  bool sawAttention = false, sawRope = false;
  for (const Analysis::DecodeOp &d : inf.ops) {
    const Op &op = g.ops[d.op];
    if (op.kind == OpKind::Attention) {
      // The new token's row: b·h·c scores at the mean context 125, 4 · 8 · 125 = 4000 exps.
      CHECK(d.time == Approx(4000e-9).epsilon(0.01));
      sawAttention = true;
    } else if (op.kind == OpKind::Rope) {
      // The prefill's sin and cos over the prompt, one token's worth.
      double perToken = t.a->ops[d.op].forward.transcendentals / 100;
      CHECK(perToken > 0);
      CHECK(d.time == Approx(perToken * 1e-9).epsilon(0.01));
      sawRope = true;
    }
  }
  CHECK(sawAttention);
  CHECK(sawRope);
}

namespace {

/// Llama-2-7B (32 KV heads) and Llama-3-8B (8 KV heads of 128), returning logits, served at
/// 4K context on one H100_SXM (81,559 MiB as the driver reports it), and the small Llama at other block sizes, KV dtypes
/// and tensor degrees.
std::string servingSource() {
  return std::string(kLlama) + R"(
infer l2 {
  model = Llama(vocab = 32000, d = 4096, heads = 32, kv_heads = 32, hidden = 11008, layers = 32)
  prompt = 2048 generate = 2048 precision = fp16 target = H100_SXM
}
infer l3 {
  model = Llama(vocab = 128256, d = 4096, heads = 32, kv_heads = 8, hidden = 14336, layers = 32)
  prompt = 2048 generate = 2048 precision = bf16 target = H100_SXM
}
infer b16 { model = Llama() concurrent = 4 prompt = 100 generate = 50 precision = bf16 target = H100_SXM }
infer b64 {
  model = Llama() concurrent = 4 prompt = 100 generate = 50 kv_block = 64 precision = bf16
  target = H100_SXM
}
infer fp8 {
  model = Llama() concurrent = 4 prompt = 100 generate = 50 kv_dtype = fp8_e4m3 precision = bf16
  target = H100_SXM
}
infer long { model = Llama() concurrent = 4 prompt = 100 generate = 50 max_context = 1000 precision = bf16 target = H100_SXM }
infer t2 {
  model = Llama() concurrent = 4 prompt = 100 generate = 50 precision = bf16
  target = 2 x H100_SXM { tensor = 2 }
}
infer t4 {
  model = Llama() concurrent = 4 prompt = 100 generate = 50 precision = bf16
  target = 4 x H100_SXM { tensor = 4 }
}
)";
}

/// What the cache may take on one device, from the analysis's own memory numbers:
/// (limit − context − comm buffers) / (1 + reserve) − weights − activations − workspace.
double cacheRoom(const Analysis &a) {
  const auto &m = a.memory;
  double r = a.plan->target.allocatorReserve;
  return (memoryLimit(*a.plan) - m.context - m.commBuffers) / (1 + r) - m.params -
         m.activations - m.workspace;
}

} // namespace

TEST_CASE("serving: KV bytes per token and the sequences that fit at 4K (issue 45)", "[inference][serving]") {
  std::string src = servingSource();
  Compiled l2(src, "l2"), l3(src, "l3");
  const auto &a = l2.a->inference, &b = l3.a->inference;
  // 2 (K and V) × 32 layers × 4096 × 2 bytes; GQA: 8 KV heads of 128 → 1024 wide.
  CHECK(a.kvBytesPerToken == 524288);
  CHECK(b.kvBytesPerToken == 131072);
  CHECK(a.kvHeads == 32);
  CHECK(b.kvHeads == 8);
  // 4096 tokens, blocks of 16: 256 blocks, 4096 × the bytes per token.
  CHECK(a.maxContext == 4096);
  CHECK(a.kvBlocksPerSequence == 256);
  CHECK(a.kvBytesPerSequence == 4096.0 * 524288);
  CHECK(b.kvBytesPerSequence == 4096.0 * 131072);
  CHECK(l2.a->params.total == 6738415616);
  CHECK(l2.a->memory.params == 2.0 * 6738415616);
  CHECK(a.kvMemoryBytes == Approx(cacheRoom(*l2.a)));
  CHECK(a.maxConcurrent == std::floor(cacheRoom(*l2.a) / (4096.0 * 524288)));
  CHECK(b.maxConcurrent == std::floor(cacheRoom(*l3.a) / (4096.0 * 131072)));
  CHECK(a.maxConcurrent == 31); // the H100's reported 81,559 MiB (28 at the datasheet's 80e9 B)
  CHECK(b.maxConcurrent == 119);
  CHECK(a.kvBlocksTotal == std::floor(cacheRoom(*l2.a) / (16.0 * 524288)));
  // The plan's own peak with max_concurrent sequences of 4096 tokens fits; one more does not.
  double r = 1.05;
  CHECK(l2.a->memory.peak - r * a.kvCacheBytes + r * a.maxConcurrent * a.kvBytesPerSequence <=
        memoryLimit(*l2.a->plan));
  CHECK(l2.a->memory.peak - r * a.kvCacheBytes + r * (a.maxConcurrent + 1) * a.kvBytesPerSequence >
        memoryLimit(*l2.a->plan));
}

TEST_CASE("serving: blocks, KV dtype, context and tensor parallelism", "[inference][serving]") {
  std::string src = servingSource();
  Compiled b16(src, "b16"), b64(src, "b64"), fp8(src, "fp8"), longer(src, "long"), t2(src, "t2"),
      t4(src, "t4");
  const auto &x = b16.a->inference;
  // `concurrent` is the batch.
  CHECK(b16.a->plan->batch == 4);
  // 2 layers × K and V × d_kv 128 × 2 bytes = 1024 per token; 150 tokens in blocks of 16 hold
  // 10 blocks (160 tokens), in blocks of 64 three (192 tokens).
  CHECK(x.kvBytesPerToken == 1024);
  CHECK(x.kvBlocksPerSequence == 10);
  CHECK(x.kvBytesPerSequence == 160 * 1024);
  CHECK(b64.a->inference.kvBytesPerSequence == 192 * 1024);
  CHECK(b64.a->inference.kvBlockBytes == 64 * 1024);
  // An fp8 cache: half the bytes, and a decode step reads half the cache: at the mean context
  // 125, each layer reads 2·b·c·d_kv and appends 2·b·d_kv one byte fewer each.
  const auto &f = fp8.a->inference;
  CHECK(f.kvDtype == Dtype::FP8E4M3);
  CHECK(f.kvBytesPerToken == 512);
  CHECK(f.kvCacheBytes == x.kvCacheBytes / 2);
  CHECK(x.decodeBytes - f.decodeBytes == Approx(2 * (2 * 4 * 125 * 128 + 2 * 4 * 128)));
  CHECK(f.decodeFlops == x.decodeFlops);
  // max_context: the cache per sequence and the slowest step grow with it; the plan's own cache
  // (prompt + generate) does not.
  const auto &l = longer.a->inference;
  CHECK(l.kvBytesPerSequence == 1008 * 1024); // 63 blocks of 16
  CHECK(l.kvCacheBytes == x.kvCacheBytes);
  CHECK(l.interTokenLatency >= x.interTokenLatency);
  // Latencies: the prefill, the step at max_context (here prompt + generate = the last step's
  // context), tokens/s per GPU at that step.
  CHECK(x.timeToFirstToken == x.prefillTime);
  CHECK(x.interTokenLatency == Approx(x.lastDecodeTime).epsilon(1e-12));
  CHECK(x.tokensPerSecondPerGpu == Approx(4 / x.interTokenLatency));
  const auto &y = t2.a->inference, &z = t4.a->inference;
  CHECK(y.tokensPerSecondPerGpu == Approx(4 / y.interTokenLatency / 2));
  // Tensor parallelism splits the 2 KV heads: over 2 ranks one each (512 B a token); over 4,
  // more ranks than KV heads, each rank keeps a copy of one, as vLLM replicates them: still 512.
  CHECK(y.kvBytesPerToken == 512);
  CHECK(y.kvReplication == 1);
  CHECK(z.kvBytesPerToken == 512);
  CHECK(z.kvReplication == 2);
  CHECK(z.kvCacheBytes == y.kvCacheBytes);
}

TEST_CASE("serving: a sliding window's blocks cover its window", "[inference][serving]") {
  // One layer with a window of 8 keys, one without; d_kv 32 in fp32: 256 B a token and layer.
  // At 30 tokens in blocks of 4 the growing layer holds ceil(30/4) = 8 blocks; the windowed
  // one the blocks of tokens 22..29: floor(29/4) − floor(22/4) + 1 = 3.
  const std::string src = kWindowedModel + R"(
infer w { model = M() prompt = 20 generate = 10 kv_block = 4 precision = fp32 target = H100_SXM }
)";
  Compiled w(src, "w");
  const auto &a = w.a->inference;
  CHECK(a.kvBytesPerToken == 512);
  CHECK(a.kvBytesPerSequence == (8 + 3) * 4 * 256);
}

TEST_CASE("serving: solve serve finds the largest concurrency within the latency budget", "[inference][serving][solvers]") {
  std::string src = servingSource();
  PlanOverrides o;
  o.maxContext = 8192;
  Compiled l3(src, "l3", o);
  Relower relower = l3.relower();
  const Analysis &a = *l3.a;
  REQUIRE(a.inference.maxContext == 8192);
  // Without a budget: the most sequences of 8192 tokens that fit beside the prefill of as many
  // prompts, which is at most what fits beside one prompt's.
  SolverAnswer all = solveServe(a, relower, 0);
  REQUIRE(all.ok());
  CHECK(all.answer >= 1);
  CHECK(all.answer <= a.inference.maxConcurrent);
  // A budget between the latencies of two candidates: the answer meets it, the next does not.
  SolverAnswer tight = solveServe(a, relower, 0.020);
  REQUIRE(tight.ok());
  CHECK(tight.answer < all.answer);
  auto row = [](const SolverAnswer &r, double n) -> const std::vector<SolverInput> * {
    for (const auto &row : r.rows)
      if (row[0].number == n)
        return &row;
    return nullptr;
  };
  const auto *best = row(tight, tight.answer), *next = row(tight, tight.answer + 1);
  REQUIRE(best);
  REQUIRE(next);
  CHECK((*best)[4].number <= 0.020);
  CHECK((*next)[4].number > 0.020);
  // The candidates are the plan at each batch, analysed whole: the answer's row is what a
  // report of that plan says.
  PlanOverrides at = o;
  at.batch = static_cast<int64_t>(tight.answer);
  Compiled same(src, "l3", at);
  CHECK((*best)[4].number == Approx(same.a->inference.interTokenLatency));
  // A budget no concurrency meets: an error, not a number.
  CHECK_FALSE(solveServe(a, relower, 1e-6).ok());
}

TEST_CASE("inference: an encoder keeps no KV cache and decodes nothing", "[inference][serving]") {
  // Two bidirectional layers (causal = false everywhere): the plan is the forward alone
  // (passes/Inference.cpp step 8).
  const std::string src = R"(
block Layer(d) {
  norm = LayerNorm(d)
  forward(x) { return norm(x + attention(x, x, x, heads = 4, causal = false)) }
}
model Encoder(d = 64) {
  embed  = Embedding(1000, d)
  layers = repeat(2) Layer(d)
  forward(tokens: i32[batch, seq]) { return mean(layers(embed(tokens))) }
}
infer e { model = Encoder() batch = 4 prompt = 128 precision = bf16 target = 2 x H100_SXM { tensor = 2 } }
)";
  Compiled e(src, "e");
  const Analysis &a = *e.a;
  const auto &inf = a.inference;
  REQUIRE(inf.active);
  CHECK(inf.encoder);
  CHECK(inf.bidirectionalLayers == 2);
  CHECK(inf.layers == 0);
  CHECK(inf.kvBytesPerToken == 0);
  CHECK(inf.kvCacheBytes == 0);
  CHECK(inf.kvBytesPerSequence == 0);
  CHECK(inf.decodeSteps == 0);
  CHECK(inf.ops.empty());
  CHECK(inf.tokensPerSecond == 0);
  REQUIRE(inf.prefillTime > 0);
  CHECK(inf.forwardTokensPerSecond == Approx(4.0 * 128 / inf.prefillTime));
  CHECK(inf.forwardTokensPerSecondPerGpu == Approx(inf.forwardTokensPerSecond / 2));
  CHECK(a.time.step == inf.prefillTime);
  CHECK(a.time.run == inf.prefillTime);
  CHECK(a.time.mfu == Approx(inf.prefillFlops / (inf.prefillTime * a.peakFlops * 2)));
  // Nothing to serve within a latency budget.
  SolverAnswer s = solveServe(a, e.relower(), 0);
  CHECK_FALSE(s.ok());
  CHECK(s.error.find("encoder") != std::string::npos);
}
