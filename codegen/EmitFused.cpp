// The fused kernels of the step (passes/Fusion.cpp; Analysis::fusion): a run of elementwise
// entries printed as one generated functor and an rt::fused call, or as the prologue of the
// norm that ends the run, and a matmul with its bias add as rt::matmul_bias. micro_step
// (EmitStep.cpp) calls fused() at the run's first entry.
#include "codegen/EmitInternal.h"

#include <algorithm>

namespace tally::codegen::emit {

bool Emitter::matmulBias(const Analysis::FusedKernel &k, const char *kind) {
  const Op &add = s.ops[a.stepSchedule[k.first + 1].op];
  op = &add;
  step = buffers.stepOf(k.first + 1);
  TensorId c = s.ops[a.stepSchedule[k.first].op].outputs[0];
  epilogueBias = ptr(add.inputs[0] == c ? add.inputs[1] : add.inputs[0]);
  epilogueOut = ptr(add.outputs[0]);
  op = &s.ops[a.stepSchedule[k.first].op];
  step = buffers.stepOf(k.first);
  std::string path = s.opPath(*op);
  body += "\n  // fused (" + std::string(kind) + "): " + commentSafe(path) + " with the bias of " +
          commentSafe(s.opPath(add)) + where(*op) + "\n";
  site(path, className(s, *op));
  bool ok = error.empty() && matmul();
  epilogueBias.clear();
  epilogueOut.clear();
  return ok;
}

const Analysis::FusedKernel *Emitter::fusedAt(size_t e) const {
  const auto &ks = a.fusion.kernels;
  auto it = std::lower_bound(ks.begin(), ks.end(), e,
                             [](const Analysis::FusedKernel &k, size_t entry) { return k.first < entry; });
  return it != ks.end() && it->first == e ? &*it : nullptr;
}

bool Emitter::fused(const Analysis::FusedKernel &k, const char *kind) {
  if (k.epilogue)
    return matmulBias(k, kind);
  std::string ty = T(s.ops[a.stepSchedule[k.first].op].outputs[0]);
  std::vector<std::string> members, args;     // functor members and the call's pointers
  std::map<TensorId, std::string> value;      // tensors held in registers
  std::string code, paths;
  int64_t n = 0;
  auto operand = [&](TensorId x, TensorId y) -> std::string {
    auto v = value.find(x);
    if (v != value.end())
      return v->second;
    std::optional<ElementIndex> ix = elementIndex(s, x, y);
    if (!ix)
      return fail("internal error: a fused operand without an element index"), "A(0)";
    std::string name = "i" + std::to_string(args.size());
    members.push_back("const " + ty + " *" + name + ";");
    args.push_back(ptr(x));
    std::string at = ix->kind == ElementIndex::Same       ? "e"
                     : ix->kind == ElementIndex::Trailing ? "e % " + std::to_string(ix->m)
                     : ix->kind == ElementIndex::Leading  ? "e / " + std::to_string(ix->m)
                                                          : "0";
    return "rt::load(" + name + "[" + at + "])";
  };
  uint32_t elems = k.count - (k.norm ? 1 : 0);
  for (uint32_t i = 0; i < elems; ++i) {
    op = &s.ops[a.stepSchedule[k.first + i].op];
    step = buffers.stepOf(k.first + i);
    TensorId y = op->outputs[0];
    n = this->n(y);
    paths += (i ? ", " : "") + commentSafe(s.opPath(*op));
    std::string expr;
    const auto &in = op->inputs;
    if (op->kind == OpKind::UnaryBackward) {
      OpKind of = op->attrs->of;
      const UnaryDef *u = unaryDef(of); // fusableElementwise joins only Unary.def's kinds
      if (!u)
        return fail("internal error: a fused unary_backward of " + opName(of).str());
      bool readsX = u->reads == GradReads::Input, neg = u->reads == GradReads::Nothing;
      std::string x = neg ? "A(0)" : operand(in[0], y);
      std::string args = std::string(readsX ? x : "A(0)") + ", " + (readsX || neg ? "A(0)" : x);
      // The CPU step's fused kernels take the unfused kernels' per-op math (rt::vm, the
      // vectorised fp32 exp and erf), so fusing changes no value; the CUDA step keeps rt::unary.
      expr = operand(in.back(), y) + " * " +
             (be.device ? std::string("rt::unary_grad(") + unOp(of) + ", " + args + ")"
                        : std::string("rt::vm::unary_grad<") + unOp(of) + ">(" + args + ")");
    } else if (op->attrs->hasScalar) {
      std::string c = "static_cast<A>(static_cast<float>(" + number(op->attrs->scalar) + "))";
      std::string x = operand(in[0], y);
      expr = std::string("rt::binop(") + binOp(op->kind) + ", " + (op->attrs->scalarOnLeft ? c + ", " + x : x + ", " + c) + ")";
    } else if (in.size() == 2) {
      std::string l = operand(in[0], y), r = operand(in[1], y);
      expr = std::string("rt::binop(") + binOp(op->kind) + ", " + l + ", " + r + ")";
    } else {
      expr = be.device ? std::string("rt::unary(") + unOp(op->kind) + ", " + operand(in[0], y) + ")"
                       : std::string("rt::vm::unary<") + unOp(op->kind) + ">(" + operand(in[0], y) + ")";
    }
    if (!error.empty())
      return false;
    std::string v = "v" + std::to_string(i);
    if (k.unwritten >> i & 1) { // nothing after the run reads it
      code += "    const A " + v + " = rt::load(rt::store<" + ty + ">(" + expr + "));\n";
      value[y] = v;
      continue;
    }
    std::string out = "o" + std::to_string(args.size());
    members.push_back(ty + " *" + out + ";");
    args.push_back(ptr(y));
    if (acc())
      expr = "rt::load(" + out + "[e]) + " + expr;
    code += "    const A " + v + " = rt::load(rt::store<" + ty + ">(" + expr + "));\n"
            "    " + out + "[e] = rt::store<" + ty + ">(" + v + ");\n";
    value[y] = v;
  }
  std::string fields;
  for (const std::string &m : members)
    fields += "  " + m + "\n";
  std::string def = fields + "  TALLY_HD void operator()(int64_t e) const {\n    using A = rt::acc_t<" + ty + ">;\n" +
                    code + "  }\n";
  auto [it, fresh] = functorOf.emplace(def, "Fused" + std::to_string(functorOf.size()));
  if (fresh)
    functors += "/// A fused kernel (first " + paths.substr(0, paths.find(',')) + ", " + kind + ").\nstruct " +
                it->second + " {\n" + def + "};\n\n";
  std::string functor = it->second + "{";
  for (size_t i = 0; i < args.size(); ++i)
    functor += (i ? ", " : "") + args[i];
  functor += "}";
  const Op *norm = k.norm ? &s.ops[a.stepSchedule[k.first + elems].op] : nullptr;
  if (norm)
    paths += ", " + commentSafe(s.opPath(*norm));
  op = &s.ops[a.stepSchedule[k.first].op];
  body += "\n  // fused (" + std::string(kind) + "): " + paths + where(*op) + "\n";
  site(s.opPath(*op), className(s, *op));
  if (!norm) {
    line("rt::fused(ctx, " + std::to_string(n) + ", " + functor + ");");
    return true;
  }
  // The norm's call, its prologue computing and writing x row by row first.
  op = norm;
  step = buffers.stepOf(k.first + elems);
  prologue = functor;
  bool ok = emitOp();
  prologue.clear();
  return ok;
}

} // namespace tally::codegen::emit
