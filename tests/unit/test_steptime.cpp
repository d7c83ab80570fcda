// test_steptime.cpp — unit tests for passes/StepTime.cpp: per-op times on a four-op toy graph
// computed by hand, accumulation, the optimizer update, data-parallel traffic for each ZeRO
// stage, tensor-parallel all-reduces and splits, the pipeline bubble, host transfers of an
// offloaded optimizer, recompute time, MFU, run time on GPT-2, the accumulation-not-integer
// error, and Narayanan et al.'s closed form for training FLOPs on GPT-2 and Llama shapes.
#include <catch.hpp>

#include "tests/unit/Support.h"

#include <cmath>
#include <string>

using namespace tally;
using namespace tally::test;

namespace {

// H100_SXM numbers and the default efficiencies (ir/Target.h).
constexpr double kF32 = 66.9e12, kBw = 3.35e12, kLink = 450e9 * 0.8, kHost = 64e9 * 0.8;
constexpr double kMatmul = 0.7, kElementwise = 0.8;

/// Four ops: matmul, relu, mul, mean. x is data, so the matmul's backward is the weight
/// gradient alone.
const char *kToy = R"(
model Toy(D = 1024, K = 256) {
  param w: [D, K]
  forward(x: f32[batch, D]) {
    h = x @ w
    a = relu(h)
    return mean(a * a)
  }
}
)";

std::string toyPlan(int batch, int devices, int zero) {
  return std::string(kToy) + "train toy { model = Toy() batch = " + std::to_string(batch) +
         " micro_batch = 16 tokens = 1M optimizer = SGD(lr = 0.1) precision = fp32 target = " +
         std::to_string(devices) + " x H100_SXM { data = " + std::to_string(devices) +
         ", zero = " + std::to_string(zero) + " } }\n";
}

/// A small GPT (GPT-2's blocks) for the parallel layouts.
const char *kTinyGPT = R"(
block MLP(d, hidden) {
  fc   = Linear(d, hidden)
  proj = Linear(hidden, d)
  forward(x) { return proj(gelu(fc(x))) }
}
block Attn(d, heads) {
  qkv  = Linear(d, 3 * d)
  proj = Linear(d, d)
  forward(x) {
    q, k, v = split(qkv(x), 3, dim = -1)
    return proj(attention(q, k, v, heads = heads, causal = true))
  }
}
block Block(d, heads) {
  ln1 = LayerNorm(d)
  attn = Attn(d, heads)
  ln2 = LayerNorm(d)
  mlp = MLP(d, 4 * d)
  forward(x) {
    x = x + attn(ln1(x))
    return x + mlp(ln2(x))
  }
}
model TinyGPT(vocab = 1024, d = 256, heads = 4, layers = 4) {
  wte = Embedding(vocab, d)
  h   = repeat(layers) Block(d, heads)
  lnf = LayerNorm(d)
  forward(tokens: i32[batch, seq]) {
    logits = lnf(h(wte(tokens))) @ transpose(wte.weight)
    return cross_entropy(logits, next_tokens(tokens))
  }
}
train par {
  model = TinyGPT()
  batch = 32
  seq = 128
  micro_batch = 4
  optimizer = AdamW(lr = 1e-3)
  precision = mixed_bf16
  target = 8 x H100_SXM { data = 2, tensor = 2, pipeline = 2, zero = 1 }
}
)";

} // namespace

TEST_CASE("steptime: a four-op graph, by hand", "[steptime]") {
  Compiled t(toyPlan(64, 2, 0), "toy");
  const Analysis &a = *t.a;
  // Per micro-batch of 16 rows: matmul [16,1024]@[1024,256] moves (16·1024 + 1024·256 +
  // 16·256)·4 = 1130496 bytes for 8388608 FLOPs: memory-bound at the fp32 rate.
  double mm = 1130496 / kBw / kMatmul;
  double relu = 32768 / kBw / kElementwise, mul = 49152 / kBw / kElementwise,
         mean = 16388 / kBw / kElementwise;
  CHECK(t.at("matmul").forwardTime == Approx(mm));
  CHECK(t.at("relu").forwardTime == Approx(relu));
  CHECK(t.at("mul").forwardTime == Approx(mul));
  CHECK(t.at("mean").forwardTime == Approx(mean));
  // The backward ops' bytes (passes/Backward.cpp), with 16·256·4 = 16384 bytes per [16, 256]:
  //   mean:   expand dloss → da² [16, 256]: 4 + 16384 = 16388
  //   mul:    a·a, both inputs a: two muls of (dy, a) → da, the second adding into the first:
  //           2·(16384 + 16384 + 16384) + 16384 (the old value it adds to) = 114688
  //   relu:   relu_backward(y, dy) → dh: 3·16384 = 49152
  //   matmul: dw = xᵀ·dh, added into the fp32 gradient region: x 65536 + dh 16384 + dw
  //           1048576 written + 1048576 read = 2179072 (x is data: no dx)
  double bmm = 2179072 / kBw / kMatmul, bmul = 114688 / kBw / kElementwise,
         brelu = 49152 / kBw / kElementwise, bmean = 16388 / kBw / kElementwise;
  CHECK(t.at("matmul").backwardTime == Approx(bmm));
  CHECK(t.at("mul").backwardTime == Approx(bmul));
  CHECK(t.at("relu").backwardTime == Approx(brelu));
  CHECK(t.at("mean").backwardTime == Approx(bmean));
  double F = mm + relu + mul + mean, B = bmm + bmul + brelu + bmean;

  // batch 64 = micro_batch 16 × 2 devices × 2 accumulation steps.
  CHECK(a.time.accumulationSteps == 2);
  CHECK(a.time.forward == Approx(2 * F));
  CHECK(a.time.backward == Approx(2 * B));
  CHECK(a.time.recompute == 0);
  CHECK(a.time.bubble == 0);
  // SGD: read and write 262144 fp32 params and grads once, 2·262144·8 bytes.
  CHECK(a.time.optimizer == Approx(2 * 262144 * 8 / kBw / kElementwise));
  // Ring all-reduce of the fp32 gradients over 2 devices: 2·(1/2)·262144·4 bytes.
  CHECK(a.time.dataParallelComm == Approx(262144 * 4 / kLink));
  CHECK(a.time.communication == Approx(a.time.dataParallelComm));
  // The input x [16, 1024] f32 goes up for each of the 2 micro-batches.
  CHECK(a.time.hostTransfer == Approx(2 * 16 * 1024 * 4 / kHost));
  double step = 2 * F + 2 * B + a.time.optimizer + a.time.communication + a.time.hostTransfer;
  CHECK(a.time.step == Approx(step));
  CHECK(a.time.mfu == Approx((a.flops.forward + a.flops.backward) / (step * kF32 * 2)));
  CHECK(a.time.hfu == Approx((a.flops.executed - a.flops.optimizer) / (step * kF32 * 2)));
  CHECK(a.time.steps == 1e6 / 64);
  CHECK(a.time.run == Approx(a.time.steps * step));
}

TEST_CASE("steptime: data-parallel traffic for each ZeRO stage", "[steptime]") {
  // 4 devices, 2 accumulation steps; G = P = 262144 fp32 = 1 MiB; ring fraction 3/4.
  const double G = 262144 * 4, ring = 0.75;
  const double expected[4] = {2 * ring * G, ring * (G + G), ring * (2 * G + G),
                              ring * (2 * G + 2 * 2 * G)};
  for (int zero = 0; zero <= 3; ++zero) {
    INFO("zero = " << zero);
    Compiled t(toyPlan(128, 4, zero), "toy");
    CHECK(t.a->time.accumulationSteps == 2);
    CHECK(t.a->time.dataParallelComm == Approx(expected[zero] / kLink));
    // The update touches the owned shard: all of it without ZeRO, a quarter with it.
    double owned = zero >= 1 ? 262144 / 4.0 : 262144;
    CHECK(t.a->time.optimizer == Approx(2 * owned * 8 / kBw / kElementwise));
  }
}

TEST_CASE("steptime: tensor and pipeline parallelism", "[steptime]") {
  Compiled t(kTinyGPT, "par");
  const Analysis &a = *t.a;
  // Megatron's split: column- and row-parallel matmuls, attention and the MLP activation are
  // split over t = 2; layer norms, residual adds and the embedding run whole.
  CHECK(t.at("h[0].attn.qkv.matmul").tensorSplit == 2);
  CHECK(t.at("h[0].attn.attention").tensorSplit == 2);
  CHECK(t.at("h[0].attn.proj.matmul").tensorSplit == 2);
  CHECK(t.at("h[0].mlp.gelu").tensorSplit == 2);
  CHECK(t.at("h[0].ln1.layer_norm").tensorSplit == 1);
  CHECK(t.at("h[0].add").tensorSplit == 1);
  CHECK(t.at("wte.embedding").tensorSplit == 1);
  CHECK(t.at("matmul").tensorSplit == 2); // the vocab-parallel head

  // m = 32 / (4 · 2) = 4 micro-batches per pipeline.
  const double m = 4, p = 2, tp = 2, X = 4 * 128 * 256 * 2; // [b, s, d] in bf16
  CHECK(a.time.accumulationSteps == 4);
  // Two all-reduces per layer forward (attn.proj, mlp.proj outputs) and two backward (the
  // gradients of ln1's and ln2's outputs, read by qkv and fc), plus the head's input gradient.
  double perMicro = 4 * 2 * X + 4 * 2 * X + X;
  CHECK(a.time.tensorParallelComm == Approx(m / p * 2 * (tp - 1) / tp * perMicro / kLink));
  // The stage boundary [b, s, d] goes forward and its gradient back every micro-batch.
  CHECK(a.time.pipelineComm == Approx(m * 2 * X / kLink));
  // Bubble: (p − 1)/m of the pipeline's compute.
  double compute = a.time.forward + a.time.backward + a.time.recompute;
  CHECK(a.time.bubble == Approx((p - 1) / m * compute));
  CHECK(a.time.communication ==
        Approx(a.time.dataParallelComm + a.time.tensorParallelComm + a.time.pipelineComm));
}

TEST_CASE("steptime: recompute is the forward time of the recomputed ops", "[steptime]") {
  std::string src = kTinyGPT;
  src.replace(src.find("micro_batch = 4"), 15, "micro_batch = 4 checkpoint = full");
  src.replace(src.find("{ data = 2, tensor = 2, pipeline = 2, zero = 1 }"), 49, "");
  src.replace(src.find("8 x H100_SXM"), 12, "H100_SXM");
  Compiled t(src, "par");
  const Analysis &a = *t.a;
  REQUIRE(a.flops.recompute > 0);
  double recomputed = 0;
  for (const ScheduleStep &s : a.schedule)
    if (s.kind == ScheduleStep::Recompute)
      recomputed += a.ops[s.op].forwardTime;
  CHECK(recomputed > 0);
  CHECK(a.time.recompute == Approx(a.time.accumulationSteps * recomputed));
  // Every block is recomputed, but not the embedding, the final norm, the head or the loss.
  CHECK(a.time.recompute < a.time.forward);
  CHECK(a.time.recompute > 0.5 * a.time.forward);
}

TEST_CASE("steptime: an optimizer on the host moves grads down and params up", "[steptime]") {
  // examples/targets.tally: 4 × MyGPU, Adam with fp32 state on the host, bf16 params and
  // grads, an fp32 master copy left on the device, a [256, 256] weight (65536 parameters).
  Compiled t(fromFile, example("targets.tally"), "on_my_gpu");
  const Analysis &a = *t.a;
  CHECK(a.memory.hostTotal == 65536 * 2 * 4);
  CHECK(a.time.optimizer == 0); // the update runs on the host CPU
  // Input x [16, 256] f32 up; grads (bf16) down; params (bf16) up; the device's master copy
  // down and up for the host's update.
  double bytes = 16 * 256 * 4 + 65536 * 2 + 65536 * 2 + 2 * 65536 * 4;
  CHECK(a.time.hostTransfer == Approx(bytes / (64e9 * 0.8)));
}

TEST_CASE("steptime: GPT-2's run time from step time and steps", "[steptime]") {
  Compiled t(fromFile, example("gpt2.tally"), "gpt2_124M");
  const Analysis &a = *t.a;
  CHECK(a.time.accumulationSteps == 4); // 512 / (16 · 8)
  CHECK(a.time.steps == Approx(10e9 / (512.0 * 1024)));
  CHECK(a.time.run == Approx(a.time.steps * a.time.step));
  CHECK(a.time.runDays == Approx(a.time.steps * a.time.step / 86400));
  double parts = a.time.forward + a.time.backward + a.time.recompute + a.time.bubble +
                 a.time.optimizer + a.time.communication + a.time.hostTransfer;
  CHECK(a.time.step == Approx(parts));
  CHECK(a.time.mfu == Approx((a.flops.forward + a.flops.backward) /
                             (a.time.step * 989.5e12 * 8)));
  // ZeRO-1 over 8 devices: reduce-scatter bf16 grads, all-gather bf16 params.
  CHECK(a.time.dataParallelComm == Approx(7.0 / 8 * 2 * 124439808 * 2 / kLink));
}

TEST_CASE("steptime: Narayanan et al.'s training FLOPs agree within 2%", "[steptime]") {
  // 72·B·s·l·h²·(1 + s/6h + V/12lh): forward + backward without recompute.
  auto narayanan = [](double B, double s, double l, double h, double V) {
    return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
  };
  SECTION("GPT-2 124M") {
    Compiled t(fromFile, example("gpt2.tally"), "gpt2_124M");
    double exact = t.a->flops.forward + t.a->flops.backward;
    REQUIRE(exact > 0);
    CHECK(std::abs(exact / narayanan(512, 1024, 12, 768, 50257) - 1) < 0.02);
  }
  SECTION("Llama-2-7B") {
    Compiled t(fromFile, example("llama2_7b.tally"), "llama2_7b");
    double exact = t.a->flops.forward + t.a->flops.backward;
    REQUIRE(exact > 0);
    CHECK(std::abs(exact / narayanan(1024, 4096, 32, 4096, 32000) - 1) < 0.02);
  }
}

TEST_CASE("steptime: batch not a multiple of micro_batch × data is an error", "[steptime]") {
  Compiled t(std::string(kToy) + R"(
train odd {
  model = Toy()
  batch = 100
  micro_batch = 16
  optimizer = SGD(lr = 0.1)
  target = 8 x H100_SXM
}
)",
             "odd");
  bool found = false;
  for (const Diagnostic *d : t.of(DiagKind::AccumulationNotInteger)) {
    found = true;
    CHECK(d->severity == Severity::Error);
    CHECK(d->line == 13); // `batch = 100`
    CHECK(d->message.find("16 × 8 = 128") != std::string::npos);
  }
  CHECK(found);
  CHECK(t.c.diags.hasErrors());
}

TEST_CASE("steptime: a target block's efficiencies override the defaults", "[steptime]") {
  // MyGPU: 4 TB/s, 900 TFLOP/s bf16; matmuls reach 35% instead of 70%, so a compute-bound
  // matmul takes twice as long and an elementwise op is unchanged.
  std::string target = R"(
target MyGPU {
  memory = 96 GiB
  bandwidth = 4 TB/s
  peak { bf16 = 900 TFLOP/s, fp32 = 60 TFLOP/s }
  EFFICIENCY
}
model M(n = 1024) {
  param w: [n, n]
  forward(x: [batch, n]) { return mean(relu(x @ w)) }
}
train p { model = M() batch = 1024 optimizer = SGD(lr = 0.1) precision = bf16 target = MyGPU }
)";
  std::string slow = target, fast = target;
  slow.replace(slow.find("EFFICIENCY"), 10, "efficiency { matmul = 0.35 }");
  fast.replace(fast.find("EFFICIENCY"), 10, "");
  Compiled s(slow, "p"), f(fast, "p");
  // 2·1024³ FLOPs at 900e12 over 3·1024²·2 bytes at 4e12: compute-bound.
  CHECK(f.at("matmul").forwardTime == Approx(2 * 1024.0 * 1024 * 1024 / 900e12 / 0.7));
  CHECK(s.at("matmul").forwardTime == Approx(2 * f.at("matmul").forwardTime));
  CHECK(s.at("relu").forwardTime == Approx(f.at("relu").forwardTime));
  CHECK(f.a->peakFlops == 900e12);
}
