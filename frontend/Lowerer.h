// The lowering's internal declarations, shared by its files (not a public header:
// frontend/Lower.h is the entry the rest of tally includes).
//
// The lowering is one object, `Lowerer`, that lives for one `lowerPlan` call and owns the
// graph it builds. Its members are defined by job:
//   frontend/Lower.cpp             the entry: run() drives the steps, collects the outputs
//   frontend/LowerInstantiate.cpp  step 1: blocks become instances (parameters, submodules)
//   frontend/LowerEvaluate.cpp     step 3: forward functions evaluated over symbolic tensors
//   frontend/LowerPrimitives.cpp   a primitive call's arguments bound (signatures from
//                                  ir/Primitives.cpp) and checked, one op appended (shapes
//                                  from ir/OpRules.cpp, layouts, rope dims)
//   frontend/LowerOps.cpp          the table of lowerings, one entry per op kind, and the
//                                  dispatch of a bound call through it; each kind's entry
//                                  and the code that reads its arguments are in its family's
//                                  file: LowerElementwise.cpp, LowerLayers.cpp, LowerData.cpp
#pragma once

#include "frontend/Lower.h"

#include "ir/OpRules.h"
#include "ir/Primitives.h"

#include "llvm/ADT/StringMap.h"

#include <algorithm>
#include <deque>
#include <set>

namespace tally {
namespace lowering {

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
/// How a lazy repeat copy's module objects map to copy 0's (cloneInstance): instances
/// [root0, …) become [root, …), copy 0's parameters from index p0 become the copy's from tp0.
struct CopyMap {
  uint32_t root0 = 0, root = 0;
  size_t p0 = 0, tp0 = 0;
};

struct ModuleObj {
  const BlockDecl *decl = nullptr;
  uint32_t instance = 0;
  std::string path;
  /// Read through Lowerer::materialize when the object may be a lazy copy.
  ConstEnv consts;
  llvm::StringMap<Value> members;
  const ForwardAST *forward = nullptr;
  /// A repeat copy whose constants and members are still copy 0's (`copyOf`, mapped by
  /// `copyMap`): cloneCall needs only decl, forward and instance, so most copies never copy
  /// them; Lowerer::materialize does on the first read.
  const ModuleObj *copyOf = nullptr;
  std::shared_ptr<const CopyMap> copyMap;
};

/// The locals of one forward call and the instance it runs in.
struct Scope {
  ModuleObj *module;
  llvm::StringMap<Value> locals;
};

/// Most block instances one model may have (a 10,000-layer GPT has 90,000): a bound on the
/// memory that instantiation may take, checked before a repeat makes its copies.
constexpr size_t kMaxInstances = 1'000'000;

/// The end of `root`'s subtree of instances: they are made depth first, so the subtree is
/// [root, end).
uint32_t subtreeEnd(const Graph &g, uint32_t root);
/// The parameters declared in instances [lo, hi): a range of Graph::params, which are made
/// in instance order.
std::pair<size_t, size_t> paramsIn(const Graph &g, uint32_t lo, uint32_t hi);

/// How many more fit under `bound` when `used` are there (0 past it).
inline size_t roomUnder(size_t used, size_t bound) { return bound - std::min(bound, used); }
/// Room in `v` for `more` elements at once, and a quarter more for what follows: a repeat
/// list's copies about to be appended (regrown, each element moved about twice; an Instance
/// and a ParamInfo hold strings). Room never used is never touched. Callers hold `more` to
/// the bounds: a request past them was a crash on out of memory.
template <class V> void reserveFor(V &v, size_t more) {
  size_t want = v.size() + more;
  if (want > v.capacity())
    v.reserve(want + want / 4 + 1024);
}

class Lowerer {
public:
  const PlanDecl *planDecl = nullptr;
  bool seqReported = false;
  Lowerer(Sema &sema, const Program &program, const Plan &plan)
      : sema(sema), diags(sema.diags), program(program), key(loweringKey(plan)),
        settingRanges(plan.settingRanges) {}

  std::optional<Graph> run(const PlanDecl &decl);

  /// A primitive call's arguments bound to the parameters of its entry in ir/Primitives.cpp.
  struct Bound {
    const Primitive *prim = nullptr;
    const Expr *call = nullptr;
    std::vector<const Expr *> exprs;
    std::vector<Value> values;
    mutable std::vector<bool> read; ///< slots the lowering has read (each one given must be)
    bool has(size_t i) const { return i < values.size() && values[i].kind != Value::Invalid; }
  };
  /// What the lowering does for one op kind: one entry per kind of ir/Ops.def, defined by one
  /// LOWERING or NO_LOWERING line (below) in its family's file, indexed by frontend/LowerOps.cpp.
  struct Lowering {
    OpKind kind; ///< the entry's own kind (the table is indexed by it; a unit test checks)
    /// The op of a bound primitive call of this kind, read from the call's arguments; null
    /// for a kind that no primitive call makes.
    Value (Lowerer::*lower)(const Bound &b, const Expr &e, Scope &scope);
    const char *none;     ///< why no call makes it, when `lower` is null
    bool returnsAll;      ///< the call's value is every output (split's parts, topk's pair),
                          ///< not the first (the rest being what the backward reads)
  };
  static const Lowering &loweringFor(OpKind k);

private:
  // The table's entries, one per kind of ir/Ops.def: a kind without its LOWERING or
  // NO_LOWERING line does not link, one with two does not either, and a line for a kind
  // ir/Ops.def does not list does not compile.
#define OP(ID, NAME, CLASS) static const Lowering lowering##ID;
#include "ir/Ops.def"

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
  /// Per instance: ops named so far, by kind (an instance makes few kinds: a short list, not
  /// a map per instance — a 10,000-layer model has 90,000 instances).
  std::vector<llvm::SmallVector<std::pair<OpKind, unsigned>, 4>> opCounts;
  bool failed = false;
  unsigned callDepth = 0;
  /// Under a `lora` plan: the targets that named a Linear, and every Linear member name seen
  /// (for the "did you mean" of a target that names none).
  std::set<std::string> loraMatched;
  std::set<std::string> linearNames;

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

  // frontend/Lower.cpp
  void context(DiagBuilder &d);
  void collectOutputs(const Value &v);
  std::string describeOutputs() const;

  // frontend/LowerInstantiate.cpp
  const BlockDecl *loraSubstitute(const BlockItem &item, const BlockDecl *b, ConstValue &call);
  bool checkLoraTargets();
  bool checkQuantized();
  bool bindArgs(const BlockDecl &b, const ConstValue &call, ConstEnv &env, llvm::SMRange where);
  bool seqGiven(llvm::SMRange use);
  bool shapeOf(const TensorTypeAST &type, const ConstEnv &consts, bool withPlan, Shape &shape,
               Dtype &dtype);
  ModuleObj *instantiate(const BlockDecl &b, const ConstValue &call, const std::string &path,
                         uint32_t instance, bool frozen, llvm::SMRange where);
  uint32_t newInstance(const std::string &path, const std::string &block, uint32_t parent,
                       llvm::SMRange where);
  bool declared(ModuleObj &m, const std::string &name, llvm::SMRange r);
  bool items(const std::vector<BlockItemPtr> &list, ModuleObj &m, bool frozen);
  std::optional<bool> condition(const Expr &e, const ConstEnv &env);
  const BlockDecl *blockOf(const Expr &e, const ConstEnv &env);
  bool member(const BlockItem &item, ModuleObj &m, bool frozen);
  /// `path` is the copy's, `part` its end after its parent's ("[5]").
  ModuleObj *cloneInstance(const ModuleObj &from, const std::string &path, const std::string &part,
                           uint32_t parent);
  /// `path`: the copy's path when the caller has it, else empty (it is derived).
  ModuleObj *lazyCopy(const ModuleObj &src, std::shared_ptr<const CopyMap> map,
                      const std::string &path = "");
  /// Gives a lazy copy its constants and members (its children stay lazy); no-op otherwise.
  ModuleObj &materialize(ModuleObj &m);

  // frontend/LowerEvaluate.cpp
  Value callModule(ModuleObj &m, std::vector<Value> args, llvm::SMRange where);
  /// A repeat copy's forward call as it was evaluated: the tensors and ops it appended, for
  /// the later copies to be copied from (cloneCall).
  struct CallRecord {
    ModuleObj *module = nullptr;
    std::vector<Value> args;
    TensorId tensorsBegin = 0, tensorsEnd = 0;
    OpId opsBegin = 0, opsEnd = 0;
    size_t localsBegin = 0, localsEnd = 0;
    Value result;
  };
  bool positionsFit(TensorId ids, TensorId table, const Expr &e, Scope &scope);
  std::optional<Value> cloneCall(const CallRecord &from, ModuleObj &m, const std::vector<Value> &args);
  bool checkInputType(ModuleObj &m, const ForwardParam &p, const Value &arg,
                      llvm::SMRange where);
  std::optional<Value> statements(const std::vector<StmtPtr> &body, Scope &scope);
  std::vector<std::string> visibleNames(const Scope &scope);
  Value lookup(const Expr &e, Scope &scope);
  static std::string llvmLower(const std::string &s);
  Value eval(const Expr &e, Scope &scope);
  Value slice(const Expr &e, const Value &base, Scope &scope);
  Value binary(const Expr &e, Scope &scope);
  Value call(const Expr &e, Scope &scope);

  // frontend/LowerPrimitives.cpp
  /// Which op of `kind` in `instance` the next one is (Op::ordinal): 1, 2, ...
  uint32_t nextOrdinal(uint32_t instance, OpKind kind);
  static bool takesRandomStream(const Op &op);
  std::optional<Bound> bind(const Primitive &p, const Expr &e, Scope &scope);
  void internalError(const Bound &b, const std::string &problem);
  size_t slot(const Bound &b, llvm::StringRef param);
  std::optional<double> defaultOf(const Bound &b, size_t i, std::optional<double> dflt);
  bool tensorArg(const Bound &b, llvm::StringRef param, TensorId &out);
  std::optional<double> numberArg(const Bound &b, llvm::StringRef param,
                                  std::optional<double> dflt = std::nullopt);
  std::optional<int64_t> intArg(const Bound &b, llvm::StringRef param,
                                std::optional<int64_t> dflt = std::nullopt);
  std::optional<bool> boolArg(const Bound &b, llvm::StringRef param);
  std::optional<double> probability(const Bound &b, llvm::StringRef param);
  bool pairArg(const Bound &b, llvm::StringRef param, int64_t lo, int64_t (&out)[2],
               std::optional<int64_t> dflt = std::nullopt);
  bool shapeArg(const Bound &b, llvm::StringRef param, Shape &out);
  Value primitive(const Primitive &p, const Expr &e, Scope &scope);
  void setViewLayouts(Op &op);
  /// A dense copy of `t` (a `contiguous` op), for a kernel that cannot read its layout.
  struct DenseCopy {
    TensorId id = kNone;
    bool valid = false;
  };
  DenseCopy dense(TensorId t, const Expr &e, Scope &scope);
  Value op1(OpKind kind, llvm::SmallVector<TensorId, 3> inputs, const OpAttrs &attrs,
            const Expr &e, Scope &scope);
  void setRopeHeadDims(const Op &attention);

  // frontend/LowerOps.cpp: the op of a bound primitive call, through the table
  Value primitiveOp(const Bound &b, const Expr &e, Scope &scope);
  /// An internal error for a kind the table says no call makes.
  Value noLowering(const Bound &b, const char *why);

  // frontend/LowerElementwise.cpp: the pure unary kinds (ir/ops/Unary.def), rope, dropout
  Value oneTensorOp(const Bound &b, const Expr &e, Scope &scope);
  Value ropeOp(const Bound &b, const Expr &e, Scope &scope);
  Value dropoutOp(const Bound &b, const Expr &e, Scope &scope);

  // frontend/LowerLayers.cpp: matmul, moe, attention, norms, softmax, loss, conv and pools
  Value matmulOp(const Bound &b, const Expr &e, Scope &scope);
  Value moeOp(const Bound &b, const Expr &e, Scope &scope);
  Value attentionOp(const Bound &b, const Expr &e, Scope &scope);
  bool attentionScores(const Bound &b, bool causal, OpAttrs &attrs);
  bool attentionLatent(const Bound &b, OpAttrs &attrs);
  Value layerNormOp(const Bound &b, const Expr &e, Scope &scope);
  Value rmsNormOp(const Bound &b, const Expr &e, Scope &scope);
  Value softmaxOp(const Bound &b, const Expr &e, Scope &scope);
  Value crossEntropyOp(const Bound &b, const Expr &e, Scope &scope);
  Value conv2dOp(const Bound &b, const Expr &e, Scope &scope);
  Value poolOp(const Bound &b, const Expr &e, Scope &scope);

  // frontend/LowerData.cpp: reductions, lookups and index generation, shapes and views
  Value reduceOp(const Bound &b, const Expr &e, Scope &scope);
  Value topKOp(const Bound &b, const Expr &e, Scope &scope);
  Value embeddingOp(const Bound &b, const Expr &e, Scope &scope);
  Value gatherOp(const Bound &b, const Expr &e, Scope &scope);
  Value positionsOp(const Bound &b, const Expr &e, Scope &scope);
  Value concatOp(const Bound &b, const Expr &e, Scope &scope);
  Value newShapeOp(const Bound &b, const Expr &e, Scope &scope);
  Value transposeOp(const Bound &b, const Expr &e, Scope &scope);
  Value splitOp(const Bound &b, const Expr &e, Scope &scope);
};

// One entry of the table (Lowerer::Lowering), written in the family file of its kind, at
// namespace tally::lowering. LOWERING: a primitive call of the kind is read by FN, a member of
// Lowerer, and returns its first output; LOWERING_ALL: returns every output as a tuple;
// NO_LOWERING: no primitive call makes the kind (an operator does, or autodiff, or step
// assembly), WHY says which.
#define LOWERING(ID, FN) const Lowerer::Lowering Lowerer::lowering##ID = {OpKind::ID, FN, nullptr, false};
#define LOWERING_ALL(ID, FN)                                                                       \
  const Lowerer::Lowering Lowerer::lowering##ID = {OpKind::ID, FN, nullptr, true};
#define NO_LOWERING(ID, WHY)                                                                       \
  const Lowerer::Lowering Lowerer::lowering##ID = {OpKind::ID, nullptr, WHY, false};

} // namespace lowering
} // namespace tally
