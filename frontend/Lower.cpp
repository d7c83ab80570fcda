// Lowering: instantiate the plan's model and evaluate its forward function into the IR graph.
//
// 1. Instantiate the model block with its constant arguments (frontend/LowerInstantiate.cpp).
// 2. Create the model's inputs from the typed forward parameters, with `batch` bound to the
//    per-device micro-batch and `seq` to the sequence length (run() below).
// 3. Evaluate the forward function like an interpreter over symbolic tensors
//    (frontend/LowerEvaluate.cpp); each primitive call appends one op to the graph
//    (frontend/LowerPrimitives.cpp).
// 4. The returned tensors become the graph's outputs (a train plan's must be one scalar loss),
//    and the graph is verified.
// Every op gets the path of the instance it was written in plus its own name. The class and
// its values are declared in frontend/Lowerer.h.
#include "frontend/Lowerer.h"

namespace tally {
namespace lowering {

std::optional<Graph> Lowerer::run(const PlanDecl &decl) {
  planDecl = &decl;
  ConstValue call;
  const BlockDecl *model = sema.planModel(program, decl, call);
  if (!model)
    return std::nullopt;
  g.model = model->name;
  g.activationDtype = key.activations;
  g.instances.push_back({&pooledName(model->name), &pooledName(""), kNone, 0, {}});
  ModuleObj *root = instantiate(*model, call, "", 0, false, call.range);
  if (!root || failed)
    return std::nullopt;
  if (!root->forward) {
    diags.report(DiagKind::MissingReturn, model->nameRange.Start,
                 "model '" + model->name + "' has no forward function")
        .range(model->nameRange);
    return std::nullopt;
  }
  // The model's inputs, with the plan's symbols bound.
  std::vector<Value> inputs;
  for (const ForwardParam &p : root->forward->params) {
    if (!p.type) {
      diags.report(DiagKind::TypeMismatch, p.range.Start,
                   "the model's input '" + p.name +
                       "' needs a type, such as " + p.name + ": i32[batch, seq]")
          .range(p.range);
      return std::nullopt;
    }
    Tensor t;
    t.role = TensorRole::Input;
    Shape shape;
    if (!shapeOf(*p.type, root->consts, true, shape, t.dtype))
      return std::nullopt;
    t.shape = shape;
    if (p.type->dtype.empty())
      t.dtype = g.activationDtype;
    if (t.dtype == Dtype::INT4 || t.dtype == Dtype::NF4) {
      diags.report(DiagKind::TypeMismatch, p.type->dtypeRange.Start,
                   "the model's input '" + p.name + "' cannot be " + nameOf(t.dtype).str() +
                       ": int4 and nf4 store frozen weights (frozen param w: nf4[d, d])")
          .range(p.type->dtypeRange);
      return std::nullopt;
    }
    TensorId id = g.addTensor(std::move(t));
    g.inputs.push_back(id);
    g.inputNames.push_back(p.name);
    inputs.push_back(Value::ofTensor(id, p.range));
  }
  Value out = callModule(*root, inputs, root->forward->range);
  if (failed || out.kind == Value::Invalid)
    return std::nullopt;
  if (!checkLoraTargets() || !checkQuantized()) // frontend/LowerLora.cpp
    return std::nullopt;
  collectOutputs(out);
  if (key.isTrain) {
    bool scalar = g.outputs.size() == 1 && g.tensors[g.outputs[0]].shape.empty() &&
                  isFloat(g.tensors[g.outputs[0]].dtype);
    if (!scalar) {
      diags.report(DiagKind::TypeMismatch, root->forward->range.Start,
                   "a train plan needs the model's forward to return a scalar loss, but '" +
                       model->name + "' returns " + describeOutputs())
          .range(llvm::SMRange(root->forward->range.Start, root->forward->range.Start))
          .note(decl.nameRange.Start, "trained by this plan");
      return std::nullopt;
    }
    g.loss = g.outputs[0];
  }
  std::string problem = verifyGraph(g);
  if (!problem.empty()) {
    diags.report(DiagKind::InvalidValue, decl.nameRange.Start,
                 "internal error: the lowered graph is invalid: " + problem);
    return std::nullopt;
  }
  return std::move(g);
}

/// Adds "in 'Linear' called here as h[3].mlp.fc" notes, innermost first (at most four;
/// the model itself, path "", needs none).
void Lowerer::context(DiagBuilder &d) {
  size_t shown = 0;
  for (auto it = sites.rbegin(); it != sites.rend() && shown < 4; ++it) {
    if (it->path.empty())
      continue;
    d.note(it->where.Start, "in '" + it->block->name + "' " +
                                (it->call ? "called" : "instantiated") + " here as " +
                                it->path,
           it->where);
    ++shown;
  }
}

void Lowerer::collectOutputs(const Value &v) {
  if (v.kind == Value::Tensor)
    g.outputs.push_back(v.tensor);
  else if (v.kind == Value::Tuple)
    for (const Value &x : v.elems)
      collectOutputs(x);
}

std::string Lowerer::describeOutputs() const {
  if (g.outputs.empty())
    return "no tensor";
  if (g.outputs.size() > 1)
    return std::to_string(g.outputs.size()) + " tensors";
  const Tensor &t = g.tensors[g.outputs[0]];
  return "a tensor of shape " + g.formatShape(t.shape) + " (" + nameOf(t.dtype).str() + ")";
}

} // namespace lowering

std::optional<Graph> lowerPlan(Sema &sema, const Program &program, const PlanDecl &decl,
                               const Plan &plan) {
  return lowering::Lowerer(sema, program, plan).run(decl);
}

} // namespace tally
