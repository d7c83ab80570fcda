// test_finetune.cpp — issue 45: the bytes of a quantized base weight as QLoRA derives them,
// LoRA applied by a plan (paths, trainable counts, memory with nf4 base weights by hand), the
// dequantization priced before each matmul, the generated step's refusal, and each MFU
// convention of passes/MfuConventions.cpp derived by hand for one small model.
#include <catch.hpp>

#include "tests/unit/Support.h"

#include <cmath>
#include <string>

using namespace tally;
using namespace tally::test;

namespace {

const Analysis::MfuConvention &convention(const Analysis &a, const std::string &name) {
  for (const Analysis::MfuConvention &c : a.time.mfuConventions)
    if (name == c.name)
      return c;
  FAIL("no MFU convention " << name);
  return a.time.mfuConventions.front();
}

// One attention layer with an untied embedding and head: N (what matrix products read) =
// qkv 32·96 + o 32·32 + head 32·64 = 6144; the embedding's 64·32 = 2048 are left out.
const char *kTiny = R"(
model Tiny(vocab = 64, d = 32, heads = 4) {
  embed = Embedding(vocab, d)
  qkv   = Linear(d, 3 * d, bias = false)
  o     = Linear(d, d, bias = false)
  head  = Linear(d, vocab, bias = false)
  forward(tokens: i32[batch, seq]) {
    x = embed(tokens)
    q, k, v = split(qkv(x), 3, dim = -1)
    y = x + o(attention(q, k, v, heads = heads, causal = true))
    return cross_entropy(head(y), next_tokens(tokens))
  }
}
train t {
  model = Tiny()
  batch = 8
  micro_batch = 2
  seq = 16
  optimizer = AdamW(lr = 1e-3)
  precision = bf16
  target = H100_SXM
}
train full {
  model = Tiny()
  batch = 8
  micro_batch = 2
  seq = 16
  optimizer = AdamW(lr = 1e-3)
  precision = bf16
  checkpoint = full
  target = H100_SXM
}
)";

// Two bias-free projections q and v of width d and a third, o, that LoRA leaves alone.
const char *kLora = R"(
block Attn(d) {
  q = Linear(d, d, bias = false)
  v = Linear(d, d, bias = false)
  o = Linear(d, d, bias = false)
  forward(x) { return o(q(x) * v(x)) }
}
model M(d = 256) {
  norm = RMSNorm(d)
  attn = Attn(d)
  forward(x: bf16[batch, d]) { return mean(attn(norm(x))) }
}
train qlora {
  model = M()
  batch = 4
  optimizer = AdamW(lr = 1e-4)
  precision = { params = bf16, base = nf4 }
  lora = { r = 8, alpha = 16, targets = [q, v] }
  target = H100_SXM
}
train lora16 {
  model = M()
  batch = 4
  optimizer = AdamW(lr = 1e-4)
  precision = bf16
  lora = { r = 8, targets = [q, v] }
  target = H100_SXM
}
)";

} // namespace

TEST_CASE("finetune: nf4 with QLoRA's double quantization is 4.127 bits per parameter",
          "[finetune]") {
  // Dettmers et al. 2023, §3: 4 bits + an fp32 absmax per block of 64 stored as 8 bits, and
  // one fp32 constant per 256 of those: 4 + 8/64 + 32/(64·256).
  QuantSpec q = defaultQuant(Dtype::NF4);
  CHECK(q.block == 64);
  CHECK(q.scale == Dtype::F32);
  CHECK(q.doubleBlock == 256);
  double bits = quantBitsPerElement(q);
  CHECK(bits == Approx(4.0 + 8.0 / 64 + 32.0 / (64 * 256)));
  CHECK(std::round(bits * 1000) / 1000 == Approx(4.127));
  CHECK(std::round(bits / 8 * 1000) / 1000 == Approx(0.516));
  // Without double quantization: 4 + 32/64 = 4.5 bits (QLoRA's "0.5 bits per parameter").
  q.doubleBlock = 0;
  CHECK(quantBitsPerElement(q) == Approx(4.5));
  // int8 with fp32 absmax per 64: 8.5 bits.
  CHECK(quantBitsPerElement(defaultQuant(Dtype::I8)) == Approx(8.5));
  CHECK(storageBytes(Dtype::NF4) == 0.5);
  CHECK(storageBytes(Dtype::INT4) == 0.5);
  CHECK(parseDtype("nf4") == Dtype::NF4);
  CHECK(parseDtype("int4") == Dtype::INT4);
  CHECK(nameOf(Dtype::NF4) == "nf4");
}

TEST_CASE("finetune: a plan's lora adapts the targeted Linears and freezes the rest",
          "[finetune]") {
  Compiled t(kLora, "lora16");
  const Graph &g = t.g();
  // The weights keep their paths; each target gains q.lora.a [256, 8] and q.lora.b [8, 256].
  std::vector<std::string> trainable, frozen;
  for (const ParamInfo &p : g.params)
    (p.trainable ? trainable : frozen).push_back(g.paramPath(p));
  CHECK(trainable == std::vector<std::string>{"attn.q.lora.a", "attn.q.lora.b", "attn.v.lora.a",
                                              "attn.v.lora.b"});
  CHECK(frozen == std::vector<std::string>{"norm.weight", "attn.q.weight", "attn.v.weight",
                                           "attn.o.weight"});
  CHECK(t.a->params.trainable == 4 * 256 * 8);
  CHECK(t.a->params.total == 256 + 3 * 256 * 256 + 4 * 256 * 8);
  // alpha defaults to r: the adapter's scale is 1.
  CHECK(t.a->params.quantized == 0);
}

TEST_CASE("finetune: nf4 base weights, by hand", "[finetune]") {
  Compiled t(kLora, "qlora");
  const Analysis &a = *t.a;
  const Graph &g = t.g();
  // The three 256×256 weights only matmuls read become nf4; the norm's stays bf16.
  for (const ParamInfo &p : g.params) {
    Dtype d = g.tensors[p.tensor].dtype;
    std::string path = g.paramPath(p);
    CHECK(d == (path == "attn.q.weight" || path == "attn.v.weight" || path == "attn.o.weight"
                    ? Dtype::NF4
                    : Dtype::BF16));
  }
  double bytesPerQ = (4 + 8.0 / 64 + 32.0 / (64 * 256)) / 8;
  CHECK(a.params.quantized == 3 * 65536);
  CHECK(a.params.quantizedBytes == Approx(3 * 65536 * bytesPerQ));
  // params: the norm and the four adapters in bf16, the base weights packed.
  double other = 256 + 4 * 256 * 8;
  CHECK(a.memory.params == Approx(other * 2 + 3 * 65536 * bytesPerQ));
  // Only the adapters have gradients and AdamW's two fp32 states.
  CHECK(a.memory.grads == Approx(4 * 256 * 8 * 2));
  CHECK(a.memory.optimizer == Approx(4 * 256 * 8 * 2 * 4));
  // Three matmuls read an nf4 weight: each dequantizes 65536 elements, reading the packed
  // weight and its scales and writing bf16, in the forward, and once more in the backward
  // where its data gradient is computed.
  CHECK(a.dequant.matmuls == 3);
  double oneBytes = 65536 * bytesPerQ + 65536 * 2;
  double oneFlops = 65536 + 65536 / 64.0;
  // q and v read the norm's output, which needs no gradient (nothing trainable before it):
  // no data gradient, no second dequantization; o reads q(x)·v(x), which needs one.
  CHECK(a.dequant.bytes == Approx(oneBytes * 4));
  CHECK(a.dequant.flops == Approx(oneFlops * 4));
  CHECK(a.dequant.forward > 0);
  CHECK(a.dequant.backward == Approx(a.dequant.forward / 3));
  // The generated step refuses quantized weights, naming the first one.
  StepFiles cpu = emitStep(a, false);
  CHECK(cpu.error.find("parameter attn.q.weight") != std::string::npos);
  CHECK(cpu.error.find("is stored in nf4") != std::string::npos);
}

TEST_CASE("finetune: MFU by each convention, by hand", "[finetune]") {
  Compiled t(kTiny, "t"), f(kTiny, "full");
  const Analysis &a = *t.a;
  double N = 32 * 96 + 32 * 32 + 32 * 64, D = 8 * 16;
  REQUIRE(N == 6144);
  // Attention per micro-batch: 4·b·s·s_kv·H·Q = 4·2·16·16·32; × 3 (forward and backward);
  // × 8/2 micro-batches = 12·L·H·Q·T·D = 12·1·32·16·128.
  double attention = 12.0 * 1 * 32 * 16 * D;
  CHECK(attention == 4.0 * 2 * 16 * 16 * 32 * 3 * 4);
  double capacity = a.time.step * a.time.mfuPeak * 1;
  CHECK(a.time.mfuPeak == Approx(989.5e12).epsilon(0.01)); // H100 SXM dense bf16
  CHECK(convention(a, "graph").flops == a.flops.forward + a.flops.backward);
  CHECK(convention(a, "graph").mfu == Approx(a.time.mfu));
  CHECK(convention(a, "six_nd").flops == 6 * N * D);
  CHECK(convention(a, "palm").flops == 6 * N * D + attention);
  CHECK(convention(a, "palm_causal").flops == 6 * N * D + attention / 2);
  // Megatron: 72·B·s·l·h²·(1 + s/6h + V/12lh) with B 8, s 16, l 1, h 32, V 64.
  double B = 8, s = 16, l = 1, h = 32, V = 64;
  CHECK(convention(a, "megatron").flops ==
        Approx(72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))));
  // Under full recomputation, eq. 3 as printed: 96·B·s·l·h²·(1 + s/6h + V/16lh).
  CHECK(convention(*f.a, "megatron").flops ==
        Approx(96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))));
  CHECK(convention(a, "hfu").flops == a.flops.executed - a.flops.optimizer);
  CHECK(convention(a, "hfu").mfu == Approx(a.time.hfu));
  for (const Analysis::MfuConvention &c : a.time.mfuConventions)
    CHECK(c.mfu == Approx(c.flops / capacity));
  CHECK(std::string(a.time.mfuConventions.front().name) == "graph");
}
