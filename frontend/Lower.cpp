// Lowering: instantiate the plan's model and evaluate its forward function into the IR graph.
//
// 1. Instantiate the model block with its constant arguments: bind parameters (positional,
//    named, defaults), then walk the body in order — `param` creates a parameter tensor,
//    `name = Block(...)` instantiates a submodule, `repeat(n)` n copies named `name[i]`,
//    other members are constants, `if` picks a branch. A block that instantiates itself
//    (directly or not) is reported with the cycle.
// 2. Create the model's inputs from the typed forward parameters, with `batch` bound to the
//    per-device micro-batch and `seq` to the sequence length.
// 3. Evaluate the forward function like an interpreter over symbolic tensors: calling a
//    submodule evaluates its forward with a fresh scope; calling a primitive appends one op,
//    whose output shapes come from the op's rule (ir/OpRules.cpp), to the graph.
// Every op gets the path of the instance it was written in plus its own name.
#include "frontend/Lower.h"

#include "ir/OpRules.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>
#include <cstdio>
#include <deque>

namespace tally {
namespace {

struct ModuleObj;

/// A value during forward evaluation.
struct Value {
  enum Kind { Invalid, Const, Tensor, Module, List, Tuple } kind = Invalid;
  ConstValue c;
  TensorId tensor = kNone;
  ModuleObj *module = nullptr;
  std::vector<ModuleObj *> list;
  std::vector<Value> elems;
  llvm::SMRange range;

  static Value ofConst(ConstValue v) {
    Value x;
    x.kind = Const;
    x.range = v.range;
    x.c = std::move(v);
    return x;
  }
  static Value ofTensor(TensorId t, llvm::SMRange r) {
    Value x;
    x.kind = Tensor;
    x.tensor = t;
    x.range = r;
    return x;
  }
  std::string describe() const {
    switch (kind) {
    case Invalid: return "an invalid value";
    case Const: return c.describe();
    case Tensor: return "a tensor";
    case Module: return "a block";
    case List: return "a repeated block";
    case Tuple: return "a tuple";
    }
    return "a value";
  }
};

/// One instantiated block.
struct ModuleObj {
  const BlockDecl *decl = nullptr;
  uint32_t instance = 0;
  std::string path;
  ConstEnv consts;
  llvm::StringMap<Value> members;
  const ForwardAST *forward = nullptr;
};

struct Scope {
  ModuleObj *module;
  llvm::StringMap<Value> locals;
};

/// Most block instances one model may have (a 10,000-layer GPT has 90,000): a bound on the
/// memory that instantiation may take, checked before a repeat makes its copies.
constexpr size_t kMaxInstances = 1'000'000;

/// A number for a message, as a person writes it: 1.5, 0.333333 (not "1.50").
std::string plainNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string join(const std::string &path, llvm::StringRef name) {
  return path.empty() ? name.str() : path + "." + name.str();
}

const std::vector<std::string> &primitiveNames() {
  static const std::vector<std::string> names = {
      "matmul", "relu", "gelu", "silu", "tanh", "sigmoid", "exp", "dropout", "rope", "softmax",
      "layer_norm", "rms_norm", "attention", "embedding", "sum", "mean", "cross_entropy",
      "positions", "next_tokens", "concat", "split", "reshape", "transpose", "topk", "gather",
      "moe", "conv2d", "max_pool2d", "avg_pool2d", "broadcast_to"};
  return names;
}

class Lowerer {
public:
  const PlanDecl *planDecl = nullptr;
  bool seqReported = false;
  Lowerer(Sema &sema, const Program &program, const Plan &plan)
      : sema(sema), diags(sema.diags), program(program), key(loweringKey(plan)),
        settingRanges(plan.settingRanges) {}

  std::optional<Graph> run(const PlanDecl &decl) {
    planDecl = &decl;
    ConstValue call;
    const BlockDecl *model = sema.planModel(program, decl, call);
    if (!model)
      return std::nullopt;
    g.model = model->name;
    g.activationDtype = key.activations;
    g.instances.push_back({"", model->name, kNone, 0});
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
      t.name = p.name;
      if (!shapeOf(*p.type, root->consts, true, t.shape, t.dtype))
        return std::nullopt;
      if (p.type->dtype.empty())
        t.dtype = g.activationDtype;
      TensorId id = g.addTensor(std::move(t));
      g.inputs.push_back(id);
      inputs.push_back(Value::ofTensor(id, p.range));
    }
    Value out = callModule(*root, inputs, root->forward->range);
    if (failed || out.kind == Value::Invalid)
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

private:
  Sema &sema;
  DiagnosticEngine &diags;
  const Program &program;
  /// All of the plan the graph depends on (ir/Plan.h), and where its settings were written
  /// (for messages only): the lowering reads nothing else of the plan.
  const LoweringKey key;
  const std::map<std::string, llvm::SMRange> &settingRanges;
  Graph g;
  std::deque<ModuleObj> modules;
  std::vector<const BlockDecl *> stack; ///< blocks being instantiated, for recursion checks
  std::vector<llvm::StringMap<unsigned>> opCounts; ///< per instance: ops named so far
  bool failed = false;
  unsigned callDepth = 0;

  /// A block being instantiated or called, innermost last: errors inside a block (often one
  /// of the standard library's) get notes that lead back to the user's code.
  struct Site {
    llvm::SMRange where;
    const BlockDecl *block;
    std::string path;
    bool call; ///< a forward call rather than an instantiation
  };
  std::vector<Site> sites;

  void fail() { failed = true; }

  /// Adds "in 'Linear' called here as h[3].mlp.fc" notes, innermost first (at most four;
  /// the model itself, path "", needs none).
  void context(DiagBuilder &d) {
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

  // ---- instantiation ------------------------------------------------------------------

  /// Binds a block's parameters from a constant call (`Linear(d, 4 * d, bias = false)`).
  bool bindArgs(const BlockDecl &b, const ConstValue &call, ConstEnv &env, llvm::SMRange where) {
    std::vector<bool> bound(b.params.size(), false);
    size_t positional = 0;
    for (size_t i = 0; i < call.elems.size(); ++i) {
      const std::string &name = i < call.names.size() ? call.names[i] : "";
      llvm::SMRange r = i < call.ranges.size() ? call.ranges[i] : where;
      llvm::SMRange nameAt = i < call.nameRanges.size() ? call.nameRanges[i] : r;
      size_t slot = b.params.size();
      if (name.empty()) {
        slot = positional++;
        if (slot >= b.params.size()) {
          diags.report(DiagKind::WrongArgCount, r.Start,
                       "'" + b.name + "' takes " + std::to_string(b.params.size()) +
                           " argument" + (b.params.size() == 1 ? "" : "s") + ", but " +
                           std::to_string(call.elems.size()) + " were given")
              .range(r)
              .note(b.nameRange.Start, "'" + b.name + "' is declared here");
          return false;
        }
      } else {
        for (size_t j = 0; j < b.params.size(); ++j)
          if (b.params[j].name == name)
            slot = j;
        if (slot == b.params.size()) {
          std::vector<std::string> names;
          for (const auto &p : b.params)
            names.push_back(p.name);
          sema.suggest(DiagKind::UnknownArgument, nameAt,
                       "'" + b.name + "' has no parameter '" + name + "'", name, names)
              .note(b.nameRange.Start, "'" + b.name + "' is declared here");
          return false;
        }
      }
      if (bound[slot]) {
        diags.report(DiagKind::DuplicateName, nameAt.Start,
                     "parameter '" + b.params[slot].name + "' of '" + b.name +
                         "' is given twice")
            .range(nameAt);
        return false;
      }
      bound[slot] = true;
      ConstValue v = call.elems[i];
      v.range = r;
      env[b.params[slot].name] = v;
    }
    for (size_t j = 0; j < b.params.size(); ++j) {
      if (bound[j])
        continue;
      if (!b.params[j].defaultValue) {
        diags.report(DiagKind::WrongArgCount, where.Start,
                     "missing argument '" + b.params[j].name + "' of '" + b.name + "'")
            .range(where)
            .note(b.params[j].range.Start, "declared here without a default");
        return false;
      }
      ConstValue v = sema.eval(*b.params[j].defaultValue, env);
      if (v.kind == ConstValue::Invalid)
        return false;
      env[b.params[j].name] = v;
    }
    return true;
  }

  /// False, after an error, when a train plan's model uses `seq` but the plan does not set it:
  /// the default of 1 would silently give a one-token model (MFU of a few percent for GPT-2).
  bool seqGiven(llvm::SMRange use) {
    if (!key.isTrain || key.seqGiven)
      return true;
    if (!seqReported && planDecl) {
      seqReported = true;
      auto b = diags.report(DiagKind::MissingSetting, planDecl->nameRange.Start,
                            "plan '" + planDecl->name +
                                "' does not say its sequence length, which its model uses");
      b.range(planDecl->nameRange);
      if (auto it = settingRanges.find("batch"); it != settingRanges.end())
        b.fixit(llvm::SMRange(it->second.End, it->second.End), "\n  seq = 1024");
      if (use.isValid())
        b.note(use.Start, "'seq' is used here", use);
    }
    return false;
  }

  /// A tensor type's shape and dtype; `withPlan` also binds batch and seq.
  bool shapeOf(const TensorTypeAST &type, const ConstEnv &consts, bool withPlan, Shape &shape,
               Dtype &dtype) {
    if (!type.dtype.empty()) {
      auto d = parseDtype(type.dtype);
      if (!d) {
        static const std::vector<std::string> known = {
            "f64", "f32", "tf32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "i64", "i32", "i8",
            "u8", "bool", "fp64", "fp32", "fp16"};
        sema.suggest(DiagKind::UnknownDtype, type.dtypeRange,
                     "unknown dtype '" + type.dtype + "'", type.dtype, known);
        return false;
      }
      dtype = *d;
    }
    // The plan's `batch` and `seq` are visible unless the block has constants of those names
    // (as in the forward function's lookup); only then is the environment copied.
    ConstEnv withSymbols;
    if (withPlan) {
      withSymbols = consts;
      withSymbols.try_emplace("batch", ConstValue::integer(key.microBatch, {}));
      withSymbols.try_emplace("seq", ConstValue::integer(key.seq, {}));
    }
    const ConstEnv &env = withPlan ? withSymbols : consts;
    for (const ExprPtr &e : type.dims) {
      if (withPlan && e->kind == ExprKind::Name && e->text == "seq" && !consts.count("seq") &&
          !seqGiven(e->range))
        return false;
      ConstValue v = sema.eval(*e, env);
      if (v.kind == ConstValue::Invalid)
        return false;
      if (v.kind == ConstValue::Word) {
        std::vector<std::string> names;
        for (const auto &kv : env)
          names.push_back(kv.getKey().str());
        sema.unknownName(e->range, "name", v.text, names);
        return false;
      }
      auto n = sema.positiveInt(v, "a dimension");
      if (!n)
        return false;
      Dim d;
      d.size = *n;
      if (withPlan && e->kind == ExprKind::Name && (e->text == "batch" || e->text == "seq") &&
          !consts.count(e->text))
        d.sym = g.symbol(e->text);
      shape.push_back(d);
    }
    if (!checkedNumel(shape)) {
      diags.report(DiagKind::Overflow, type.range.Start,
                   "tensor of shape " + Graph::formatSizes(shape) +
                       " has more elements than fit in 64 bits")
          .range(type.range);
      return false;
    }
    return true;
  }

  ModuleObj *instantiate(const BlockDecl &b, const ConstValue &call, const std::string &path,
                         uint32_t instance, bool frozen, llvm::SMRange where) {
    for (size_t i = 0; i < stack.size(); ++i) {
      if (stack[i] != &b)
        continue;
      std::string cycle;
      for (size_t j = i; j < stack.size(); ++j)
        cycle += stack[j]->name + " → ";
      cycle += b.name;
      diags.report(DiagKind::RecursiveBlock, where.Start,
                   "block '" + b.name + "' contains itself: " + cycle)
          .range(where)
          .note(b.nameRange.Start, "'" + b.name + "' is declared here");
      fail();
      return nullptr;
    }
    if (stack.size() >= kMaxInstanceDepth) {
      diags.report(DiagKind::NestingTooDeep, where.Start,
                   "blocks are nested more than " + std::to_string(kMaxInstanceDepth) +
                       " deep")
          .range(where);
      fail();
      return nullptr;
    }
    if (g.instances.size() > kMaxInstances) {
      diags.report(DiagKind::Overflow, where.Start,
                   "the model has more than " + std::to_string(kMaxInstances) +
                       " block instances; tally stops counting here")
          .range(where);
      fail();
      return nullptr;
    }
    modules.emplace_back();
    ModuleObj &m = modules.back();
    m.decl = &b;
    m.instance = instance;
    m.path = path;
    if (!bindArgs(b, call, m.consts, where)) {
      fail();
      return nullptr;
    }
    stack.push_back(&b);
    sites.push_back({where, &b, path, false});
    bool ok = items(b.items, m, frozen);
    sites.pop_back();
    stack.pop_back();
    if (!ok) {
      fail();
      return nullptr;
    }
    return &m;
  }

  uint32_t newInstance(const std::string &path, const std::string &block, uint32_t parent) {
    g.instances.push_back({path, block, parent, g.instances[parent].depth + 1});
    return static_cast<uint32_t>(g.instances.size() - 1);
  }

  bool declared(ModuleObj &m, const std::string &name, llvm::SMRange r) {
    if (m.members.count(name) || m.consts.count(name)) {
      auto d = diags.report(DiagKind::DuplicateName, r.Start,
                            "'" + name + "' is already declared in block '" + m.decl->name +
                                "'");
      d.range(r);
      if (auto it = m.members.find(name); it != m.members.end())
        d.note(it->second.range.Start, "first declared here");
      return true;
    }
    return false;
  }

  bool items(const std::vector<BlockItemPtr> &list, ModuleObj &m, bool frozen) {
    for (const BlockItemPtr &item : list) {
      switch (item->kind) {
      case BlockItemKind::Param: {
        if (declared(m, item->name, item->nameRange))
          return false;
        Tensor t;
        t.role = TensorRole::Param;
        t.dtype = key.params;
        if (!shapeOf(*item->type, m.consts, false, t.shape, t.dtype))
          return false;
        t.name = join(m.path, item->name);
        t.requiresGrad = !(frozen || item->frozen);
        t.param = static_cast<uint32_t>(g.params.size());
        TensorId id = g.addTensor(t);
        g.params.push_back({t.name, id, t.requiresGrad, m.instance, item->range});
        m.members[item->name] = Value::ofTensor(id, item->range);
        break;
      }
      case BlockItemKind::Member: {
        if (declared(m, item->name, item->nameRange))
          return false;
        if (!member(*item, m, frozen || item->frozen))
          return false;
        break;
      }
      case BlockItemKind::Forward:
        if (m.forward) {
          diags.report(DiagKind::DuplicateName, item->nameRange.Start,
                       "block '" + m.decl->name + "' has two forward functions")
              .range(item->nameRange);
          return false;
        }
        m.forward = item->forward.get();
        break;
      case BlockItemKind::If: {
        auto cond = condition(*item->value, m.consts);
        if (!cond)
          return false;
        if (!items(*cond ? item->thenItems : item->elseItems, m, frozen))
          return false;
        break;
      }
      }
    }
    return true;
  }

  std::optional<bool> condition(const Expr &e, const ConstEnv &env) {
    ConstValue v = sema.eval(e, env);
    if (v.kind == ConstValue::Invalid)
      return std::nullopt;
    if (v.kind != ConstValue::Bool) {
      auto d = diags.report(DiagKind::TypeMismatch, e.range.Start,
                            "a condition must be true or false, not " + v.describe());
      d.range(e.range);
      context(d);
      return std::nullopt;
    }
    return v.boolean;
  }

  /// The block a call expression names, if it names one.
  const BlockDecl *blockOf(const Expr &e, const ConstEnv &env) {
    if (e.kind != ExprKind::Call || e.lhs->kind != ExprKind::Name || env.count(e.lhs->text))
      return nullptr;
    auto it = program.blocks.find(e.lhs->text);
    return it == program.blocks.end() ? nullptr : it->second;
  }

  bool member(const BlockItem &item, ModuleObj &m, bool frozen) {
    const Expr &e = *item.value;
    std::string path = join(m.path, item.name);
    if (e.kind == ExprKind::Repeat) {
      ConstValue count = sema.eval(*e.args[0], m.consts);
      if (count.kind == ConstValue::Invalid)
        return false;
      auto n = sema.positiveInt(count, "a repeat count");
      if (!n)
        return false;
      const BlockDecl *b = blockOf(*e.lhs, m.consts);
      if (!b) {
        diags.report(DiagKind::TypeMismatch, e.lhs->range.Start,
                     "repeat(n) is followed by a block call, such as repeat(12) Block(d, heads)")
            .range(e.lhs->range);
        return false;
      }
      ConstValue call = sema.eval(*e.lhs, m.consts);
      if (call.kind == ConstValue::Invalid)
        return false;
      if (static_cast<uint64_t>(*n) > kMaxInstances - std::min(kMaxInstances, g.instances.size())) {
        diags.report(DiagKind::Overflow, e.args[0]->range.Start,
                     "repeat(" + std::to_string(*n) + ") makes more than " +
                         std::to_string(kMaxInstances) +
                         " block instances; tally stops counting here")
            .range(e.args[0]->range);
        return false;
      }
      uint32_t listInstance = newInstance(path, "repeat", m.instance);
      Value list;
      list.kind = Value::List;
      list.range = item.range;
      for (int64_t i = 0; i < *n; ++i) {
        std::string sub = path + "[" + std::to_string(i) + "]";
        ModuleObj *child =
            instantiate(*b, call, sub, newInstance(sub, b->name, listInstance), frozen,
                        e.lhs->range);
        if (!child)
          return false;
        list.list.push_back(child);
      }
      m.members[item.name] = std::move(list);
      return true;
    }
    if (const BlockDecl *b = blockOf(e, m.consts)) {
      ConstValue call = sema.eval(e, m.consts);
      if (call.kind == ConstValue::Invalid)
        return false;
      ModuleObj *child =
          instantiate(*b, call, path, newInstance(path, b->name, m.instance), frozen, e.range);
      if (!child)
        return false;
      Value v;
      v.kind = Value::Module;
      v.module = child;
      v.range = item.range;
      m.members[item.name] = v;
      return true;
    }
    if (e.kind == ExprKind::Call && e.lhs->kind == ExprKind::Name &&
        !m.consts.count(e.lhs->text)) {
      std::vector<std::string> names;
      for (const auto &kv : program.blocks)
        names.push_back(kv.getKey().str());
      sema.unknownName(e.lhs->range, "block", e.lhs->text, names);
      return false;
    }
    ConstValue v = sema.eval(e, m.consts);
    if (v.kind == ConstValue::Invalid)
      return false;
    m.consts[item.name] = v;
    return true;
  }

  // ---- forward evaluation ---------------------------------------------------------------

  Value callModule(ModuleObj &m, std::vector<Value> args, llvm::SMRange where) {
    if (!m.forward) {
      diags.report(DiagKind::TypeMismatch, where.Start,
                   "block '" + m.decl->name + "' has no forward function to call")
          .range(where)
          .note(m.decl->nameRange.Start, "'" + m.decl->name + "' is declared here");
      fail();
      return {};
    }
    const ForwardAST &f = *m.forward;
    if (args.size() != f.params.size()) {
      diags.report(DiagKind::WrongArgCount, where.Start,
                   "'" + m.decl->name + "' takes " + std::to_string(f.params.size()) +
                       " input" + (f.params.size() == 1 ? "" : "s") + ", but " +
                       std::to_string(args.size()) + (args.size() == 1 ? " was" : " were") +
                       " given")
          .range(where)
          .note(f.range.Start, "its forward function is declared here");
      fail();
      return {};
    }
    if (++callDepth > kMaxInstanceDepth * 2) {
      diags.report(DiagKind::NestingTooDeep, where.Start, "calls are nested too deeply")
          .range(where);
      fail();
      return {};
    }
    Scope scope{&m, {}};
    for (size_t i = 0; i < args.size(); ++i) {
      if (f.params[i].type && args[i].kind == Value::Tensor &&
          !checkInputType(m, f.params[i], args[i], where)) {
        --callDepth;
        fail();
        return {};
      }
      scope.locals[f.params[i].name] = args[i];
    }
    sites.push_back({where, m.decl, m.path, true});
    std::optional<Value> result = statements(f.body, scope);
    sites.pop_back();
    --callDepth;
    if (failed)
      return {};
    if (!result) {
      diags.report(DiagKind::MissingReturn, f.range.Start,
                   "the forward function of '" + m.decl->name + "' does not return a value")
          .range(llvm::SMRange(f.range.Start, f.range.Start));
      fail();
      return {};
    }
    return *result;
  }

  bool checkInputType(ModuleObj &m, const ForwardParam &p, const Value &arg,
                      llvm::SMRange where) {
    Shape want;
    Dtype dtype = g.tensors[arg.tensor].dtype;
    if (!shapeOf(*p.type, m.consts, true, want, dtype))
      return false;
    const Shape &have = g.tensors[arg.tensor].shape;
    bool same = have.size() == want.size();
    for (size_t i = 0; same && i < have.size(); ++i)
      same = have[i].size == want[i].size;
    if (!same) {
      diags.report(DiagKind::ShapeMismatch, where.Start,
                   "input '" + p.name + "' of '" + m.decl->name + "' must be " +
                       g.formatShape(want) + ", but it is " + g.formatShape(have))
          .range(where)
          .note(p.range.Start, "declared here");
      return false;
    }
    return true;
  }

  /// Runs statements; returns the returned value, or nullopt if the end is reached.
  std::optional<Value> statements(const std::vector<StmtPtr> &body, Scope &scope) {
    for (const StmtPtr &s : body) {
      if (failed)
        return Value{};
      switch (s->kind) {
      case StmtKind::Return:
        return eval(*s->value, scope);
      case StmtKind::If: {
        auto cond = condition(*s->value, scope.module->consts);
        if (!cond) {
          fail();
          return Value{};
        }
        auto r = statements(*cond ? s->thenBody : s->elseBody, scope);
        if (r)
          return r;
        break;
      }
      case StmtKind::Assign: {
        Value v = eval(*s->value, scope);
        if (v.kind == Value::Invalid) {
          fail();
          return Value{};
        }
        if (s->targets.size() == 1) {
          scope.locals[s->targets[0]] = v;
          break;
        }
        if (v.kind != Value::Tuple || v.elems.size() != s->targets.size()) {
          diags.report(DiagKind::WrongArgCount, s->range.Start,
                       "cannot unpack " +
                           (v.kind == Value::Tuple ? std::to_string(v.elems.size()) + " values"
                                                   : v.describe()) +
                           " into " + std::to_string(s->targets.size()) + " names")
              .range(s->value->range);
          fail();
          return Value{};
        }
        for (size_t i = 0; i < s->targets.size(); ++i)
          scope.locals[s->targets[i]] = v.elems[i];
        break;
      }
      }
    }
    return std::nullopt;
  }

  std::vector<std::string> visibleNames(const Scope &scope) {
    std::vector<std::string> names;
    for (const auto &kv : scope.locals)
      names.push_back(kv.getKey().str());
    for (const auto &kv : scope.module->members)
      names.push_back(kv.getKey().str());
    for (const auto &kv : scope.module->consts)
      names.push_back(kv.getKey().str());
    for (const std::string &p : primitiveNames())
      names.push_back(p);
    names.push_back("batch");
    names.push_back("seq");
    return names;
  }

  Value lookup(const Expr &e, Scope &scope) {
    const std::string &n = e.text;
    auto set = [&](Value v) {
      v.range = e.range;
      if (v.kind == Value::Const)
        v.c.range = e.range;
      return v;
    };
    if (auto it = scope.locals.find(n); it != scope.locals.end())
      return set(it->second);
    if (auto it = scope.module->members.find(n); it != scope.module->members.end())
      return set(it->second);
    if (auto it = scope.module->consts.find(n); it != scope.module->consts.end())
      return set(Value::ofConst(it->second));
    if (n == "batch")
      return set(Value::ofConst(ConstValue::integer(key.microBatch, e.range)));
    if (n == "seq" && !seqGiven(e.range)) {
      failed = true;
      return set(Value());
    }
    if (n == "seq")
      return set(Value::ofConst(ConstValue::integer(key.seq, e.range)));
    if (n == "true" || n == "false") {
      ConstValue c;
      c.kind = ConstValue::Bool;
      c.boolean = n == "true";
      c.range = e.range;
      return Value::ofConst(c);
    }
    if (std::find(primitiveNames().begin(), primitiveNames().end(), n) !=
        primitiveNames().end()) {
      diags.report(DiagKind::TypeMismatch, e.range.Start,
                   "'" + n + "' is a primitive op; call it, as in " + n + "(x)")
          .range(e.range);
      return {};
    }
    if (program.blocks.count(n)) {
      diags.report(DiagKind::TypeMismatch, e.range.Start,
                   "block '" + n + "' must be declared as a member before the forward "
                   "function uses it, as in `" + llvmLower(n) + " = " + n + "(...)`")
          .range(e.range);
      return {};
    }
    sema.unknownName(e.range, "name", n, visibleNames(scope));
    return {};
  }

  static std::string llvmLower(const std::string &s) {
    std::string out = s;
    for (char &c : out)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
  }

  Value eval(const Expr &e, Scope &scope) {
    if (failed)
      return {};
    switch (e.kind) {
    case ExprKind::Number:
    case ExprKind::String: {
      ConstEnv none;
      ConstValue v = sema.eval(e, none);
      return v.kind == ConstValue::Invalid ? Value{} : Value::ofConst(v);
    }
    case ExprKind::Name:
      return lookup(e, scope);
    case ExprKind::Neg: {
      Value v = eval(*e.args[0], scope);
      if (v.kind == Value::Tensor)
        return op1(OpKind::Neg, {v.tensor}, OpAttrs(), e, scope);
      if (v.kind == Value::Const && v.c.kind == ConstValue::Number)
        return Value::ofConst(v.c.isInteger && v.c.intValue != INT64_MIN
                                  ? ConstValue::integer(-v.c.intValue, e.range)
                                  : ConstValue::real(-v.c.number, v.c.dim, e.range));
      if (v.kind != Value::Invalid)
        diags.report(DiagKind::TypeMismatch, e.range.Start, "cannot negate " + v.describe())
            .range(e.range);
      return {};
    }
    case ExprKind::Binary:
      return binary(e, scope);
    case ExprKind::Call:
      return call(e, scope);
    case ExprKind::Member: {
      Value base = eval(*e.lhs, scope);
      if (base.kind == Value::Invalid)
        return {};
      if (base.kind != Value::Module) {
        diags.report(DiagKind::TypeMismatch, e.opLoc,
                     "'." + e.text + "' needs a block on its left, not " + base.describe())
            .range(e.lhs->range);
        return {};
      }
      ModuleObj &m = *base.module;
      if (auto it = m.members.find(e.text); it != m.members.end()) {
        Value v = it->second;
        v.range = e.range;
        return v;
      }
      if (auto it = m.consts.find(e.text); it != m.consts.end())
        return Value::ofConst(it->second);
      std::vector<std::string> names;
      for (const auto &kv : m.members)
        names.push_back(kv.getKey().str());
      for (const auto &kv : m.consts)
        names.push_back(kv.getKey().str());
      llvm::SMRange at(e.opLoc, e.range.End);
      sema.suggest(DiagKind::UnknownName, at,
                   "'" + m.decl->name + "' has no member '" + e.text + "'", e.text, names);
      return {};
    }
    case ExprKind::Index: {
      Value base = eval(*e.lhs, scope);
      if (base.kind == Value::Tensor)
        return slice(e, base, scope);
      if (base.kind != Value::Invalid && (e.args.size() != 1 || e.args[0]->kind == ExprKind::Slice)) {
        diags.report(DiagKind::TypeMismatch, e.args[0]->range.Start,
                     "only tensors take slices or several subscripts; " + base.describe() +
                         " takes one index")
            .range(e.args[0]->range);
        return {};
      }
      Value index = base.kind == Value::Invalid ? Value() : eval(*e.args[0], scope);
      if (base.kind == Value::Invalid || index.kind == Value::Invalid)
        return {};
      size_t count = base.kind == Value::List ? base.list.size()
                     : base.kind == Value::Tuple ? base.elems.size()
                                                 : 0;
      if (count == 0) {
        diags.report(DiagKind::TypeMismatch, e.opLoc,
                     "only repeated blocks and tuples can be indexed, not " + base.describe())
            .range(e.lhs->range);
        return {};
      }
      if (index.kind != Value::Const || !index.c.isInteger || index.c.dim != UnitDim::None) {
        diags.report(DiagKind::TypeMismatch, e.args[0]->range.Start,
                     "an index must be a whole number")
            .range(e.args[0]->range);
        return {};
      }
      int64_t i = index.c.intValue < 0 ? index.c.intValue + static_cast<int64_t>(count)
                                       : index.c.intValue;
      if (i < 0 || i >= static_cast<int64_t>(count)) {
        diags.report(DiagKind::InvalidValue, e.args[0]->range.Start,
                     "index " + std::to_string(index.c.intValue) + " is out of range for " +
                         std::to_string(count) + " elements")
            .range(e.args[0]->range);
        return {};
      }
      if (base.kind == Value::Tuple)
        return base.elems[static_cast<size_t>(i)];
      Value v;
      v.kind = Value::Module;
      v.module = base.list[static_cast<size_t>(i)];
      v.range = e.range;
      return v;
    }
    case ExprKind::Tuple:
    case ExprKind::List: {
      Value v;
      v.kind = Value::Tuple;
      v.range = e.range;
      for (const ExprPtr &a : e.args) {
        Value x = eval(*a, scope);
        if (x.kind == Value::Invalid)
          return {};
        v.elems.push_back(std::move(x));
      }
      return v;
    }
    case ExprKind::Record:
    case ExprKind::Repeat:
    case ExprKind::Device:
    case ExprKind::Slice:
      diags.report(DiagKind::TypeMismatch, e.range.Start,
                   "this kind of expression is not allowed in a forward function")
          .range(e.range);
      return {};
    }
    return {};
  }

  /// `x[:, 0]`, `x[:, 1:]`, `x[..., lo:hi:step]` on a tensor: a `slice` view (no copy). Each
  /// subscript takes one axis from the left; an integer index drops its axis; bounds may be
  /// negative (from the end), a slice's bounds are clamped to the axis as in Python, and an
  /// index out of range or an empty slice is an error at the subscript.
  Value slice(const Expr &e, const Value &base, Scope &scope) {
    const Shape shape = g.tensors[base.tensor].shape;
    if (e.args.size() > shape.size()) {
      diags.report(DiagKind::InvalidValue, e.args[shape.size()]->range.Start,
                   std::to_string(e.args.size()) + " subscripts for a tensor of rank " +
                       std::to_string(shape.size()) + ", " + g.formatShape(shape))
          .range(e.args[shape.size()]->range);
      return {};
    }
    OpAttrs attrs;
    auto whole = [&](const Expr *x, const char *what, std::optional<int64_t> &out) {
      if (!x)
        return true;
      Value v = eval(*x, scope);
      if (v.kind == Value::Invalid)
        return false;
      if (v.kind != Value::Const || v.c.kind != ConstValue::Number || !v.c.isInteger ||
          v.c.dim != UnitDim::None) {
        diags.report(DiagKind::NotInteger, x->range.Start,
                     std::string("a tensor ") + what + " must be a whole number, not " + v.describe())
            .range(x->range);
        return false;
      }
      out = v.c.intValue;
      return true;
    };
    for (size_t i = 0; i < e.args.size(); ++i) {
      const Expr &sub = *e.args[i];
      int64_t n = shape[i].size;
      SliceDim d;
      if (sub.kind != ExprKind::Slice) {
        std::optional<int64_t> idx;
        if (!whole(&sub, "index", idx))
          return {};
        int64_t k = *idx < 0 ? *idx + n : *idx;
        if (k < 0 || k >= n) {
          diags.report(DiagKind::InvalidValue, sub.range.Start,
                       "index " + std::to_string(*idx) + " is out of range for dimension " +
                           std::to_string(i) + " of " + g.formatShape(shape) + " (size " +
                           std::to_string(n) + ")")
              .range(sub.range);
          return {};
        }
        d.start = k;
        d.count = 1;
        d.drop = true;
        attrs.slices.push_back(d);
        continue;
      }
      std::optional<int64_t> lo, hi, step;
      if (!whole(sub.args[0].get(), "slice bound", lo) ||
          !whole(sub.args[1].get(), "slice bound", hi) || !whole(sub.args[2].get(), "slice step", step))
        return {};
      if (step && *step <= 0) {
        diags.report(DiagKind::InvalidValue, sub.args[2]->range.Start,
                     "a slice step must be 1 or more, not " + std::to_string(*step))
            .range(sub.args[2]->range);
        return {};
      }
      auto clamp = [n](std::optional<int64_t> v, int64_t dflt) {
        if (!v)
          return dflt;
        int64_t k = *v < 0 ? std::max<int64_t>(*v, -n) + n : *v;
        return std::min(k, n);
      };
      d.start = clamp(lo, 0);
      int64_t stop = clamp(hi, n);
      d.step = std::min(step.value_or(1), n); // a longer step takes one element all the same
      if (stop <= d.start) {
        diags.report(DiagKind::InvalidValue, sub.range.Start,
                     "slice " + std::to_string(d.start) + ":" + std::to_string(stop) +
                         " of dimension " + std::to_string(i) + " of " + g.formatShape(shape) +
                         " (size " + std::to_string(n) + ") is empty")
            .range(sub.range);
        return {};
      }
      d.count = 1 + (stop - d.start - 1) / d.step;
      attrs.slices.push_back(d);
    }
    return op1(OpKind::Slice, {base.tensor}, attrs, e, scope);
  }

  Value binary(const Expr &e, Scope &scope) {
    Value a = eval(*e.args[0], scope);
    Value b = eval(*e.args[1], scope);
    if (a.kind == Value::Invalid || b.kind == Value::Invalid)
      return {};
    if (a.kind == Value::Const && b.kind == Value::Const) {
      ConstValue v = sema.arith(e, a.c, b.c);
      return v.kind == ConstValue::Invalid ? Value{} : Value::ofConst(v);
    }
    const std::string &op = e.text;
    OpKind kind = op == "@" ? OpKind::Matmul
                  : op == "+" ? OpKind::Add
                  : op == "-" ? OpKind::Sub
                  : op == "*" ? OpKind::Mul
                              : OpKind::Div;
    if (a.kind == Value::Tensor && b.kind == Value::Tensor)
      return op1(kind, {a.tensor, b.tensor}, OpAttrs(), e, scope);
    const Value &t = a.kind == Value::Tensor ? a : b;
    const Value &c = a.kind == Value::Tensor ? b : a;
    if (t.kind != Value::Tensor || c.kind != Value::Const || c.c.kind != ConstValue::Number ||
        kind == OpKind::Matmul) {
      const Value &bad = t.kind != Value::Tensor ? t : c;
      diags.report(DiagKind::TypeMismatch, e.opLoc,
                   "operator '" + op + "' cannot take " + bad.describe())
          .range(bad.range);
      return {};
    }
    if (c.c.dim != UnitDim::None) {
      diags.report(DiagKind::UnitMismatch, c.range.Start,
                   "tensor arithmetic takes plain numbers, not " + c.c.describe())
          .range(c.range);
      return {};
    }
    OpAttrs attrs;
    attrs.hasScalar = true;
    attrs.scalar = c.c.number;
    attrs.scalarOnLeft = a.kind == Value::Const;
    return op1(kind, {t.tensor}, attrs, e, scope);
  }

  Value call(const Expr &e, Scope &scope) {
    // A primitive, unless a local or member of that name shadows it.
    if (e.lhs->kind == ExprKind::Name) {
      const std::string &n = e.lhs->text;
      bool shadowed = scope.locals.count(n) || scope.module->members.count(n) ||
                      scope.module->consts.count(n);
      if (!shadowed && std::find(primitiveNames().begin(), primitiveNames().end(), n) !=
                           primitiveNames().end())
        return primitive(n, e, scope);
    }
    Value callee = eval(*e.lhs, scope);
    if (callee.kind == Value::Invalid)
      return {};
    std::vector<Value> args;
    for (size_t i = 0; i < e.args.size(); ++i) {
      if (!e.argNames[i].empty()) {
        diags.report(DiagKind::UnknownArgument, e.argNameRanges[i].Start,
                     "a block's forward function takes its inputs by position")
            .range(e.argNameRanges[i]);
        return {};
      }
      Value v = eval(*e.args[i], scope);
      if (v.kind == Value::Invalid)
        return {};
      args.push_back(std::move(v));
    }
    if (callee.kind == Value::Module)
      return callModule(*callee.module, std::move(args), e.range);
    if (callee.kind == Value::List) {
      // The copies run in order. With one input, each copy's output is the next one's input.
      // With several (a decoder block's (x, memory)), a copy returning one tensor replaces the
      // first input and the others reach every copy unchanged; a copy returning as many values
      // as it takes passes all of them on.
      if (args.empty()) {
        diags.report(DiagKind::WrongArgCount, e.range.Start,
                     "a repeated block needs at least one input")
            .range(e.range);
        return {};
      }
      bool all = false; // the last copy returned every input's next value
      for (ModuleObj *m : callee.list) {
        Value y = callModule(*m, args, e.range);
        if (y.kind == Value::Invalid)
          return {};
        if (args.size() > 1 && y.kind == Value::Tuple && y.elems.size() == args.size()) {
          args = y.elems;
          all = true;
        } else if (args.size() > 1 && y.kind == Value::Tuple) {
          diags.report(DiagKind::WrongArgCount, e.range.Start,
                       "a copy of this repeated block returns " + std::to_string(y.elems.size()) +
                           " values for " + std::to_string(args.size()) +
                           " inputs; return one tensor (the first input's next value) or all " +
                           std::to_string(args.size()))
              .range(e.range);
          return {};
        } else {
          args[0] = y;
          all = false;
        }
      }
      if (!all)
        return args[0];
      Value out;
      out.kind = Value::Tuple;
      out.range = e.range;
      out.elems = args;
      return out;
    }
    diags.report(DiagKind::TypeMismatch, e.range.Start,
                 "cannot call " + callee.describe())
        .range(e.lhs->range);
    return {};
  }

  // ---- primitives -------------------------------------------------------------------------

  /// Arguments of a primitive call bound to its parameter names.
  struct Bound {
    std::vector<const Expr *> exprs;
    std::vector<Value> values;
    bool has(size_t i) const { return i < values.size() && values[i].kind != Value::Invalid; }
  };

  std::optional<Bound> bind(const std::string &name, const std::vector<std::string> &params,
                            size_t required, bool variadic, const Expr &e, Scope &scope) {
    Bound b;
    b.exprs.assign(params.size(), nullptr);
    b.values.resize(params.size());
    size_t positional = 0;
    for (size_t i = 0; i < e.args.size(); ++i) {
      size_t slot;
      if (e.argNames[i].empty()) {
        slot = positional++;
        if (variadic && slot >= params.size() - 1) {
          // extra positional inputs of concat gather into its first parameter
          Value v = eval(*e.args[i], scope);
          if (v.kind == Value::Invalid)
            return std::nullopt;
          if (b.values[0].kind != Value::Tuple) {
            Value first = b.values[0];
            b.values[0] = Value();
            b.values[0].kind = Value::Tuple;
            b.values[0].range = e.range;
            if (first.kind != Value::Invalid)
              b.values[0].elems.push_back(first);
          }
          b.values[0].elems.push_back(v);
          b.exprs[0] = &e;
          continue;
        }
        if (slot >= params.size()) {
          diags.report(DiagKind::WrongArgCount, e.args[i]->range.Start,
                       "'" + name + "' takes at most " + std::to_string(params.size()) +
                           " argument" + (params.size() == 1 ? "" : "s"))
              .range(e.args[i]->range);
          return std::nullopt;
        }
      } else {
        auto it = std::find(params.begin(), params.end(), e.argNames[i]);
        if (it == params.end()) {
          sema.suggest(DiagKind::UnknownArgument, e.argNameRanges[i],
                       "'" + name + "' has no argument '" + e.argNames[i] + "'", e.argNames[i],
                       params);
          return std::nullopt;
        }
        slot = static_cast<size_t>(it - params.begin());
      }
      if (b.exprs[slot]) {
        llvm::SMRange at = e.argNames[i].empty() ? e.args[i]->range : e.argNameRanges[i];
        diags.report(DiagKind::DuplicateName, at.Start,
                     "argument '" + params[slot] + "' of '" + name + "' is given twice")
            .range(at);
        return std::nullopt;
      }
      Value v = eval(*e.args[i], scope);
      if (v.kind == Value::Invalid)
        return std::nullopt;
      b.exprs[slot] = e.args[i].get();
      b.values[slot] = std::move(v);
    }
    for (size_t i = 0; i < required; ++i)
      if (!b.exprs[i]) {
        diags.report(DiagKind::WrongArgCount, e.range.Start,
                     "'" + name + "' needs its argument '" + params[i] + "'")
            .range(e.range);
        return std::nullopt;
      }
    return b;
  }

  bool tensorArg(const Bound &b, size_t i, const std::string &fn, const std::string &what,
                 TensorId &out) {
    if (b.values[i].kind != Value::Tensor) {
      diags.report(DiagKind::TypeMismatch, b.values[i].range.Start,
                   "'" + what + "' of '" + fn + "' must be a tensor, not " +
                       b.values[i].describe())
          .range(b.values[i].range);
      return false;
    }
    out = b.values[i].tensor;
    return true;
  }

  std::optional<double> numberArg(const Bound &b, size_t i, const std::string &what,
                                  double dflt) {
    if (!b.has(i))
      return dflt;
    const Value &v = b.values[i];
    if (v.kind != Value::Const || v.c.kind != ConstValue::Number ||
        (v.c.dim != UnitDim::None && v.c.dim != UnitDim::Ratio)) {
      diags.report(DiagKind::TypeMismatch, v.range.Start,
                   "'" + what + "' must be a number, not " + v.describe())
          .range(v.range);
      return std::nullopt;
    }
    return v.c.number;
  }

  std::optional<int64_t> intArg(const Bound &b, size_t i, const std::string &what,
                                int64_t dflt) {
    if (!b.has(i))
      return dflt;
    const Value &v = b.values[i];
    if (v.kind != Value::Const || v.c.kind != ConstValue::Number || !v.c.isInteger ||
        v.c.dim != UnitDim::None) {
      bool plain = v.kind == Value::Const && v.c.kind == ConstValue::Number &&
                   v.c.dim == UnitDim::None;
      diags.report(DiagKind::NotInteger, v.range.Start,
                   "'" + what + "' must be a whole number, " +
                       (plain ? "but it is " + plainNumber(v.c.number) : "not " + v.describe()))
          .range(v.range);
      return std::nullopt;
    }
    return v.c.intValue;
  }

  std::optional<bool> boolArg(const Bound &b, size_t i, const std::string &what, bool dflt) {
    if (!b.has(i))
      return dflt;
    const Value &v = b.values[i];
    if (v.kind != Value::Const || v.c.kind != ConstValue::Bool) {
      diags.report(DiagKind::TypeMismatch, v.range.Start,
                   "'" + what + "' must be true or false, not " + v.describe())
          .range(v.range);
      return std::nullopt;
    }
    return v.c.boolean;
  }

  std::optional<double> probability(const Bound &b, size_t i, const std::string &what) {
    auto p = numberArg(b, i, what, 0);
    if (p && (*p < 0 || *p >= 1)) {
      diags.report(DiagKind::InvalidValue, b.values[i].range.Start,
                   "'" + what + "' is a probability in [0, 1), not " +
                       plainNumber(*p))
          .range(b.values[i].range);
      return std::nullopt;
    }
    return p;
  }

  /// `stride = 2` or `stride = (2, 1)`: one whole number for both spatial axes or one each;
  /// at least `lo`. Absent: both `dflt`.
  bool pairArg(const Bound &b, size_t i, const std::string &what, int64_t lo, int64_t dflt,
               int64_t (&out)[2]) {
    out[0] = out[1] = dflt;
    if (!b.has(i))
      return true;
    const Value &v = b.values[i];
    std::vector<Value> items = v.kind == Value::Tuple ? v.elems : std::vector<Value>{v};
    bool ok = items.size() == 1 || items.size() == 2;
    for (size_t k = 0; ok && k < items.size(); ++k) {
      const Value &x = items[k];
      ok = x.kind == Value::Const && x.c.kind == ConstValue::Number && x.c.isInteger &&
           x.c.dim == UnitDim::None && x.c.intValue >= lo && x.c.intValue <= (int64_t(1) << 40);
      if (ok)
        out[k] = out[items.size() == 1 ? 1 : k] = x.c.intValue;
    }
    if (!ok)
      diags.report(DiagKind::InvalidValue, v.range.Start,
                   "'" + what + "' must be a whole number " + (lo > 0 ? "of at least 1" : "of at least 0") +
                       ", or a pair (height, width) of them, not " + v.describe())
          .range(v.range);
    return ok;
  }

  bool shapeArg(const Value &v, Shape &out) {
    std::vector<Value> items = v.kind == Value::Tuple ? v.elems : std::vector<Value>{v};
    for (const Value &x : items) {
      if (x.kind != Value::Const || !x.c.isInteger || x.c.dim != UnitDim::None ||
          (x.c.intValue <= 0 && x.c.intValue != -1)) {
        diags.report(DiagKind::TypeMismatch, x.range.Start,
                     "a shape is a list of positive whole numbers (one may be -1)")
            .range(x.range);
        return false;
      }
      Dim d;
      d.size = x.c.intValue;
      out.push_back(d);
    }
    return true;
  }

  Value primitive(const std::string &name, const Expr &e, Scope &scope) {
    static const std::map<std::string, OpKind> unary = {
        {"relu", OpKind::Relu}, {"gelu", OpKind::Gelu},       {"silu", OpKind::Silu},
        {"tanh", OpKind::Tanh}, {"sigmoid", OpKind::Sigmoid}, {"exp", OpKind::Exp},
        {"next_tokens", OpKind::NextTokens}};
    OpAttrs attrs;
    TensorId x = kNone, y = kNone, z = kNone;
    if (auto it = unary.find(name); it != unary.end()) {
      auto b = bind(name, {"x"}, 1, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "x", x))
        return {};
      return op1(it->second, {x}, attrs, e, scope);
    }
    if (name == "rope") { // fraction < 1: partial rotary (NeoX rotary_pct)
      auto b = bind(name, {"x", "fraction"}, 1, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "x", x))
        return {};
      auto f = numberArg(*b, 1, "fraction", 1);
      if (!f)
        return {};
      if (!(*f > 0 && *f <= 1)) {
        diags.report(DiagKind::InvalidValue, b->values[1].range.Start,
                     "'fraction' of rope is the share of each head's dims rotated, in (0, 1], not " +
                         plainNumber(*f))
            .range(b->values[1].range);
        return {};
      }
      attrs.fraction = *f;
      return op1(OpKind::Rope, {x}, attrs, e, scope);
    }
    if (name == "conv2d") {
      auto b = bind(name, {"x", "weight", "bias", "stride", "padding"}, 2, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "x", x) || !tensorArg(*b, 1, name, "weight", y))
        return {};
      if (b->has(2) && !tensorArg(*b, 2, name, "bias", z))
        return {};
      if (!pairArg(*b, 3, "stride", 1, 1, attrs.strides) ||
          !pairArg(*b, 4, "padding", 0, 0, attrs.pads))
        return {};
      const Shape &w = g.tensors[y].shape;
      if (w.size() == 4) {
        attrs.window[0] = w[2].size;
        attrs.window[1] = w[3].size;
      }
      if (z == kNone)
        return op1(OpKind::Conv2d, {x, y}, attrs, e, scope);
      return op1(OpKind::Conv2d, {x, y, z}, attrs, e, scope);
    }
    if (name == "max_pool2d" || name == "avg_pool2d") {
      auto b = bind(name, {"x", "kernel", "stride", "padding"}, 2, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "x", x) || !pairArg(*b, 1, "kernel", 1, 1, attrs.window))
        return {};
      // The stride defaults to the window, as in PyTorch.
      if (!pairArg(*b, 2, "stride", 1, attrs.window[0], attrs.strides) ||
          !pairArg(*b, 3, "padding", 0, 0, attrs.pads))
        return {};
      if (!b->has(2))
        attrs.strides[1] = attrs.window[1];
      return op1(name == "max_pool2d" ? OpKind::MaxPool2d : OpKind::AvgPool2d, {x}, attrs, e,
                 scope);
    }
    if (name == "broadcast_to") {
      auto b = bind(name, {"x", "shape"}, 2, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "x", x) || !shapeArg(b->values[1], attrs.newShape))
        return {};
      return op1(OpKind::BroadcastTo, {x}, attrs, e, scope);
    }
    if (name == "matmul") {
      auto b = bind(name, {"a", "b"}, 2, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "a", x) || !tensorArg(*b, 1, name, "b", y))
        return {};
      return op1(OpKind::Matmul, {x, y}, attrs, e, scope);
    }
    if (name == "dropout") {
      auto b = bind(name, {"x", "p"}, 2, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "x", x))
        return {};
      auto p = probability(*b, 1, "p");
      if (!p)
        return {};
      attrs.p = *p;
      return op1(OpKind::Dropout, {x}, attrs, e, scope);
    }
    if (name == "softmax") {
      auto b = bind(name, {"x", "dim"}, 1, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "x", x))
        return {};
      auto dim = intArg(*b, 1, "dim", -1);
      if (!dim)
        return {};
      attrs.dim = *dim;
      return op1(OpKind::Softmax, {x}, attrs, e, scope);
    }
    if (name == "layer_norm") {
      auto b = bind(name, {"x", "weight", "bias", "eps"}, 2, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "x", x) || !tensorArg(*b, 1, name, "weight", y))
        return {};
      if (b->has(2) && !tensorArg(*b, 2, name, "bias", z))
        return {};
      auto eps = numberArg(*b, 3, "eps", 1e-5);
      if (!eps)
        return {};
      attrs.eps = *eps;
      if (z == kNone)
        return op1(OpKind::LayerNorm, {x, y}, attrs, e, scope);
      return op1(OpKind::LayerNorm, {x, y, z}, attrs, e, scope);
    }
    if (name == "rms_norm") {
      auto b = bind(name, {"x", "weight", "eps"}, 2, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "x", x) || !tensorArg(*b, 1, name, "weight", y))
        return {};
      auto eps = numberArg(*b, 2, "eps", 1e-6);
      if (!eps)
        return {};
      attrs.eps = *eps;
      return op1(OpKind::RmsNorm, {x, y}, attrs, e, scope);
    }
    if (name == "attention") {
      auto b = bind(name,
                    {"q", "k", "v", "heads", "kv_heads", "causal", "fused", "dropout", "alibi", "mask"},
                    4, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "q", x) || !tensorArg(*b, 1, name, "k", y) ||
          !tensorArg(*b, 2, name, "v", z))
        return {};
      auto heads = intArg(*b, 3, "heads", 1);
      auto kv = intArg(*b, 4, "kv_heads", heads ? *heads : 1);
      auto causal = boolArg(*b, 5, "causal", false);
      auto fused = boolArg(*b, 6, "fused", true);
      auto p = probability(*b, 7, "dropout");
      auto alibi = boolArg(*b, 8, "alibi", false);
      if (!heads || !kv || !causal || !fused || !p || !alibi)
        return {};
      TensorId mask = kNone;
      if (b->has(9) && !tensorArg(*b, 9, name, "mask", mask))
        return {};
      if (mask != kNone && isFloat(g.tensors[mask].dtype)) {
        diags.report(DiagKind::TypeMismatch, b->values[9].range.Start,
                     "'mask' of 'attention' is a padding mask of integers or booleans "
                     "[batch, seq_kv] (nonzero: attend), not " +
                         nameOf(g.tensors[mask].dtype).str())
            .range(b->values[9].range);
        return {};
      }
      if (*heads <= 0 || *kv <= 0) {
        diags.report(DiagKind::InvalidValue, e.range.Start,
                     "attention needs a positive number of heads")
            .range(e.range);
        return {};
      }
      attrs.heads = *heads;
      attrs.kvHeads = *kv;
      attrs.causal = *causal;
      attrs.fused = *fused;
      attrs.p = *p;
      attrs.alibi = *alibi;
      attrs.hasMask = mask != kNone;
      if (mask != kNone)
        return op1(OpKind::Attention, {x, y, z, mask}, attrs, e, scope);
      return op1(OpKind::Attention, {x, y, z}, attrs, e, scope);
    }
    if (name == "embedding") {
      auto b = bind(name, {"ids", "weight"}, 2, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "ids", x) || !tensorArg(*b, 1, name, "weight", y))
        return {};
      return op1(OpKind::Embedding, {x, y}, attrs, e, scope);
    }
    if (name == "sum" || name == "mean") {
      auto b = bind(name, {"x", "dim", "keepdim"}, 1, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "x", x))
        return {};
      auto dim = intArg(*b, 1, "dim", -1);
      auto keep = boolArg(*b, 2, "keepdim", false);
      if (!dim || !keep)
        return {};
      attrs.reduceAll = !b->has(1);
      attrs.dim = *dim;
      attrs.keepDim = *keep;
      return op1(name == "sum" ? OpKind::Sum : OpKind::Mean, {x}, attrs, e, scope);
    }
    if (name == "cross_entropy") {
      auto b = bind(name, {"logits", "labels"}, 2, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "logits", x) || !tensorArg(*b, 1, name, "labels", y))
        return {};
      return op1(OpKind::CrossEntropy, {x, y}, attrs, e, scope);
    }
    if (name == "positions") {
      auto b = bind(name, {"n"}, 1, false, e, scope);
      if (!b)
        return {};
      auto n = intArg(*b, 0, "n", 1);
      if (!n)
        return {};
      if (*n <= 0) {
        diags.report(DiagKind::InvalidValue, e.range.Start, "positions(n) needs n > 0")
            .range(e.range);
        return {};
      }
      Dim d;
      d.size = *n;
      const Expr *arg = b->exprs[0];
      if (arg->kind == ExprKind::Name && (arg->text == "seq" || arg->text == "batch") &&
          !scope.locals.count(arg->text) && !scope.module->consts.count(arg->text))
        d.sym = g.symbol(arg->text);
      attrs.newShape.push_back(d);
      return op1(OpKind::Positions, {}, attrs, e, scope);
    }
    if (name == "concat") {
      auto b = bind(name, {"tensors", "dim"}, 1, true, e, scope);
      if (!b)
        return {};
      auto dim = intArg(*b, 1, "dim", -1);
      if (!dim)
        return {};
      attrs.dim = *dim;
      llvm::SmallVector<TensorId, 3> ins;
      const Value &list = b->values[0];
      std::vector<Value> items = list.kind == Value::Tuple ? list.elems : std::vector<Value>{list};
      for (const Value &v : items) {
        if (v.kind != Value::Tensor) {
          diags.report(DiagKind::TypeMismatch, v.range.Start,
                       "concat joins tensors, not " + v.describe())
              .range(v.range);
          return {};
        }
        ins.push_back(v.tensor);
      }
      return op1(OpKind::Concat, ins, attrs, e, scope);
    }
    if (name == "split") {
      auto b = bind(name, {"x", "parts", "dim"}, 2, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "x", x))
        return {};
      auto parts = intArg(*b, 1, "parts", 1);
      auto dim = intArg(*b, 2, "dim", -1);
      if (!parts || !dim)
        return {};
      if (*parts <= 0 || *parts > 4096) {
        diags.report(DiagKind::InvalidValue, b->values[1].range.Start,
                     "split needs between 1 and 4096 parts")
            .range(b->values[1].range);
        return {};
      }
      attrs.parts = *parts;
      attrs.dim = *dim;
      return op1(OpKind::Split, {x}, attrs, e, scope);
    }
    if (name == "topk") {
      auto b = bind(name, {"x", "k", "dim"}, 2, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "x", x))
        return {};
      auto k = intArg(*b, 1, "k", 1);
      auto dim = intArg(*b, 2, "dim", -1);
      if (!k || !dim)
        return {};
      attrs.k = *k;
      attrs.dim = *dim;
      return op1(OpKind::TopK, {x}, attrs, e, scope);
    }
    if (name == "gather") {
      auto b = bind(name, {"x", "indices", "dim"}, 2, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "x", x) || !tensorArg(*b, 1, name, "indices", y))
        return {};
      auto dim = intArg(*b, 2, "dim", -1);
      if (!dim)
        return {};
      attrs.dim = *dim;
      return op1(OpKind::Gather, {x, y}, attrs, e, scope);
    }
    if (name == "moe") {
      auto b = bind(name, {"x", "gates", "indices", "w_gate", "w_up", "w_down", "capacity_factor"},
                    6, false, e, scope);
      llvm::SmallVector<TensorId, 3> ins(6, kNone);
      static const char *const names[] = {"x", "gates", "indices", "w_gate", "w_up", "w_down"};
      if (!b)
        return {};
      for (unsigned i = 0; i < 6; ++i)
        if (!tensorArg(*b, i, name, names[i], ins[i]))
          return {};
      auto cf = numberArg(*b, 6, "capacity_factor", 0);
      if (!cf)
        return {};
      if (*cf < 0 || *cf > 1e6) {
        diags.report(DiagKind::InvalidValue, b->values[6].range.Start,
                     "capacity_factor is 0 (no cap) or a positive factor such as 1.25, not " +
                         plainNumber(*cf))
            .range(b->values[6].range);
        return {};
      }
      attrs.capacity = *cf;
      return op1(OpKind::Moe, ins, attrs, e, scope);
    }
    if (name == "reshape") {
      auto b = bind(name, {"x", "shape"}, 2, false, e, scope);
      if (!b || !tensorArg(*b, 0, name, "x", x) || !shapeArg(b->values[1], attrs.newShape))
        return {};
      return op1(OpKind::Reshape, {x}, attrs, e, scope);
    }
    // transpose
    auto b = bind(name, {"x", "dim0", "dim1"}, 1, false, e, scope);
    if (!b || !tensorArg(*b, 0, name, "x", x))
      return {};
    auto d0 = intArg(*b, 1, "dim0", -2);
    auto d1 = intArg(*b, 2, "dim1", -1);
    if (!d0 || !d1)
      return {};
    attrs.transposeA = *d0;
    attrs.transposeB = *d1;
    return op1(OpKind::Transpose, {x}, attrs, e, scope);
  }

  /// The strides and offset of a view op's outputs over the storage of its input (step 3 of
  /// the layout rules in docs/ir.md): split offsets each part along its axis, slice offsets
  /// its start and multiplies strides by its steps (dropping indexed axes), transpose swaps
  /// two strides, reshape re-strides a dense input (a reshape of a non-dense view is made
  /// dense later by passes/Contiguous.cpp, which gives it a copy to view).
  void setViewLayouts(Op &op) {
    const Tensor &x = g.tensors[op.inputs[0]];
    for (size_t i = 0; i < op.outputs.size(); ++i) {
      Tensor &t = g.tensors[op.outputs[i]];
      Layout l = x.layout;
      if (op.kind == OpKind::Split) {
        size_t axis = 0;
        normalizeAxis(op.attrs.dim, x.shape.size(), axis);
        l.offset += static_cast<int64_t>(i) * t.shape[axis].size * x.layout.strides[axis];
      } else if (op.kind == OpKind::Slice) {
        llvm::SmallVector<int64_t, 4> st;
        for (size_t a = 0; a < x.shape.size(); ++a) {
          if (a >= op.attrs.slices.size()) {
            st.push_back(x.layout.strides[a]);
            continue;
          }
          const SliceDim &d = op.attrs.slices[a];
          l.offset += d.start * x.layout.strides[a];
          if (!d.drop)
            st.push_back(x.layout.strides[a] * d.step);
        }
        l.strides = std::move(st);
      } else if (op.kind == OpKind::Transpose) {
        size_t a0 = 0, a1 = 0;
        normalizeAxis(op.attrs.transposeA, x.shape.size(), a0);
        normalizeAxis(op.attrs.transposeB, x.shape.size(), a1);
        std::swap(l.strides[a0], l.strides[a1]);
      } else {
        l.strides = viewStrides(x.shape, x.layout.strides, t.shape)
                        .value_or(denseStrides(t.shape));
      }
      t.layout = std::move(l);
    }
  }

  /// A dense copy of `t` (a `contiguous` op), for a kernel that cannot read its layout.
  struct DenseCopy {
    TensorId id = kNone;
    bool valid = false;
  };
  DenseCopy dense(TensorId t, const Expr &e, Scope &scope) {
    Value v = op1(OpKind::Contiguous, {t}, OpAttrs(), e, scope);
    if (v.kind != Value::Tensor)
      return {};
    return {v.tensor, true};
  }

  /// Appends one op; returns its output (or a tuple of outputs for split).
  Value op1(OpKind kind, llvm::SmallVector<TensorId, 3> inputs, const OpAttrs &attrs,
            const Expr &e, Scope &scope) {
    if (g.ops.size() >= kMaxOps) {
      diags.report(DiagKind::Overflow, e.range.Start,
                   "the model has more than " + std::to_string(kMaxOps) +
                       " ops; tally stops counting here")
          .range(e.range);
      fail();
      return {};
    }
    Op op;
    op.kind = kind;
    op.inputs = std::move(inputs);
    op.attrs = attrs;
    op.instance = scope.module->instance;
    op.range = e.range;
    // A kernel that cannot read an input's layout (an elementwise op on a transposed view,
    // say) reads a dense copy of it instead: the copy is an op of its own, priced like any.
    for (unsigned i = 0; i < op.inputs.size(); ++i) {
      if (acceptsLayout(g, op, i))
        continue;
      DenseCopy copy = dense(op.inputs[i], e, scope);
      if (!copy.valid)
        return {};
      op.inputs[i] = copy.id;
    }
    llvm::SmallVector<TensorType, 3> outs;
    ShapeError err;
    bool inferred = ruleFor(kind).infer(g, op, outs, err);
    if (inferred && kind == OpKind::Reshape && !outs.empty()) {
      const Tensor &x = g.tensors[op.inputs[0]];
      if (!viewStrides(x.shape, x.layout.strides, outs[0].shape)) {
        auto copy = dense(op.inputs[0], e, scope);
        if (!copy.valid)
          return {};
        op.inputs[0] = copy.id;
      }
    }
    if (!inferred) {
      DiagKind dk = err.kind == ShapeErrorKind::Matmul      ? DiagKind::MatmulShape
                    : err.kind == ShapeErrorKind::Broadcast ? DiagKind::BroadcastShape
                    : err.kind == ShapeErrorKind::Overflow  ? DiagKind::Overflow
                    : err.kind == ShapeErrorKind::Invalid   ? DiagKind::InvalidValue
                                                            : DiagKind::ShapeMismatch;
      llvm::SMLoc at = e.kind == ExprKind::Binary ? e.opLoc : e.range.Start;
      auto d = diags.report(dk, at, err.message);
      d.range(e.range);
      context(d);
      fail();
      return {};
    }
    // Name the op after its instance and kind: "h[3].attn.qkv.matmul", "h[3].add#2".
    if (opCounts.size() < g.instances.size())
      opCounts.resize(g.instances.size());
    unsigned n = ++opCounts[op.instance][opName(kind)];
    op.path = join(scope.module->path, opName(kind));
    if (n > 1)
      op.path += "#" + std::to_string(n);
    bool grad = false;
    for (TensorId t : op.inputs)
      grad |= g.tensors[t].requiresGrad;
    TensorId base = kNone;
    if (opClass(kind) == OpClass::View && !op.inputs.empty())
      base = g.tensors[op.inputs[0]].viewOf != kNone ? g.tensors[op.inputs[0]].viewOf
                                                     : op.inputs[0];
    Value result;
    result.kind = Value::Tuple;
    result.range = e.range;
    // Split returns all its parts, topk (values, indices); every other op returns its first
    // output, the rest being
    // what its backward reads (statistics, logsumexp, masks), which carry no gradient.
    bool tuple = kind == OpKind::Split || kind == OpKind::TopK;
    for (TensorType &tt : outs) {
      Tensor t;
      t.shape = std::move(tt.shape);
      t.dtype = tt.dtype;
      t.requiresGrad = grad && isFloat(tt.dtype) && (tuple || op.outputs.empty());
      t.viewOf = base;
      TensorId id = g.addTensor(std::move(t));
      op.outputs.push_back(id);
      result.elems.push_back(Value::ofTensor(id, e.range));
    }
    if (!op.inputs.empty() && opClass(kind) == OpClass::View)
      setViewLayouts(op);
    if (op.kind == OpKind::Dropout || (op.kind == OpKind::Attention && op.attrs.p > 0))
      op.attrs.stream = g.randomStreams++;
    if (op.kind == OpKind::Attention && op.attrs.scale == 0)
      op.attrs.scale = 1 / std::sqrt(static_cast<double>(g.tensors[op.inputs[0]].shape[2].size) /
                                     static_cast<double>(op.attrs.heads));
    if (op.kind == OpKind::Attention)
      setRopeHeadDims(op);
    g.addOp(std::move(op));
    if (!tuple)
      return result.elems[0];
    return result;
  }

  /// Rope rotates pairs within each head, so it needs the head size of the attention that
  /// reads it: q's (and k's) rope, reached through views and copies, gets d / heads unless the
  /// head size was already set.
  void setRopeHeadDims(const Op &attention) {
    if (attention.attrs.heads <= 0)
      return;
    int64_t hd = g.tensors[attention.inputs[0]].shape.back().size / attention.attrs.heads;
    for (unsigned i = 0; i < 2 && i < attention.inputs.size(); ++i) {
      TensorId t = attention.inputs[i];
      while (t != kNone) {
        OpId p = g.tensors[t].producer;
        if (p == kNone)
          break;
        Op &op = g.ops[p];
        if (op.kind == OpKind::Rope) {
          if (op.attrs.headDim == 0)
            op.attrs.headDim = hd;
          auto rot = static_cast<int64_t>(static_cast<double>(op.attrs.headDim) * op.attrs.fraction);
          if (op.attrs.fraction < 1 && (rot <= 0 || rot % 2 != 0)) {
            auto d = diags.report(DiagKind::InvalidValue, op.range.Start,
                                  "rope fraction " + plainNumber(op.attrs.fraction) + " of head size " +
                                      std::to_string(op.attrs.headDim) + " rotates " +
                                      std::to_string(rot) + " dims; it must be an even number above 0");
            d.range(op.range);
            context(d);
            fail();
          }
          break;
        }
        if (opClass(op.kind) != OpClass::View && op.kind != OpKind::Contiguous)
          break;
        t = op.inputs.empty() ? kNone : op.inputs[0];
      }
    }
  }

  void collectOutputs(const Value &v) {
    if (v.kind == Value::Tensor)
      g.outputs.push_back(v.tensor);
    else if (v.kind == Value::Tuple)
      for (const Value &x : v.elems)
        collectOutputs(x);
  }

  std::string describeOutputs() const {
    if (g.outputs.empty())
      return "no tensor";
    if (g.outputs.size() > 1)
      return std::to_string(g.outputs.size()) + " tensors";
    const Tensor &t = g.tensors[g.outputs[0]];
    return "a tensor of shape " + g.formatShape(t.shape) + " (" + nameOf(t.dtype).str() + ")";
  }
};

} // namespace

std::optional<Graph> lowerPlan(Sema &sema, const Program &program, const PlanDecl &decl,
                               const Plan &plan) {
  return Lowerer(sema, program, plan).run(decl);
}

} // namespace tally
