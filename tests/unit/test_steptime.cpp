// test_steptime.cpp — unit tests for passes/StepTime.cpp: per-op times on a four-op toy graph
// computed by hand, accumulation, the optimizer update, data-parallel traffic for each ZeRO
// stage, tensor-parallel all-reduces and splits, the pipeline bubble, host transfers of an
// offloaded optimizer, recompute time, MFU, run time on GPT-2, the accumulation-not-integer
// error, and Narayanan et al.'s closed form for training FLOPs on GPT-2 and Llama shapes.
#include <catch.hpp>

#include "tests/unit/Support.h"

#include "passes/Collectives.h"

#include <algorithm>
#include <cmath>
#include <string>

using namespace tally;
using namespace tally::test;

namespace {

// H100_SXM numbers and the default efficiencies (ir/Target.h).
constexpr double kF32 = 66.9e12, kBw = 3.35e12, kLink = 450e9 * 0.8, kHost = 64e9 * 0.8;
// The H100's matmul efficiency: the A100-set 0.7 scaled by the published Maximum Achievable
// Matmul FLOPS fractions, 80.1% against 85.9% (ir/Target.cpp, kernelRates).
constexpr double kMatmul = 0.7 * 0.801 / 0.859, kElementwise = 0.8;
// The A100's NVLink after efficiency; its network: one HDR 200 Gb/s NIC per GPU.
constexpr double kA100Link = 300e9 * 0.8, kA100Net = 25e9 * 0.8;

/// One collective of `bytes` over `group` as passes/Collectives.cpp prices it
/// (test_collectives.cpp pins that pricing by hand): these tests check what the step does with
/// collectives — how many, how large, over which group, what overlaps.
double coll(const Analysis &a, char group, Collective c, double bytes) {
  return collectiveTime(a.plan->target, place(*a.plan, group), c, bytes);
}

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

std::string toyPlan(int batch, int devices, int zero, const std::string &extra = "") {
  return std::string(kToy) + "train toy { model = Toy() batch = " + std::to_string(batch) +
         " micro_batch = 16 tokens = 1M optimizer = SGD(lr = 0.1) precision = fp32 target = " +
         std::to_string(devices) + " x H100_SXM { data = " + std::to_string(devices) +
         ", zero = " + std::to_string(zero) + extra + " } }\n";
}

/// kTinyGPTModel (Support.h) with a plan on the parallel layouts.
const std::string kTinyGPT = std::string(kTinyGPTModel) + R"(
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
  // Launches taken as free (the next test case prices them): every time is its roofline's.
  Compiled t(toyPlan(64, 2, 0, ", kernel_launch = 0 us"), "toy");
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
  // All-reduce of the fp32 gradients over 2 devices: one DDP bucket (1 MiB < 25 MiB), which, as
  // the last, never hides behind the backward. NCCL runs a message this small as a ring under
  // the LL protocol: its base latency 6.6 us, 2 steps of 0.6 us, at LL's cap of 141 GB/s on
  // Hopper, the algorithm bandwidth 141e9 × n / (2(n − 1)) = 141e9.
  CHECK(a.stack.name == "ddp");
  CHECK(a.time.dataParallelComm == Approx(6.6e-6 + 2 * 0.6e-6 + 262144 * 4 / 141e9));
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

TEST_CASE("steptime: no kernel call takes less than its launch", "[steptime]") {
  // The four-op toy's kernels move kilobytes: each takes the 3.8 us an H100_SXM's CPU needs
  // to launch it (Target::kernelLaunch), whatever its roofline time (~10 ns to 0.5 us).
  constexpr double kLaunch = 3.8e-6;
  CHECK(findTarget("H100_SXM")->kernelLaunch == kLaunch);
  for (const Target &c : targetCatalogue())
    CHECK(c.kernelLaunch == kLaunch);
  Compiled t(toyPlan(64, 2, 0), "toy"), free(toyPlan(64, 2, 0, ", kernel_launch = 0 us"), "toy");
  for (const char *op : {"matmul", "relu", "mul", "mean"}) {
    INFO(op);
    CHECK(free.at(op).forwardTime < kLaunch);
    CHECK(t.at(op).forwardTime == Approx(kLaunch));
  }
  // Backward: one launch per backward kernel (the mul's two, the rest one each; the matmul's
  // weight gradient alone, x being data).
  CHECK(t.at("matmul").backwardTime == Approx(kLaunch));
  CHECK(t.at("mul").backwardTime == Approx(2 * kLaunch));
  CHECK(t.at("relu").backwardTime == Approx(kLaunch));
  CHECK(t.at("mean").backwardTime == Approx(kLaunch));
  // 2 micro-batches of 4 forward and 5 backward launches.
  CHECK(t.a->time.forward == Approx(2 * 4 * kLaunch));
  CHECK(t.a->time.backward == Approx(2 * 5 * kLaunch));
  // The SGD update: one call for the one parameter tensor and one for zero_grad, 7.6 us
  // against the 1.56 us its 2·262144·8 bytes take.
  CHECK(free.a->time.optimizer == Approx(2 * 262144 * 8 / kBw / kElementwise));
  CHECK(t.a->time.optimizer == Approx(2 * kLaunch));
  // A large kernel never meets the floor: its time is the roofline's with or without it.
  std::string large = toyPlan(65536, 2, 0);
  large.replace(large.find("micro_batch = 16"), 16, "micro_batch = 32768");
  Compiled big(large, "toy");
  CHECK(big.at("matmul").forwardTime > 10 * kLaunch);
  CHECK(big.at("matmul").forwardTime ==
        Approx(std::max(2.0 * 32768 * 1024 * 256 / kF32,
                        (32768.0 * 1024 + 1024 * 256 + 32768 * 256) * 4 / kBw) /
               kMatmul));
  // Views launch nothing: the split of qkv's output costs 0.
  Compiled tiny(kTinyGPT, "par");
  CHECK(tiny.at("h[0].attn.split").forwardTime == 0);
  CHECK(tiny.at("h[0].attn.qkv.add").forwardTime == Approx(kLaunch));
  // A target declared without `kernel_launch` has no floor; one that states it has its own.
  std::string declared = std::string(kToy) + R"(
target Slow {
  memory = 80 GB
  bandwidth = 3 TB/s
  peak { fp32 = 60 TFLOP/s }
  LAUNCH
}
train toy { model = Toy() batch = 16 micro_batch = 16 tokens = 1M optimizer = SGD(lr = 0.1)
            precision = fp32 target = Slow }
)";
  std::string none = declared, ten = declared;
  none.replace(none.find("LAUNCH"), 6, "");
  ten.replace(ten.find("LAUNCH"), 6, "kernel_launch = 10 us");
  Compiled n(none, "toy"), d(ten, "toy");
  CHECK(n.at("relu").forwardTime == Approx(32768 / 3e12 / kElementwise));
  CHECK(d.at("relu").forwardTime == Approx(10e-6));
}

TEST_CASE("steptime: data-parallel traffic for each ZeRO stage", "[steptime]") {
  // 4 devices, 2 accumulation steps; G = P = 262144 fp32 = 1 MiB, one message (every stack's
  // bucket is larger; the toy has no repeated block, so FSDP's unit is the model). Overlap off:
  // every collective is exposed.
  const double G = 262144 * 4;
  for (int zero = 0; zero <= 3; ++zero) {
    INFO("zero = " << zero);
    Compiled t(toyPlan(128, 4, zero, ", overlap = false, kernel_launch = 0 us"), "toy");
    const Analysis &a = *t.a;
    double ar = coll(a, 'd', Collective::AllReduce, G), rs = coll(a, 'd', Collective::ReduceScatter, G),
           ag = coll(a, 'd', Collective::AllGather, G);
    // ZeRO 0: one all-reduce; 1: a reduce-scatter and the gather of the update; 2: a
    // reduce-scatter per micro-batch and the gather; 3: per micro-batch a reduce-scatter and
    // the gathers before the forward and the backward.
    const double expected[4] = {ar, rs + ag, 2 * rs + ag, 2 * rs + 2 * 2 * ag};
    CHECK(t.a->time.accumulationSteps == 2);
    CHECK(t.a->time.dataParallelComm == Approx(expected[zero]));
    // The update touches the owned shard: all of it without ZeRO, a quarter with it.
    double owned = zero >= 1 ? 262144 / 4.0 : 262144;
    CHECK(t.a->time.optimizer == Approx(2 * owned * 8 / kBw / kElementwise));
  }
  // With overlap (the default) ZeRO 2's first micro-batch reduce-scatter hides behind the
  // second micro-batch's backward when that is longer; here the backward (2 × ~0.9 us) is
  // shorter than one reduce-scatter, so only that much is hidden.
  // (ZeRO 2 is DeepSpeed's, whose overlap_comm is off unless the plan turns it on.)
  Compiled on(toyPlan(128, 4, 2, ", overlap = true"), "toy");
  double backward = on.a->time.backward + on.a->time.recompute; // m = 2 micro-batches
  double rs = coll(*on.a, 'd', Collective::ReduceScatter, G), ag = coll(*on.a, 'd', Collective::AllGather, G);
  // What is hidden still costs the compute beside it the H100's multiprocessors NCCL's 16
  // blocks hold: 16 / 132 of the hidden time for the kernels that launch a block per tile,
  // and half of it for the matmuls, whose persistent kernels (one block per multiprocessor)
  // run 16 of their 132 blocks as a second wave (Collectives.h, overlapInterference).
  double exposed = std::max(rs, 2 * rs - backward), hidden = 2 * rs - exposed;
  CHECK(hidden > 0);
  double matmul = 0, all = 0;
  for (OpId i = 0; i < on.a->ops.size(); ++i) {
    double time = on.a->ops[i].forwardTime + on.a->ops[i].backwardTime;
    all += time;
    if (opClass(on.g().ops[i].kind) == OpClass::Matmul)
      matmul += time;
  }
  double share = matmul / all, lost = share * 0.5 + (1 - share) * 16 / 132;
  CHECK(share > 0.1);
  CHECK(on.a->time.overlapInterference == Approx(hidden * lost));
  CHECK(on.a->time.dataParallelComm == Approx(exposed + hidden * lost + ag));
  // A GPU whose matmuls launch a block per tile (the A100) loses the blocks' share only.
  Target a100 = *findTarget("A100_80GB");
  CHECK(overlapInterference(a100, share) == Approx(16.0 / 108));
  CHECK(overlapInterference(a100, 0) == overlapInterference(a100, 1));
  CHECK(overlapInterference(on.a->plan->target, 1) == Approx(0.5));
  CHECK(overlapInterference(on.a->plan->target, 0) == Approx(16.0 / 132));
  Compiled dflt(toyPlan(128, 4, 2), "toy");
  CHECK(dflt.a->stack.name == "deepspeed");
  CHECK(!dflt.a->stack.overlap);
  CHECK(dflt.a->time.dataParallelComm == Approx(2 * rs + ag));
  CHECK(dflt.a->time.overlapInterference == 0); // nothing hidden, nothing slowed
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
  // 17 all-reduces of X over the tensor pair inside the node.
  double oneAllReduce = coll(a, 't', Collective::AllReduce, X);
  CHECK(a.time.tensorParallelComm == Approx(m / p * 17 * oneAllReduce));
  // The stage boundary [b, s, d] goes forward and its gradient back every micro-batch: a stage
  // sends its 1/t share (one Simple step of NVLink, 3.4 us), the next all-gathers it over the
  // tensor pair.
  double send = (3.4e-6 + X / tp / kLink) + coll(a, 't', Collective::AllGather, X);
  CHECK(a.time.pipelineComm == Approx(m * 2 * send));
  // Bubble: what the devices other than the busiest compute in one micro-batch (balanced
  // stages: (p − 1)/m of the pipeline's compute).
  const auto &pl = a.pipeline;
  REQUIRE(pl.stageForward.size() == 2);
  double w0 = pl.stageForward[0] + pl.stageBackward[0], w1 = pl.stageForward[1] + pl.stageBackward[1];
  CHECK(a.time.bubble == Approx(std::min(w0, w1)));
  CHECK(a.time.forward + a.time.backward + a.time.recompute == Approx(m * std::max(w0, w1)));
  CHECK(a.time.communication ==
        Approx(a.time.dataParallelComm + a.time.tensorParallelComm + a.time.pipelineComm));
}

/// kTinyGPT with its target line replaced.
static std::string tinyOn(const std::string &target) {
  std::string src = kTinyGPT;
  std::string old = "8 x H100_SXM { data = 2, tensor = 2, pipeline = 2, zero = 1 }";
  src.replace(src.find(old), old.size(), target);
  return src;
}

TEST_CASE("steptime: tensor_overlap hides each backward all-reduce behind its weight gradients",
          "[steptime]") {
  // Megatron's asynchronous backward: the all-reduce of ln1's output gradient runs while qkv
  // computes its weight gradient, ln2's while fc does, the head input's while the head does;
  // what exceeds that time is exposed. The forward all-reduces stay exposed.
  Compiled off(tinyOn("8 x H100_SXM { data = 2, tensor = 2, pipeline = 2 }"), "par");
  Compiled on(tinyOn("8 x H100_SXM { data = 2, tensor = 2, pipeline = 2, tensor_overlap = true }"),
              "par");
  const double m = 4, p = 2, X = 4 * 128 * 256 * 2; // [b, s, d] in bf16
  double oneAllReduce = coll(*on.a, 't', Collective::AllReduce, X);
  auto wgrad = [&](const std::string &path) {
    const OpAnalysis &o = on.at(path);
    return o.backwardTime * o.weightGradFlops / (o.inputGradFlops + o.weightGradFlops);
  };
  double backward = 0;
  for (int l = 0; l < 4; ++l)
    for (const char *reader : {".attn.qkv.matmul", ".mlp.fc.matmul"})
      backward += std::max(0.0, oneAllReduce - wgrad("h[" + std::to_string(l) + "]" + reader));
  backward += std::max(0.0, oneAllReduce - wgrad("matmul"));
  CHECK(off.a->time.tensorParallelComm == Approx(m / p * 17 * oneAllReduce));
  CHECK(on.a->time.tensorParallelComm == Approx(m / p * (8 * oneAllReduce + backward)));
  CHECK(on.a->time.tensorParallelComm < off.a->time.tensorParallelComm);
  // Compute is priced the same; only the exposed communication differs.
  CHECK(on.a->time.backward == off.a->time.backward);
  CHECK(on.a->time.step == Approx(off.a->time.step - off.a->time.tensorParallelComm +
                                  on.a->time.tensorParallelComm));
}

TEST_CASE("steptime: the first pipeline stage holds the embedding and 1/p of the copies",
          "[steptime]") {
  // Memory per device is the first stage's (its activations hold the most micro-batches): the
  // tied embedding (read before the copies) whole, 1/p of the 4 layers, not lnf (after them).
  // mixed_bf16: params 2 bytes, grads 2, master 4, AdamW 2 × 4; ZeRO-1 shards the last two.
  Compiled t(tinyOn("8 x H100_SXM { data = 2, tensor = 2, pipeline = 2, zero = 1 }"), "par");
  const Analysis &a = *t.a;
  double wte = t.block("wte").count, h = t.block("h").count, lnf = t.block("lnf").count;
  REQUIRE(a.params.total == wte + h + lnf);
  CHECK(a.params.beforeCopies == wte);
  CHECK(a.params.inCopies == h);
  double stage = (wte + h / 2) / 2; // over t = 2
  CHECK(a.memory.params == Approx(stage * 2));
  CHECK(a.memory.grads == Approx(stage * 2));
  CHECK(a.memory.master == Approx(stage * 4 / 2));
  CHECK(a.memory.optimizer == Approx(stage * 8 / 2));
  CHECK(stage > a.params.total / 4); // the old 1/(t·p) of the whole model
  // The layout search's floor counts the same states (it once spread the model evenly).
  double states = a.memory.params + a.memory.grads + a.memory.master + a.memory.optimizer;
  CHECK(modelStatesFloor(a, *a.plan) == Approx(reservedPeak(a, states)));

  // Without pipeline stages: 1/t of everything.
  Compiled flat(tinyOn("8 x H100_SXM { data = 4, tensor = 2 }"), "par");
  CHECK(flat.a->memory.params == Approx(flat.a->params.total / 2 * 2));
}

TEST_CASE("steptime: a pipeline runs at the pace of its busiest stage, the last holding the head",
          "[steptime][pipeline]") {
  // TinyGPT's 4 layers over p = 2 stages: stage 0 runs the embedding and layers 0-1, stage 1
  // layers 2-3, the final norm, the head and the loss (passes/PipelineStages.cpp). Summed here
  // from the per-op times, by where each op sits relative to the repeat copies.
  Compiled t(tinyOn("8 x H100_SXM { data = 2, tensor = 2, pipeline = 2, zero = 1 }"), "par");
  const Analysis &a = *t.a;
  const Graph &g = *a.graph;
  const RepeatCopies &rc = *a.copies;
  REQUIRE(rc.copies.size() == 4);
  double W[2] = {0, 0}, Fs[2] = {0, 0}, Bs[2] = {0, 0};
  int stage = 0;
  for (OpId i = 0; i < g.ops.size(); ++i) {
    if (rc.ofOp[i] != kNone)
      stage = rc.ofOp[i] < 2 ? 0 : 1;
    Fs[stage] += a.ops[i].forwardTime;
    Bs[stage] += a.ops[i].backwardTime;
  }
  for (int s : {0, 1})
    W[s] = Fs[s] + Bs[s]; // checkpoint = none: no recompute
  REQUIRE(a.pipeline.stageForward.size() == 2);
  CHECK(a.pipeline.stageForward[0] == Approx(Fs[0]));
  CHECK(a.pipeline.stageForward[1] == Approx(Fs[1]));
  CHECK(a.pipeline.stageBackward[1] == Approx(Bs[1]));
  int slow = W[1] >= W[0] ? 1 : 0;
  double m = 32.0 / (4 * 2);
  CHECK(a.time.forward == Approx(m * Fs[slow]));
  CHECK(a.time.backward == Approx(m * Bs[slow]));
  CHECK(a.time.bubble == Approx(W[1 - slow]));
  // The balanced form it replaces spread the head over both stages: m·(F + B)/p plus
  // (p − 1)/p of one micro-batch; counting the stages costs at least that.
  double balanced = m * (Fs[0] + Fs[1] + Bs[0] + Bs[1]) / 2 + (W[0] + W[1]) / 2;
  CHECK(a.time.forward + a.time.backward + a.time.bubble >= balanced * (1 - 1e-12));
  // Fewer copies than stages: taken as balanced, as before.
  Compiled deep(tinyOn("8 x H100_SXM { pipeline = 8 }"), "par");
  CHECK(deep.a->pipeline.stageForward.empty());
}

TEST_CASE("steptime: a block's time is one device's, over the pipeline stages it spans",
          "[steptime]") {
  // TinyGPT's 4 layers on p = 2 stages (and on 4 chunks with v = 2): a copy runs on one
  // device, the repeat `h` on all p, wte before the copies on the first stage, lnf after them
  // on the last. The model's time is then its forward + backward spread over the p devices
  // (the step runs at the pace of the busiest, passes/PipelineStages.cpp).
  for (const char *target : {"8 x H100_SXM { data = 2, tensor = 2, pipeline = 2, zero = 1 }",
                             "8 x H100_SXM { data = 2, tensor = 2, pipeline = 2, interleave = 2 }",
                             "8 x H100_SXM { data = 8 }"}) {
    CAPTURE(target);
    Compiled t(tinyOn(target), "par");
    const Analysis &a = *t.a;
    const Graph &g = t.g();
    double m = static_cast<double>(a.time.accumulationSteps);
    double p = static_cast<double>(std::max<int64_t>(1, a.plan->parallel.pipeline));
    auto opsTime = [&](const std::string &prefix) {
      double s = 0;
      for (OpId i = 0; i < g.ops.size(); ++i)
        if (g.opPath(i).rfind(prefix, 0) == 0)
          s += a.ops[i].forwardTime + a.ops[i].backwardTime;
      return s * m;
    };
    CHECK(a.params.byBlock.front().time == Approx(opsTime("") / p));
    if (p == 1)
      CHECK(a.params.byBlock.front().time == Approx(a.time.forward + a.time.backward));
    CHECK(t.block("h[1]").time == Approx(opsTime("h[1].")));
    CHECK(t.block("h").time == Approx(opsTime("h[") / p));
    CHECK(t.block("wte").time == Approx(opsTime("wte.")));
    CHECK(t.block("lnf").time == Approx(opsTime("lnf.")));
  }
}

TEST_CASE("steptime: collectives priced by the tiers they cross", "[steptime]") {
  // 16 A100s in two DGX nodes, data parallel: the ring leaves each node through its 8 NICs,
  // bw = min(NVLink 240e9, 8 × 20e9) = 160e9; its 2·15 steps include 2 network hops.
  Compiled two(tinyOn("16 x A100_80GB { data = 16, overlap = false }"), "par");
  double G = two.a->params.trainable * 2; // bf16 gradients, one DDP bucket
  REQUIRE(G < 25.0 * 1024 * 1024);
  CollectiveCost c = collectiveCost(two.a->plan->target, place(*two.a->plan, 'd'),
                                    Collective::AllReduce, G);
  CHECK(c.group.n == 16);
  CHECK(c.group.k == 8);
  CHECK(c.group.r == 2);
  CHECK(c.busBandwidth <= 160e9);
  CHECK(two.a->time.dataParallelComm == Approx(c.time));
  // The same 16 in one node (a plan override): NVLink only, no network step.
  Compiled one(tinyOn("16 x A100_80GB { data = 16, overlap = false, gpus_per_node = 16 }"),
               "par");
  CollectiveCost in = collectiveCost(one.a->plan->target, place(*one.a->plan, 'd'),
                                     Collective::AllReduce, G);
  CHECK(in.group.r == 1);
  CHECK(in.interSteps == 0);
  CHECK(one.a->time.dataParallelComm == Approx(in.time));
  CHECK(one.a->time.dataParallelComm < two.a->time.dataParallelComm);
  // A faster network (400 Gb/s = 50e9 B/s per GPU): 8 × 40e9 = 320e9 > NVLink, so NVLink bounds.
  Compiled fast(tinyOn("16 x A100_80GB { data = 16, overlap = false, network = 400 Gb/s }"),
                "par");
  CHECK(collectiveCost(fast.a->plan->target, place(*fast.a->plan, 'd'), Collective::AllReduce, G)
            .busBandwidth <= kA100Link);
  CHECK(fast.a->time.dataParallelComm <= two.a->time.dataParallelComm);
  // Data innermost: each tensor pair is 8 ranks apart, one member in each node, so every
  // tensor all-reduce crosses the network at one NIC's 20e9 B/s; packed, NVLink's.
  Compiled spread(tinyOn("16 x A100_80GB { tensor = 2, data = 8, order = dpt }"), "par");
  const double X = 4 * 128 * 256 * 2, m = 32 / (4.0 * 8);
  CollectiveCost wide = collectiveCost(spread.a->plan->target, place(*spread.a->plan, 't'),
                                       Collective::AllReduce, X);
  CHECK(wide.group.k == 1);
  CHECK(wide.busBandwidth <= kA100Net);
  CHECK(spread.a->time.tensorParallelComm == Approx(m * 17 * wide.time));
  Compiled packed(tinyOn("16 x A100_80GB { tensor = 2, data = 8 }"), "par");
  CHECK(packed.a->time.tensorParallelComm ==
        Approx(m * 17 * coll(*packed.a, 't', Collective::AllReduce, X)));
  CHECK(packed.a->time.tensorParallelComm < spread.a->time.tensorParallelComm);
}

TEST_CASE("steptime: interleaved stages and sequence parallelism", "[steptime]") {
  Compiled base(kTinyGPT, "par");
  Compiled v2(tinyOn("8 x H100_SXM { data = 2, tensor = 2, pipeline = 2, zero = 1, "
                     "interleave = 2 }"),
              "par");
  // Bubble (p − 1)/(v·m): half of the plain 1F1B's; twice the stage-boundary sends.
  CHECK(v2.a->time.bubble == Approx(base.a->time.bubble / 2));
  CHECK(v2.a->time.pipelineComm == Approx(2 * base.a->time.pipelineComm));
  CHECK(v2.a->time.forward == Approx(base.a->time.forward));
  // The first stage keeps 1 + (p − 1)/(p·v) = 1.25 times the activations in flight.
  CHECK(v2.a->memory.activations == Approx(1.25 * base.a->memory.activations));

  // Launches taken as free: the norms' halved work would otherwise wait for its launch.
  Compiled free(tinyOn("8 x H100_SXM { data = 2, tensor = 2, pipeline = 2, zero = 1, "
                       "kernel_launch = 0 us }"),
                "par");
  Compiled sp(tinyOn("8 x H100_SXM { data = 2, tensor = 2, pipeline = 2, zero = 1, "
                     "sequence_parallel = true, kernel_launch = 0 us }"),
              "par");
  // Norms and residual adds work on 1/t of the tokens; the embedding runs whole on every rank
  // and is scattered along the sequence (Megatron's LanguageModelEmbedding).
  CHECK(sp.at("h[0].ln1.layer_norm").tensorSplit == 2);
  CHECK(sp.at("h[0].add").tensorSplit == 2);
  CHECK(sp.at("wte.embedding").tensorSplit == 1);
  CHECK(sp.at("h[0].ln1.layer_norm").forwardTime ==
        Approx(free.at("h[0].ln1.layer_norm").forwardTime / 2));
  // Megatron's sequence parallelism (docs/time.md step 7): each all-reduce is a reduce-scatter of
  // the same message; all-gathers beside them, of each column input before its matmuls and again
  // for their weight gradients (layers.py), of each row output's gradient (mappings.py); once
  // per step the norms' and row biases' gradients all-reduced in one message
  // (finalize_model_grads.py): 4 layers × (2 norms × 2 × 256 + 2 biases × 256) + lnf's 512 =
  // 6656 elements, half of them on each pipeline stage, bf16 gradients.
  auto count = [](const Analysis &a, Collective k, const char *what) {
    double n = 0;
    for (const Analysis::CollectiveUse &u : a.collectives)
      if (u.group == 't' && u.cost.kind == k && u.what.find(what) != std::string::npos)
        n += u.perStep;
    return n;
  };
  double forward = count(*base.a, Collective::AllReduce, "forward"), all = count(*base.a, Collective::AllReduce, "");
  CHECK(forward > 0);
  CHECK(all > forward);
  CHECK(count(*sp.a, Collective::ReduceScatter, "") == all);
  // ... and the gradient of the scattered embedding once per micro-batch, m / p = 2 per step.
  CHECK(count(*sp.a, Collective::AllGather, "embeddings") == 2);
  CHECK(count(*sp.a, Collective::AllGather, "") == forward + 2 * (all - forward) + 2);
  CHECK(count(*sp.a, Collective::AllReduce, "norms") == 1);
  CHECK(count(*sp.a, Collective::AllReduce, "") == 1);
  double priced = 0, normBytes = 0;
  for (const Analysis::CollectiveUse &u : sp.a->collectives)
    if (u.group == 't') {
      priced += u.perStep * u.cost.time;
      if (u.cost.kind == Collective::AllReduce)
        normBytes = u.cost.bytes;
    }
  CHECK(normBytes == 6656 / 2 * 2);
  CHECK(sp.a->time.tensorParallelComm == Approx(priced));
  CHECK(sp.a->time.tensorParallelComm > base.a->time.tensorParallelComm);
  // Activation memory (passes/Activations.cpp): the norms' and adds' tensors are split too, so
  // less is live at the peak, but never less than half (t = 2 splits each tensor at most once).
  CHECK(sp.a->memory.activations < base.a->memory.activations);
  CHECK(sp.a->memory.activations >= base.a->memory.activations / 2);
  // The boundary is already split over the sequence: the 1/t send without the all-gather.
  const double X = 4 * 128 * 256 * 2;
  CHECK(sp.a->time.pipelineComm == Approx(4 * 2 * (3.4e-6 + X / 2 / kLink)));
}

TEST_CASE("steptime: context parallelism splits the sequence and passes K/V round a ring",
          "[steptime]") {
  // 8 devices as 4 data replicas of 2 context ranks; m = 32 / (4 × 4) = 2 micro-batches.
  // Launches taken as free: the halved ops would otherwise wait for their launches.
  Compiled ctx(tinyOn("8 x H100_SXM { data = 4, context = 2, overlap = false, "
                      "kernel_launch = 0 us }"),
               "par");
  Compiled flat(tinyOn("8 x H100_SXM { data = 8, kernel_launch = 0 us }"), "par"); // same micro-batch
  const Analysis &a = *ctx.a;
  // Every op works on half the tokens.
  CHECK(ctx.at("h[0].ln1.layer_norm").tensorSplit == 2);
  CHECK(ctx.at("h[0].ln1.layer_norm").forwardTime ==
        Approx(flat.at("h[0].ln1.layer_norm").forwardTime / 2));
  CHECK(a.memory.activations == Approx(flat.a->memory.activations / 2));
  // Ring attention: each layer's local K and V, 2 × [4, 128, 256] bf16 / 2 = 262144 bytes, go
  // once round the pair forward and twice backward, hidden behind the attention's own time.
  const double send = 3.4e-6 + 262144 / kLink; // one Simple step of NVLink
  double ring = 0;
  for (int i = 0; i < 4; ++i) {
    const OpAnalysis &att = ctx.at("h[" + std::to_string(i) + "].attn.attention");
    ring += std::max(0.0, send - att.forwardTime) + std::max(0.0, 2 * send - att.backwardTime);
  }
  REQUIRE(ring > 0);
  CHECK(a.time.contextParallelComm == Approx(2 * ring));
  // Gradients: an all-reduce over the 4 replicas and one over the context pair (Megatron's
  // buckets of 40M elements: one message).
  double G = a.params.trainable * 2;
  CHECK(a.stack.name == "megatron");
  CHECK(a.time.dataParallelComm ==
        Approx(coll(a, 'd', Collective::AllReduce, G) + coll(a, 'c', Collective::AllReduce, G)));
  CHECK(a.time.communication == Approx(a.time.dataParallelComm + a.time.tensorParallelComm +
                                       a.time.pipelineComm + a.time.contextParallelComm));
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
  // ZeRO-1 over 8 devices is DeepSpeed's (the layout's choice): bf16 grads reduce-scattered in
  // one message (reduce_bucket_size, 5e8 elements, holds them all), not overlapped
  // (overlap_comm's default below ZeRO 3), then the bf16 params all-gathered.
  CHECK(a.stack.name == "deepspeed");
  CHECK(a.stack.chosen);
  double G = 124439808 * 2.0;
  CHECK(a.time.dataParallelComm == Approx(coll(a, 'd', Collective::ReduceScatter, G) +
                                          coll(a, 'd', Collective::AllGather, G)));
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

TEST_CASE("steptime: flash attention pays an exp per score, so small heads reach less of "
          "the peak",
          "[steptime]") {
  // One bf16 attention over 8 sequences of 2048 with d = 1024 in heads of 64 or of 128: the
  // same 4·dh matmul FLOPs per score times scores (8·h·2048²), but heads of 64 make twice the
  // scores, and each score is an exp on the special-function units (ir/Target.cpp).
  auto plan = [](int heads, const char *extra) {
    return std::string(R"(
model A(s = 2048, d = 1024) {
  forward(q: bf16[batch, s, d], k: bf16[batch, s, d], v: bf16[batch, s, d]) {
    return mean(attention(q, k, v, causal = false, heads = )") +
           std::to_string(heads) + extra + R"())
  }
}
train p { model = A() batch = 8 optimizer = SGD(lr = 0.1) precision = bf16 target = H100_SXM }
)";
  };
  const Target &h100 = *findTarget("H100_SXM");
  const double peak = 989.5e12, exp = 1 / (132 * 16 * 1.83e9);
  double fraction[2];
  for (int i = 0; i < 2; ++i) {
    int heads = i == 0 ? 16 : 8;
    double dh = 1024.0 / heads, scores = 8 * heads * 2048.0 * 2048;
    Compiled t(plan(heads, ""), "p");
    const OpAnalysis &at = t.at("attention");
    // 4·dh FLOPs per score for QKᵀ and PV, 5 for scale, mask and softmax (ir/ops/Attention.cpp).
    CHECK(at.forward.executedFlops == Approx(scores * (4 * dh + 5)));
    CHECK(at.forward.transcendentals == Approx(scores));
    // Q in and the output and logsumexp out, once per query tile, outside the loop over keys.
    double outside = (2 * 8 * 2048 * 1024 * 2.0 + 8 * heads * 2048 * 4.0) / 3.35e12;
    CHECK(at.forwardTime == Approx(scores * (4 * dh + 5) / (peak * h100.efficiency.attention) +
                                   scores * exp + outside));
    fraction[i] = scores * 4 * dh / at.forwardTime / peak;
    // Materialised, the score matrices go through memory and bound the time instead; the
    // exps hide behind their bytes.
    Compiled u(plan(heads, ", fused = false"), "p");
    const OpAnalysis &mat = u.at("attention");
    double bytes = mat.forward.bytesRead + mat.forward.bytesWritten;
    CHECK(mat.forwardTime == Approx(bytes / 3.35e12 / h100.efficiency.attention));
  }
  // FlashAttention-2 (Dao's kernel, what PyTorch's SDPA runs) on an H100 at 16k tokens, no
  // mask (Shah et al. 2024, Figure 5): 324 TFLOP/s at dh 64 vs 370 at 128 (0.88); the Triton
  // tutorial kernel 353 vs 477 (0.74, pytorch/benchmark #2370, #2391), FlashAttention-3 416 vs
  // 621 (0.67). The model at the H100's FlashAttention-2 efficiency (ir/Target.cpp,
  // kernelRates): 0.86 at the 2048 tokens here, where the bytes outside the loop weigh more.
  CHECK(fraction[0] / fraction[1] == Approx(0.863).margin(0.005));
  CHECK(fraction[1] == Approx(0.302).margin(0.005));

  // tally's own CUDA step (--backend cuda) runs bf16 attention through cuDNN's fused attention
  // (passes/CudnnAttention.h), priced as the H100's native fused attention: faster than the
  // FlashAttention-2 a framework's stack runs.
  PlanOverrides cuda;
  cuda.cudaStep = true;
  cuda.fuseKernels = true;
  Compiled dnn(plan(8, ""), "p", cuda);
  Compiled flash(plan(8, ""), "p");
  CHECK(dnn.at("attention").forwardTime < flash.at("attention").forwardTime);
  CHECK(dnn.at("attention").forwardTime > 0.5 * flash.at("attention").forwardTime);
  // Its other ops keep the catalogue's pricing: the mean is the same kernel either way.
  CHECK(dnn.at("mean").forwardTime == Approx(flash.at("mean").forwardTime));
  // In fp32 the step runs the runtime's scalar attention kernel: fp32 FMAs on the CUDA cores
  // (66.9 TFLOP/s) at the fractions cuda_check measured, 0.0549 forward and 0.0257 backward; the
  // exps stay at the special-function rate. GPT-2's first attention (q, k and v need gradients
  // there): 65394278400 executed backward FLOPs and 100761600 exps.
  cuda.precision = "fp32";
  Compiled gpt2(fromFile, example("gpt2.tally"), "gpt2_124M", cuda);
  const OpAnalysis &g0 = gpt2.at("h[0].attn.attention");
  CHECK(g0.forwardTime == Approx(g0.forward.executedFlops / (66.9e12 * 0.0549) + 100761600 * exp));
  CHECK(g0.executedBackwardFlops == 65394278400);
  CHECK(g0.backwardTime == Approx(65394278400 / (66.9e12 * 0.0257) + 100761600 * exp));
}

TEST_CASE("steptime: the simulated pipeline schedule has the closed form's bubble",
          "[steptime][pipeline]") {
  // passes/PipelineTimeline.cpp runs the 1F1B order slot by slot with each virtual stage's own
  // times; the busiest device's idle time must be StepTime's (Σ_s W_s − max_s W_s)/v whatever
  // the stage count and micro-batch count when the busiest device is the last — the one with
  // the output layer and the loss — as in a model whose layers split evenly; when an earlier
  // device is the busiest the closed form is an upper bound (a device before the busiest one
  // finishes its last backwards while the busiest is still working). Interleaved, with chunks
  // of uneven load, the closed form is within 10% of the schedule's bubble.
  struct Case {
    int pipeline, interleave, batch, microBatch;
  };
  for (Case c : {Case{2, 1, 32, 4}, Case{4, 1, 32, 4}, Case{4, 1, 8, 4}, Case{4, 2, 32, 4},
                 Case{2, 2, 32, 4}, Case{4, 4, 64, 4}}) {
    int data = 8 / c.pipeline;
    std::string target = std::to_string(8) + " x H100_SXM { data = " + std::to_string(data) +
                         ", pipeline = " + std::to_string(c.pipeline) +
                         (c.interleave > 1 ? ", interleave = " + std::to_string(c.interleave) : "") +
                         " }";
    std::string src = tinyOn(target);
    auto replace = [&](const std::string &from, const std::string &to) {
      src.replace(src.find(from), from.size(), to);
    };
    replace("batch = 32", "batch = " + std::to_string(c.batch));
    replace("micro_batch = 4", "micro_batch = " + std::to_string(c.microBatch));
    Compiled run(src, "par");
    const auto &pl = run.a->pipeline;
    INFO("pipeline " << c.pipeline << ", interleave " << c.interleave << ", batch " << c.batch);
    int64_t m = c.batch / (c.microBatch * data);
    REQUIRE(pl.stages == c.pipeline);
    CHECK(pl.microBatches == m);
    // Every stage runs a forward and a backward of every shown micro-batch on every chunk.
    CHECK(pl.slots.size() == static_cast<size_t>(2 * c.pipeline * c.interleave * pl.shownMicroBatches));
    std::vector<double> load(static_cast<size_t>(c.pipeline), 0);
    for (size_t k = 0; k < pl.stageForward.size(); ++k)
      load[k % load.size()] += pl.stageForward[k] + pl.stageBackward[k];
    bool lastBusiest = pl.stageForward.empty() ||
                       std::max_element(load.begin(), load.end()) == load.end() - 1;
    if (c.interleave > 1) // uneven chunks: the interleaved closed form is an approximation
      CHECK(pl.bubble == Approx(run.a->time.bubble).epsilon(0.1));
    else if (lastBusiest)
      CHECK(pl.bubble == Approx(run.a->time.bubble).epsilon(1e-9));
    else
      CHECK(pl.bubble <= run.a->time.bubble * (1 + 1e-9));
    // Each stage's slots never overlap.
    for (int s = 0; s < c.pipeline; ++s) {
      double free = 0;
      for (const auto &slot : pl.slots)
        if (slot.stage == s) {
          CHECK(slot.start >= free - 1e-15);
          free = slot.end;
        }
    }
  }
  // No pipeline, no schedule; an interleaved plan whose micro-batches do not fill a round of p
  // has no schedule Megatron would run.
  Compiled flat(kTinyGPT, "par");
  CHECK(!flat.a->pipeline.slots.empty());
  Compiled none(tinyOn("8 x H100_SXM { data = 8 }"), "par");
  CHECK(none.a->pipeline.slots.empty());
  std::string odd = tinyOn("8 x H100_SXM { data = 2, pipeline = 4, interleave = 2 }");
  odd.replace(odd.find("batch = 32"), 10, "batch = 24");
  Compiled partial(odd, "par");
  CHECK(partial.a->pipeline.slots.empty());
}

TEST_CASE("steptime: a matmul whose rows do not start on 16 bytes", "[steptime]") {
  // passes/MatmulAlignment.cpp: K and N in elements must be multiples of 16 bytes over the
  // compute dtype's size (8 in bf16, 4 in tf32), on a GPU only.
  auto plan = [](int d, const std::string &precision) {
    return "model M(d = " + std::to_string(d) + R"() {
  param w: [d, 1024]
  forward(x: [batch, d]) { return mean(x @ w) }
}
train p { model = M() batch = 4096 optimizer = SGD(lr = 0.1) precision = )" +
           precision + " target = H100_SXM }\n";
  };
  Compiled bf16_772(plan(772, "bf16"), "p"), tf32_772(plan(772, "tf32"), "p"),
      bf16_776(plan(776, "bf16"), "p"), fp32_772(plan(772, "fp32"), "p");
  auto opOf = [](const Compiled &c) {
    for (OpId i = 0; i < c.a->graph->ops.size(); ++i)
      if (c.a->graph->ops[i].kind == OpKind::Matmul)
        return i;
    return OpId(kNone);
  };
  CHECK(unalignedMatmul(*bf16_772.a, opOf(bf16_772)));  // 772 = 8·96 + 4
  CHECK_FALSE(unalignedMatmul(*tf32_772.a, opOf(tf32_772))); // 772 = 4·193
  CHECK_FALSE(unalignedMatmul(*bf16_776.a, opOf(bf16_776))); // 776 = 8·97
  CHECK_FALSE(unalignedMatmul(*fp32_772.a, opOf(fp32_772))); // no tensor cores
  CHECK(bf16_772.count(DiagKind::UnalignedMatmul) == 1);
  CHECK(bf16_776.count(DiagKind::UnalignedMatmul) == 0);
  // The framework estimate prices it as aligned; tally's CUDA step at the measured 0.1262.
  PlanOverrides step;
  step.cudaStep = true;
  Compiled cuda(plan(772, "bf16"), "p", step);
  double flops = 2.0 * 4096 * 772 * 1024;
  CHECK(bf16_772.at("matmul").forwardTime == Approx(flops / 989.5e12 / kMatmul));
  CHECK(cuda.at("matmul").forwardTime == Approx(flops / 989.5e12 / 0.1262));
}

TEST_CASE("steptime: flash attention's bytes outside its loop slow short sequences",
          "[steptime]") {
  // FlashAttention-2 (Dao's CUDA kernel, what flash-attn 2 and PyTorch's SDPA run) on an H100,
  // bf16, heads of 128, B·S = 16k, H·dh = 2048, no mask (Shah et al. 2024, FlashAttention-3,
  // Figures 5 and 6): forward 309, 350, 362, 368, 370, 370 TFLOP/s and backward 214, 260, 291,
  // 310, 318, 322 at S = 512 … 16k (4·dh FLOPs per score forward, 2.5 times that backward).
  // ir/Target.cpp solves the H100's attention efficiency from the two together at 16k; at
  // shorter sequences the model follows the series through the bytes outside the loop: a
  // training step's forward and backward together within 5% from 2k tokens, 11% at 1k, 23% at
  // 512 (the backward's per-tile work, which no byte count gives, is what is left there).
  const double forward[] = {309, 350, 362, 368, 370, 370};
  const double backward[] = {214, 260, 291, 310, 318, 322};
  const double bound[] = {0.23, 0.11, 0.05, 0.05, 0.05, 0.05};
  double sum = 0;
  for (int i = 0; i < 6; ++i) {
    int S = 512 << i;
    INFO("S = " << S);
    std::string src = "model A(s = " + std::to_string(S) + R"(, d = 2048) {
  w = Linear(d, d, bias = false)
  forward(x: bf16[batch, s, d]) {
    y = w(x)
    return mean(attention(y, y, y, causal = false, heads = 16))
  }
}
train p { model = A() batch = )" + std::to_string(16384 / S) +
                      " optimizer = SGD(lr = 0.1) precision = bf16 target = H100_SXM }\n";
    Compiled t(src, "p");
    const OpAnalysis &at = t.at("attention");
    double scores = 16384.0 / S * 16 * S * S;
    double published = 3.5 / (1 / forward[i] + 2.5 / backward[i]);
    double model = 3.5 * scores * 4 * 128 / (at.forwardTime + at.backwardTime) / 1e12;
    CHECK(std::abs(model / published - 1) < bound[i]);
    sum += std::abs(model / published - 1);
  }
  CHECK(sum / 6 < 0.07);
  // FlashAttention-3 overlaps its exps with its matmuls and reaches 621 TFLOP/s forward
  // (ir/Target.cpp, nativeAttention); FlashAttention-2 adds them, at a lower fraction of the
  // tensor rate besides. The A100 keeps FlashAttention-2's default.
  const Target &h100 = *findTarget("H100_SXM");
  CHECK(h100.efficiency.attention == Approx(0.379).margin(0.002));
  CHECK(h100.nativeAttention > 1.6 * h100.efficiency.attention);
  CHECK(findTarget("A100_80GB")->efficiency.attention == 0.6);
}

TEST_CASE("steptime: a matmul's fraction of the peak by its shape", "[steptime]") {
  // bf16 on an H100_SXM (989.5 TFLOP/s, 3.35 TB/s, matmul efficiency 0.653, 3.8 us a launch):
  // a large square reaches the class efficiency; a small one waits for its launch; a skinny
  // one (16 rows: a decode step's mat-vec) is bound by the weight's bytes.
  auto fraction = [](int m, int n, int k) {
    std::string src = "model M(m = " + std::to_string(m) + ", n = " + std::to_string(n) +
                      ", k = " + std::to_string(k) + R"() {
  param w: [k, n]
  forward(x: bf16[m, k]) { return mean(x @ w) }
}
train p { model = M() batch = 1 optimizer = SGD(lr = 0.1) precision = bf16 target = H100_SXM }
)";
    Compiled t(src, "p");
    const OpAnalysis &o = t.at("matmul");
    return o.forward.executedFlops / o.forwardTime / 989.5e12;
  };
  CHECK(fraction(4096, 4096, 4096) == Approx(kMatmul));
  // 2·512³ FLOPs need 0.39 us and their 1.5 MiB 0.67 us: the 3.8 us launch sets the time.
  CHECK(fraction(512, 512, 512) == Approx(2.0 * 512 * 512 * 512 / 3.8e-6 / 989.5e12));
  CHECK(fraction(512, 512, 512) < 0.08);
  // 16 × 4096 × 4096: 2·16·4096² FLOPs over (16·4096·2 + 4096²) · 2 bytes, 31 FLOP/byte,
  // far below the ridge (295): the bytes at 0.653 of 3.35 TB/s.
  double bytes = (16.0 * 4096 * 2 + 4096.0 * 4096) * 2;
  CHECK(fraction(16, 4096, 4096) ==
        Approx(2.0 * 16 * 4096 * 4096 / (bytes / 3.35e12 / kMatmul) / 989.5e12));
  CHECK(fraction(16, 4096, 4096) < 0.08);
}

TEST_CASE("steptime: the stack picks the attention kernel; Hopper's own overlaps its exps",
          "[steptime]") {
  // One bf16 attention over 16k tokens in 16 heads of 128 (the setting of the published
  // FlashAttention-3 rate, pytorch/benchmark #2391: 621 TFLOP/s at 4·dh FLOPs per score).
  auto plan = [](const std::string &target) {
    return std::string(R"(
model A(s = 16384, d = 2048) {
  forward(q: bf16[batch, s, d], k: bf16[batch, s, d], v: bf16[batch, s, d]) {
    return mean(attention(q, k, v, causal = false, heads = 16))
  }
}
train p { model = A() batch = 1 optimizer = SGD(lr = 0.1) precision = bf16 target = )") +
           target + " }\n";
  };
  const double scores = 16.0 * 16384 * 16384;
  auto tflops = [&](const Compiled &t) {
    return scores * 4 * 128 / t.at("attention").forwardTime / 1e12;
  };
  // PyTorch's stacks run FlashAttention-2 at the default efficiency, its exps added to its
  // matmuls; Megatron runs Transformer Engine's cuDNN kernel, which the H100 target prices at
  // FlashAttention-3's published rate, its exps overlapped.
  Compiled ddp(plan("1 x H100_SXM"), "p"), megatron(plan("1 x H100_SXM { stack = megatron }"), "p");
  CHECK(ddp.a->stack.name == "ddp");
  CHECK(!ddp.a->stack.nativeAttention);
  CHECK(megatron.a->stack.nativeAttention);
  CHECK(tflops(megatron) == Approx(621).epsilon(1e-9));
  CHECK(tflops(ddp) < 0.8 * tflops(megatron));
  const Target &h100 = *findTarget("H100_SXM");
  const OpAnalysis &at = megatron.at("attention");
  double matmuls = at.forward.executedFlops / (989.5e12 * h100.nativeAttention);
  double exps = scores * h100.transcendentalTime;
  CHECK(exps < matmuls);
  double outside = (2 * 16384 * 2048 * 2.0 + 16 * 16384 * 4.0) / 3.35e12;
  CHECK(at.forwardTime == Approx(std::max(matmuls, exps) + outside));
  // The A100 has no kernel of its own beyond FlashAttention-2: Megatron runs that there.
  CHECK(findTarget("A100_80GB")->nativeAttention == 0);
  Compiled a100(plan("1 x A100_80GB { stack = megatron }"), "p"),
      a100ddp(plan("1 x A100_80GB"), "p");
  CHECK(!a100.a->stack.nativeAttention);
  CHECK(a100.at("attention").forwardTime == a100ddp.at("attention").forwardTime);
}

/// One causal attention of 16 heads over 4,096 tokens on 8 A100s, its target record `record`:
/// large enough that no kernel is launch-bound.
static std::string attentionOn(const std::string &record) {
  return R"(
model M(d = 1024, heads = 16) {
  param wq: [d, d]
  forward(x: bf16[batch, seq, d]) {
    return mean(attention(x @ wq, x, x, heads = heads, causal = true))
  }
}
train t {
  model = M()
  batch = 16
  micro_batch = 1
  seq = 4096
  optimizer = SGD(lr = 0.1)
  precision = mixed_bf16
  target = 8 x A100_80GB )" + record + R"(
}
)";
}

TEST_CASE("steptime: attention_kernel = flash1_triton takes FlashAttention-2's time x 1.4 "
          "forward, x 2 backward",
          "[steptime][stack]") {
  // The FlashAttention-2 paper's ratios (Dao 2023, §4.1; passes/Stack.cpp attentionSlowdown),
  // applied to the fused attention only: every other op prices the same, and the step's compute
  // grows by exactly the attention's extra time.
  Compiled flash2(attentionOn("{ data = 8 }"));
  Compiled triton(attentionOn("{ data = 8, attention_kernel = flash1_triton }"));
  const Graph &g = flash2.g();
  double extra = 0;
  int attentions = 0;
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const OpAnalysis &x = flash2.a->ops[i], &y = triton.a->ops[i];
    if (g.ops[i].kind != OpKind::Attention) {
      CHECK(y.forwardTime == x.forwardTime);
      CHECK(y.backwardTime == x.backwardTime);
      continue;
    }
    ++attentions;
    CHECK(y.forwardTime == Approx(1.4 * x.forwardTime).epsilon(1e-12));
    CHECK(y.backwardTime == Approx(2.0 * x.backwardTime).epsilon(1e-12));
    extra += 0.4 * x.forwardTime + 1.0 * x.backwardTime;
  }
  CHECK(attentions == 1);
  CHECK(triton.a->stack.attentionKernel.find("Triton") != std::string::npos);
  const double m = 2; // 16 sequences, 1 per micro-batch, over 8 devices
  CHECK(triton.a->time.forward + triton.a->time.backward ==
        Approx(flash2.a->time.forward + flash2.a->time.backward + m * extra));
}
