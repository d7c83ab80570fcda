// The kernel cases of tests/step/cuda_check, written once and compiled twice: in
// cuda_check_cpu.cpp against the CPU runtime (the reference) and in cuda_check.cu against the
// CUDA runtime. Each case builds its inputs from a fixed seed (so both builds see the same
// numbers), runs one kernel or a forward/backward pair, and returns every output as floats.
//
// Before including this file a translation unit includes one runtime header, defines
// TALLY_CHECK_NS (the namespace of this build's entry point) and a class `Mem` with
//   template <class T> T* upload(const std::vector<T>&);   // a copy the kernels can read
//   template <class T> T* zeros(int64_t n);                 // zero-filled
//   template <class T> std::vector<T> download(const T*, int64_t n);  // waits for the kernels
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace tally_check {

/// Outputs of one case by name ("y", "dx", …), as floats.
using Outputs = std::map<std::string, std::vector<float>>;

/// One case: its kernel (the table's first column), dtype and outputs.
struct CaseResult {
  std::string kernel;
  std::string dtype;
  Outputs out;
  std::string error;  // the case threw (cuDNN cases): a failed row
};

/// A small deterministic generator (64-bit LCG) so both builds draw identical inputs.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 6364136223846793005ULL + 1442695040888963407ULL) {}
  /// Uniform in [lo, hi).
  float uni(float lo = -1.f, float hi = 1.f) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * static_cast<float>(s >> 40) * (1.0f / 16777216.0f);
  }
  int32_t below(int32_t n) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(n));
  }
};

/// One attention case: forward then backward over the same random inputs in every build. Dense
/// [B, S, heads·hd] q, k, v, or (rowPad > 0) q, k, v as row-strided parts of one fused
/// [B, S, (H + 2·Hkv)·hd + rowPad] buffer (rt::AttnRows), whose gradients go to the same parts of
/// a gradient buffer whose padding columns hold a sentinel (7) that must come back unchanged
/// ("dqkv" is the whole buffer), added into it (accumulate) or written.
struct AttnCase {
  const char* name;
  int64_t B, S, Skv, H, Hkv, hd;
  bool causal;
  float p;
  bool materialised;
  bool noLse;  // materialised without an lse buffer (allowed by API.md)
  int64_t window = 0;   // rt::AttnScores (issue 44)
  float softcap = 0.f;
  int64_t rowPad = 0;
  bool accumulate = false;
};

inline const std::vector<AttnCase>& attentionCases() {
  static const std::vector<AttnCase> cases = {
      {"attention_causal_hd64", 2, 70, 70, 4, 4, 64, true, 0.f, false, false},
      {"attention_gqa_hd128", 1, 45, 45, 8, 2, 128, true, 0.f, false, false},
      {"attention_noncausal_kv_longer_hd80", 2, 20, 52, 3, 1, 80, false, 0.f, false, false},
      {"attention_causal_kv_longer_hd32", 1, 19, 40, 2, 2, 32, true, 0.f, false, false},
      {"attention_dropout_hd64", 1, 33, 33, 2, 1, 64, true, 0.1f, false, false},
      {"attention_materialised_hd64", 2, 40, 40, 4, 2, 64, true, 0.1f, true, false},
      {"attention_materialised_nolse_hd64", 1, 24, 24, 2, 2, 64, false, 0.f, true, true},
      {"attention_window_gqa_hd64", 2, 100, 100, 4, 2, 64, true, 0.f, false, false, 37},
      {"attention_window_softcap_kv_longer_hd32", 1, 19, 40, 2, 2, 32, true, 0.1f, false, false, 9, 1.5f},
      {"attention_softcap_hd128", 1, 45, 45, 4, 2, 128, true, 0.f, false, false, 0, 2.f},
      // Issue 38: shapes for cuDNN's fused attention too (non-causal over S = Skv with grouped
      // queries; causal past one 128-row tile)
      {"attention_noncausal_gqa_hd64", 1, 48, 48, 6, 2, 64, false, 0.f, false, false},
      {"attention_causal_long_hd128", 1, 200, 200, 2, 2, 128, true, 0.f, false, false},
      {"attention_strided_qkv_gqa_hd64", 2, 37, 37, 4, 2, 64, true, 0.f, false, false, 0, 0.f, 8, true},
      {"attention_strided_qkv_gqa_hd64_write", 2, 37, 37, 4, 2, 64, true, 0.f, false, false, 0, 0.f, 8, false},
  };
  return cases;
}

/// Whether cuDNN's fused attention runs case `c` in a generated step: passes/CudnnAttention.h's
/// rule (16-bit storage aside) with the emitter's (no accumulation into the gradients).
inline bool cudnnTakes(const AttnCase& c) {
  const int64_t rowQ = c.rowPad ? (c.H + 2 * c.Hkv) * c.hd + c.rowPad : c.H * c.hd;
  return c.p == 0.f && !c.materialised && !c.noLse && c.window == 0 && c.softcap == 0.f && !c.accumulate &&
         c.hd % 8 == 0 && c.hd <= 128 && c.H % c.Hkv == 0 && !(c.causal && c.S != c.Skv) && rowQ % 8 == 0;
}

}  // namespace tally_check

namespace TALLY_CHECK_NS {

using tally_check::CaseResult;
using tally_check::Outputs;
using tally_check::Rng;

template <class T> std::vector<T> randomT(uint64_t seed, int64_t n, float lo = -1.f, float hi = 1.f) {
  Rng r(seed);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = rt::store<T>(r.uni(lo, hi));
  return v;
}
inline std::vector<float> randomF(uint64_t seed, int64_t n, float lo = -1.f, float hi = 1.f) {
  return randomT<float>(seed, n, lo, hi);
}
template <class T> std::vector<float> toFloat(const std::vector<T>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(rt::load(v[i]));
  return r;
}
template <class T> std::vector<float> get(Mem& m, const T* p, int64_t n) { return toFloat(m.template download<T>(p, n)); }
inline std::vector<float> getI(Mem& m, const int32_t* p, int64_t n) {
  std::vector<int32_t> v = m.template download<int32_t>(p, n);
  return std::vector<float>(v.begin(), v.end());
}
inline std::vector<float> getU8(Mem& m, const uint8_t* p, int64_t n) {
  std::vector<uint8_t> v = m.template download<uint8_t>(p, n);
  return std::vector<float>(v.begin(), v.end());
}

/// A fused kernel as the generated step writes one (codegen/EmitFused.cpp `fused`): bias add, then
/// GELU, each value rounded to the storage type; the GELU output is the norms' x.
template <class T> struct BiasGelu {
  const T* x;
  const T* bias;
  T* pre;
  T* out;
  int64_t cols;
  TALLY_HD void operator()(int64_t e) const {
    using A = rt::acc_t<T>;
    const A v0 = rt::load(rt::store<T>(rt::binop(rt::BinOp::Add, rt::load(x[e]), rt::load(bias[e % cols]))));
    pre[e] = rt::store<T>(v0);
    const A v1 = rt::load(rt::store<T>(rt::unary(rt::UnOp::Gelu, v0)));
    out[e] = rt::store<T>(v1);
  }
};

/// attention_fwd/_bwd of case `c` on the runtime's kernels, or on cuDNN's fused attention
/// (`cudnn`: the CUDA runtime's attention_fwd_cudnn/_bwd_cudnn, bf16 and fp16; a build defines
/// TALLY_CHECK_CUDNN where they exist).
template <class T>
void attentionCall(rt::Ctx& ctx, bool cudnn, const tally_check::AttnCase& c, const T* q, const T* k, const T* v, T* o,
                   float* lse, T* P, const T* dO, T* dq, T* dk, T* dv, rt::AttnRows rows) {
  const rt::AttnScores sm{c.window, c.softcap};
#ifdef TALLY_CHECK_CUDNN
  if constexpr (!std::is_same<T, float>::value) {
    if (cudnn) {
      rt::attention_fwd_cudnn<T>(ctx, q, k, v, o, lse, P, c.B, c.S, c.Skv, c.H, c.Hkv, c.hd, 0.f, c.causal, c.p, 42, 3,
                                 rows, sm);
      rt::attention_bwd_cudnn<T>(ctx, q, k, v, o, lse, P, dO, dq, dk, dv, c.B, c.S, c.Skv, c.H, c.Hkv, c.hd, 0.f,
                                 c.causal, c.p, 42, 3, c.accumulate, rows, sm);
      return;
    }
  }
#endif
  if (cudnn) throw std::runtime_error("cuDNN's fused attention is not in this build or for this type");
  rt::attention_fwd<T>(ctx, q, k, v, o, lse, P, c.B, c.S, c.Skv, c.H, c.Hkv, c.hd, 0.f, c.causal, c.p, 42, 3, rows, sm);
  rt::attention_bwd<T>(ctx, q, k, v, o, lse, P, dO, dq, dk, dv, c.B, c.S, c.Skv, c.H, c.Hkv, c.hd, 0.f, c.causal, c.p,
                       42, 3, c.accumulate, rows, sm);
}

/// The outputs of attention case `c` (tally_check::AttnCase) on the engine `cudnn` picks.
template <class T> Outputs attentionCase(rt::Ctx& ctx, Mem& m, const tally_check::AttnCase& c, bool cudnn) {
  const int64_t nq = c.B * c.S * c.H * c.hd, nkv = c.B * c.Skv * c.Hkv * c.hd;
  const T* dO = m.upload(randomT<T>(c.rowPad ? 43 : 35, nq));
  T* o = m.template zeros<T>(nq);
  float* lse = c.noLse ? nullptr : m.template zeros<float>(c.B * c.H * c.S);
  if (c.rowPad) {  // one fused buffer (S = Skv)
    const int64_t W = (c.H + 2 * c.Hkv) * c.hd + c.rowPad, nf = c.B * c.S * W;
    const T* f = m.upload(randomT<T>(42, nf, -2.f, 2.f));
    std::vector<T> g0 = randomT<T>(44, nf);
    if (!c.accumulate) g0 = std::vector<T>(static_cast<size_t>(nf), rt::store<T>(-3.f));  // overwritten
    for (int64_t r = 0; r < c.B * c.S; ++r)
      for (int64_t col = W - c.rowPad; col < W; ++col) g0[static_cast<size_t>(r * W + col)] = rt::store<T>(7.f);
    T* g = m.upload(g0);
    const int64_t kc = c.H * c.hd, vc = (c.H + c.Hkv) * c.hd;  // where k and v start in a row
    attentionCall<T>(ctx, cudnn, c, f, f + kc, f + vc, o, lse, static_cast<T*>(nullptr), dO, g, g + kc, g + vc,
                     rt::AttnRows{W, W, W});
    return {{"o", get(m, o, nq)}, {"lse", get(m, lse, c.B * c.H * c.S)}, {"dqkv", get(m, g, nf)}};
  }
  const T* q = m.upload(randomT<T>(32, nq, -2.f, 2.f));
  const T* k = m.upload(randomT<T>(33, nkv, -2.f, 2.f));
  const T* v = m.upload(randomT<T>(34, nkv));
  const int64_t np = c.B * c.H * c.S * c.Skv;
  T* P = c.materialised ? m.template zeros<T>(np) : nullptr;
  T* dq = m.template zeros<T>(nq);
  T* dk = m.template zeros<T>(nkv);
  T* dv = m.upload(randomT<T>(36, nkv));  // overwritten (accumulate = false)
  attentionCall<T>(ctx, cudnn, c, q, k, v, o, lse, P, dO, dq, dk, dv, rt::AttnRows{});
  Outputs out{{"o", get(m, o, nq)}, {"dq", get(m, dq, nq)}, {"dk", get(m, dk, nkv)}, {"dv", get(m, dv, nkv)}};
  if (lse) out["lse"] = get(m, lse, c.B * c.H * c.S);
  if (P) out["P"] = get(m, P, np);
  return out;
}

#ifdef TALLY_CHECK_CUDNN
/// The attention cases cuDNN's fused attention takes (tally_check::cudnnTakes), run on it:
/// "<case> [cudnn]", compared with the CPU's "<case>". A case cuDNN fails (no engine for the
/// graph, a refused descriptor) comes back with its error, so one GPU run reports every case.
template <class T> std::vector<CaseResult> runCudnnCases(rt::Ctx& ctx, Mem& m, const std::string& dt) {
  std::vector<CaseResult> res;
  for (const tally_check::AttnCase& c : tally_check::attentionCases()) {
    if (!tally_check::cudnnTakes(c)) continue;
    CaseResult r{std::string(c.name) + " [cudnn]", dt, {}};
    try {
      r.out = attentionCase<T>(ctx, m, c, true);
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    res.push_back(std::move(r));
  }
  return res;
}
#endif

/// Every case for storage type T, in a fixed order.
template <class T> std::vector<CaseResult> runCases(rt::Ctx& ctx, Mem& m, const std::string& dt) {
  std::vector<CaseResult> res;
  auto add = [&](const std::string& k, Outputs o) { res.push_back({k, dt, std::move(o)}); };

  {  // matmul: plain, transposed operands with padded leading dimensions, alpha/beta
    const int64_t M = 67, N = 45, K = 130;
    const T* A = m.upload(randomT<T>(1, M * K));
    const T* B = m.upload(randomT<T>(2, K * N));
    T* C = m.upload(randomT<T>(3, M * N));
    rt::matmul<T>(ctx, false, false, M, N, K, 1.f, A, K, 0, B, N, 0, 0.f, C, N, 0, 1);
    Outputs o{{"C", get(m, C, M * N)}};
    const T* At = m.upload(randomT<T>(4, K * (M + 3)));  // [K, M] with ld M + 3
    const T* Bt = m.upload(randomT<T>(5, N * (K + 5)));  // [N, K] with ld K + 5
    T* C2 = m.upload(randomT<T>(6, M * (N + 2)));
    rt::matmul<T>(ctx, true, true, M, N, K, 0.5f, At, M + 3, 0, Bt, K + 5, 0, 0.25f, C2, N + 2, 0, 1);
    o["C_tt_beta"] = get(m, C2, M * (N + 2));
    add("matmul", o);
  }
  {  // matmul_bias: cuBLASLt's bias epilogue (the bias over the row-major C's columns), transposed too
    const int64_t M = 67, N = 45, K = 130;
    const T* A = m.upload(randomT<T>(64, M * K));
    const T* B = m.upload(randomT<T>(65, K * N));
    const T* bias = m.upload(randomT<T>(66, N));
    T* C = m.template zeros<T>(M * N);
    rt::matmul_bias<T>(ctx, false, false, M, N, K, A, K, B, N, bias, C, N);
    Outputs o{{"C", get(m, C, M * N)}};
    T* Ct = m.template zeros<T>(M * N);
    rt::matmul_bias<T>(ctx, true, true, M, N, K, A, M, B, K, bias, Ct, N);  // A, B read as [K, M], [N, K]
    o["C_tt"] = get(m, Ct, M * N);
    add("matmul_bias", o);
  }
  {  // batched matmul with a broadcast (stride 0) right operand, as attention's materialised path
    const int64_t M = 33, N = 17, K = 64, batch = 5;
    const T* A = m.upload(randomT<T>(7, batch * M * K));
    const T* B = m.upload(randomT<T>(8, K * N));
    T* C = m.template zeros<T>(batch * M * N);
    rt::matmul<T>(ctx, false, false, M, N, K, 1.f, A, K, M * K, B, N, 0, 0.f, C, N, M * N, batch);
    add("matmul_batched", {{"C", get(m, C, batch * M * N)}});
  }
  {  // binary with broadcasting: a [4, 5, 6] op b [1, 5, 1]
    const int64_t shape[3] = {4, 5, 6}, as[3] = {30, 6, 1}, bs[3] = {0, 1, 0};
    const T* a = m.upload(randomT<T>(9, 120));
    const T* b = m.upload(randomT<T>(10, 5, 0.5f, 2.f));
    Outputs o;
    const char* names[4] = {"add", "sub", "mul", "div"};
    for (int op = 0; op < 4; ++op) {
      T* out = m.upload(randomT<T>(11, 120));
      rt::binary<T>(ctx, static_cast<rt::BinOp>(op), a, as, b, bs, out, shape, 3, op == 0);
      o[names[op]] = get(m, out, 120);
    }
    T* out = m.template zeros<T>(120);
    rt::binary_scalar<T>(ctx, rt::BinOp::Div, a, 3.f, true, out, 120, false);
    o["scalar_left_div"] = get(m, out, 120);
    add("binary", o);
  }
  {  // reduce_to: [4, 5, 6] → [1, 5, 1] (bias-style gradient), accumulated, scaled
    const int64_t shape[3] = {4, 5, 6}, os[3] = {0, 1, 0};
    const T* x = m.upload(randomT<T>(12, 120));
    T* out = m.upload(randomT<T>(13, 5));
    rt::reduce_to<T>(ctx, x, shape, 3, out, os, 0.5f, true);
    add("reduce_to", {{"out", get(m, out, 5)}});
  }
  {  // unary forward and backward for every op
    const int64_t n = 1000;
    const T* x = m.upload(randomT<T>(14, n, -4.f, 4.f));
    const T* dy = m.upload(randomT<T>(15, n));
    Outputs o;
    const char* names[8] = {"neg", "relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid", "exp"};
    for (int op = 0; op < 8; ++op) {
      T* y = m.template zeros<T>(n);
      T* dx = m.upload(randomT<T>(16, n));
      rt::unary_fwd<T>(ctx, static_cast<rt::UnOp>(op), x, y, n);
      rt::unary_bwd<T>(ctx, static_cast<rt::UnOp>(op), x, y, dy, dx, n, true);
      o[std::string(names[op]) + ".y"] = get(m, y, n);
      o[std::string(names[op]) + ".dx"] = get(m, dx, n);
    }
    add("unary", o);
  }
  {  // dropout: masks must be bit-identical (Philox)
    const int64_t n = 4099;
    const T* x = m.upload(randomT<T>(17, n));
    T* y = m.template zeros<T>(n);
    uint8_t* mask = m.template zeros<uint8_t>(n);
    rt::dropout_fwd<T>(ctx, x, y, mask, n, 0.3f, 1234, 7);
    T* dx = m.template zeros<T>(n);
    T* dx2 = m.template zeros<T>(n);
    rt::dropout_bwd<T>(ctx, x, mask, dx, n, 0.3f, 1234, 7, false);
    rt::dropout_bwd<T>(ctx, x, static_cast<const uint8_t*>(nullptr), dx2, n, 0.3f, 1234, 7, false);
    add("dropout_mask", {{"mask", getU8(m, mask, n)}});
    add("dropout", {{"y", get(m, y, n)}, {"dx_mask", get(m, dx, n)}, {"dx_regen", get(m, dx2, n)}});
  }
  {  // rope with and without positions
    const int64_t B = 2, S = 7, H = 3, hd = 16, n = B * S * H * hd;
    const T* x = m.upload(randomT<T>(18, n));
    std::vector<int32_t> pos{5, 3, 9, 0, 1, 2, 100};
    const int32_t* p = m.upload(pos);
    T* y = m.template zeros<T>(n);
    T* y2 = m.template zeros<T>(n);
    T* dx = m.upload(randomT<T>(19, n));
    rt::rope_fwd<T>(ctx, x, y, static_cast<const int32_t*>(nullptr), B, S, H, hd, 10000.f);
    rt::rope_fwd<T>(ctx, x, y2, p, B, S, H, hd, 500000.f);
    rt::rope_bwd<T>(ctx, x, dx, p, B, S, H, hd, 500000.f, true);
    add("rope", {{"y", get(m, y, n)}, {"y_pos", get(m, y2, n)}, {"dx", get(m, dx, n)}});
  }
  {  // softmax
    const int64_t rows = 37, cols = 301;
    const T* x = m.upload(randomT<T>(20, rows * cols, -5.f, 5.f));
    const T* dy = m.upload(randomT<T>(21, rows * cols));
    T* y = m.template zeros<T>(rows * cols);
    T* dx = m.template zeros<T>(rows * cols);
    rt::softmax_fwd<T>(ctx, x, y, rows, cols);
    rt::softmax_bwd<T>(ctx, y, dy, dx, rows, cols, false);
    add("softmax", {{"y", get(m, y, rows * cols)}, {"dx", get(m, dx, rows * cols)}});
  }
  for (int bias = 0; bias < 2; ++bias) {  // layer norm, with and without bias
    const int64_t rows = 70, cols = 200;
    const T* x = m.upload(randomT<T>(22, rows * cols, -2.f, 3.f));
    const T* w = m.upload(randomT<T>(23, cols, 0.5f, 1.5f));
    const T* b = bias ? m.upload(randomT<T>(24, cols)) : nullptr;
    const T* dy = m.upload(randomT<T>(25, rows * cols));
    T* y = m.template zeros<T>(rows * cols);
    float* mean = m.template zeros<float>(rows);
    float* rstd = m.template zeros<float>(rows);
    T* dx = m.template zeros<T>(rows * cols);
    T* dw = m.upload(randomT<T>(26, cols));
    T* db = bias ? m.upload(randomT<T>(27, cols)) : nullptr;
    rt::layer_norm_fwd<T>(ctx, x, w, b, y, mean, rstd, rows, cols, 1e-5f);
    rt::layer_norm_bwd<T>(ctx, x, w, mean, rstd, dy, dx, dw, db, rows, cols, false);
    T* dxOnly = m.template zeros<T>(rows * cols);  // dw, db null: only the input gradient
    rt::layer_norm_bwd<T>(ctx, x, w, mean, rstd, dy, dxOnly, static_cast<T*>(nullptr), static_cast<T*>(nullptr),
                          rows, cols, false);
    Outputs o{{"y", get(m, y, rows * cols)}, {"mean", get(m, mean, rows)}, {"rstd", get(m, rstd, rows)},
              {"dx", get(m, dx, rows * cols)}, {"dw", get(m, dw, cols)}, {"dx_only", get(m, dxOnly, rows * cols)}};
    if (bias) o["db"] = get(m, db, cols);
    add(bias ? "layer_norm" : "layer_norm_nobias", o);
  }
  {  // layer norm without a weight or a bias (w, b, dw, db null: OLMo 1's norm)
    const int64_t rows = 70, cols = 200;
    const T* x = m.upload(randomT<T>(22, rows * cols, -2.f, 3.f));
    const T* dy = m.upload(randomT<T>(25, rows * cols));
    T* y = m.template zeros<T>(rows * cols);
    float* mean = m.template zeros<float>(rows);
    float* rstd = m.template zeros<float>(rows);
    T* dx = m.upload(randomT<T>(28, rows * cols));  // accumulated into
    const T* none = nullptr;
    rt::layer_norm_fwd<T>(ctx, x, none, none, y, mean, rstd, rows, cols, 1e-5f);
    rt::layer_norm_bwd<T>(ctx, x, none, mean, rstd, dy, dx, static_cast<T*>(nullptr), static_cast<T*>(nullptr), rows,
                          cols, true);
    add("layer_norm_noaffine", {{"y", get(m, y, rows * cols)}, {"mean", get(m, mean, rows)},
                                {"rstd", get(m, rstd, rows)}, {"dx", get(m, dx, rows * cols)}});
  }
  {  // fused: a generated functor alone, and as the prologue of a layer and an RMS norm
    const int64_t rows = 70, cols = 200;
    const T* x = m.upload(randomT<T>(60, rows * cols, -2.f, 2.f));
    const T* bias = m.upload(randomT<T>(61, cols));
    const T* w = m.upload(randomT<T>(62, cols, 0.5f, 1.5f));
    const T* b = m.upload(randomT<T>(63, cols));
    T* pre = m.template zeros<T>(rows * cols);
    T* act = m.template zeros<T>(rows * cols);
    rt::fused(ctx, rows * cols, BiasGelu<T>{x, bias, pre, act, cols});
    Outputs o{{"pre", get(m, pre, rows * cols)}, {"act", get(m, act, rows * cols)}};
    T* act2 = m.template zeros<T>(rows * cols);
    T* y = m.template zeros<T>(rows * cols);
    float* mean = m.template zeros<float>(rows);
    float* rstd = m.template zeros<float>(rows);
    rt::layer_norm_fwd_fused<T>(ctx, BiasGelu<T>{x, bias, pre, act2, cols}, act2, w, b, y, mean, rstd, rows, cols,
                                1e-5f);
    o["ln_x"] = get(m, act2, rows * cols);
    o["ln_y"] = get(m, y, rows * cols);
    o["ln_mean"] = get(m, mean, rows);
    o["ln_rstd"] = get(m, rstd, rows);
    T* act3 = m.template zeros<T>(rows * cols);
    T* yr = m.template zeros<T>(rows * cols);
    float* rstdR = m.template zeros<float>(rows);
    rt::rms_norm_fwd_fused<T>(ctx, BiasGelu<T>{x, bias, pre, act3, cols}, act3, w, yr, rstdR, rows, cols, 1e-6f);
    o["rms_x"] = get(m, act3, rows * cols);
    o["rms_y"] = get(m, yr, rows * cols);
    o["rms_rstd"] = get(m, rstdR, rows);
    add("fused", o);
  }
  {  // RMS norm
    const int64_t rows = 50, cols = 256;
    const T* x = m.upload(randomT<T>(28, rows * cols, -2.f, 2.f));
    const T* w = m.upload(randomT<T>(29, cols, 0.5f, 1.5f));
    const T* dy = m.upload(randomT<T>(30, rows * cols));
    T* y = m.template zeros<T>(rows * cols);
    float* rstd = m.template zeros<float>(rows);
    T* dx = m.upload(randomT<T>(31, rows * cols));
    T* dw = m.template zeros<T>(cols);
    rt::rms_norm_fwd<T>(ctx, x, w, y, rstd, rows, cols, 1e-6f);
    rt::rms_norm_bwd<T>(ctx, x, w, rstd, dy, dx, dw, rows, cols, true);
    add("rms_norm", {{"y", get(m, y, rows * cols)}, {"rstd", get(m, rstd, rows)}, {"dx", get(m, dx, rows * cols)},
                     {"dw", get(m, dw, cols)}});
  }
  for (const tally_check::AttnCase& c : tally_check::attentionCases()) add(c.name, attentionCase<T>(ctx, m, c, false));
  {  // embedding, with repeated ids (the scatter-add)
    const int64_t rows = 300, d = 96, vocab = 37;
    std::vector<int32_t> ids(rows);
    Rng r(37);
    for (auto& i : ids) i = r.below(static_cast<int32_t>(vocab));
    const int32_t* id = m.upload(ids);
    const T* w = m.upload(randomT<T>(38, vocab * d));
    const T* dy = m.upload(randomT<T>(39, rows * d));
    T* out = m.template zeros<T>(rows * d);
    T* dw = m.upload(randomT<T>(40, vocab * d));
    rt::embedding_fwd<T>(ctx, id, w, out, rows, d, vocab);
    rt::embedding_bwd<T>(ctx, id, dy, dw, rows, d, vocab);
    add("embedding", {{"out", get(m, out, rows * d)}, {"dw", get(m, dw, vocab * d)}});
  }
  {  // cross-entropy with ignored rows
    const int64_t rows = 40, V = 1000;
    std::vector<int32_t> labels(rows);
    Rng r(41);
    for (auto& l : labels) l = r.below(static_cast<int32_t>(V));
    labels[3] = labels[17] = -1;
    const int32_t* lab = m.upload(labels);
    const T* logits = m.upload(randomT<T>(42, rows * V, -6.f, 6.f));
    float* loss = m.template zeros<float>(1);
    float* lse = m.template zeros<float>(rows);
    const float* dloss = m.upload(std::vector<float>{0.75f});
    T* dl = m.template zeros<T>(rows * V);
    rt::cross_entropy_fwd<T>(ctx, logits, lab, loss, lse, rows, V);
    rt::cross_entropy_bwd<T>(ctx, logits, lab, lse, dloss, dl, rows, V, false);
    add("cross_entropy", {{"loss", get(m, loss, 1)}, {"lse", get(m, lse, rows)}, {"dlogits", get(m, dl, rows * V)}});
  }
  {  // sum over the middle axis, the last axis, and everything; backward
    const T* x = m.upload(randomT<T>(43, 3 * 50 * 7));
    T* y1 = m.template zeros<T>(21);
    T* y2 = m.template zeros<T>(150);
    T* y3 = m.template zeros<T>(1);
    rt::sum_fwd<T>(ctx, x, y1, 3, 50, 7, false);
    rt::sum_fwd<T>(ctx, x, y2, 150, 7, 1, true);
    rt::sum_fwd<T>(ctx, x, y3, 1, 1050, 1, true);
    T* dx = m.upload(randomT<T>(44, 1050));
    rt::sum_bwd<T>(ctx, static_cast<const T*>(y1), dx, 3, 50, 7, true, true);
    add("sum", {{"axis1", get(m, y1, 21)}, {"last_mean", get(m, y2, 150)}, {"all_mean", get(m, y3, 1)},
                {"dx", get(m, dx, 1050)}});
  }
  {  // copy: a transposed view into dense, converting to float and back, accumulated strided
    const int64_t shape[2] = {12, 9}, srcT[2] = {1, 12}, dense[2] = {9, 1}, dstPad[2] = {11, 1};
    const T* x = m.upload(randomT<T>(45, 108));
    float* f = m.template zeros<float>(108);
    rt::copy<T, float>(ctx, x, srcT, f, nullptr, shape, 2, false);
    T* back = m.upload(randomT<T>(46, 12 * 11));
    rt::copy<float, T>(ctx, f, dense, back, dstPad, shape, 2, true);
    add("copy", {{"dense_f32", get(m, f, 108)}, {"strided_acc", get(m, back, 12 * 11)}});
  }
  {  // index helpers, fill, scale, sum_squares
    int32_t* pos = m.template zeros<int32_t>(10);
    rt::positions(ctx, pos, 10);
    std::vector<int32_t> tok(2 * 6);
    for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>(i * 7 % 13);
    const int32_t* t = m.upload(tok);
    int32_t* lab = m.template zeros<int32_t>(12);
    rt::next_tokens(ctx, t, lab, 2, 6);
    T* x = m.upload(randomT<T>(47, 5000));
    rt::scale<T>(ctx, x, 0.5f, 5000);
    float* ss = m.template zeros<float>(1);
    rt::sum_squares<T>(ctx, x, 5000, ss);
    T* z = m.template zeros<T>(77);
    rt::fill<T>(ctx, z, 2.5f, 77);
    add("index_fill_scale", {{"positions", getI(m, pos, 10)}, {"next_tokens", getI(m, lab, 12)},
                             {"scaled", get(m, x, 5000)}, {"fill", get(m, z, 77)}});
    add("sum_squares", {{"sum", get(m, ss, 1)}});
  }
  {  // optimizers: three steps each over one flat region, with a refreshed model copy
    const int64_t n = 3001;
    const T* g = m.upload(randomT<T>(48, n));
    Outputs o;
    auto state = [&](uint64_t seed) { return m.upload(randomF(seed, n)); };
    auto sq = [&](uint64_t seed) { return m.upload(randomF(seed, n, 0.f, 1.f)); };
    {
      float* p = state(49); T* pm = m.template zeros<T>(n); float* mom = state(50);
      for (int s = 0; s < 3; ++s) rt::sgd_update<T>(ctx, p, pm, g, mom, n, 0.1f, 0.9f, 0.01f, 0.5f);
      o["sgd.p"] = get(m, p, n); o["sgd.pm"] = get(m, pm, n); o["sgd.mom"] = get(m, mom, n);
    }
    {
      float* p = state(51); T* pm = m.template zeros<T>(n); float* sum = sq(52);
      for (int s = 0; s < 3; ++s) rt::adagrad_update<T>(ctx, p, pm, g, sum, n, 0.1f, 1e-10f, 0.01f, 1.f);
      o["adagrad.p"] = get(m, p, n); o["adagrad.sum"] = get(m, sum, n);
    }
    {
      float* p = state(53); T* pm = m.template zeros<T>(n); float* s2 = sq(54); float* buf = state(55);
      for (int s = 0; s < 3; ++s) rt::rmsprop_update<T>(ctx, p, pm, g, s2, buf, n, 0.01f, 0.99f, 1e-8f, 0.f, 0.9f, 1.f);
      o["rmsprop.p"] = get(m, p, n); o["rmsprop.buf"] = get(m, buf, n);
    }
    for (int dec = 0; dec < 2; ++dec) {
      float* p = state(56); T* pm = m.template zeros<T>(n); float* mm = m.template zeros<float>(n);
      float* vv = m.template zeros<float>(n);
      for (int s = 1; s <= 3; ++s) rt::adam_update<T>(ctx, p, pm, g, mm, vv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, dec != 0, s, 0.8f);
      const std::string k = dec ? "adamw" : "adam";
      o[k + ".p"] = get(m, p, n); o[k + ".pm"] = get(m, pm, n); o[k + ".m"] = get(m, mm, n); o[k + ".v"] = get(m, vv, n);
    }
    {
      float* p = state(57); T* pm = m.template zeros<T>(n); float* mm = state(58);
      for (int s = 0; s < 3; ++s) rt::lion_update<T>(ctx, p, pm, g, mm, n, 1e-4f, 0.9f, 0.99f, 0.1f, 1.f);
      o["lion.p"] = get(m, p, n); o["lion.m"] = get(m, mm, n);
    }
    add("optimizers", o);
  }
  return res;
}

}  // namespace TALLY_CHECK_NS
