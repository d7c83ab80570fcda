// Lowering, step 1: instantiation. The model block and everything it contains become
// instances with their constants, parameters and submodules (frontend/Lower.cpp has the steps).
//
// 1. Bind the block's parameters from the constant call: positional, named, then defaults
//    (bindArgs).
// 2. Walk the body in order: `param` creates a parameter tensor (its shape from constants
//    only; a frozen block's parameters need no gradient), `name = Block(...)` instantiates a
//    submodule, `repeat(n) Block(...)` makes n copies named `name[i]` (copy 0 instantiated,
//    the others copied from it when it said nothing: cloneInstance), other members are
//    constants, `if` picks a branch, `forward` is remembered for step 3.
// A block that instantiates itself (directly or not) is reported with the cycle; nesting and
// the number of instances are bounded (kMaxInstanceDepth, kMaxInstances).
#include "frontend/Lowerer.h"
#include "llvm/Support/ErrorHandling.h"
#include "support/Suggest.h"

#include <algorithm>

namespace tally {
namespace lowering {

/// Binds a block's parameters from a constant call (`Linear(d, 4 * d, bias = false)`).
bool Lowerer::bindArgs(const BlockDecl &b, const ConstValue &call, ConstEnv &env, llvm::SMRange where) {
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
bool Lowerer::seqGiven(llvm::SMRange use) {
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
bool Lowerer::shapeOf(const TensorTypeAST &type, const ConstEnv &consts, bool withPlan, Shape &shape,
                      Dtype &dtype) {
  if (!type.dtype.empty()) {
    auto d = parseDtype(type.dtype);
    if (!d) {
      sema.suggest(DiagKind::UnknownDtype, type.dtypeRange,
                   "unknown dtype '" + type.dtype + "'", type.dtype, dtypeSpellings())
          .note(llvm::SMLoc(), "the dtypes are: " + choiceList(dtypeNames()));
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

ModuleObj *Lowerer::instantiate(const BlockDecl &b, const ConstValue &call, const std::string &path,
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

uint32_t subtreeEnd(const Graph &g, uint32_t root) {
  uint32_t end = root + 1;
  while (end < g.instances.size() && g.instances[end].depth > g.instances[root].depth)
    ++end;
  return end;
}

std::pair<size_t, size_t> paramsIn(const Graph &g, uint32_t lo, uint32_t hi) {
  auto byInstance = [](const ParamInfo &p, uint32_t i) { return p.instance < i; };
  auto a = std::lower_bound(g.params.begin(), g.params.end(), lo, byInstance);
  auto b = std::lower_bound(a, g.params.end(), hi, byInstance);
  return {static_cast<size_t>(a - g.params.begin()), static_cast<size_t>(b - g.params.begin())};
}

/// The part of `path` after the path of instance `parent`: an instance keeps only that
/// (Instance::part). Every path lowering makes is its parent's with a member or an index
/// appended, so the parent's is a prefix.
static const std::string &partAfter(const Graph &g, const std::string &path, uint32_t parent) {
  std::string parentPath = g.instancePath(parent);
  if (llvm::StringRef(path).startswith(parentPath))
    return pooledName(llvm::StringRef(path).drop_front(parentPath.size()));
  llvm::report_fatal_error(llvm::Twine("internal error: instance path '") + path + "' does not extend its parent's '" +
                           parentPath + "'");
}

/// A repeat list's next copy made from its first (`from`, instantiated under the same list
/// with the same call, and which said nothing): `from`'s instances, parameters (with their
/// tensors) again, renamed from its path to `path` and re-indexed, each list in the order
/// instantiation makes it — so the graph is the one instantiating the copy gives, byte for
/// byte (lit lower-repeat-copies compares the IR; issue 12: instantiating every copy of a
/// 10,000-layer model was 15% of its check). The copy's module object is lazy (lazyCopy):
/// its constants and members are copy 0's, mapped, once something reads them
/// (materialize: an evaluated call, a member access such as `h[2].fc`); a copy only ever
/// called through cloneCall never copies them (copying and freeing them was 10% of a
/// 1,000-layer report). Nullptr, with nothing appended, when the copy would pass
/// kMaxInstances: instantiation then says so.
ModuleObj *Lowerer::cloneInstance(const ModuleObj &from, const std::string &path,
                                  const std::string &part, uint32_t parent) {
  uint32_t root0 = from.instance, end0 = subtreeEnd(g, root0);
  auto [p0, p1] = paramsIn(g, root0, end0);
  if (g.instances.size() + (end0 - root0) > kMaxInstances || g.params.size() + (p1 - p0) > kMaxParams)
    return nullptr;
  // Paths are derived (Instance::part): only the copy's root has a part of its own ("[5]"),
  // which the list gives (partAfter would build the list's path again for every copy).
  auto root = static_cast<uint32_t>(g.instances.size());
  for (uint32_t k = root0; k < end0; ++k) {
    Instance in = g.instances[k];
    if (k == root0)
      in.part = &pooledName(part);
    in.parent = k == root0 ? parent : in.parent - root0 + root;
    g.instances.push_back(in);
  }
  size_t tp0 = g.params.size();
  for (size_t q = p0; q < p1; ++q) {
    ParamInfo info = g.params[q];
    Tensor t = g.tensors[info.tensor];
    t.param = static_cast<uint32_t>(g.params.size());
    TensorId id = g.addTensor(std::move(t));
    info.tensor = id;
    info.instance = info.instance - root0 + root;
    g.params.push_back(std::move(info));
  }
  auto map = std::make_shared<CopyMap>();
  map->root0 = root0;
  map->root = root;
  map->p0 = p0;
  map->tp0 = tp0;
  return lazyCopy(from, std::move(map), path);
}

ModuleObj *Lowerer::lazyCopy(const ModuleObj &from, std::shared_ptr<const CopyMap> map,
                             const std::string &path) {
  // A nested repeat's copies inside copy 0 may be lazy themselves: give the source its
  // members first (the modules are all this lowering's), so a copy reads real ones.
  const ModuleObj &src = materialize(const_cast<ModuleObj &>(from));
  modules.emplace_back();
  ModuleObj &m = modules.back();
  m.decl = src.decl;
  m.instance = src.instance - map->root0 + map->root;
  m.path = path.empty() ? g.instancePath(m.instance) : path;
  m.forward = src.forward;
  m.copyOf = &src;
  m.copyMap = std::move(map);
  return &m;
}

ModuleObj &Lowerer::materialize(ModuleObj &m) {
  if (!m.copyOf)
    return m;
  const ModuleObj &src = *m.copyOf;
  std::shared_ptr<const CopyMap> map = std::move(m.copyMap);
  m.copyOf = nullptr;
  m.consts = src.consts;
  for (const auto &kv : src.members) {
    Value v = kv.getValue();
    if (v.kind == Value::Tensor) // a parameter declared in the copied subtree
      v.tensor = g.params[map->tp0 + (g.tensors[v.tensor].param - map->p0)].tensor;
    else if (v.kind == Value::Module)
      v.module = lazyCopy(*v.module, map);
    else if (v.kind == Value::List)
      for (ModuleObj *&c : v.list)
        c = lazyCopy(*c, map);
    m.members[kv.getKey()] = std::move(v);
  }
  return m;
}

uint32_t Lowerer::newInstance(const std::string &path, const std::string &block, uint32_t parent,
                              llvm::SMRange where) {
  Instance in;
  in.where = where;
  in.block = &pooledName(block);
  in.part = &partAfter(g, path, parent);
  in.parent = parent;
  in.depth = g.instances[parent].depth + 1;
  g.instances.push_back(in);
  return static_cast<uint32_t>(g.instances.size() - 1);
}

bool Lowerer::declared(ModuleObj &m, const std::string &name, llvm::SMRange r) {
  if (m.members.count(name) || m.consts.count(name)) {
    auto d = diags.report(DiagKind::DuplicateName, r.Start,
                          "'" + name + "' is already declared in block '" + m.decl->name +
                              "'");
    d.range(r);
    if (auto it = m.members.find(name); it != m.members.end()) {
      d.note(it->second.range.Start, "first declared here");
      return true;
    }
    // A block parameter: members, constants and parameters share one set of names.
    for (const BlockParamAST &p : m.decl->params)
      if (p.name == name) {
        d.note(p.range.Start,
               "'" + name + "' is a parameter of '" + m.decl->name +
                   "'; a member cannot take a parameter's name",
               p.range);
        return true;
      }
    if (auto it = m.consts.find(name); it != m.consts.end() && it->second.range.isValid())
      d.note(it->second.range.Start, "first declared here", it->second.range);
    return true;
  }
  return false;
}

bool Lowerer::items(const std::vector<BlockItemPtr> &list, ModuleObj &m, bool frozen) {
  for (const BlockItemPtr &item : list) {
    switch (item->kind) {
    case BlockItemKind::Param: {
      if (declared(m, item->name, item->nameRange))
        return false;
      Tensor t;
      t.role = TensorRole::Param;
      t.dtype = key.params;
      Shape shape;
      if (!shapeOf(*item->type, m.consts, false, shape, t.dtype))
        return false;
      t.shape = shape;
      // Under a `lora` plan only the adapters train (LoRA blocks); every other weight is frozen.
      t.requiresGrad = !(frozen || item->frozen) && (key.lora.r == 0 || m.decl->name == "LoRA");
      if ((t.dtype == Dtype::INT4 || t.dtype == Dtype::NF4) && t.requiresGrad) {
        diags.report(DiagKind::TypeMismatch, item->type->dtypeRange.Start,
                     "parameter '" + item->name + "' is stored in " + nameOf(t.dtype).str() +
                         ", a quantized format that cannot be trained: declare it `frozen param` "
                         "(QLoRA trains adapters beside frozen quantized weights)")
            .range(item->type->dtypeRange);
        fail();
        return false;
      }
      if (g.params.size() >= kMaxParams) {
        diags.report(DiagKind::Overflow, item->nameRange.Start,
                     "the model has more than " + std::to_string(kMaxParams) +
                         " parameter tensors; tally stops counting here")
            .range(item->nameRange);
        fail();
        return false;
      }
      t.param = static_cast<uint32_t>(g.params.size());
      TensorId id = g.addTensor(t);
      g.params.push_back({&pooledName(item->name), id, t.requiresGrad, m.instance, item->range});
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

std::optional<bool> Lowerer::condition(const Expr &e, const ConstEnv &env) {
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
const BlockDecl *Lowerer::blockOf(const Expr &e, const ConstEnv &env) {
  if (e.kind != ExprKind::Call || e.lhs->kind != ExprKind::Name || env.count(e.lhs->text))
    return nullptr;
  auto it = program.blocks.find(e.lhs->text);
  return it == program.blocks.end() ? nullptr : it->second;
}

bool Lowerer::member(const BlockItem &item, ModuleObj &m, bool frozen) {
  const Expr &e = *item.value;
  std::string path = joinPath(m.path, item.name);
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
    uint32_t listInstance = newInstance(path, "repeat", m.instance, item.range);
    Value list;
    list.kind = Value::List;
    list.range = item.range;
    // Copy 0 is instantiated; when that said nothing, the others are copies of it (the same
    // block and call: cloneInstance), else each is instantiated and says what it says.
    const ModuleObj *first = nullptr;
    for (int64_t i = 0; i < *n; ++i) {
      std::string part = "[" + std::to_string(i) + "]", sub = path + part;
      ModuleObj *child = first ? cloneInstance(*first, sub, part, listInstance) : nullptr;
      if (!child) {
        unsigned said = diags.errorCount() + diags.warningCount();
        child = instantiate(*b, call, sub, newInstance(sub, b->name, listInstance, item.range), frozen,
                            e.lhs->range);
        if (child && i == 0 && diags.errorCount() + diags.warningCount() == said) {
          first = child;
          // The other copies will be clones of this one: room for their instances, parameters
          // and parameter tensors at once, as many as the bounds allow (reserveFor).
          uint32_t i0 = child->instance, i1 = subtreeEnd(g, i0);
          auto [p0, p1] = paramsIn(g, i0, i1);
          size_t left = std::min({static_cast<size_t>(*n - 1),
                                  roomUnder(g.instances.size(), kMaxInstances) / (i1 - i0),
                                  roomUnder(g.params.size(), kMaxParams) / std::max<size_t>(1, p1 - p0)});
          reserveFor(g.instances, left * (i1 - i0));
          reserveFor(g.params, left * (p1 - p0));
          reserveFor(g.tensors, left * (p1 - p0));
        }
      }
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
    b = loraSubstitute(item, b, call);
    ModuleObj *child =
        instantiate(*b, call, path, newInstance(path, b->name, m.instance, item.range), frozen, e.range);
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

} // namespace lowering
} // namespace tally
