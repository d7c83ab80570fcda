// The fusion pass (passes/Fusion.cpp) and the fused kernels it makes codegen print. Numbers are
// derived by hand from bench/cpu/gpt_d256.tally: 4 GPT blocks, d = 256, MLP 1024, micro-batch
// 4 × seq 128 = 512 tokens, fp32. The step runs (tests/step/e2e/check_fusion.py) check that the
// fused step computes the unfused one's loss and gradients.
#include "Support.h"

#include "codegen/Emit.h"
#include "passes/Fusion.h"

using namespace tally;
using namespace tally::test;

namespace {

/// The plan on one H100 (the unit tests cannot calibrate the host its file names).
PlanOverrides fused(bool on) {
  PlanOverrides o;
  o.target = "H100_SXM";
  o.fuseKernels = on;
  return o;
}

std::string gptD256() { return sourceDir() + "/bench/cpu/gpt_d256.tally"; }

size_t count(const std::string &text, const std::string &what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

} // namespace

TEST_CASE("fusion: a GPT block's bias adds fuse with the residual add, the next norm and GELU", "[fusion]") {
  Compiled t(fromFile, gptD256(), "", fused(true));
  const Analysis &a = *t.a;
  REQUIRE(a.fusion.enabled);
  // Per block, three forward runs: attn.proj's bias add + the residual add + ln2, mlp.fc's
  // bias add + GELU, mlp.proj's bias add + the residual add + the next ln1 (lnf after the
  // last block). The backward has no two elementwise ops in a row (each sits between matmul
  // backwards), so nothing there. The embeddings' add stays alone: h[0].ln1's statistics
  // would overwrite the freed token embeddings that other rows still read.
  CHECK(a.fusion.kernels.size() == 12);
  CHECK(a.fusion.ops == 32);
  CHECK(a.fusion.launchesSaved == 20);
  CHECK(a.fusion.elementwiseOps == 33);
  size_t norms = 0;
  for (const Analysis::FusedKernel &k : a.fusion.kernels) {
    CHECK(k.count == (k.norm ? 3 : 2));
    norms += k.norm;
    CHECK(a.stepSchedule[k.first].kind == StepEntry::Forward);
  }
  CHECK(norms == 8);
  // Bytes per block: the residual adds read the bias add's [512, 256] fp32 output from a
  // register (524,288 B) and need not write it (only the add reads it: 524,288 B), and the norm
  // after each reads the sum back from cache (524,288 B), twice; GELU reads the fc bias add's
  // [512, 1024] output from a register (2,097,152 B) but it is still written, GELU's backward
  // reads it. 4 × (2 × 1,572,864 + 2,097,152) = 20,971,520.
  CHECK(a.fusion.bytesSaved == 20971520.0);
  CHECK(t.at("h[0].ln2.layer_norm").fusedForwardBytes == 524288.0);
  CHECK(t.at("h[0].ln2.layer_norm").fusedForwardCalls == 1);
  CHECK(t.at("h[0].ln1.layer_norm").fusedForwardCalls == 0);
  CHECK(t.at("h[0].mlp.gelu").fusedForwardBytes == 2097152.0);
  CHECK(t.at("h[0].mlp.gelu").fusedForwardCalls == 1);
  CHECK(t.at("h[0].mlp.fc.add").fusedForwardBytes == 0);
  CHECK(t.at("h[0].mlp.fc.add").fusedForwardCalls == 0);
  CHECK(t.at("h[2].attn.proj.add").fusedForwardCalls == 0);
  CHECK(t.at("h[2].attn.proj.add").fusedForwardBytes == 524288.0); // its write, not done
  CHECK(t.at("h[2].add").fusedForwardBytes == 524288.0);           // its read of a register
  CHECK(t.at("h[2].add").fusedForwardCalls == 1);
  // The first run of each pair leaves the bias add unwritten; the GELU run writes both.
  CHECK(a.fusion.kernels[0].unwritten == 1);
  CHECK(a.fusion.kernels[1].unwritten == 0);

  // The step time prices it: less forward time, the same backward, the same memory.
  Compiled plain(fromFile, gptD256(), "", fused(false));
  CHECK_FALSE(plain.a->fusion.enabled);
  CHECK(plain.a->fusion.kernels.empty());
  CHECK(plain.at("h[0].mlp.gelu").fusedForwardBytes == 0);
  CHECK(a.time.forward < plain.a->time.forward);
  CHECK(a.time.backward == plain.a->time.backward);
  CHECK(a.time.step < plain.a->time.step);
  CHECK(a.arenaBytes == plain.a->arenaBytes);
  CHECK(a.memory.peak == plain.a->memory.peak);
  // Only the fused ops' times moved.
  CHECK(t.at("h[0].attn.qkv.matmul").forwardTime == plain.at("h[0].attn.qkv.matmul").forwardTime);
  CHECK(t.at("h[0].mlp.gelu").forwardTime < plain.at("h[0].mlp.gelu").forwardTime);
}

TEST_CASE("fusion: codegen prints one functor per distinct run and one call per run", "[fusion][codegen]") {
  Compiled t(fromFile, gptD256(), "", fused(true));
  for (bool cuda : {false, true}) {
    INFO((cuda ? "cuda" : "cpu"));
    std::vector<codegen::File> files;
    codegen::EmitOptions o;
    std::string err = cuda ? codegen::emitCudaStep(*t.a, o, files) : codegen::emitCpuStep(*t.a, o, files);
    REQUIRE(err == "");
    std::string text;
    for (const codegen::File &f : files)
      if (f.path == (cuda ? "step.cu" : "step.cpp"))
        text = f.text;
    // The four blocks' runs are two shapes: bias + residual (twice a block, the prologue of
    // the next layer norm), bias + GELU.
    CHECK(count(text, "struct Fused") == 2);
    CHECK(count(text, "rt::layer_norm_fwd_fused<float>(ctx, Fused0{") == 8);
    CHECK(count(text, "rt::fused(ctx, 524288, Fused1{") == 4);
    CHECK(count(text, "rt::fused(") == 4);
    // The bias is read at e % 256 and e % 1024; the unwritten bias add has no output pointer.
    CHECK(count(text, "i1[e % 256]") == 1);
    CHECK(count(text, "i1[e % 1024]") == 1);
    CHECK(count(text, "rt::unary(rt::UnOp::Gelu, v0)") == 1);
    CHECK(count(text, "float *o3;") == 2); // Fused0: i0, i1, i2, o3; Fused1: i0, i1, o2, o3
    CHECK(count(text, "float *o2;") == 1);
  }
}

TEST_CASE("fusion: how an operand's element is found from the output's", "[fusion]") {
  Graph g;
  auto tensor = [&](std::initializer_list<int64_t> sizes) {
    Tensor t;
    for (int64_t s : sizes)
      t.shape.push_back(Dim{s, 0});
    t.dtype = Dtype::F32;
    auto st = denseStrides(t.shape);
    t.layout.strides.assign(st.begin(), st.end());
    return g.addTensor(t);
  };
  TensorId out = tensor({4, 8, 16});
  auto kindOf = [&](TensorId x) { return elementIndex(g, x, out); };
  CHECK(kindOf(tensor({4, 8, 16}))->kind == ElementIndex::Same);
  auto bias = kindOf(tensor({16}));
  REQUIRE(bias);
  CHECK(bias->kind == ElementIndex::Trailing);
  CHECK(bias->m == 16);
  CHECK(kindOf(tensor({8, 16}))->m == 128);
  CHECK(kindOf(tensor({1, 8, 16}))->kind == ElementIndex::Trailing);
  auto row = kindOf(tensor({4, 8, 1}));
  REQUIRE(row);
  CHECK(row->kind == ElementIndex::Leading);
  CHECK(row->m == 16); // element e of the output reads e / 16
  CHECK(kindOf(tensor({4, 1, 1}))->m == 128);
  CHECK(kindOf(tensor({1}))->kind == ElementIndex::Scalar);
  CHECK_FALSE(kindOf(tensor({4, 1, 16}))); // broadcast in the middle: not one division
  CHECK_FALSE(kindOf(tensor({8, 1})));     // leading dimensions missing
  TensorId strided = tensor({4, 8, 16});
  g.tensors[strided].layout.strides = {8 * 48, 48, 1}; // a split part of [4, 8, 48]
  CHECK_FALSE(kindOf(strided));
}
