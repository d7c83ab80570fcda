// step_attn_rows.cpp — attention with row-strided q, k, v (rt::AttnRows): q, k and v read as
// column slices of one fused projection buffer, and dq, dk, dv written into (or added to) the
// same slices of its gradient. Each call must equal the dense call on copies of the slices
// exactly (the kernels stage the same values and do the same arithmetic), and the columns the
// call does not own (padding filled with a sentinel) must be left alone. One thread, so that the
// order in which grouped-query heads add into dk/dv is the same in both calls.
#include "StepSupport.h"

#include "../../codegen/runtime/cuda/launch.h"   // host-only planning: cuda_plan::checkAttentionRows

using namespace step;

namespace {

/// A fused buffer's layout: per row, q (H·hd) when fusedQ, then k (Hkv·hd), v (Hkv·hd), then
/// `pad` columns that belong to no one. Without fusedQ, q is a dense buffer of its own and the
/// fused buffer holds k and v only.
struct Layout {
  int64_t B, S, Skv, H, Hkv, hd, pad;
  bool fusedQ;
  int64_t qw() const { return H * hd; }
  int64_t kw() const { return Hkv * hd; }
  int64_t width() const { return (fusedQ ? qw() : 0) + 2 * kw() + pad; }
  int64_t qcol() const { return 0; }
  int64_t kcol() const { return fusedQ ? qw() : 0; }
  int64_t vcol() const { return kcol() + kw(); }
};

constexpr double kSentinel = 7.0;

/// Columns [c0, c0 + w) of a [rows, W] buffer, densely.
template <class T>
std::vector<T> slice(const std::vector<T>& x, int64_t rows, int64_t W, int64_t c0, int64_t w) {
  std::vector<T> r(static_cast<size_t>(rows * w));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < w; ++c) r[i * w + c] = x[i * W + c0 + c];
  return r;
}

/// Exact equality of two storage vectors (through load: bf16 bits compare as floats).
template <class T> void expect_equal(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(rt::load(got[i]) == rt::load(want[i]))) ++bad;
  CHECK(bad == 0);
}

/// Runs attention fwd + bwd on the layout, strided and dense, and compares.
template <class T>
void check_layout(const Layout& L, bool materialised, bool accumulate, float p) {
  INFO("B " << L.B << " S " << L.S << " Skv " << L.Skv << " H " << L.H << " Hkv " << L.Hkv << " hd " << L.hd
            << " pad " << L.pad << (L.fusedQ ? " fused q" : " separate q") << (materialised ? " materialised" : " fused")
            << (accumulate ? " accumulate" : " overwrite") << " p " << p);
  rt::Ctx c1;
  c1.threads = 1;
  const int64_t W = L.width(), qw = L.qw(), kw = L.kw();
  const int64_t qRows = L.B * L.S, kvRows = L.B * L.Skv;
  REQUIRE((!L.fusedQ || L.S == L.Skv));   // q shares its rows with k and v
  // The fused input: random everywhere (padding included: it must not be read into anything).
  std::vector<T> fused = to<T>(uniform(static_cast<size_t>(kvRows * W), 601, -2.0, 2.0));
  std::vector<T> qsep = to<T>(uniform(static_cast<size_t>(qRows * qw), 602, -2.0, 2.0));
  const T* qs = L.fusedQ ? fused.data() + L.qcol() : qsep.data();
  const T* ks = fused.data() + L.kcol();
  const T* vs = fused.data() + L.vcol();
  const rt::AttnRows rows{L.fusedQ ? W : 0, W, W};
  // Dense copies.
  std::vector<T> q = L.fusedQ ? slice(fused, qRows, W, L.qcol(), qw) : qsep;
  std::vector<T> k = slice(fused, kvRows, W, L.kcol(), kw), v = slice(fused, kvRows, W, L.vcol(), kw);
  std::vector<T> dO = to<T>(uniform(static_cast<size_t>(qRows * qw), 603));
  const int64_t nlse = L.B * L.H * L.S, nP = L.B * L.H * L.S * L.Skv;

  // Forward, dense and strided: o, lse, P are dense in both.
  std::vector<T> o1(qRows * qw), o2(qRows * qw), P1(materialised ? nP : 0), P2(materialised ? nP : 0);
  std::vector<float> lse1(nlse), lse2(nlse);
  rt::attention_fwd<T>(c1, q.data(), k.data(), v.data(), o1.data(), lse1.data(), materialised ? P1.data() : nullptr,
                       L.B, L.S, L.Skv, L.H, L.Hkv, L.hd, 0.0f, true, p, 11, 12);
  rt::attention_fwd<T>(c1, qs, ks, vs, o2.data(), lse2.data(), materialised ? P2.data() : nullptr, L.B, L.S, L.Skv,
                       L.H, L.Hkv, L.hd, 0.0f, true, p, 11, 12, rows);
  expect_equal("o", o2, o1);
  expect_equal("lse", lse2, lse1);
  if (materialised) expect_equal("P", P2, P1);

  // Backward. The gradient buffers start as random values when accumulating, else a sentinel
  // (which overwriting must replace); padding columns are always the sentinel.
  auto start = [&](int64_t rowsN, int64_t Wn, int64_t ownedCols, uint64_t seed) {
    std::vector<T> g = accumulate ? to<T>(uniform(static_cast<size_t>(rowsN * Wn), seed)) : std::vector<T>(rowsN * Wn);
    for (int64_t i = 0; i < rowsN; ++i)
      for (int64_t c = 0; c < Wn; ++c)
        if (!accumulate || c >= ownedCols) g[i * Wn + c] = rt::store<T>(static_cast<rt::acc_t<T>>(kSentinel));
    return g;
  };
  std::vector<T> dfused = start(kvRows, W, W - L.pad, 604);
  std::vector<T> dqsep = start(qRows, qw, qw, 605);
  T* dqs = L.fusedQ ? dfused.data() + L.qcol() : dqsep.data();
  std::vector<T> dq = L.fusedQ ? slice(dfused, qRows, W, L.qcol(), qw) : dqsep;
  std::vector<T> dk = slice(dfused, kvRows, W, L.kcol(), kw), dv = slice(dfused, kvRows, W, L.vcol(), kw);
  rt::attention_bwd<T>(c1, q.data(), k.data(), v.data(), o1.data(), lse1.data(), materialised ? P1.data() : nullptr,
                       dO.data(), dq.data(), dk.data(), dv.data(), L.B, L.S, L.Skv, L.H, L.Hkv, L.hd, 0.0f, true, p, 11,
                       12, accumulate);
  rt::attention_bwd<T>(c1, qs, ks, vs, o2.data(), lse2.data(), materialised ? P2.data() : nullptr, dO.data(), dqs,
                       dfused.data() + L.kcol(), dfused.data() + L.vcol(), L.B, L.S, L.Skv, L.H, L.Hkv, L.hd, 0.0f,
                       true, p, 11, 12, accumulate, rows);
  expect_equal("dq", L.fusedQ ? slice(dfused, qRows, W, L.qcol(), qw) : dqsep, dq);
  expect_equal("dk", slice(dfused, kvRows, W, L.kcol(), kw), dk);
  expect_equal("dv", slice(dfused, kvRows, W, L.vcol(), kw), dv);
  // The dense call really produced gradients (not the sentinel), and padding kept the sentinel.
  int64_t sentinelInDq = 0;
  for (const T& x : dq) sentinelInDq += rt::load(x) == kSentinel;
  CHECK(sentinelInDq == 0);
  std::vector<T> padding = slice(dfused, kvRows, W, W - L.pad, L.pad);
  int64_t changed = 0;
  for (const T& x : padding) changed += !(rt::load(x) == kSentinel);
  CHECK(changed == 0);
}

} // namespace

TEST_CASE("attention: q, k, v as row-strided parts of one qkv buffer equal the dense call", "[attention]") {
  // q, k, v the three parts of [B, S, 3·H·hd] plus 3 padding columns; S = 70 spans two query blocks.
  const Layout mha{2, 70, 70, 2, 2, 8, 3, true};
  // Grouped-query: k and v narrower than q ([B, S, (4 + 2·2)·hd]).
  const Layout gqa{2, 33, 33, 4, 2, 8, 0, true};
  // q dense on its own, k and v row-strided parts of a kv buffer with Skv != S.
  const Layout cross{1, 9, 21, 4, 1, 16, 5, false};
  for (const Layout* L : {&mha, &gqa, &cross}) {
    for (bool materialised : {false, true}) {
      for (bool accumulate : {false, true}) {
        check_layout<float>(*L, materialised, accumulate, 0.0f);
        check_layout<rt::bf16>(*L, materialised, accumulate, 0.0f);
      }
    }
    check_layout<double>(*L, false, true, 0.1f);   // dropout, fp64's own lse path
    check_layout<rt::f16>(*L, true, false, 0.1f);
  }
}

TEST_CASE("attention: a row stride smaller than the width is rt::Error", "[attention][errors]") {
  rt::Ctx c;
  std::vector<float> x(64), o(64), lse(8);
  // H = 2, hd = 4: q's width is 8; Hkv = 1: k and v are 4 wide.
  CHECK_THROWS_WITH(rt::attention_fwd<float>(c, x.data(), x.data(), x.data(), o.data(), lse.data(), nullptr, 1, 4, 4, 2,
                                             1, 4, 0.0f, true, 0.0f, 0, 0, rt::AttnRows{7, 0, 0}),
                    Catch::Contains("rt::attention_fwd") && Catch::Contains("q row stride 7") &&
                        Catch::Contains("width 8"));
  CHECK_THROWS_WITH(rt::attention_bwd<float>(c, x.data(), x.data(), x.data(), o.data(), lse.data(), nullptr, x.data(),
                                             o.data(), o.data(), o.data(), 1, 4, 4, 2, 1, 4, 0.0f, true, 0.0f, 0, 0,
                                             false, rt::AttnRows{0, 4, 3}),
                    Catch::Contains("rt::attention_bwd") && Catch::Contains("v row stride 3") &&
                        Catch::Contains("width 4"));
  CHECK_THROWS_WITH(rt::attention_fwd<float>(c, x.data(), x.data(), x.data(), o.data(), lse.data(), nullptr, 1, 4, 4, 2,
                                             1, 4, 0.0f, true, 0.0f, 0, 0, rt::AttnRows{0, -4, 0}),
                    Catch::Contains("k row stride -4"));
  // Exactly the width is accepted (the same as dense).
  CHECK_NOTHROW(rt::attention_fwd<float>(c, x.data(), x.data(), x.data(), o.data(), lse.data(), nullptr, 1, 4, 4, 2, 1,
                                         4, 0.0f, true, 0.0f, 0, 0, rt::AttnRows{8, 4, 4}));
}

// The CUDA runtime's host-side check of the same rule (codegen/runtime/cuda/launch.h, plain C++).
TEST_CASE("attention: the CUDA runtime's row-stride check", "[attention][errors]") {
  using rt::cuda_plan::checkAttentionRows;
  CHECK(checkAttentionRows(4, 2, 8, 0, 0, 0).empty());       // dense
  CHECK(checkAttentionRows(4, 2, 8, 64, 64, 64).empty());    // q, k, v parts of [.., (4 + 2·2)·8]
  CHECK(checkAttentionRows(4, 2, 8, 32, 16, 16).empty());    // exactly the widths
  CHECK(checkAttentionRows(4, 2, 8, 31, 0, 0) == "q row stride 31 is smaller than its width 32");
  CHECK(checkAttentionRows(4, 2, 8, 0, 15, 0) == "k row stride 15 is smaller than its width 16");
  CHECK(checkAttentionRows(4, 2, 8, 0, 0, -1) == "v row stride -1 is smaller than its width 16");
}
