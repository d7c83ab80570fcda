// step_gradients.cpp — every differentiable kernel of codegen/runtime/API.md against central
// finite differences in fp64 (T = double): the loss is L = Σ w·y for fixed random weights w, so
// the backward kernel called with dy = w must give ∂L/∂input. One test case per kernel family,
// tolerances in the one table below, and a test that fails when an API.md kernel has no test.
#include "StepSupport.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>

using namespace step;

namespace {

/// Tolerances of the gradient checks, by family (|analytic − numeric| <= atol + rtol·|numeric|).
/// Central differences with h = 1e-5 in fp64 have truncation error ~h²·|f'''| ≈ 1e-10 and
/// rounding error ~1e-16/h ≈ 1e-11, so exact-in-fp64 kernels get 1e-7. Kernels whose backward
/// reads an fp32 statistic the forward saved (norms: mean/rstd) inherit fp32's relative 6e-8 on
/// that statistic, amplified by the row length: 1e-5.
const std::map<std::string, Tol> kTolerances = {
    {"matmul", {1e-7, 1e-9}},            // linear: exact up to rounding
    {"binary", {1e-7, 1e-9}},            // add/sub/mul/div with broadcasting, via reduce_to
    {"binary_scalar", {1e-7, 1e-9}},
    {"unary", {1e-7, 1e-9}},             // smooth ops; relu's inputs kept away from 0
    {"dropout", {1e-7, 1e-9}},           // linear for a fixed mask
    {"rope", {1e-7, 1e-9}},              // a rotation
    {"softmax", {1e-7, 1e-9}},
    {"layer_norm", {1e-5, 1e-8}},        // fp32 mean/rstd saved by the forward
    {"rms_norm", {1e-5, 1e-8}},          // fp32 rstd saved by the forward
    {"attention", {1e-7, 1e-9}},         // fp64 recomputes the lse in double
    {"embedding", {1e-7, 1e-9}},
    {"cross_entropy", {1e-7, 1e-9}},     // against the fp64 formula (the kernel's loss is fp32)
    // Through the kernel's own fp32 loss with h = 1e-3: the loss (≈ 2) is rounded to fp32
    // (ulp 2.4e-7), so differences carry up to 2.4e-7 / 2h ≈ 1.2e-4 absolute.
    {"cross_entropy_fp32_loss", {1e-3, 2e-4}},
    {"sum", {1e-7, 1e-9}},
    {"copy", {1e-7, 1e-9}},
};

Tol tol(const std::string& family) { return kTolerances.at(family); }

rt::Ctx ctx;

} // namespace

// ---- matmul -------------------------------------------------------------------------------------
static Covers covMatmul(true, {"matmul"});
TEST_CASE("fd: matmul (transposes, batch broadcast, alpha/beta)", "[fd]") {
  for (int variant = 0; variant < 4; ++variant) {
    const bool tA = variant & 1, tB = variant & 2;
    const int64_t M = 3, N = 4, K = 5, batch = 2;
    // A: per batch (stride M·K); B broadcast over the batch (stride 0).
    Vec A = uniform(batch * M * K, 1 + variant), B = uniform(K * N, 11 + variant), W = uniform(batch * M * N, 21);
    Vec C0 = uniform(batch * M * N, 31);
    const int64_t lda = tA ? M : K, ldb = tB ? K : N;
    const float alpha = 0.75f, beta = 0.5f;
    auto fwd = [&]() {
      Vec C = C0;
      rt::matmul<double>(ctx, tA, tB, M, N, K, alpha, A.data(), lda, M * K, B.data(), ldb, 0, beta,
                         C.data(), N, M * N, batch);
      return C;
    };
    auto loss = [&]() { return dotv(fwd(), W); };
    // dA[b] = alpha · W[b] @ op(B)ᵀ (laid out as A is); dB = alpha · Σ_b op(A[b])ᵀ @ W[b].
    Vec dA(A.size(), 0.0), dB(B.size(), 0.0);
    for (int64_t b = 0; b < batch; ++b) {
      if (!tA)  // dA [M,K] = W [M,N] @ op(B)ᵀ [N,K]
        rt::matmul<double>(ctx, false, !tB, M, K, N, alpha, W.data() + b * M * N, N, 0, B.data(), ldb, 0,
                           0.0f, dA.data() + b * M * K, K, 0, 1);
      else      // dA stored [K,M] = op(B) [K,N] @ Wᵀ [N,M]
        rt::matmul<double>(ctx, tB, true, K, M, N, alpha, B.data(), ldb, 0, W.data() + b * M * N, N, 0,
                           0.0f, dA.data() + b * M * K, M, 0, 1);
      if (!tB)  // dB [K,N] += op(A)ᵀ [K,M] @ W [M,N]
        rt::matmul<double>(ctx, !tA, false, K, N, M, alpha, A.data() + b * M * K, lda, 0, W.data() + b * M * N,
                           N, 0, 1.0f, dB.data(), N, 0, 1);
      else      // dB stored [N,K] += Wᵀ [N,M] @ op(A) [M,K]
        rt::matmul<double>(ctx, true, tA, N, K, M, alpha, W.data() + b * M * N, N, 0, A.data() + b * M * K,
                           lda, 0, 1.0f, dB.data(), K, 0, 1);
    }
    INFO("transA " << tA << " transB " << tB);
    expect_close("matmul dA", dA, numgrad(A, loss), tol("matmul"));
    expect_close("matmul dB", dB, numgrad(B, loss), tol("matmul"));
    expect_close("matmul dC", [&] { Vec g(C0.size()); for (size_t i = 0; i < g.size(); ++i) g[i] = beta * W[i]; return g; }(),
                 numgrad(C0, loss), tol("matmul"));
  }
}

// ---- binary with broadcasting, and reduce_to (its backward) -------------------------------------
static Covers covBinary(true, {"binary", "reduce_to"});
TEST_CASE("fd: binary ops with broadcasting, gradients through reduce_to", "[fd]") {
  // out [2,3,4] = a [2,1,4] op b [3,1] (b broadcast over dims 0 and 2).
  const int64_t shape[3] = {2, 3, 4}, dense[3] = {12, 4, 1};
  const int64_t aS[3] = {4, 0, 1}, bS[3] = {0, 1, 0};
  const int64_t n = 24;
  for (rt::BinOp op : {rt::BinOp::Add, rt::BinOp::Sub, rt::BinOp::Mul, rt::BinOp::Div}) {
    Vec a = uniform(8, 41), b = uniform(3, 42, 0.5, 1.5), W = uniform(n, 43);
    auto fwd = [&]() {
      Vec y(n);
      rt::binary<double>(ctx, op, a.data(), aS, b.data(), bS, y.data(), shape, 3, false);
      return y;
    };
    auto loss = [&]() { return dotv(fwd(), W); };
    // Per-element partials on the out grid, then reduced to each operand's shape.
    Vec ga(n), gb(n);
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 3; ++j)
        for (int64_t k = 0; k < 4; ++k) {
          int64_t e = i * 12 + j * 4 + k;
          double av = a[i * 4 + k], bv = b[j], w = W[e];
          switch (op) {
            case rt::BinOp::Add: ga[e] = w; gb[e] = w; break;
            case rt::BinOp::Sub: ga[e] = w; gb[e] = -w; break;
            case rt::BinOp::Mul: ga[e] = w * bv; gb[e] = w * av; break;
            case rt::BinOp::Div: ga[e] = w / bv; gb[e] = -w * av / (bv * bv); break;
          }
        }
    Vec da(8, 0.0), db(3, 0.0);
    rt::reduce_to<double>(ctx, ga.data(), shape, 3, da.data(), aS, 1.0f, false);
    rt::reduce_to<double>(ctx, gb.data(), shape, 3, db.data(), bS, 1.0f, false);
    INFO("op " << static_cast<int>(op));
    expect_close("binary da", da, numgrad(a, loss), tol("binary"));
    expect_close("binary db", db, numgrad(b, loss), tol("binary"));
  }
  // accumulate adds into out; reduce_to's scale multiplies.
  Vec a = uniform(8, 44), b = uniform(3, 45), y(n, 1.0), y2(n, 0.0);
  rt::binary<double>(ctx, rt::BinOp::Add, a.data(), aS, b.data(), bS, y.data(), shape, 3, true);
  rt::binary<double>(ctx, rt::BinOp::Add, a.data(), aS, b.data(), bS, y2.data(), shape, 3, false);
  for (int64_t e = 0; e < n; ++e) CHECK(y[e] == Approx(y2[e] + 1.0).epsilon(1e-15));
  Vec r(8, 0.0), r2(8, 0.0);
  rt::reduce_to<double>(ctx, y2.data(), shape, 3, r.data(), aS, 0.5f, false);
  rt::reduce_to<double>(ctx, y2.data(), shape, 3, r2.data(), aS, 1.0f, false);
  for (int64_t e = 0; e < 8; ++e) CHECK(r[e] == Approx(0.5 * r2[e]).epsilon(1e-15));
  (void)dense;
}

static Covers covBinaryScalar(true, {"binary_scalar"});
TEST_CASE("fd: binary_scalar (both sides)", "[fd]") {
  const int64_t n = 10;
  const float s = 1.75f;
  for (rt::BinOp op : {rt::BinOp::Add, rt::BinOp::Sub, rt::BinOp::Mul, rt::BinOp::Div})
    for (bool left : {false, true}) {
      Vec x = uniform(n, 51, 0.5, 2.0), W = uniform(n, 52);
      auto loss = [&]() {
        Vec y(n);
        rt::binary_scalar<double>(ctx, op, x.data(), s, left, y.data(), n, false);
        return dotv(y, W);
      };
      // dx = w · ∂(x op s)/∂x: computed with binary_scalar itself where the derivative is a constant.
      Vec dx(n);
      for (int64_t i = 0; i < n; ++i) {
        double d = 1.0;
        if (op == rt::BinOp::Sub && left) d = -1.0;
        if (op == rt::BinOp::Mul) d = s;
        if (op == rt::BinOp::Div) d = left ? -s / (x[i] * x[i]) : 1.0 / s;
        dx[i] = W[i] * d;
      }
      INFO("op " << static_cast<int>(op) << " scalarLeft " << left);
      expect_close("binary_scalar dx", dx, numgrad(x, loss), tol("binary_scalar"));
    }
}

// ---- div_bwd and div_scalar_bwd: the gradients of a / b (b a tensor) and of c / x ---------------
static Covers covDivBwd(true, {"div_bwd", "div_scalar_bwd"});
TEST_CASE("fd: division's gradients (div_bwd broadcast and strided, div_scalar_bwd)", "[fd]") {
  // y [2,3,4] = a [2,1,4] / b [3,1]: db = reduce_to(div_bwd(a, b, w)) against differences in b.
  const int64_t shape[3] = {2, 3, 4};
  const int64_t aS[3] = {4, 0, 1}, bS[3] = {0, 1, 0};
  const int64_t n = 24;
  Vec a = uniform(8, 61), b = uniform(3, 62, 0.5, 1.5), W = uniform(n, 63);
  auto loss = [&]() {
    Vec y(n);
    rt::binary<double>(ctx, rt::BinOp::Div, a.data(), aS, b.data(), bS, y.data(), shape, 3, false);
    return dotv(y, W);
  };
  Vec local(n, 0.0), db(3, 0.0);
  rt::div_bwd<double>(ctx, a.data(), aS, b.data(), bS, W.data(), nullptr, local.data(), nullptr, shape, 3, false);
  rt::reduce_to<double>(ctx, local.data(), shape, 3, db.data(), bS, 1.0f, false);
  expect_close("div_bwd db", db, numgrad(b, loss), tol("binary"));
  // Written through a view: out is the second half of each row of a [2,3,8] buffer (stride 8,
  // offset 4), accumulate adds, the other half keeps its sentinel.
  Vec wide(2 * 3 * 8, 7.0);
  const int64_t oS[3] = {24, 8, 1};
  rt::div_bwd<double>(ctx, a.data(), aS, b.data(), bS, W.data(), nullptr, wide.data() + 4, oS, shape, 3, true);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 8; ++k) {
        double v = wide[i * 24 + j * 8 + k];
        if (k < 4) CHECK(v == 7.0);
        else CHECK(v == Approx(7.0 + local[i * 12 + j * 4 + (k - 4)]).epsilon(1e-15));
      }
  // binary writes through a view the same way (a gradient into a split part).
  Vec wide2(2 * 3 * 8, 7.0), dense(n, 0.0);
  rt::binary<double>(ctx, rt::BinOp::Mul, a.data(), aS, b.data(), bS, dense.data(), shape, 3, false);
  rt::binary<double>(ctx, rt::BinOp::Mul, a.data(), aS, b.data(), bS, wide2.data() + 4, shape, 3, false, oS);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 8; ++k)
        CHECK(wide2[i * 24 + j * 8 + k] == (k < 4 ? 7.0 : dense[i * 12 + j * 4 + (k - 4)]));
  // c / x: the gradient from the output y = c / x.
  const float c = 2.5f;
  Vec x = uniform(10, 64, 0.5, 2.0), W2 = uniform(10, 65);
  auto loss2 = [&]() {
    Vec y(10);
    rt::binary_scalar<double>(ctx, rt::BinOp::Div, x.data(), c, true, y.data(), 10, false);
    return dotv(y, W2);
  };
  Vec y(10), dx(10, 0.0);
  rt::binary_scalar<double>(ctx, rt::BinOp::Div, x.data(), c, true, y.data(), 10, false);
  rt::div_scalar_bwd<double>(ctx, y.data(), W2.data(), c, dx.data(), 10, false);
  expect_close("div_scalar_bwd dx", dx, numgrad(x, loss2), tol("binary"));
}

// ---- unary ---------------------------------------------------------------------------------------
static Covers covUnary(true, {"unary_fwd", "unary_bwd"});
TEST_CASE("fd: unary ops", "[fd]") {
  const int64_t n = 16;
  for (rt::UnOp op : {rt::UnOp::Neg, rt::UnOp::Relu, rt::UnOp::Gelu, rt::UnOp::GeluTanh, rt::UnOp::Silu,
                      rt::UnOp::Tanh, rt::UnOp::Sigmoid, rt::UnOp::Exp}) {
    Vec x = uniform(n, 61, -3.0, 3.0), W = uniform(n, 62);
    for (auto& v : x)
      if (std::fabs(v) < 0.05) v = 0.3;   // relu's kink
    auto fwd = [&]() {
      Vec y(n);
      rt::unary_fwd<double>(ctx, op, x.data(), y.data(), n);
      return y;
    };
    Vec y = fwd(), dx(n, 0.0);
    rt::unary_bwd<double>(ctx, op, x.data(), y.data(), W.data(), dx.data(), n, false);
    INFO("op " << static_cast<int>(op));
    expect_close("unary dx", dx, numgrad(x, [&] { return dotv(fwd(), W); }), tol("unary"));
    // accumulate: a second call adds the same gradient again.
    Vec dx2 = dx;
    rt::unary_bwd<double>(ctx, op, x.data(), y.data(), W.data(), dx2.data(), n, true);
    for (int64_t i = 0; i < n; ++i) CHECK(dx2[i] == Approx(2 * dx[i]).epsilon(1e-15).margin(1e-300));
  }
}

// ---- dropout -------------------------------------------------------------------------------------
static Covers covDropout(true, {"dropout_fwd", "dropout_bwd"});
TEST_CASE("fd: dropout (mask recorded and regenerated)", "[fd]") {
  const int64_t n = 64;
  const float p = 0.3f;
  Vec x = uniform(n, 71), W = uniform(n, 72);
  std::vector<uint8_t> mask(n);
  auto fwd = [&]() {
    Vec y(n);
    rt::dropout_fwd<double>(ctx, x.data(), y.data(), mask.data(), n, p, 1234, 7);
    return y;
  };
  Vec num = numgrad(x, [&] { return dotv(fwd(), W); });
  Vec dxMask(n), dxRegen(n);
  rt::dropout_bwd<double>(ctx, W.data(), mask.data(), dxMask.data(), n, p, 1234, 7, false);
  rt::dropout_bwd<double>(ctx, W.data(), nullptr, dxRegen.data(), n, p, 1234, 7, false);
  expect_close("dropout dx (mask)", dxMask, num, tol("dropout"));
  expect_close("dropout dx (regenerated)", dxRegen, num, tol("dropout"));
  int kept = 0;
  for (auto m : mask) kept += m;
  CHECK(kept > 0);
  CHECK(kept < n);
}

// ---- rope ----------------------------------------------------------------------------------------
static Covers covRope(true, {"rope_fwd", "rope_bwd"});
TEST_CASE("fd: rope (default and explicit positions)", "[fd]") {
  const int64_t B = 2, S = 3, H = 2, hd = 4, n = B * S * H * hd;
  const int32_t pos[3] = {5, 0, 17};
  for (const int32_t* positions : {static_cast<const int32_t*>(nullptr), pos}) {
    Vec x = uniform(n, 81), W = uniform(n, 82);
    auto loss = [&]() {
      Vec y(n);
      rt::rope_fwd<double>(ctx, x.data(), y.data(), positions, B, S, H, hd, 10000.0f);
      return dotv(y, W);
    };
    Vec dx(n);
    rt::rope_bwd<double>(ctx, W.data(), dx.data(), positions, B, S, H, hd, 10000.0f, false);
    expect_close("rope dx", dx, numgrad(x, loss), tol("rope"));
  }
}

// ---- softmax -------------------------------------------------------------------------------------
static Covers covSoftmax(true, {"softmax_fwd", "softmax_bwd"});
TEST_CASE("fd: softmax", "[fd]") {
  const int64_t rows = 3, cols = 7, n = rows * cols;
  Vec x = uniform(n, 91, -4, 4), W = uniform(n, 92);
  auto fwd = [&]() {
    Vec y(n);
    rt::softmax_fwd<double>(ctx, x.data(), y.data(), rows, cols);
    return y;
  };
  Vec y = fwd(), dx(n);
  rt::softmax_bwd<double>(ctx, y.data(), W.data(), dx.data(), rows, cols, false);
  expect_close("softmax dx", dx, numgrad(x, [&] { return dotv(fwd(), W); }), tol("softmax"));
}

// ---- norms ---------------------------------------------------------------------------------------
static Covers covLayerNorm(true, {"layer_norm_fwd", "layer_norm_bwd"});
TEST_CASE("fd: layer norm (x, w, b; without bias; without weight or bias)", "[fd]") {
  const int64_t rows = 3, cols = 8, n = rows * cols;
  // affine 2: weight and bias; 1: weight alone; 0: neither (w and b null, OLMo 1's norm).
  for (int affine : {2, 1, 0}) {
    Vec x = uniform(n, 101, -2, 2), w = uniform(cols, 102, 0.5, 1.5), b = uniform(cols, 103), W = uniform(n, 104);
    const double* wp = affine > 0 ? w.data() : nullptr;
    std::vector<float> mean(rows), rstd(rows);
    auto loss = [&]() {
      Vec y(n);
      rt::layer_norm_fwd<double>(ctx, x.data(), wp, affine == 2 ? b.data() : nullptr, y.data(), mean.data(),
                                 rstd.data(), rows, cols, 1e-5f);
      return dotv(y, W);
    };
    loss();
    Vec dx(n), dw(cols, 0.0), db(cols, 0.0);
    rt::layer_norm_bwd<double>(ctx, x.data(), wp, mean.data(), rstd.data(), W.data(), dx.data(),
                               affine > 0 ? dw.data() : nullptr, affine == 2 ? db.data() : nullptr, rows, cols,
                               false);
    INFO("affine " << affine);
    expect_close("layer_norm dx", dx, numgrad(x, loss), tol("layer_norm"));
    if (affine > 0) expect_close("layer_norm dw", dw, numgrad(w, loss), tol("layer_norm"));
    if (affine == 2) expect_close("layer_norm db", db, numgrad(b, loss), tol("layer_norm"));
    if (affine == 0) {  // y = x̂ exactly: the unit-scale output of the weighted kernel with w = 1
      Vec ones(cols, 1.0), y0(n), y1(n);
      rt::layer_norm_fwd<double>(ctx, x.data(), nullptr, nullptr, y0.data(), mean.data(), rstd.data(), rows, cols, 1e-5f);
      rt::layer_norm_fwd<double>(ctx, x.data(), ones.data(), nullptr, y1.data(), mean.data(), rstd.data(), rows, cols,
                                 1e-5f);
      expect_close("layer_norm y without a weight", y0, y1, tol("layer_norm"));
    }
  }
}

static Covers covRmsNorm(true, {"rms_norm_fwd", "rms_norm_bwd"});
TEST_CASE("fd: RMS norm (x, w)", "[fd]") {
  const int64_t rows = 3, cols = 8, n = rows * cols;
  Vec x = uniform(n, 111, -2, 2), w = uniform(cols, 112, 0.5, 1.5), W = uniform(n, 113);
  std::vector<float> rstd(rows);
  auto loss = [&]() {
    Vec y(n);
    rt::rms_norm_fwd<double>(ctx, x.data(), w.data(), y.data(), rstd.data(), rows, cols, 1e-6f);
    return dotv(y, W);
  };
  loss();
  Vec dx(n), dw(cols, 0.0);
  rt::rms_norm_bwd<double>(ctx, x.data(), w.data(), rstd.data(), W.data(), dx.data(), dw.data(), rows, cols, false);
  expect_close("rms_norm dx", dx, numgrad(x, loss), tol("rms_norm"));
  expect_close("rms_norm dw", dw, numgrad(w, loss), tol("rms_norm"));
}

// ---- attention -----------------------------------------------------------------------------------
static Covers covAttention(true, {"attention_fwd", "attention_bwd"});
TEST_CASE("fd: attention (fused and materialised, causal, GQA, S != Skv, dropout, window, softcap)", "[fd]") {
  struct Case {
    int64_t B, S, Skv, H, Hkv, hd;
    bool causal;
    float p;
    bool materialised;
    int64_t window = 0;   // rt::AttnScores (issue 44)
    float softcap = 0.0f;
  };
  const Case cases[] = {
      {1, 4, 4, 2, 2, 3, false, 0.0f, false},
      {2, 3, 3, 4, 2, 2, true, 0.0f, false},
      {1, 3, 5, 2, 1, 4, true, 0.0f, true},     // Skv > S: query i sees keys <= i + 2
      {1, 5, 3, 2, 1, 2, true, 0.0f, false},    // S > Skv: the first rows see nothing
      {1, 4, 70, 2, 1, 2, false, 0.0f, false},  // more keys than one online-softmax block (64)
      {1, 3, 4, 2, 2, 2, true, 0.25f, false},
      {1, 3, 4, 2, 2, 2, true, 0.25f, true},
      {1, 70, 70, 2, 1, 2, true, 0.1f, false},  // several query and key blocks (64)
      {1, 70, 67, 2, 1, 2, true, 0.1f, true},
      // Sliding windows (query i sees keys i - w < j <= i + Skv - S) and soft caps.
      {1, 70, 70, 2, 1, 2, true, 0.0f, false, 9},          // a window across key blocks
      {1, 70, 70, 2, 1, 2, true, 0.1f, false, 20, 1.5f},   // with dropout and a cap
      {1, 3, 5, 2, 1, 4, true, 0.0f, false, 2},            // Skv > S
      {1, 5, 3, 2, 1, 2, true, 0.0f, false, 2, 0.5f},      // S > Skv: the first rows see nothing
      {2, 6, 6, 2, 2, 3, true, 0.0f, true, 2, 0.7f},       // materialised: the cap's scores recomputed
      {1, 70, 67, 2, 1, 2, true, 0.1f, true, 30, 1.0f},
      {1, 4, 4, 2, 2, 3, false, 0.0f, false, 0, 0.6f},     // a cap without the causal mask
  };
  for (const Case& c : cases) {
    const int64_t nq = c.B * c.S * c.H * c.hd, nk = c.B * c.Skv * c.Hkv * c.hd;
    Vec q = uniform(nq, 121), k = uniform(nk, 122), v = uniform(nk, 123), W = uniform(nq, 124);
    std::vector<float> lse(c.B * c.H * c.S);
    Vec P(c.materialised ? c.B * c.H * c.S * c.Skv : 0);
    Vec o(nq);
    auto fwd = [&]() {
      rt::attention_fwd<double>(ctx, q.data(), k.data(), v.data(), o.data(), lse.data(),
                                c.materialised ? P.data() : nullptr, c.B, c.S, c.Skv, c.H, c.Hkv, c.hd, 0.0f,
                                c.causal, c.p, 99, 3, rt::AttnRows{}, rt::AttnScores{c.window, c.softcap});
      return dotv(o, W);
    };
    fwd();
    Vec dq(nq), dk(nk), dv(nk);
    // Materialised: what the plan keeps, P (and the replayed dropout mask), without o or lse.
    rt::attention_bwd<double>(ctx, q.data(), k.data(), v.data(), c.materialised ? nullptr : o.data(),
                              c.materialised ? nullptr : lse.data(), c.materialised ? P.data() : nullptr, W.data(), dq.data(), dk.data(), dv.data(), c.B,
                              c.S, c.Skv, c.H, c.Hkv, c.hd, 0.0f, c.causal, c.p, 99, 3, false, rt::AttnRows{},
                              rt::AttnScores{c.window, c.softcap});
    INFO("B " << c.B << " S " << c.S << " Skv " << c.Skv << " H " << c.H << " Hkv " << c.Hkv << " hd " << c.hd
              << " causal " << c.causal << " p " << c.p << " materialised " << c.materialised << " window "
              << c.window << " softcap " << c.softcap);
    expect_close("attention dq", dq, numgrad(q, fwd), tol("attention"));
    expect_close("attention dk", dk, numgrad(k, fwd), tol("attention"));
    expect_close("attention dv", dv, numgrad(v, fwd), tol("attention"));
  }
}

// ---- embedding -----------------------------------------------------------------------------------
static Covers covEmbedding(true, {"embedding_fwd", "embedding_bwd"});
TEST_CASE("fd: embedding (repeated ids accumulate)", "[fd]") {
  const int64_t rows = 6, d = 3, vocab = 5;
  const int32_t ids[6] = {1, 4, 1, 0, 1, 3};
  Vec w = uniform(vocab * d, 131), W = uniform(rows * d, 132);
  auto loss = [&]() {
    Vec y(rows * d);
    rt::embedding_fwd<double>(ctx, ids, w.data(), y.data(), rows, d, vocab);
    return dotv(y, W);
  };
  Vec dw(vocab * d, 0.0);
  rt::embedding_bwd<double>(ctx, ids, W.data(), dw.data(), rows, d, vocab);
  expect_close("embedding dw", dw, numgrad(w, loss), tol("embedding"));
}

// ---- cross-entropy -------------------------------------------------------------------------------
static Covers covCrossEntropy(true, {"cross_entropy_fwd", "cross_entropy_bwd"});
TEST_CASE("fd: cross-entropy with ignored rows", "[fd]") {
  const int64_t rows = 4, V = 6;
  const int32_t labels[4] = {2, -1, 5, 0};
  Vec x = uniform(rows * V, 141, -3, 3);
  // The formula in fp64: mean over counted rows of lse − x[label].
  auto reference = [&]() {
    double total = 0;
    int count = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (labels[r] < 0) continue;
      double m = -INFINITY, s = 0;
      for (int64_t j = 0; j < V; ++j) m = std::max(m, x[r * V + j]);
      for (int64_t j = 0; j < V; ++j) s += std::exp(x[r * V + j] - m);
      total += m + std::log(s) - x[r * V + labels[r]];
      ++count;
    }
    return total / count;
  };
  float loss = 0;
  std::vector<float> lse(rows);
  auto kernelLoss = [&]() {
    rt::cross_entropy_fwd<double>(ctx, x.data(), labels, &loss, lse.data(), rows, V);
    return static_cast<double>(loss);
  };
  CHECK(kernelLoss() == Approx(reference()).epsilon(1e-7));   // the fp32 loss rounds once
  const float dloss = 1.5f;
  Vec dx(rows * V);
  rt::cross_entropy_bwd<double>(ctx, x.data(), labels, lse.data(), &dloss, dx.data(), rows, V, false);
  Vec num = numgrad(x, reference);
  for (auto& g : num) g *= dloss;
  expect_close("cross_entropy dlogits", dx, num, tol("cross_entropy"));
  Vec num32 = numgrad(x, kernelLoss, 1e-3);
  for (auto& g : num32) g *= dloss;
  expect_close("cross_entropy dlogits (fp32 loss)", dx, num32, tol("cross_entropy_fp32_loss"));
  for (int64_t j = 0; j < V; ++j) CHECK(dx[1 * V + j] == 0.0);   // the ignored row
}

// ---- sum -----------------------------------------------------------------------------------------
static Covers covSum(true, {"sum_fwd", "sum_bwd"});
TEST_CASE("fd: sum and mean over an axis", "[fd]") {
  struct Case { int64_t outer, axis, inner; };
  for (Case c : {Case{2, 3, 4}, Case{1, 7, 1}, Case{3, 5, 1}, Case{1, 4, 300}})
    for (bool mean : {false, true}) {
      const int64_t n = c.outer * c.axis * c.inner, m = c.outer * c.inner;
      Vec x = uniform(n, 151), W = uniform(m, 152);
      auto loss = [&]() {
        Vec y(m);
        rt::sum_fwd<double>(ctx, x.data(), y.data(), c.outer, c.axis, c.inner, mean);
        return dotv(y, W);
      };
      Vec dx(n);
      rt::sum_bwd<double>(ctx, W.data(), dx.data(), c.outer, c.axis, c.inner, mean, false);
      INFO("outer " << c.outer << " axis " << c.axis << " inner " << c.inner << " mean " << mean);
      expect_close("sum dx", dx, numgrad(x, loss), tol("sum"));
    }
}

// ---- copy ----------------------------------------------------------------------------------------
static Covers covCopy(true, {"copy"});
TEST_CASE("fd: strided copy (a transpose) and its backward (a strided accumulate)", "[fd]") {
  // y [3,4] dense = xᵀ where x is [4,3]: src strides {1, 3}. Backward: dx (strided dst) += dy.
  const int64_t shape[2] = {3, 4}, srcStrides[2] = {1, 3}, dense[2] = {4, 1};
  Vec x = uniform(12, 161), W = uniform(12, 162);
  auto loss = [&]() {
    Vec y(12);
    rt::copy<double, double>(ctx, x.data(), srcStrides, y.data(), nullptr, shape, 2, false);
    return dotv(y, W);
  };
  Vec dx(12, 0.0);
  rt::copy<double, double>(ctx, W.data(), dense, dx.data(), srcStrides, shape, 2, true);
  expect_close("copy dx", dx, numgrad(x, loss), tol("copy"));
}

// ---- coverage ------------------------------------------------------------------------------------
namespace {
/// The kernel names in the code blocks of codegen/runtime/API.md, and which section they are in.
std::map<std::string, bool> apiKernels(bool& found) {
  std::map<std::string, bool> names;   // name -> in the "Kernels" section (differentiable pairs)
  const char* src = std::getenv("TALLY_SOURCE_DIR");
  std::string path = std::string(src ? src : TALLY_DEFAULT_SOURCE_DIR) + "/codegen/runtime/API.md";
  std::ifstream in(path);
  found = static_cast<bool>(in);
  std::string line;
  bool inCode = false, kernelsSection = false;
  const std::regex decl(R"(^([a-z_0-9]+)(<[^>]*>)?\(ctx)");
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) kernelsSection = line.find("Kernels") != std::string::npos;
    if (line.rfind("```", 0) == 0) { inCode = !inCode; continue; }
    std::smatch m;
    if (inCode && std::regex_search(line, m, decl)) names[m[1]] = kernelsSection;
  }
  return names;
}
} // namespace

TEST_CASE("every API.md kernel has a test; every differentiable one a gradient test", "[coverage]") {
  bool found = false;
  auto names = apiKernels(found);
  INFO("reading codegen/runtime/API.md under $TALLY_SOURCE_DIR (default: the configured source folder)");
  REQUIRE(found);
  REQUIRE(names.size() >= 30);
  // Kernels of the "Kernels" section that have no gradient: index data and initialisation.
  const std::set<std::string> notDifferentiable = {"positions", "next_tokens", "fill"};
  const Registry& reg = Registry::get();
  for (const auto& [name, differentiable] : names) {
    INFO("kernel " << name);
    if (differentiable && !notDifferentiable.count(name)) CHECK(reg.gradient.count(name) == 1);
    CHECK((reg.gradient.count(name) + reg.value.count(name)) >= 1);
  }
}
