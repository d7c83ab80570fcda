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
  o.generatedStep = true; // as `tally build` analyzes it: the step's own (fused) loss
  return o;
}

std::string gptD256() { return sourceDir() + "/bench/cpu/gpt_d256.tally"; }


} // namespace

TEST_CASE("fusion: a GPT block's bias adds become matmul epilogues, its residual adds the next norm's prologue", "[fusion]") {
  Compiled t(fromFile, gptD256(), "", fused(true));
  const Analysis &a = *t.a;
  REQUIRE(a.fusion.enabled);
  // Per block, the four linears (qkv, attn.proj, fc, mlp.proj) are a matmul and a bias add that
  // only the add reads: 4 matmuls with a bias epilogue. The two residual adds then each run as
  // the prologue of the next layer norm (ln2; the next block's ln1, lnf after the last). GELU
  // stays alone (the fc epilogue writes its input), the embeddings' add too (h[0].ln1's
  // statistics would overwrite the freed token embeddings that other rows still read), and the
  // backward has no two elementwise ops in a row.
  CHECK(a.fusion.kernels.size() == 24);
  CHECK(a.fusion.epilogues == 16);
  CHECK(a.fusion.ops == 48);
  CHECK(a.fusion.launchesSaved == 24);
  CHECK(a.fusion.elementwiseOps == 33);
  size_t norms = 0, epilogues = 0;
  for (const Analysis::FusedKernel &k : a.fusion.kernels) {
    CHECK(k.count == 2);
    norms += k.norm;
    epilogues += k.epilogue;
    CHECK(a.stepSchedule[k.first].kind == StepEntry::Forward);
    if (k.epilogue) {
      CHECK(t.a->step->ops[a.stepSchedule[k.first].op].kind == OpKind::Matmul);
      CHECK(k.unwritten == 1); // the matmul's own output
    }
  }
  CHECK(norms == 8);
  CHECK(epilogues == 16);
  // Bytes per block, fp32, 512 tokens: each epilogue saves its add's whole traffic (the matmul
  // output read, the bias read, the sum written): qkv 2 × 512·768·4 + 768·4 = 3,148,800, attn.proj
  // 2 × 512·256·4 + 256·4 = 1,049,600, fc 2 × 512·1024·4 + 1024·4 = 4,198,400, mlp.proj 1,049,600;
  // each norm reads its [512, 256] input back from cache (524,288), twice a block.
  // 4 × (9,446,400 + 1,048,576) = 41,979,904.
  CHECK(a.fusion.bytesSaved == 41979904.0);
  CHECK(a.fusedOf(t.op("h[0].mlp.fc.add")).forwardBytes == 4198400.0);
  CHECK(a.fusedOf(t.op("h[0].mlp.fc.add")).forwardCalls == 1);
  CHECK(a.fusedOf(t.op("h[0].mlp.fc.matmul")).forwardBytes == 0);
  CHECK(a.fusedOf(t.op("h[2].attn.qkv.add")).forwardBytes == 3148800.0);
  CHECK(a.fusedOf(t.op("h[0].mlp.gelu")).forwardBytes == 0);
  CHECK(a.fusedOf(t.op("h[0].mlp.gelu")).forwardCalls == 0);
  CHECK(a.fusedOf(t.op("h[0].ln2.layer_norm")).forwardBytes == 524288.0);
  CHECK(a.fusedOf(t.op("h[0].ln2.layer_norm")).forwardCalls == 1);
  CHECK(a.fusedOf(t.op("h[2].add")).forwardBytes == 0); // the run's first op reads from memory
  CHECK(a.fusedOf(t.op("h[2].add")).forwardCalls == 0);
  CHECK(a.fusedOf(t.op("h[0].ln1.layer_norm")).forwardCalls == 0);

  // The step time prices it: less forward time, the same backward, the same memory.
  Compiled plain(fromFile, gptD256(), "", fused(false));
  CHECK_FALSE(plain.a->fusion.enabled);
  CHECK(plain.a->fusion.kernels.empty());
  CHECK(plain.a->fusedOf(plain.op("h[0].mlp.fc.add")).forwardBytes == 0);
  CHECK(a.time.forward < plain.a->time.forward);
  CHECK(a.time.backward == plain.a->time.backward);
  CHECK(a.time.step < plain.a->time.step);
  CHECK(a.arenaBytes == plain.a->arenaBytes);
  CHECK(a.memory.peak == plain.a->memory.peak);
  // Only the fused ops' times moved: an epilogue's add keeps only its arithmetic (no bytes,
  // no launch), its matmul costs what it did.
  CHECK(t.at("h[0].attn.qkv.matmul").forwardTime == plain.at("h[0].attn.qkv.matmul").forwardTime);
  CHECK(t.at("h[0].mlp.fc.add").forwardTime < plain.at("h[0].mlp.fc.add").forwardTime / 100);
  CHECK(t.at("h[0].mlp.gelu").forwardTime == plain.at("h[0].mlp.gelu").forwardTime);
  CHECK(t.at("h[0].ln2.layer_norm").forwardTime < plain.at("h[0].ln2.layer_norm").forwardTime);
}

TEST_CASE("fusion: codegen prints one functor per distinct run and one call per kernel", "[fusion][codegen]") {
  Compiled t(fromFile, gptD256(), "", fused(true));
  for (bool cuda : {false, true}) {
    INFO((cuda ? "cuda" : "cpu"));
    StepFiles step = emitStep(*t.a, cuda);
    REQUIRE(step.error == "");
    const std::string &text = step.byPath[cuda ? "step.cu" : "step.cpp"];
    // Every block's residual runs are one shape: the residual add as a norm's prologue.
    CHECK(countOf(text, "struct Fused") == 1);
    CHECK(countOf(text, "rt::layer_norm_fwd_fused<float>(ctx, Fused0{") == 8);
    CHECK(countOf(text, "rt::fused(") == 0);
    CHECK(countOf(text, "rt::matmul_bias<float>(ctx, ") == 16);
    // The fc epilogue: 512 × 1024 from [512, 256] · [256, 1024] with its 1024 biases.
    CHECK(countOf(text, "rt::matmul_bias<float>(ctx, false, false, 512, 1024, 256, ") == 4);
    CHECK(countOf(text, "const A v0 = rt::load(rt::store<float>(rt::binop(rt::BinOp::Add, rt::load(i0[e]), rt::load(i1[e]))));") == 1);
    CHECK(countOf(text, "float *o2;") == 1); // the sum the norm reads back
    CHECK(countOf(text, "rt::unary_fwd<float>(ctx, rt::UnOp::Gelu, ") == 4);
  }
}

TEST_CASE("fusion: how an operand's element is found from the output's", "[fusion]") {
  Graph g;
  auto tensor = [&](std::initializer_list<int64_t> sizes) {
    Tensor t;
    Shape shape;
    for (int64_t s : sizes)
      shape.push_back(Dim{s, 0});
    t.shape = shape;
    t.dtype = Dtype::F32;
    auto st = denseStrides(t.shape);
    t.layout = Layout(st, t.layout.offset());
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
  g.tensors[strided].layout = Layout({8 * 48, 48, 1}, 0); // a split part of [4, 8, 48]
  CHECK_FALSE(kindOf(strided));
}
