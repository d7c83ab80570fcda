// Lowering: fine-tuning a model without rewriting it (issue 45).
//
// 1. LoRA (`lora = { r = 16, alpha = 32, targets = [q, v] }` in a train plan): a member
//    `q = Linear(d, d, bias = false)` whose name is a target is instantiated as the standard
//    library's `LoRALinear(d, d, bias = false, r = 16, alpha = 32)` instead: the same frozen
//    `weight` (and `b`) at the same paths, plus a trainable `LoRA` adapter at `q.lora`
//    (x @ a @ b · alpha/r, Hu et al. 2021). Every parameter outside the LoRA blocks is frozen
//    (LowerInstantiate.cpp, items). A target that names no Linear is an error.
// 2. Quantized base weights (`base = nf4` in the precision record): every frozen parameter
//    that only matrix products read, as their right operand and not through a view, is stored
//    in that dtype (bitsandbytes' Linear4bit: the embedding and the norms stay in `params`).
// 3. A tensor in int4 or nf4 (a quantized frozen weight) may only be the right operand of a
//    matrix product: tally prices its dequantization before each one (passes/StepTime.cpp);
//    any other use is an error naming the op.
#include "frontend/Lowerer.h"
#include "support/Suggest.h"

namespace tally {
namespace lowering {

const BlockDecl *Lowerer::loraSubstitute(const BlockItem &item, const BlockDecl *b,
                                         ConstValue &call) {
  if (key.lora.r == 0 || b->name != "Linear")
    return b;
  linearNames.insert(item.name);
  const auto &t = key.lora.targets;
  if (std::find(t.begin(), t.end(), item.name) == t.end())
    return b;
  auto it = program.blocks.find("LoRALinear");
  if (it == program.blocks.end())
    return b; // a file that replaced the standard library's block set: checkLoraTargets says so
  loraMatched.insert(item.name);
  auto add = [&](const char *name, ConstValue v) {
    // Positional arguments keep their slots; the rank and alpha are named.
    call.names.resize(call.elems.size());
    call.ranges.resize(call.elems.size(), call.range);
    call.nameRanges.resize(call.elems.size(), call.range);
    call.elems.push_back(std::move(v));
    call.names.push_back(name);
    call.ranges.push_back(call.range);
    call.nameRanges.push_back(call.range);
  };
  add("r", ConstValue::integer(key.lora.r, call.range));
  add("alpha", ConstValue::real(key.lora.alpha, UnitDim::None, call.range));
  return it->second;
}

bool Lowerer::checkLoraTargets() {
  if (key.lora.r == 0)
    return true;
  bool ok = true;
  for (size_t i = 0; i < key.lora.targets.size(); ++i) {
    const std::string &name = key.lora.targets[i];
    if (loraMatched.count(name))
      continue;
    llvm::SMRange at = i < key.lora.targetRanges.size() ? key.lora.targetRanges[i] : llvm::SMRange();
    if (!at.isValid())
      if (auto r = settingRanges.find("lora"); r != settingRanges.end())
        at = r->second;
    std::vector<std::string> names(linearNames.begin(), linearNames.end());
    std::string close = closestName(name, names);
    auto d = diags.report(DiagKind::UnknownName, at.Start,
                          "lora target '" + name + "' names no Linear of model '" + g.model +
                              "'" + didYouMean(close));
    d.range(at);
    if (!close.empty())
      d.fixit(at, close);
    if (!program.blocks.count("LoRALinear"))
      d.note(llvm::SMLoc(), "the standard library's LoRALinear block is missing");
    ok = false;
  }
  return ok;
}

bool Lowerer::checkQuantized() {
  // Step 2: the precision record's frozen storage for the frozen weights only matmuls read.
  if (isQuantized(key.frozen)) {
    std::vector<uint8_t> onlyMatmul(g.tensors.size(), 1);
    for (const Op &op : g.ops)
      for (size_t i = 0; i < op.inputs.size(); ++i) {
        TensorId x = op.inputs[i];
        TensorId s = g.storageOf(x);
        if (!(op.kind == OpKind::Matmul && i == 1 && s == x))
          onlyMatmul[s] = 0;
      }
    std::vector<uint8_t> read(g.tensors.size(), 0);
    for (const Op &op : g.ops)
      for (TensorId x : op.inputs)
        read[g.storageOf(x)] = 1;
    for (const ParamInfo &p : g.params) {
      Tensor &w = g.tensors[p.tensor];
      if (!p.trainable && read[p.tensor] && onlyMatmul[p.tensor] && w.shape.size() == 2 &&
          w.dtype == key.params)
        w.dtype = key.frozen;
    }
  }
  // Step 3: sub-byte tensors only as a matmul's weight.
  for (const Op &op : g.ops)
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const Tensor &x = g.tensors[g.storageOf(op.inputs[i])];
      if (x.dtype != Dtype::INT4 && x.dtype != Dtype::NF4)
        continue;
      if (op.kind == OpKind::Matmul && i == 1 && op.inputs[i] == g.storageOf(op.inputs[i]))
        continue;
      std::string name = x.param != kNone ? g.paramPath(x.param) : "a tensor";
      diags.report(DiagKind::TypeMismatch, op.range.Start,
                   "'" + name + "' is stored in " + nameOf(x.dtype).str() +
                       " and can only be the right operand of a matrix product (tally "
                       "dequantizes it before each one), not an operand of " + g.opPath(op))
          .range(op.range);
      return false;
    }
  return true;
}

} // namespace lowering
} // namespace tally
