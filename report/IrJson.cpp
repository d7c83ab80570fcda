// `tally report FILE --emit=ir --format json`: the training step's graph as JSON (schema in
// docs/ir.md): every tensor with its layout, every op with its phase, operands, path and the
// FLOPs and bytes its rule gives. A renderer only: the numbers come from ir/OpRules.
#include "report/Report.h"

#include "ir/OpRules.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

namespace tally {

namespace {
llvm::json::Array ids(llvm::ArrayRef<TensorId> ts) {
  llvm::json::Array a;
  for (TensorId t : ts)
    a.push_back(static_cast<int64_t>(t));
  return a;
}
llvm::StringRef roleName(TensorRole r) {
  switch (r) {
  case TensorRole::Input: return "input";
  case TensorRole::Param: return "param";
  case TensorRole::Activation: return "activation";
  case TensorRole::Gradient: return "gradient";
  }
  return "activation";
}
} // namespace

void renderIrJson(const Graph &g, llvm::raw_ostream &os) {
  llvm::json::Array tensors, ops;
  for (TensorId t = 0; t < g.tensors.size(); ++t) {
    const Tensor &x = g.tensors[t];
    llvm::json::Array shape, strides;
    for (const Dim &d : x.shape)
      shape.push_back(d.size);
    for (int64_t s : stridesOf(x.shape, x.layout))
      strides.push_back(s);
    const std::string &name = g.tensorName(t);
    llvm::json::Object o{{"id", static_cast<int64_t>(t)},
                         {"name", name},
                         {"role", roleName(x.role)},
                         {"shape", std::move(shape)},
                         {"dtype", nameOf(x.dtype)},
                         {"strides", std::move(strides)},
                         {"offset", x.layout.offset()}};
    if (x.viewOf != kNone)
      o["view_of"] = static_cast<int64_t>(x.viewOf);
    if (x.gradOf != kNone)
      o["gradient_of"] = static_cast<int64_t>(x.gradOf);
    tensors.push_back(std::move(o));
  }
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const Op &op = g.ops[i];
    ForwardCost c = ruleFor(op.kind).forward(g, op);
    llvm::json::Object o{{"id", static_cast<int64_t>(i)},
                         {"kind", opName(op.kind)},
                         {"phase", phaseName(op.phase)},
                         {"inputs", ids(op.inputs)},
                         {"outputs", ids(op.outputs)},
                         {"path", g.opPath(op)},
                         {"flops", c.flops},
                         {"bytes", c.bytesRead + c.bytesWritten}};
    if (op.forwardOp != kNone)
      o["forward_op"] = static_cast<int64_t>(op.forwardOp);
    if (op.accumulate) {
      llvm::json::Array acc;
      for (size_t k = 0; k < op.outputs.size(); ++k)
        if (k < 32 && ((op.accumulate >> k) & 1)) // a 32-bit mask: a shift past it is undefined
          acc.push_back(static_cast<int64_t>(op.outputs[k]));
      o["accumulates"] = std::move(acc);
    }
    if (op.attrs->stream != kNone)
      o["random_stream"] = static_cast<int64_t>(op.attrs->stream);
    ops.push_back(std::move(o));
  }
  llvm::json::Object root{{"model", g.model}, {"tensors", std::move(tensors)}, {"ops", std::move(ops)}};
  printJson(os, std::move(root));
}

} // namespace tally
