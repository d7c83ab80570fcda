// step_torch.cpp — the runtime against PyTorch: torch_reference.py (run by ctest first) writes
// inputs and torch's outputs and gradients into $TALLY_TORCH_DATA; each case here runs our fp32
// kernels on the same inputs and compares. Tolerance: relative 1e-5 (plus an absolute floor of
// 1e-6 for values near 0, where a relative bound is meaningless); attention's gradients 2e-5
// relative (longer fp32 reductions in a different order). Tagged [torch]: `step` excludes them,
// `step-torch` runs them. Without torch the script leaves a SKIPPED file and these print its reason.
#include "StepSupport.h"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>

using namespace step;

namespace {

rt::Ctx ctx;

/// The tensors torch_reference.py wrote: index.txt lines `NAME DTYPE NDIM DIMS...`, NAME.bin raw.
class Ref {
 public:
  /// Loads the index; returns false (with the reason in `why`) when the data is skipped or absent.
  bool open(std::string& why) {
    const char* dir = std::getenv("TALLY_TORCH_DATA");
    if (!dir) { why = "TALLY_TORCH_DATA is not set (ctest sets it after running torch_reference.py)"; return false; }
    dir_ = dir;
    std::ifstream skipped(dir_ + "/SKIPPED");
    if (skipped) { std::getline(skipped, why); skipped_ = true; return false; }
    std::ifstream idx(dir_ + "/index.txt");
    if (!idx) { why = "no " + dir_ + "/index.txt (torch_reference.py did not run)"; return false; }
    std::string name, dtype;
    int ndim;
    while (idx >> name >> dtype >> ndim) {
      std::vector<int64_t> shape(ndim);
      for (auto& d : shape) idx >> d;
      shapes_[name] = shape;
    }
    return true;
  }
  bool skipped() const { return skipped_; }

  /// An f32 tensor as doubles.
  Vec f(const std::string& name) const {
    std::vector<float> raw = read<float>(name);
    return Vec(raw.begin(), raw.end());
  }
  /// An f32 tensor as floats.
  std::vector<float> f32(const std::string& name) const { return read<float>(name); }
  /// An i32 tensor.
  std::vector<int32_t> i(const std::string& name) const { return read<int32_t>(name); }

 private:
  template <class X> std::vector<X> read(const std::string& name) const {
    auto it = shapes_.find(name);
    INFO("reference tensor " << name);
    REQUIRE(it != shapes_.end());
    int64_t n = 1;
    for (int64_t d : it->second) n *= d;
    std::vector<X> v(static_cast<size_t>(n));
    std::ifstream in(dir_ + "/" + name + ".bin", std::ios::binary);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(X)));
    REQUIRE(in.gcount() == static_cast<std::streamsize>(n * sizeof(X)));
    return v;
  }
  std::string dir_;
  bool skipped_ = false;
  std::map<std::string, std::vector<int64_t>> shapes_;
};

/// Opens the reference data, or ends the test case: a printed skip when torch is absent, a
/// failure when the data is missing for another reason.
#define OPEN_REF(ref)                                    \
  Ref ref;                                               \
  {                                                      \
    std::string why;                                     \
    if (!ref.open(why)) {                                \
      if (ref.skipped()) {                               \
        std::cout << "skipped: " << why << "\n";      \
        return;                                          \
      }                                                  \
      FAIL(why);                                         \
    }                                                    \
  }

const Tol kFp32{1e-5, 1e-6};
const Tol kAttentionGrad{2e-5, 2e-6};

Vec asVec(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

} // namespace

static Covers covTorchUnary(false, {"unary_fwd", "unary_bwd"});
TEST_CASE("torch: gelu (erf, tanh), silu, tanh, sigmoid, relu, exp, neg", "[torch]") {
  OPEN_REF(ref);
  auto x = ref.f32("unary.x"), dy = ref.f32("unary.dy");
  const int64_t n = static_cast<int64_t>(x.size());
  const std::pair<const char*, rt::UnOp> ops[] = {
      {"gelu", rt::UnOp::Gelu}, {"gelu_tanh", rt::UnOp::GeluTanh}, {"silu", rt::UnOp::Silu},
      {"tanh", rt::UnOp::Tanh}, {"sigmoid", rt::UnOp::Sigmoid}, {"relu", rt::UnOp::Relu},
      {"exp", rt::UnOp::Exp}, {"neg", rt::UnOp::Neg}};
  for (auto [name, op] : ops) {
    std::vector<float> y(n), dx(n);
    rt::unary_fwd<float>(ctx, op, x.data(), y.data(), n);
    rt::unary_bwd<float>(ctx, op, x.data(), y.data(), dy.data(), dx.data(), n, false);
    std::string pre = std::string("unary.") + name;
    expect_close(pre + ".y", asVec(y), ref.f(pre + ".y"), kFp32);
    expect_close(pre + ".dx", asVec(dx), ref.f(pre + ".dx"), kFp32);
  }
}

static Covers covTorchSoftmax(false, {"softmax_fwd", "softmax_bwd"});
TEST_CASE("torch: softmax", "[torch]") {
  OPEN_REF(ref);
  auto x = ref.f32("softmax.x"), dy = ref.f32("softmax.dy");
  std::vector<float> y(x.size()), dx(x.size());
  rt::softmax_fwd<float>(ctx, x.data(), y.data(), 5, 13);
  rt::softmax_bwd<float>(ctx, y.data(), dy.data(), dx.data(), 5, 13, false);
  expect_close("softmax y", asVec(y), ref.f("softmax.y"), kFp32);
  expect_close("softmax dx", asVec(dx), ref.f("softmax.dx"), kFp32);
}

static Covers covTorchNorms(false, {"layer_norm_fwd", "layer_norm_bwd", "rms_norm_fwd", "rms_norm_bwd"});
TEST_CASE("torch: layer_norm and RMS norm", "[torch]") {
  OPEN_REF(ref);
  const int64_t rows = 6, cols = 32;
  {
    auto x = ref.f32("layer_norm.x"), w = ref.f32("layer_norm.w"), b = ref.f32("layer_norm.b"), dy = ref.f32("layer_norm.dy");
    std::vector<float> y(x.size()), mean(rows), rstd(rows), dx(x.size()), dw(cols, 0.0f), db(cols, 0.0f);
    rt::layer_norm_fwd<float>(ctx, x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, cols, 1e-5f);
    rt::layer_norm_bwd<float>(ctx, x.data(), w.data(), mean.data(), rstd.data(), dy.data(), dx.data(), dw.data(),
                              db.data(), rows, cols, false);
    expect_close("layer_norm y", asVec(y), ref.f("layer_norm.y"), kFp32);
    expect_close("layer_norm dx", asVec(dx), ref.f("layer_norm.dx"), kFp32);
    expect_close("layer_norm dw", asVec(dw), ref.f("layer_norm.dw"), kFp32);
    expect_close("layer_norm db", asVec(db), ref.f("layer_norm.db"), kFp32);
  }
  {
    auto x = ref.f32("rms_norm.x"), w = ref.f32("rms_norm.w"), dy = ref.f32("rms_norm.dy");
    std::vector<float> y(x.size()), rstd(rows), dx(x.size()), dw(cols, 0.0f);
    rt::rms_norm_fwd<float>(ctx, x.data(), w.data(), y.data(), rstd.data(), rows, cols, 1e-6f);
    rt::rms_norm_bwd<float>(ctx, x.data(), w.data(), rstd.data(), dy.data(), dx.data(), dw.data(), rows, cols, false);
    expect_close("rms_norm y", asVec(y), ref.f("rms_norm.y"), kFp32);
    expect_close("rms_norm dx", asVec(dx), ref.f("rms_norm.dx"), kFp32);
    expect_close("rms_norm dw", asVec(dw), ref.f("rms_norm.dw"), kFp32);
  }
}

static Covers covTorchCe(false, {"cross_entropy_fwd", "cross_entropy_bwd"});
TEST_CASE("torch: cross_entropy with ignore_index = -1", "[torch]") {
  OPEN_REF(ref);
  auto logits = ref.f32("cross_entropy.logits");
  auto labels = ref.i("cross_entropy.labels");
  const int64_t rows = static_cast<int64_t>(labels.size()), V = static_cast<int64_t>(logits.size()) / rows;
  float loss = 0, dloss = 1.0f;
  std::vector<float> lse(rows), dl(logits.size());
  rt::cross_entropy_fwd<float>(ctx, logits.data(), labels.data(), &loss, lse.data(), rows, V);
  rt::cross_entropy_bwd<float>(ctx, logits.data(), labels.data(), lse.data(), &dloss, dl.data(), rows, V, false);
  expect_close("cross_entropy loss", Vec{loss}, ref.f("cross_entropy.loss"), kFp32);
  expect_close("cross_entropy dlogits", asVec(dl), ref.f("cross_entropy.dlogits"), kFp32);
}

static Covers covTorchEmb(false, {"embedding_fwd", "embedding_bwd"});
TEST_CASE("torch: embedding", "[torch]") {
  OPEN_REF(ref);
  auto w = ref.f32("embedding.w"), dy = ref.f32("embedding.dy");
  auto ids = ref.i("embedding.ids");
  const int64_t rows = 6, d = 5, vocab = 9;
  std::vector<float> y(rows * d), dw(vocab * d, 0.0f);
  rt::embedding_fwd<float>(ctx, ids.data(), w.data(), y.data(), rows, d, vocab);
  rt::embedding_bwd<float>(ctx, ids.data(), dy.data(), dw.data(), rows, d, vocab);
  expect_close("embedding y", asVec(y), ref.f("embedding.y"), kFp32);
  expect_close("embedding dw", asVec(dw), ref.f("embedding.dw"), kFp32);
}

static Covers covTorchRope(false, {"rope_fwd", "rope_bwd"});
TEST_CASE("torch: rotary embedding (rotate-half, explicit positions)", "[torch]") {
  OPEN_REF(ref);
  auto x = ref.f32("rope.x"), dy = ref.f32("rope.dy");
  auto pos = ref.i("rope.positions");
  const int64_t B = 2, S = 5, H = 3, hd = 8;
  std::vector<float> y(x.size()), dx(x.size());
  rt::rope_fwd<float>(ctx, x.data(), y.data(), pos.data(), B, S, H, hd, 10000.0f);
  rt::rope_bwd<float>(ctx, dy.data(), dx.data(), pos.data(), B, S, H, hd, 10000.0f, false);
  // Positions up to 2047: the fp32 angle p·inv_freq is computed the same way as torch, but
  // cos/sin of a large fp32 angle differ by an ulp of the angle between libms (~1e-4 · 2^-23 ·
  // 2047): an absolute 1e-5 floor.
  expect_close("rope y", asVec(y), ref.f("rope.y"), {1e-5, 1e-5});
  expect_close("rope dx", asVec(dx), ref.f("rope.dx"), {1e-5, 1e-5});
}

static Covers covTorchAttn(false, {"attention_fwd", "attention_bwd"});
TEST_CASE("torch: attention (causal grouped-query; cross with S != Skv; value heads unlike q's), fused and materialised", "[torch]") {
  OPEN_REF(ref);
  for (const char* tag : {"causal_gqa", "cross", "mla_values"}) {
    const std::string pre = std::string("attention.") + tag + ".";
    auto dims = ref.i(pre + "dims");
    const int64_t B = dims[0], S = dims[1], Skv = dims[2], H = dims[3], Hkv = dims[4], hd = dims[5];
    const bool causal = dims[6] != 0;
    const int64_t hv = dims[7];   // the value head size (MLA: unlike q/k's)
    auto q = ref.f32(pre + "q"), k = ref.f32(pre + "k"), v = ref.f32(pre + "v"), dO = ref.f32(pre + "dO");
    for (bool materialised : {false, true}) {
      std::vector<float> o(B * S * H * hv), lse(B * H * S), P(materialised ? B * H * S * Skv : 0);
      std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
      float* Pp = materialised ? P.data() : nullptr;
      rt::attention_fwd<float>(ctx, q.data(), k.data(), v.data(), o.data(), lse.data(), Pp, B, S, Skv, H, Hkv, hd,
                               0.0f, causal, 0.0f, 0, 0, {}, {}, hv);
      // Materialised: P only, as the plan keeps it (no o, no lse).
      rt::attention_bwd<float>(ctx, q.data(), k.data(), v.data(), materialised ? nullptr : o.data(),
                               materialised ? nullptr : lse.data(), Pp, dO.data(), dq.data(),
                               dk.data(), dv.data(), B, S, Skv, H, Hkv, hd, 0.0f, causal, 0.0f, 0, 0, false, {}, {}, hv);
      INFO(tag << (materialised ? " materialised" : " fused"));
      expect_close(pre + "o", asVec(o), ref.f(pre + "o"), kFp32);
      expect_close(pre + "lse", asVec(lse), ref.f(pre + "lse"), kFp32);
      expect_close(pre + "dq", asVec(dq), ref.f(pre + "dq"), kAttentionGrad);
      expect_close(pre + "dk", asVec(dk), ref.f(pre + "dk"), kAttentionGrad);
      expect_close(pre + "dv", asVec(dv), ref.f(pre + "dv"), kAttentionGrad);
    }
  }
}

static Covers covTorchMatmul(false, {"matmul"});
TEST_CASE("torch: batched matmul with a broadcast operand", "[torch]") {
  OPEN_REF(ref);
  auto A = ref.f32("matmul.A"), B = ref.f32("matmul.B");
  std::vector<float> C(3 * 4 * 6);
  rt::matmul<float>(ctx, false, false, 4, 6, 5, 1.0f, A.data(), 5, 20, B.data(), 6, 0, 0.0f, C.data(), 6, 24, 3);
  expect_close("matmul C", asVec(C), ref.f("matmul.C"), kFp32);
}

static Covers covTorchOptim(false, {"sgd_update", "adagrad_update", "rmsprop_update", "adam_update"});
TEST_CASE("torch: torch.optim SGD, Adagrad, RMSprop, Adam, AdamW over three steps", "[torch]") {
  OPEN_REF(ref);
  const auto p0 = ref.f32("optim.p0");
  const int64_t n = static_cast<int64_t>(p0.size());
  std::vector<float> g[3] = {ref.f32("optim.g1"), ref.f32("optim.g2"), ref.f32("optim.g3")};
  using Step = std::function<void(float* p, const float* g, float* s1, float* s2, int64_t t)>;
  const std::pair<const char*, Step> cases[] = {
      {"sgd", [&](float* p, const float* gg, float*, float*, int64_t) {
         rt::sgd_update<float>(ctx, p, nullptr, gg, nullptr, n, 0.1f, 0.0f, 0.0f, 1.0f); }},
      {"sgd_momentum", [&](float* p, const float* gg, float* m, float*, int64_t) {
         rt::sgd_update<float>(ctx, p, nullptr, gg, m, n, 0.1f, 0.9f, 0.01f, 1.0f); }},
      {"adagrad", [&](float* p, const float* gg, float* s, float*, int64_t) {
         rt::adagrad_update<float>(ctx, p, nullptr, gg, s, n, 0.05f, 1e-10f, 0.01f, 1.0f); }},
      {"rmsprop", [&](float* p, const float* gg, float* sq, float*, int64_t) {
         rt::rmsprop_update<float>(ctx, p, nullptr, gg, sq, nullptr, n, 0.01f, 0.99f, 1e-8f, 0.01f, 0.0f, 1.0f); }},
      {"rmsprop_momentum", [&](float* p, const float* gg, float* sq, float* buf, int64_t) {
         rt::rmsprop_update<float>(ctx, p, nullptr, gg, sq, buf, n, 0.01f, 0.99f, 1e-8f, 0.01f, 0.9f, 1.0f); }},
      {"adam", [&](float* p, const float* gg, float* m, float* v, int64_t t) {
         rt::adam_update<float>(ctx, p, nullptr, gg, m, v, n, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, false, t, 1.0f); }},
      {"adamw", [&](float* p, const float* gg, float* m, float* v, int64_t t) {
         rt::adam_update<float>(ctx, p, nullptr, gg, m, v, n, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, true, t, 1.0f); }},
  };
  for (const auto& [name, step] : cases) {
    std::vector<float> p = p0, s1(n, 0.0f), s2(n, 0.0f);
    for (int64_t t = 1; t <= 3; ++t) {
      step(p.data(), g[t - 1].data(), s1.data(), s2.data(), t);
      expect_close(std::string("optim.") + name + ".p" + std::to_string(t), asVec(p),
                   ref.f(std::string("optim.") + name + ".p" + std::to_string(t)), kFp32);
    }
  }
}

TEST_CASE("torch: float -> bf16 and fp16 rounding, bit for bit (ties, subnormals, overflow)", "[torch]") {
  OPEN_REF(ref);
  auto x = ref.f32("round.x");
  auto bb = ref.i("round.bf16"), hb = ref.i("round.f16");
  REQUIRE(x.size() == bb.size());
  int badB = 0, badH = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (rt::bf16(x[i]).bits != static_cast<uint16_t>(bb[i])) {
      if (badB++ < 3) WARN("bf16 of " << x[i] << ": ours " << rt::bf16(x[i]).bits << ", torch " << bb[i]);
    }
    if (rt::f16(x[i]).bits != static_cast<uint16_t>(hb[i])) {
      if (badH++ < 3) WARN("fp16 of " << x[i] << ": ours " << rt::f16(x[i]).bits << ", torch " << hb[i]);
    }
  }
  INFO(x.size() << " values, including 512 exact bf16 ties and 512 exact fp16 ties");
  CHECK(badB == 0);
  CHECK(badH == 0);
}
