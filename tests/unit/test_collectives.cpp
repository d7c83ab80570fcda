// test_collectives.cpp — passes/Collectives.cpp priced by hand: NCCL's tuner model
// (src/graph/tuning.cc) worked through for the cases that decide a step's communication — a
// large all-reduce inside an NVLink-switch node (NVLS), a small one (the ring under LL), a
// reduce-scatter across 192 nodes (LL's low per-step latency), one member per node (PAT
// against the ring), the framework stacks' buckets and the user's overrides.
#include <catch.hpp>

#include "tests/unit/Support.h"

#include "passes/Collectives.h"
#include "passes/Stack.h"

#include <cmath>

using namespace tally;
using namespace tally::test;

namespace {

constexpr double us = 1e-6;

Target catalogue(const char *name) {
  const Target *t = findTarget(name);
  REQUIRE(t != nullptr);
  return *t;
}

Placement group(double n, double k) {
  Placement g;
  g.n = n;
  g.k = k;
  g.r = std::ceil(n / k);
  return g;
}

} // namespace

TEST_CASE("collectives: catalogue latencies are NCCL's Simple ring steps", "[collectives]") {
  for (const char *name : {"H100_SXM", "H200", "A100_80GB", "B200"}) {
    INFO(name);
    CHECK(catalogue(name).linkLatency == 3.4e-6);
    CHECK(catalogue(name).networkLatency == 14e-6);
  }
  CHECK(catalogue("RTX_4090").linkLatency == 5.7e-6); // PCIe
  CHECK(catalogue("H100_SXM").nvlinkSwitch);
  CHECK(catalogue("H200").nvlinkSwitch);
  CHECK(!catalogue("A100_80GB").nvlinkSwitch); // NVSwitch 2 has no NVLink SHARP
  CHECK(!catalogue("H100_PCIe").nvlinkSwitch);
}

TEST_CASE("collectives: a large all-reduce in one H100 node runs on NVLS", "[collectives]") {
  // 256 MiB over 8 H100s. Bus bandwidth B = 450e9 × 0.8 = 360e9.
  //   ring Simple: 8.4 us + 14 × 3.4 us = 56 us; 268435456 / (360e9 × 8/14) = 1.305 ms
  //   NVLS: the switch reduces: 360e9 × 0.85 × 15/16 × 2 = 573.75e9 bus, × 8/14 of the
  //         buffer = 327.86e9; 25 us + 268435456 / 327.86e9 = 843.7 us
  Target h100 = catalogue("H100_SXM");
  const double bytes = 256.0 * 1024 * 1024;
  CollectiveCost c = collectiveCost(h100, group(8, 8), Collective::AllReduce, bytes);
  CHECK(c.algorithm == CollAlgorithm::Nvls);
  CHECK(c.protocol == CollProtocol::Simple);
  CHECK(c.latency == Approx(25 * us));
  CHECK(c.busBandwidth == Approx(360e9 * 0.85 * 15 / 16 * 2));
  CHECK(c.time == Approx(25 * us + bytes / (360e9 * 0.85 * 15 / 16 * 2 * 8 / 14)));
  // Without the switch's reduction (`nvls = false`, or an A100) the ring carries it.
  h100.nvlinkSwitch = false;
  CollectiveCost ring = collectiveCost(h100, group(8, 8), Collective::AllReduce, bytes);
  CHECK(ring.algorithm == CollAlgorithm::Ring);
  CHECK(ring.protocol == CollProtocol::Simple);
  CHECK(ring.intraSteps == 14);
  CHECK(ring.latency == Approx(8.4 * us + 14 * 3.4 * us));
  CHECK(ring.time == Approx(8.4 * us + 14 * 3.4 * us + bytes / (360e9 * 8 / 14)));
}

TEST_CASE("collectives: a small all-reduce takes the LL protocol", "[collectives]") {
  // 256 KiB over 8 A100s (B = 240e9). Ring LL: 6.6 us + 14 × 0.6 us = 15 us, bus bandwidth
  // min(LL's 87.7e9 Ampere cap, 0.5 × 240e9) = 87.7e9, × 8/14: 262144 / 50.11e9 = 5.23 us.
  // Ring Simple pays 56 us of latency; the tree under LL 15.2 us, but at 240e9 / 3.8 × 0.5 and
  // NCCL's 0.4 correction for 2^12 × 64 bytes, 20.8 us of transfer.
  Target a100 = catalogue("A100_80GB");
  CollectiveCost c = collectiveCost(a100, group(8, 8), Collective::AllReduce, 262144);
  CHECK(c.algorithm == CollAlgorithm::Ring);
  CHECK(c.protocol == CollProtocol::LL);
  CHECK(c.busBandwidth == Approx(87.7e9));
  CHECK(c.time == Approx(15 * us + 262144 / (87.7e9 * 8 / 14)));
}

TEST_CASE("collectives: a reduce-scatter over 1,536 ranks in 192 nodes", "[collectives]") {
  // 25 MiB (one DDP bucket) on A100s, 8 per node: 1535 steps, 191 of them across nodes. Inside
  // a node each step costs at least the CPU's 1 us network post.
  //   LL:     6.6 + 1344 × max(0.6, 1) + 191 × 2.7 = 1866.3 us; bandwidth 20.4e9 (LL's cap
  //           across more than 2 nodes) × 1536/1535: 1.284 ms; 3.150 ms in all
  //   LL128:  14 + 1344 × 1.9 + 191 × 4.0 = 3331.6 us, more already
  //   Simple: 8.4 + 1344 × 3.4 + 191 × 14 = 7252 us
  // The old model's ring (2.5 us and 6.6 us steps at Simple's bandwidth) priced 4.6 ms.
  Target a100 = catalogue("A100_80GB");
  const double bytes = 25.0 * 1024 * 1024;
  CollectiveCost c = collectiveCost(a100, group(1536, 8), Collective::ReduceScatter, bytes);
  CHECK(c.algorithm == CollAlgorithm::Ring);
  CHECK(c.protocol == CollProtocol::LL);
  CHECK(c.intraSteps == 1344);
  CHECK(c.interSteps == 191);
  CHECK(c.latency == Approx((6.6 + 1344 * 1.0 + 191 * 2.7) * us));
  CHECK(c.time == Approx((6.6 + 1344 + 191 * 2.7) * us + bytes / (20.4e9 * 1536 / 1535)));
}

TEST_CASE("collectives: one member per node, PAT against the ring", "[collectives]") {
  // An all-gather of 64 MiB over 64 H100s one per node (a data group outside tensor 8): bus
  // bandwidth one NIC's 50e9 × 0.8 = 40e9.
  //   PAT:          8 + 64 × 2.8 + log2(64) × 14 / 3.5 = 211.2 us; 0.75 × 40e9: 2.237 ms
  //   ring LL128:   14 + 63 × 8.5 (the tree's network step, one rank per node) = 549.5 us;
  //                 0.92 × 40e9 × 64/63: 1.795 ms → 2.345 ms, the fastest
  //   ring Simple:  8.4 + 63 × 14 = 890.4 us + 1.651 ms
  Target h100 = catalogue("H100_SXM");
  const double bytes = 64.0 * 1024 * 1024;
  CollectiveCost c = collectiveCost(h100, group(64, 1), Collective::AllGather, bytes);
  CHECK(c.algorithm == CollAlgorithm::Ring);
  CHECK(c.protocol == CollProtocol::LL128);
  CHECK(c.time == Approx((14 + 63 * 8.5) * us + bytes / (0.92 * 40e9 * 64 / 63)));
  // A small gather goes to PAT: its latency grows with log2 of the nodes, not the ring's 63 hops.
  CollectiveCost small = collectiveCost(h100, group(64, 1), Collective::AllGather, 1 << 20);
  CHECK(small.algorithm == CollAlgorithm::Pat);
  CHECK(small.latency == Approx((8 + 64 * 2.8 + 6 * 14 / 3.5) * us));
  CHECK(small.time == Approx(small.latency + (1 << 20) / (0.75 * 40e9)));
}

TEST_CASE("collectives: plan latencies scale NCCL's table", "[collectives]") {
  // Twice the Simple ring's NVLink step doubles every in-node latency, LL's included.
  Target a100 = catalogue("A100_80GB");
  double base = collectiveCost(a100, group(8, 8), Collective::AllReduce, 262144).latency;
  a100.linkLatency *= 2;
  CHECK(collectiveCost(a100, group(8, 8), Collective::AllReduce, 262144).latency ==
        Approx(2 * base));
  // A declared target without latencies has none.
  a100.linkLatency = a100.networkLatency = 0;
  CHECK(collectiveCost(a100, group(8, 8), Collective::AllReduce, 262144).latency == 0);
  // No group, no bytes: nothing to do.
  CHECK(collectiveCost(a100, group(1, 1), Collective::AllReduce, 1e9).time == 0);
  CHECK(collectiveCost(a100, group(8, 8), Collective::AllReduce, 0).time == 0);
}

TEST_CASE("collectives: SHARP reduces an all-reduce in the network", "[collectives]") {
  // 1 MiB over 256 A100s in 32 nodes. With in-network reduction (`sharp = true`) CollNet's
  // latency is 2 × (3.7 us + 7 × 0.4 us) + 31 us = 44 us, and 13 us of transfer at half of
  // 160e9; without it the best is a tree under LL128, 14 + 2 × (7 × 1.25 + 5 × 8.5) = 116.5 us
  // and 23 us of transfer (0.6 of its model at this size).
  Target a100 = catalogue("A100_80GB");
  CollectiveCost plain = collectiveCost(a100, group(256, 8), Collective::AllReduce, 1 << 20);
  CHECK(plain.algorithm != CollAlgorithm::CollNet);
  a100.collnet = true;
  CollectiveCost sharp = collectiveCost(a100, group(256, 8), Collective::AllReduce, 1 << 20);
  CHECK(sharp.algorithm == CollAlgorithm::CollNet);
  CHECK(sharp.latency == Approx(2 * (3.7 + 7 * 0.4) * us + 31 * us));
  CHECK(sharp.time < plain.time);
}

TEST_CASE("collectives: framework stacks and their buckets", "[collectives]") {
  auto facts = [](const std::string &target) {
    Compiled t(std::string(kTinyGPTModel) + "train p { model = TinyGPT() batch = 2048 seq = 128 "
                                            "micro_batch = 4 optimizer = AdamW(lr = 1e-3) "
                                            "precision = mixed_bf16 target = " +
                   target + " }\n",
               "p");
    return t.a->stack;
  };
  // Chosen from the layout.
  StackFacts ddp = facts("16 x H100_SXM");
  CHECK(ddp.name == "ddp");
  CHECK(ddp.chosen);
  CHECK(ddp.gradientBucket == 25.0 * 1024 * 1024);
  CHECK(ddp.overlap);
  StackFacts ds = facts("16 x H100_SXM { zero = 1 }");
  CHECK(ds.name == "deepspeed");
  CHECK(ds.gradientBucket == 5e8 * 2); // reduce_bucket_size elements of bf16 gradients
  CHECK(!ds.overlap);                  // overlap_comm's default below ZeRO 3
  StackFacts fsdp = facts("16 x H100_SXM { zero = 3 }");
  CHECK(fsdp.name == "fsdp");
  CHECK(fsdp.gradientBucket == 0); // one reduce-scatter per block
  CHECK(fsdp.overlap);
  StackFacts mg = facts("16 x H100_SXM { tensor = 2 }");
  CHECK(mg.name == "megatron");
  CHECK(mg.gradientBucket == 40e6 * 2); // max(40M, 1M × 8) elements
  CHECK(!mg.overlap);
  {
    // A bucket is a count of elements: with fp32 gradients and bf16 parameters a gradient
    // message holds 4 bytes an element and a parameter gather 2.
    Compiled t(std::string(kTinyGPTModel) + "train p { model = TinyGPT() batch = 2048 seq = 128 "
                                            "micro_batch = 4 optimizer = AdamW(lr = 1e-3) "
                                            "precision = mixed_bf16 target = 16 x H100_SXM "
                                            "{ tensor = 2 } }\n",
               "p");
    StackFacts wide = stackFacts(*t.a->plan, 4, 2);
    CHECK(wide.gradientBucket == 40e6 * 4);
    CHECK(wide.gatherBucket == 40e6 * 2);
    Plan ddpPlan = *t.a->plan;
    ddpPlan.parallel.stack = "ddp";
    StackFacts ddp = stackFacts(ddpPlan, 4, 2);
    CHECK(ddp.gatherBucket == ddp.gradientBucket / 2);
  }
  CHECK(facts("1024 x H100_SXM { tensor = 2 }").gradientBucket == 512e6 * 2); // 1M × dp
  // Written by the plan, and overridden one by one.
  StackFacts w = facts("16 x H100_SXM { zero = 1, stack = megatron, bucket = 100 MiB, overlap = true }");
  CHECK(w.name == "megatron");
  CHECK(!w.chosen);
  CHECK(w.gradientBucket == 100.0 * 1024 * 1024);
  CHECK(w.bucketSource == "bucket");
  CHECK(w.overlap);
}

TEST_CASE("collectives: FSDP reduces once per block where DDP's buckets are many",
          "[collectives]") {
  // The same ZeRO-3 step under fsdp (one reduce-scatter per layer) and ddp's 25 MiB buckets
  // forced small (bucket = 64 KiB): the bucketed one makes more, smaller collectives.
  auto plan = [](const std::string &extra) {
    return std::string(kTinyGPTModel) +
           "train p { model = TinyGPT() batch = 256 seq = 128 micro_batch = 4 optimizer = "
           "AdamW(lr = 1e-3) precision = mixed_bf16 target = 64 x A100_80GB { zero = 3, "
           "overlap = false" +
           extra + " } }\n";
  };
  Compiled fsdp(plan(""), "p"), small(plan(", stack = ddp, bucket = 64 KiB"), "p");
  auto reduceScatters = [](const Analysis &a) {
    for (const Analysis::CollectiveUse &u : a.collectives)
      if (u.cost.kind == Collective::ReduceScatter)
        return u;
    FAIL("no reduce-scatter");
    return Analysis::CollectiveUse{};
  };
  Analysis::CollectiveUse f = reduceScatters(*fsdp.a), s = reduceScatters(*small.a);
  double m = fsdp.a->time.accumulationSteps;
  CHECK(f.perStep == Approx(4 * m)); // TinyGPT's 4 layers, every micro-batch
  CHECK(s.perStep > f.perStep);
  CHECK(s.cost.bytes <= 64 * 1024);
  CHECK(small.a->time.dataParallelComm > fsdp.a->time.dataParallelComm);
}

TEST_CASE("collectives: DeepSpeed keeps the bf16 gradients beside its fp32 buffer",
          "[collectives]") {
  // grad_dtype = f32: Megatron's main_grad replaces the bf16 gradients; DeepSpeed's
  // BF16_Optimizer keeps both (passes/StaticMemory.cpp).
  auto plan = [](const char *stack) {
    return std::string(kTinyGPTModel) +
           "train p { model = TinyGPT() batch = 64 seq = 128 micro_batch = 4 optimizer = "
           "AdamW(lr = 1e-3) precision = mixed_bf16 grad_dtype = f32 target = 16 x A100_80GB { "
           "zero = 1, stack = " + stack + " } }\n";
  };
  Compiled mg(plan("megatron"), "p"), ds(plan("deepspeed"), "p");
  double T = mg.a->params.trainable;
  CHECK(mg.a->memory.gradAccum == Approx(T * 4));
  CHECK(mg.a->memory.grads == 0);
  CHECK(ds.a->memory.gradAccum == Approx(T * 4));
  CHECK(ds.a->memory.grads == Approx(T * 2));
}

TEST_CASE("collectives: a compiled stack fuses its elementwise chains", "[collectives]") {
  // `compiled = true` (torch.compile, Megatron's fused kernels) prices the step as --fuse does.
  auto plan = [](const char *extra) {
    return std::string(kTinyGPTModel) +
           "train p { model = TinyGPT() batch = 64 seq = 128 micro_batch = 4 optimizer = "
           "AdamW(lr = 1e-3) precision = mixed_bf16 target = 16 x H100_SXM { zero = 3" +
           extra + " } }\n";
  };
  Compiled eager(plan(""), "p"), compiled(plan(", compiled = true"), "p");
  CHECK(!eager.a->stack.compiled);
  CHECK(!eager.a->fusion.enabled);
  CHECK(compiled.a->stack.compiled);
  CHECK(compiled.a->fusion.enabled);
  CHECK(compiled.a->fusion.kernels.size() > 0);
  CHECK(compiled.a->time.forward < eager.a->time.forward);
}
