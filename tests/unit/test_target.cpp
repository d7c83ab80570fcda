// Unit tests for ir/Target: the built-in catalogue and roofline helpers.
#include "ir/Target.h"

#include <catch.hpp>

using namespace tally;

TEST_CASE("target: catalogue holds the required targets", "[target]") {
  const char *names[] = {"H100_SXM",  "H100_PCIe", "H200",    "A100_80GB",
                         "A100_40GB", "B200",      "RTX_4090"};
  for (const char *name : names) {
    INFO(name);
    const Target *t = findTarget(name);
    REQUIRE(t != nullptr);
    CHECK(t->name == name);
    CHECK_FALSE(t->description.empty());
    CHECK_FALSE(t->source.empty());
    CHECK(t->memoryBytes > 0);
    CHECK(t->bandwidth > 0);
    CHECK(t->peakF64 > 0);
    CHECK(t->peakF32 > 0);
    CHECK(t->peakTF32 > 0);
    CHECK(t->peakF16 > 0);
    CHECK(t->peakBF16 > 0);
    CHECK(t->peakINT8 > 0);
    CHECK(t->hostLink > 0);
    CHECK(t->interconnect > 0);
    CHECK(t->hostMemoryBytes > 0);
    // Tensor rates are ordered as on every NVIDIA part since Ampere.
    CHECK(t->peakBF16 >= t->peakTF32);
    CHECK(t->peakTF32 >= t->peakF32);
    CHECK(t->efficiency.matmul > 0);
    CHECK(t->efficiency.matmul <= 1);
  }
  CHECK(targetCatalogue().size() >= 7);
}

TEST_CASE("target: names are unique", "[target]") {
  const auto &c = targetCatalogue();
  for (size_t i = 0; i < c.size(); ++i)
    for (size_t j = i + 1; j < c.size(); ++j)
      CHECK(c[i].name != c[j].name);
}

TEST_CASE("target: H100_SXM datasheet numbers", "[target]") {
  const Target *t = findTarget("H100_SXM");
  REQUIRE(t != nullptr);
  CHECK(t->memoryBytes == 81559.0 * 1024 * 1024); // NVML's total (nvidia-smi: 81559MiB)
  CHECK(t->datasheetMemory == 80e9);
  CHECK(t->statedMemory() == 80e9);
  CHECK(t->bandwidth == 3.35e12);
  CHECK(t->peakBF16 == 989.5e12);
  CHECK(t->peakF16 == 989.5e12);
  CHECK(t->peakTF32 == 494.7e12);
  CHECK(t->peakF32 == 66.9e12);
  CHECK(t->peakFP8 == 1979e12);
  CHECK(t->interconnect == 450e9);
  CHECK(t->hostLink == 64e9);
  CHECK(t->ridge(Dtype::BF16) == Approx(295.37).margin(0.01));
}

TEST_CASE("target: other anchor numbers", "[target]") {
  CHECK(findTarget("H200")->memoryBytes == 143771.0 * 1024 * 1024);
  CHECK(findTarget("H200")->statedMemory() == 141e9);
  CHECK(findTarget("A100_80GB")->memoryBytes == 80.0 * 1024 * 1024 * 1024);
  CHECK(findTarget("A100_40GB")->memoryBytes == 40.0 * 1024 * 1024 * 1024);
  CHECK(findTarget("H200")->bandwidth == 4.8e12);
  CHECK(findTarget("A100_80GB")->bandwidth == 2.039e12);
  CHECK(findTarget("A100_40GB")->bandwidth == 1.555e12);
  CHECK(findTarget("A100_80GB")->peakBF16 == 312e12);
  CHECK(findTarget("RTX_4090")->peakF32 == 82.6e12);
}

TEST_CASE("target: special-function rates from multiprocessors and clocks", "[target]") {
  // 16 exp2 per clock per SM (CUDA C++ Programming Guide, compute capability 7.0-9.0) at the
  // clock the datasheet rates are given at.
  const Target *h100 = findTarget("H100_SXM");
  CHECK(h100->multiprocessors == 132);
  CHECK(h100->transcendentalTime == Approx(1 / (132 * 16 * 1.83e9)));
  // Shah et al. 2024 (FlashAttention-3): "3.9 TFLOPS of special functions" on this part.
  CHECK(1 / h100->transcendentalTime == Approx(3.9e12).epsilon(0.01));
  // The datasheet's dense FP16 rate is 4,096 FLOPs per clock per Hopper SM (2,048 on Ampere)
  // at that clock: the clocks are the rates', not a boost figure from elsewhere.
  CHECK(h100->peakF16 == Approx(132 * 4096 * 1.83e9).epsilon(0.001));
  const Target *pcie = findTarget("H100_PCIe");
  CHECK(pcie->peakF16 == Approx(114 * 4096 * 1.62e9).epsilon(0.001));
  CHECK(pcie->transcendentalTime == Approx(1 / (114 * 16 * 1.62e9)));
  CHECK(findTarget("H200")->transcendentalTime == h100->transcendentalTime);
  const Target *a100 = findTarget("A100_80GB");
  CHECK(a100->peakF16 == Approx(108 * 2048 * 1.41e9).epsilon(0.001));
  CHECK(a100->transcendentalTime == Approx(1 / (108 * 16 * 1.41e9)));
  CHECK(findTarget("A100_40GB")->transcendentalTime == a100->transcendentalTime);
  CHECK(findTarget("RTX_4090")->transcendentalTime == Approx(1 / (128 * 16 * 2.52e9)));
  // The B200's are derived, not printed (docs/targets.md, "Uncertain numbers"): 148 SMs at the
  // clock its dense FP16 rate implies at 8,192 FLOPs per clock per SM.
  const Target *b200 = findTarget("B200");
  CHECK(b200->multiprocessors == 148);
  CHECK(b200->peakF16 == Approx(148 * 8192 * 1.856e9).epsilon(0.001));
  CHECK(b200->transcendentalTime == Approx(1 / (148 * 16 * 1.856e9)));
}

TEST_CASE("target: peakFor maps dtypes to rates", "[target]") {
  const Target *t = findTarget("H100_SXM");
  REQUIRE(t != nullptr);
  CHECK(t->peakFor(Dtype::F64) == t->peakF64);
  CHECK(t->peakFor(Dtype::F32) == t->peakF32);
  CHECK(t->peakFor(Dtype::TF32) == t->peakTF32);
  CHECK(t->peakFor(Dtype::F16) == t->peakF16);
  CHECK(t->peakFor(Dtype::BF16) == t->peakBF16);
  CHECK(t->peakFor(Dtype::FP8E4M3) == t->peakFP8);
  CHECK(t->peakFor(Dtype::FP8E5M2) == t->peakFP8);
  CHECK(t->peakFor(Dtype::I8) == t->peakINT8);
  CHECK(t->peakFor(Dtype::I32) == 0);
  CHECK(t->peakFor(Dtype::Bool) == 0);
  CHECK(t->peakFor(Dtype::Invalid) == 0);
  // A100 has no FP8: 0 peak and 0 ridge rather than a division by zero.
  const Target *a = findTarget("A100_80GB");
  CHECK(a->peakFor(Dtype::FP8E4M3) == 0);
  CHECK(a->ridge(Dtype::FP8E4M3) == 0);
  Target empty;
  CHECK(empty.ridge(Dtype::BF16) == 0);
}

TEST_CASE("target: unknown names", "[target]") {
  CHECK(findTarget("nope") == nullptr);
  CHECK(findTarget("h100_sxm") == nullptr);
  CHECK(findTarget("") == nullptr);
}

TEST_CASE("target: every catalogue GPU sits in a node", "[target]") {
  // DGX A100: 8 GPUs, one 200 Gb/s HDR NIC each (25e9 B/s); DGX H100/H200/B200: 400 Gb/s NDR.
  const Target *a = findTarget("A100_80GB"), *a40 = findTarget("A100_40GB");
  CHECK(a->gpusPerNode == 8);
  CHECK(a->network == 25e9);
  CHECK(a40->network == 25e9);
  for (const char *n : {"H100_SXM", "H200", "B200"}) {
    INFO(n);
    CHECK(findTarget(n)->gpusPerNode == 8);
    CHECK(findTarget(n)->network == 50e9);
  }
  for (const Target &t : targetCatalogue()) {
    INFO(t.name);
    CHECK(t.gpusPerNode >= 1);
    CHECK(t.network > 0);
    CHECK(t.network < t.interconnect); // the node's own link is the faster tier
    CHECK(t.linkLatency > 0);
    CHECK(t.networkLatency >= t.linkLatency);
  }
}
