// The loss as frameworks run it (ir/ops/Loss.cpp, docs/memory.md "The loss as frameworks run
// it"): one fused kernel, PyTorch's eager F.cross_entropy on an fp32 copy, or Megatron's fp32
// softmax in place. A model that is only a head and its loss, so that the loss's buffers are the
// peak: what each way keeps, what its backward holds at once and the bytes it moves, per logit,
// and which way a plan gets from its stack.
#include "tests/unit/Support.h"

#include <catch.hpp>

#include <string>

using namespace tally;
using namespace tally::test;

namespace {

/// B rows of V logits in bf16 (the head's output under mixed_bf16), a loss over them.
constexpr double B = 256, V = 32768, N = B * V;

std::string headPlan(const std::string &layout) {
  return R"(
model Head(d = 64, vocab = 32768) {
  param w: [d, vocab]
  forward(x: f32[batch, d], y: i32[batch]) { return cross_entropy(x @ w, y) }
}
train t {
  model = Head()
  batch = 256
  optimizer = SGD(lr = 0.1)
  precision = mixed_bf16
  target = )" + layout + R"(
}
)";
}

} // namespace

TEST_CASE("loss kernels: what each way keeps and holds in its backward, per logit", "[loss]") {
  Compiled fused(headPlan("1 x H100_SXM { cross_entropy = fused }"));
  Compiled eager(headPlan("1 x H100_SXM { cross_entropy = eager }"));
  Compiled megatron(headPlan("1 x H100_SXM { cross_entropy = megatron }"));
  const double lse = 4 * B; // the fused loss's logsumexp, fp32 per row
  // Kept for the backward: the bf16 logits and the logsumexp (fused), log_softmax's fp32 output
  // (eager), the fp32 softmax (Megatron).
  CHECK(eager.a->memory.activations - fused.a->memory.activations == 4 * N - 2 * N - lse);
  CHECK(megatron.a->memory.activations == eager.a->memory.activations);
  // Held at the loss's backward beside what is kept: the logits' bf16 gradient (every way), and
  // the eager backward's fp32 gradients, 12 bytes a logit in all with its kept 4.
  CHECK(eager.a->memory.workspace - fused.a->memory.workspace == 6 * N);
  // Megatron's backward holds its softmax (turned gradient) and the bf16 gradient, 6 bytes a
  // logit, as its forward holds the logits and the softmax copy: the first of the two is the
  // peak, where the op's other outputs, the logsumexp row and the loss, are live too.
  CHECK(megatron.a->memory.workspace - fused.a->memory.workspace == lse + 4);
  CHECK(eager.a->memory.activations + eager.a->memory.workspace -
            (fused.a->memory.activations + fused.a->memory.workspace) ==
        (4 + 2 + 6) * N - (2 + 2) * N - lse);
  // The FLOPs do not depend on the framework; the bytes do.
  const OpAnalysis &f = fused.at("cross_entropy"), &e = eager.at("cross_entropy"),
                   &m = megatron.at("cross_entropy");
  CHECK(e.forward.flops == f.forward.flops);
  CHECK(m.forward.flops == f.forward.flops);
  CHECK(f.forward.bytesRead == 2 * N + 4 * B);                       // the logits, the labels
  CHECK(e.forward.bytesRead == 2 * N + 4 * N + 4 * B);              // the cast, log_softmax
  CHECK(e.forward.bytesWritten - f.forward.bytesWritten == 8 * N);  // the fp32 copy, log-probs
  CHECK(m.forward.bytesRead == 2 * N + 20 * N + 4 * B);             // the cast, five passes
  CHECK(m.forward.bytesWritten - f.forward.bytesWritten == 16 * N); // the copy, three in place
  // The backward is slower eager (22 bytes a logit) than fused (4) or Megatron's (14).
  CHECK(e.backwardTime > m.backwardTime);
  CHECK(m.backwardTime > f.backwardTime);
}

TEST_CASE("loss kernels: the stack decides, a plan's cross_entropy overrides", "[loss]") {
  auto kernel = [](const std::string &layout) {
    Compiled c(headPlan(layout));
    return c.a->stack.crossEntropy + " (" + c.a->stack.crossEntropySource + ")";
  };
  CHECK(kernel("8 x H100_SXM") == "eager (the stack's PyTorch loss)");                   // ddp
  CHECK(kernel("8 x H100_SXM { zero = 3 }") == "eager (the stack's PyTorch loss)");      // fsdp
  CHECK(kernel("8 x H100_SXM { stack = megatron }") == "megatron (stack megatron)");
  CHECK(kernel("8 x H100_SXM { compiled = true }") == "fused (compiled = true)");
  CHECK(kernel("8 x H100_SXM { stack = megatron, cross_entropy = eager }") == "eager (cross_entropy)");
  // tally's own step runs one fused kernel whatever the stack (tally build analyzes so).
  PlanOverrides built;
  built.generatedStep = true;
  Compiled step(headPlan("8 x H100_SXM { zero = 3 }"), "", built);
  CHECK(step.a->stack.crossEntropy == "fused");
  CHECK(step.a->stack.crossEntropySource == "tally's generated step");
}
