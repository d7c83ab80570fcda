// test_inference.cpp — unit tests for passes/Inference.cpp on examples/gpt2.tally's
// gpt2_decode (a 512-token prompt, 256 generated tokens, bf16 on H100_SXM) and a small
// grouped-query Llama: the KV cache from the attention ops' k/v shapes, the decode step's FLOPs
// and bytes worked out by hand, memory-bound decode mat-vecs, tokens per second, the total,
// and tensor parallelism splitting the cache and the step.
#include <catch.hpp>

#include "tests/unit/Support.h"

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

TEST_CASE("inference: a sliding window caches and reads only its window (issue 44)", "[inference]") {
  // Two layers of d 64, 4 heads of 16, 2 kv heads (d_kv 32), fp32; the first has a window of
  // 8 keys. 3 sequences, a 20-token prompt, 10 generated.
  const char *src = R"(
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
