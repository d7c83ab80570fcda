// test_autodiff.cpp — unit tests for passes/Autodiff.cpp: backward FLOPs split into weight and
// input gradients (none for data, integer tensors and frozen parameters), the lecture's exact
// numbers, per-step scaling, the optimizer's FLOPs, the step, executed FLOPs and 6·N·D.
// Plans are compiled from source through tally::Compilation, as the CLI does.
#include <map>
#include <catch.hpp>

#include "tests/unit/Support.h"

#include <string>

using namespace tally;
using namespace tally::test;

TEST_CASE("autodiff: the lecture's DeepLinear backward skips the data gradient", "[autodiff]") {
  Compiled t(fromFile, example("lecture.tally"), "lecture");
  const Analysis &a = *t.a;
  const double B = 1024, D = 1024, K = 64;
  // Forward matmul FLOPs exactly 2·B·(D·D + D·K).
  CHECK(a.flops.forwardMatmul == 2 * B * (D * D + D * K));
  // Backward: grads of w1, h1 and w2, not of x.
  const OpAnalysis &m1 = t.at("matmul"), &m2 = t.at("matmul#2");
  CHECK(m1.weightGradFlops == 2 * B * D * D);
  CHECK(m1.inputGradFlops == 0); // x is data
  CHECK(m2.weightGradFlops == 2 * B * D * K);
  CHECK(m2.inputGradFlops == 2 * B * D * K); // h1's gradient
  CHECK(m1.weightGradFlops + m2.weightGradFlops == 2 * B * (D * D + D * K));
  CHECK(m1.inputGradFlops + m2.inputGradFlops == 2 * B * D * K);
  // The whole step: no parameters outside the matmuls, so every weight gradient is theirs; the
  // input gradients add h2 * h2 (both operands: 2·n) and the mean (n).
  double n = B * K;
  CHECK(a.flops.backwardWeightGrad == 2 * B * (D * D + D * K));
  CHECK(a.flops.backwardInputGrad == 2 * B * D * K + 2 * n + n);
  CHECK(a.flops.backward == a.flops.backwardWeightGrad + a.flops.backwardInputGrad);
  // 6·N·D with N = D·D + D·K trainable parameters and B tokens (seq = 1).
  double N = D * D + D * K;
  CHECK(a.params.trainable == N);
  CHECK(a.flops.tokensPerStep == B);
  CHECK(a.flops.sixND == 6 * N * B);
  CHECK(a.flops.ratioToSixND == Approx((a.flops.forward + a.flops.backward) / (6 * N * B)));
  CHECK(a.flops.ratioToSixND < 0.7); // about 4ND: the first layer's data gradient is skipped
  // SGD without momentum or weight decay: p -= lr·g, 2 FLOPs per parameter, once per step.
  CHECK(a.flops.optimizer == 2 * N);
  CHECK(a.flops.step == a.flops.forward + a.flops.backward + a.flops.optimizer);
  // Saved: the matmul of w1 keeps x (data, so no activation memory) for w1's gradient.
  bool keepsX = false;
  for (const SavedTensor &s : a.savedOf(t.op("matmul")))
    keepsX = keepsX || s.tensor == t.g().inputs[0];
  CHECK(keepsX);
}

TEST_CASE("autodiff: frozen parameters and data get no gradient", "[autodiff]") {
  Compiled t(std::string(R"(
model Frozen(D = 64, K = 8) {
  frozen param w1: [D, D]
  param w2: [D, K]
  forward(x: f32[batch, D]) {
    h1 = x @ w1
    return mean(h1 @ w2)
  }
}
train t { model = Frozen()  batch = 16  optimizer = SGD(lr = 0.1)  precision = fp32  target = H100_SXM }
)"));
  const OpAnalysis &m1 = t.at("matmul"), &m2 = t.at("matmul#2");
  // x @ w1: neither input needs a gradient, so no backward and nothing saved.
  CHECK(m1.weightGradFlops == 0);
  CHECK(m1.inputGradFlops == 0);
  CHECK(m1.executedBackwardFlops == 0);
  CHECK(m1.backwardBytes == 0);
  CHECK(t.a->savedOf(t.op("matmul")).empty());
  // h1 needs no gradient either (it depends on no trainable parameter): only w2's.
  CHECK(m2.weightGradFlops == 2 * 16 * 64 * 8);
  CHECK(m2.inputGradFlops == 0);
  CHECK(t.a->params.trainable == 64 * 8);
  CHECK(t.a->flops.optimizer == 2 * 64 * 8);
}

TEST_CASE("autodiff: totals scale by batch / micro_batch; backward bytes from the backward ops",
          "[autodiff]") {
  Compiled t(std::string(kDeepLinear) + R"(
train t { model = DeepLinear()  batch = 64  micro_batch = 16  optimizer = SGD(lr = 0.1)
          precision = fp32  target = H100_SXM }
)");
  const Analysis &a = *t.a;
  double input = 0, weight = 0, executed = 0, executedFwd = 0;
  for (const OpAnalysis &o : a.ops) {
    input += o.inputGradFlops;
    weight += o.weightGradFlops;
    executed += o.executedBackwardFlops;
    executedFwd += o.forward.executedFlops;
  }
  // Backward bytes come from the backward ops (micro-batch 16, fp32, D = 1024, K = 64):
  //   mean(y):   expand dloss → d(h2²) [16, 64]: 4 + 4096 = 4100
  //   h2 * h2:   two muls (dy, h2) → dh2, the second adding: 2·3·4096 + 4096 = 28672
  //   h1 @ w2:   dh1 = dh2·w2ᵀ: 4096 + 262144 + 65536 = 331776; dw2 = h1ᵀ·dh2 into the grads
  //              region: 65536 + 4096 + 2·262144 = 593920; together 925696
  //   x @ w1:    x is data: dw1 = xᵀ·dh1: 65536 + 65536 + 2·4194304 = 8519680
  std::map<std::string, double> bytes;
  for (OpId i = 0; i < t.g().ops.size(); ++i)
    bytes[t.g().opPath(i)] = a.ops[i].backwardBytes;
  CHECK(bytes["mean"] == 4100);
  CHECK(bytes["mul"] == 28672);
  CHECK(bytes["matmul#2"] == 925696);
  CHECK(bytes["matmul"] == 8519680);
  CHECK(t.g().tensors[t.g().inputs[0]].shape[0].size == 16); // one micro-batch lowered
  CHECK(a.flops.backwardInputGrad == 4 * input);
  CHECK(a.flops.backwardWeightGrad == 4 * weight);
  CHECK(a.flops.executed ==
        4 * executedFwd + 4 * executed + a.flops.optimizer + a.flops.recompute);
  CHECK(a.flops.tokensPerStep == 64);
}

TEST_CASE("autodiff: optimizer FLOPs per trainable parameter", "[autodiff]") {
  std::string src = std::string(kDeepLinear) + R"(
train sgd      { model = DeepLinear()  batch = 8  optimizer = SGD(lr = 0.1)  target = H100_SXM }
train momentum { model = DeepLinear()  batch = 8  optimizer = SGD(lr = 0.1, momentum = 0.9)  target = H100_SXM }
train sgdwd    { model = DeepLinear()  batch = 8  optimizer = SGD(lr = 0.1, weight_decay = 0.1)  target = H100_SXM }
train adagrad  { model = DeepLinear()  batch = 8  optimizer = AdaGrad(lr = 0.1)  target = H100_SXM }
train rmsprop  { model = DeepLinear()  batch = 8  optimizer = RMSprop(lr = 0.1)  target = H100_SXM }
train adam     { model = DeepLinear()  batch = 8  optimizer = Adam(lr = 0.1)  target = H100_SXM }
train adamw    { model = DeepLinear()  batch = 8  optimizer = AdamW(lr = 0.1, weight_decay = 0.1)  target = H100_SXM }
train lion     { model = DeepLinear()  batch = 8  optimizer = Lion(lr = 0.1)  target = H100_SXM }
)";
  const double N = 1024 * 1024 + 1024 * 64;
  std::pair<const char *, double> expected[] = {
      {"sgd", 2},      {"momentum", 4}, {"sgdwd", 4}, {"adagrad", 7},
      {"rmsprop", 9},  {"adam", 13},    {"adamw", 14}, {"lion", 9}};
  for (auto &e : expected) {
    Compiled t(src, e.first);
    INFO(e.first);
    CHECK(t.a->flops.optimizer == e.second * N);
    CHECK(t.a->flops.step == t.a->flops.forward + t.a->flops.backward + t.a->flops.optimizer);
    // The 6ND ratio leaves the optimizer out.
    CHECK(t.a->flops.ratioToSixND ==
          Approx((t.a->flops.forward + t.a->flops.backward) / t.a->flops.sixND));
  }
}

TEST_CASE("autodiff: a tied head's transpose(weight) is a weight gradient; integer ids get none",
          "[autodiff]") {
  Compiled t(std::string(R"(
model Tied(vocab = 100, d = 32) {
  wte = Embedding(vocab, d)
  forward(tokens: i32[batch, seq]) {
    x = wte(tokens)
    return cross_entropy(x @ transpose(wte.weight), next_tokens(tokens))
  }
}
train t { model = Tied()  batch = 4  seq = 8  optimizer = SGD(lr = 0.1)  target = H100_SXM }
)"));
  const double rows = 4 * 8, V = 100, d = 32;
  const OpAnalysis &head = t.at("matmul");
  CHECK(head.weightGradFlops == 2 * rows * d * V); // d(wteᵀ) through the view
  CHECK(head.inputGradFlops == 2 * rows * d * V);  // dx
  const OpAnalysis &emb = t.at("wte.embedding");
  CHECK(emb.weightGradFlops == rows * d); // scatter-add
  CHECK(emb.inputGradFlops == 0);         // token ids are integers
  const OpAnalysis &ce = t.at("cross_entropy");
  CHECK(ce.inputGradFlops == 3 * rows * V); // logits only, not the integer labels
}

TEST_CASE("autodiff: causal flash attention's executed backward differs from model FLOPs",
          "[autodiff]") {
  Compiled t(std::string(R"(
model A(d = 64, heads = 4) {
  param wq: [d, d]
  forward(x: f32[batch, seq, d]) {
    q = x @ wq
    return mean(attention(q, q, q, heads = heads, causal = true))
  }
}
train t { model = A()  batch = 2  seq = 16  optimizer = SGD(lr = 0.1)  target = H100_SXM }
)"));
  const OpAnalysis &att = t.at("attention");
  double model = att.inputGradFlops + att.weightGradFlops;
  CHECK(model > 0);
  CHECK(att.weightGradFlops == 0);
  CHECK(att.executedBackwardFlops > 0);
  CHECK(att.executedBackwardFlops != model);
  const Analysis &a = *t.a;
  double executed = 0, forwardExecuted = 0;
  for (const OpAnalysis &o : a.ops)
    executed += o.executedBackwardFlops, forwardExecuted += o.forward.executedFlops;
  CHECK(a.flops.executed == Approx(forwardExecuted + executed + a.flops.optimizer));
}

TEST_CASE("autodiff: infer plans have no backward", "[autodiff]") {
  Compiled t(std::string(kDeepLinear) + R"(
infer i { model = DeepLinear()  batch = 8  prompt = 16  generate = 4  precision = fp32  target = H100_SXM }
)");
  const Analysis &a = *t.a;
  CHECK(a.flops.backward == 0);
  CHECK(a.flops.backwardInputGrad == 0);
  CHECK(a.flops.backwardWeightGrad == 0);
  CHECK(a.flops.optimizer == 0);
  CHECK(a.flops.step == a.flops.forward);
  for (const OpAnalysis &o : a.ops)
    CHECK(o.inputGradFlops + o.weightGradFlops + o.executedBackwardFlops == 0);
  for (OpId o = 0; o < a.ops.size(); ++o)
    CHECK(a.savedOf(o).empty());
}
