// The table of callable primitives (see ir/Primitives.h). docs/language.md §5 says what each
// computes; ir/ops/ has each op kind's shapes and costs.
#include "ir/Primitives.h"

#include "llvm/ADT/StringMap.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace tally {

PrimitiveParam::PrimitiveParam(const char *name, const char *defaultText)
    : name(name), defaultText(defaultText), defaultValue(std::nan("")) {
  if (!defaultText)
    return;
  if (std::strcmp(defaultText, "true") == 0 || std::strcmp(defaultText, "false") == 0) {
    defaultValue = defaultText[0] == 't' ? 1 : 0;
    return;
  }
  char *end = nullptr;
  double v = std::strtod(defaultText, &end);
  if (end != defaultText && *end == '\0')
    defaultValue = v;
}

size_t Primitive::index(llvm::StringRef param) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (param == params[i].name)
      return i;
  return params.size();
}

std::string Primitive::signature() const {
  std::string s = name().str() + "(";
  for (size_t i = 0; i < params.size(); ++i) {
    s += (i ? ", " : "") + std::string(params[i].name);
    if (variadic && i == 0)
      s += "...";
    if (params[i].defaultText)
      s += std::string(" = ") + params[i].defaultText;
  }
  return s + ")";
}

const std::vector<Primitive> &primitives() {
  using P = PrimitiveParam;
  static const std::vector<Primitive> table = {
      {OpKind::Matmul, {P("a"), P("b")}, 2},
      {OpKind::Relu, {P("x")}, 1},
      {OpKind::Gelu, {P("x")}, 1},
      {OpKind::GeluTanh, {P("x")}, 1},
      {OpKind::Silu, {P("x")}, 1},
      {OpKind::Tanh, {P("x")}, 1},
      {OpKind::Sigmoid, {P("x")}, 1},
      {OpKind::Exp, {P("x")}, 1},
      {OpKind::Dropout, {P("x"), P("p")}, 2},
      // fraction < 1: partial rotary (GPT-NeoX rotary_pct); head: the head size when no
      // attention reads the result through views (MLA's per-head q_rope, concatenated)
      {OpKind::Rope, {P("x"), P("fraction", "1"), P("head", "0")}, 1},
      {OpKind::Softmax, {P("x"), P("dim", "-1")}, 1},
      // weight and bias optional: layer_norm(x) normalises alone (PyTorch's
      // elementwise_affine = False); a bias needs a weight
      {OpKind::LayerNorm, {P("x"), P("weight"), P("bias"), P("eps", "1e-5")}, 1},
      {OpKind::RmsNorm, {P("x"), P("weight"), P("eps", "1e-6")}, 2},
      {OpKind::Attention,
       {P("q"), P("k"), P("v"), P("heads"), P("kv_heads", "heads"), P("causal", "false"),
        P("fused", "true"), P("dropout", "0"), P("alibi", "false"), P("mask"),
        P("window", "0"), P("softcap", "0"), P("latent", "0"), P("latent_rope", "0")},
       4},
      {OpKind::Embedding, {P("ids"), P("weight")}, 2},
      {OpKind::Sum, {P("x"), P("dim"), P("keepdim", "false")}, 1},
      {OpKind::Mean, {P("x"), P("dim"), P("keepdim", "false")}, 1},
      {OpKind::CrossEntropy, {P("logits"), P("labels")}, 2},
      {OpKind::Positions, {P("n")}, 1},
      {OpKind::NextTokens, {P("x")}, 1},
      {OpKind::Concat, {P("tensors"), P("dim", "-1")}, 1, /*variadic=*/true},
      {OpKind::Split, {P("x"), P("parts"), P("dim", "-1")}, 2},
      {OpKind::Reshape, {P("x"), P("shape")}, 2},
      {OpKind::Transpose, {P("x"), P("dim0", "-2"), P("dim1", "-1")}, 1},
      {OpKind::TopK, {P("x"), P("k"), P("dim", "-1")}, 2},
      {OpKind::Gather, {P("x"), P("indices"), P("dim", "-1")}, 2},
      {OpKind::Moe,
       {P("x"), P("gates"), P("indices"), P("w_gate"), P("w_up"), P("w_down"),
        P("capacity_factor", "0")},
       6},
      {OpKind::Conv2d, {P("x"), P("weight"), P("bias"), P("stride", "1"), P("padding", "0")}, 2},
      // The stride defaults to the window, as in PyTorch.
      {OpKind::MaxPool2d, {P("x"), P("kernel"), P("stride", "kernel"), P("padding", "0")}, 2},
      {OpKind::AvgPool2d, {P("x"), P("kernel"), P("stride", "kernel"), P("padding", "0")}, 2},
      {OpKind::BroadcastTo, {P("x"), P("shape")}, 2},
  };
  return table;
}

const Primitive *findPrimitive(llvm::StringRef name) {
  static const llvm::StringMap<const Primitive *> byName = [] {
    llvm::StringMap<const Primitive *> m;
    for (const Primitive &p : primitives())
      m[p.name()] = &p;
    return m;
  }();
  auto it = byName.find(name);
  return it == byName.end() ? nullptr : it->second;
}

const std::vector<std::string> &primitiveNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Primitive &p : primitives())
      v.push_back(p.name().str());
    return v;
  }();
  return names;
}

} // namespace tally
