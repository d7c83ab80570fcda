// test_roofline.cpp — unit tests for passes/Roofline.cpp: the lecture's intensity table on
// H100_SXM in bf16 (ridge 295.37 FLOP/byte; ReLU, GELU, a dot product and a matrix-vector
// product memory-bound, a 1024³ matmul compute-bound), the compute dtype of each op (tf32 only
// under the tf32 preset) and the fallback to a wider format when the target has no rate.
// Plans are compiled from source through tally::Compilation, as the CLI does.
#include <catch.hpp>

#include "tests/unit/Support.h"

#include <string>

using namespace tally;
using namespace tally::test;

namespace {

/// The lecture's table: one model per row, each run as a bf16 infer plan on H100_SXM.
const char *kTable = R"(
model Relu(n = 1024)   { forward(x: bf16[n, n]) { return relu(x) } }
model Gelu(n = 1024)   { forward(x: bf16[n, n]) { return gelu(x) } }
model Dot(n = 1024)    { forward(x: bf16[n], y: bf16[n]) { return x @ y } }
model MatVec(n = 1024) {
  param w: [n, n]
  forward(x: bf16[n]) { return w @ x }
}
model MatMul(n = 1024) {
  param w: [n, n]
  forward(x: bf16[n, n]) { return x @ w }
}
infer relu   { model = Relu()   batch = 1 prompt = 1 precision = bf16 target = H100_SXM }
infer gelu   { model = Gelu()   batch = 1 prompt = 1 precision = bf16 target = H100_SXM }
infer dot    { model = Dot()    batch = 1 prompt = 1 precision = bf16 target = H100_SXM }
infer matvec { model = MatVec() batch = 1 prompt = 1 precision = bf16 target = H100_SXM }
infer matmul { model = MatMul() batch = 1 prompt = 1 precision = bf16 target = H100_SXM }
)";

const char *kFp32 = R"(
model M(n = 1024) {
  param w: [n, n]
  forward(x: f32[batch, n]) { return mean(relu(x @ w)) }
}
)";

} // namespace

TEST_CASE("roofline: the H100 bf16 ridge is 295.37 FLOP/byte", "[roofline]") {
  Compiled t(kTable, "relu");
  CHECK(t.a->ridge == Approx(989.5e12 / 3.35e12));
  CHECK(t.a->ridge == Approx(295.37).epsilon(1e-4));
  CHECK(t.a->peakFlops == 989.5e12);
}

TEST_CASE("roofline: the lecture's intensity table", "[roofline]") {
  const double n = 1024;
  SECTION("ReLU: 1 FLOP per element, 2 + 2 bytes: 0.25") {
    Compiled t(kTable, "relu");
    const OpAnalysis &o = t.at("relu");
    CHECK(o.intensity() == Approx(0.25));
    CHECK_FALSE(o.computeBound);
    CHECK(o.computeDtype == Dtype::BF16);
  }
  SECTION("GELU: 8 FLOPs per element, 2 + 2 bytes: 2") {
    Compiled t(kTable, "gelu");
    CHECK(t.at("gelu").intensity() == Approx(2));
    CHECK_FALSE(t.at("gelu").computeBound);
  }
  SECTION("dot product: 2n FLOPs over 2n + 2n + 2 bytes: about 0.5") {
    Compiled t(kTable, "dot");
    CHECK(t.at("matmul").intensity() == Approx(2 * n / (4 * n + 2)));
    CHECK_FALSE(t.at("matmul").computeBound);
  }
  SECTION("matrix-vector: 2n² FLOPs over 2n² + 4n bytes: about 1") {
    Compiled t(kTable, "matvec");
    CHECK(t.at("matmul").intensity() == Approx(2 * n * n / (2 * n * n + 4 * n)));
    CHECK_FALSE(t.at("matmul").computeBound);
  }
  SECTION("1024³ matmul: 2·1024³ / (3·1024²·2) = 341.3, above the ridge") {
    Compiled t(kTable, "matmul");
    CHECK(t.at("matmul").intensity() == Approx(341.333).epsilon(1e-5));
    CHECK(t.at("matmul").computeBound);
  }
}

TEST_CASE("roofline: fp32 matmuls run at the fp32 rate unless the preset is tf32", "[roofline]") {
  std::string plan = R"(
train p { model = M() batch = 1024 optimizer = SGD(lr = 0.1) precision = PRESET target = H100_SXM }
)";
  SECTION("fp32: the CUDA-core rate, ridge 66.9e12 / 3.35e12") {
    std::string src = kFp32 + plan;
    src.replace(src.find("PRESET"), 6, "fp32");
    Compiled t(src, "p");
    CHECK(t.at("matmul").computeDtype == Dtype::F32);
    CHECK(t.a->peakFlops == 66.9e12);
    CHECK(t.a->ridge == Approx(66.9e12 / 3.35e12));
    // 2·1024³ FLOPs over 3·1024²·4 bytes = 170.7 ≥ 19.97: compute-bound at the fp32 rate.
    CHECK(t.at("matmul").computeBound);
  }
  SECTION("tf32: matmuls on the TF32 tensor cores, everything else in fp32") {
    std::string src = kFp32 + plan;
    src.replace(src.find("PRESET"), 6, "tf32");
    Compiled t(src, "p");
    CHECK(t.at("matmul").computeDtype == Dtype::TF32);
    CHECK(t.at("relu").computeDtype == Dtype::F32);
    CHECK(t.a->peakFlops == 494.7e12);
    // 170.7 ≥ 494.7e12 / 3.35e12 = 147.7: still compute-bound at the TF32 rate.
    CHECK(t.at("matmul").computeBound);
    CHECK_FALSE(t.at("relu").computeBound);
  }
}

TEST_CASE("roofline: a dtype the target cannot compute in falls back to a wider one",
          "[roofline]") {
  // The A100 has no fp8 tensor cores: fp8 activations compute at the bf16 rate.
  std::string src = std::string(kFp32) + R"(
train p {
  model = M()
  batch = 1024
  optimizer = SGD(lr = 0.1)
  precision = { params = bf16, grads = bf16, activations = fp8_e4m3, optimizer = fp32 }
  target = A100_80GB
}
)";
  Compiled t(src, "p");
  CHECK(t.at("matmul").computeDtype == Dtype::BF16);
  CHECK(t.a->peakFlops == 312e12);
  CHECK(t.a->ridge == Approx(312e12 / 2.039e12));
}

TEST_CASE("roofline: views move nothing and are not compute-bound", "[roofline]") {
  Compiled t(R"(
model V(n = 64) {
  param w: [n, n]
  forward(x: bf16[batch, n]) { return mean(x @ transpose(w)) }
}
infer p { model = V() batch = 8 prompt = 1 precision = bf16 target = H100_SXM }
)",
             "p");
  const OpAnalysis &v = t.at("transpose");
  CHECK(v.forward.bytesRead + v.forward.bytesWritten == 0);
  CHECK_FALSE(v.computeBound);
  CHECK(v.forwardTime == 0);
}
