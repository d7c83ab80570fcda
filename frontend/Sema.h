// Semantic analysis: the program's names (blocks of the standard library and of the user's
// files, targets, plans), constant arithmetic with units, and the resolution of a `train` or
// `infer` declaration into a checked Plan. Lowering (frontend/Lower.h) uses the same constant
// evaluator for block arguments and dimensions. Defined in frontend/Sema.cpp (names,
// constants), SemaTargets.cpp, SemaPlans.cpp, SemaParallel.cpp and SemaCheckpoint.cpp.
#pragma once

#include "frontend/AST.h"
#include "support/Diagnostics.h"
#include "ir/Plan.h"
#include "ir/Units.h"

#include "llvm/ADT/StringMap.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tally {

/// A compile-time value: numbers with their unit dimension, booleans, bare words (`fp32`,
/// `auto`), strings, tuples and records, calls of blocks or optimizers with constant
/// arguments (`GPT2(layers = 48)`, `AdamW(lr = 3e-4)`) and device specs (`8 x H100_SXM {...}`).
struct ConstValue {
  enum Kind { Invalid, Number, Bool, Word, String, Tuple, Record, Call, Device } kind = Invalid;
  double number = 0;
  bool isInteger = false;           ///< an exact integer that fits int64 (`intValue`)
  int64_t intValue = 0;
  UnitDim dim = UnitDim::None;
  bool boolean = false;
  std::string text;                 ///< Word, String, Call callee, Device target
  std::vector<ConstValue> elems;    ///< Tuple elements, Record values, Call arguments
  std::vector<std::string> names;   ///< Record keys, Call argument names ("" positional)
  std::vector<std::string> placements; ///< Record: "" or "host"
  std::vector<llvm::SMRange> ranges;   ///< where each element was written
  std::vector<llvm::SMRange> nameRanges; ///< Record keys, Call argument names (positional: the value)
  llvm::SMRange nameRange;             ///< Device: the target name; Call: the callee
  llvm::SMRange range;

  static ConstValue integer(int64_t v, llvm::SMRange r);
  static ConstValue real(double v, UnitDim d, llvm::SMRange r);
  std::string describe() const;     ///< "a number", "bytes", "a tuple", ... for messages
};

/// Names visible while evaluating constants (block parameters, constant members).
using ConstEnv = llvm::StringMap<ConstValue>;

/// Every declaration of the compilation, by name.
struct Program {
  std::vector<std::unique_ptr<Module>> modules; ///< the standard library first
  llvm::StringMap<const BlockDecl *> blocks;
  llvm::StringMap<const PlanDecl *> plans;
  llvm::StringMap<const TargetDecl *> targets;
  std::vector<const PlanDecl *> planOrder;      ///< in source order
};

/// Settings given on the command line; they replace what the file says.
struct PlanOverrides {
  std::string target, precision, checkpoint;
  std::optional<int64_t> batch, microBatch; ///< validated like the file's settings (0 is an error)
  /// `tally solve serve --context N`: an infer plan's max_context, validated like the file's.
  std::optional<int64_t> maxContext;
  /// `tally run --threads T`: the OpenMP threads each rank runs with, which prices each rank at
  /// its part of the calibrated host (Target::shareHost); 0: the default.
  int64_t hostThreads = 0;
  /// `--fuse` (and `tally build/run --backend cuda`): Plan::fuseKernels.
  bool fuseKernels = false;
  /// `tally build/run --backend cuda`: Plan::cudaStep.
  bool cudaStep = false;
  /// `--pad-head` (default on for --backend cuda): Plan::padHead.
  bool padHead = false;
  /// `tally build/run --backend cpu`: Plan::tensorStep, for a plan with tensor > 1.
  bool tensorStep = false;
  /// `tally build/run` (either backend): Plan::generatedStep.
  bool generatedStep = false;
};

class Sema {
public:
  explicit Sema(DiagnosticEngine &diags) : diags(diags) {}

  /// Adds a parsed module; reports names declared twice. Later user modules may shadow the
  /// standard library, not each other.
  void addModule(std::unique_ptr<Module> m, Program &p);

  /// Evaluates a constant expression; reports and returns Invalid on error. Names resolve in
  /// `env`, then to bare words (fp32, auto, true/false become Bool).
  ConstValue eval(const Expr &e, const ConstEnv &env);

  /// Checks that `v` is a positive integer usable as a dimension or count.
  std::optional<int64_t> positiveInt(const ConstValue &v, const char *what);
  /// The `checkpoint` setting: one policy, or a block policy + selective (see docs/memory.md).
  std::optional<std::string> checkpointPolicy(const Expr &e, ConstEnv &env);
  std::optional<std::string> singleCheckpointPolicy(const ConstValue &v);
  std::optional<std::string> keepPolicy(const Expr &e);
  std::optional<std::string> keepPolicy(const std::string &text, llvm::SMRange r);
  std::optional<std::string> combinedCheckpointPolicy(const std::string &a, const std::string &b,
                                                      llvm::SMRange r);

  /// Resolves a target by name: the user's `target` declarations first, then the catalogue.
  std::optional<Target> resolveTarget(const Program &p, llvm::StringRef name, llvm::SMRange r);

  /// Resolves a train/infer declaration into a Plan.
  std::optional<Plan> resolvePlan(const Program &p, const PlanDecl &d, const PlanOverrides &o);

  /// The model call of a plan (`GPT2(layers = 48)`): the block and its constant arguments.
  const BlockDecl *planModel(const Program &p, const PlanDecl &d, ConstValue &call);

  /// Reports `name` as unknown, suggesting the closest of `candidates`.
  void unknownName(llvm::SMRange r, llvm::StringRef what, llvm::StringRef name,
                   const std::vector<std::string> &candidates);
  /// unknownName for an enumerated setting (precision, optimizer, checkpoint, dtype): also a
  /// note listing the valid values, "the precisions are: fp32, ...".
  void unknownChoice(llvm::SMRange r, llvm::StringRef what, llvm::StringRef plural,
                     llvm::StringRef name, const std::vector<std::string> &candidates);

  /// Reports `message` at `at`, adding "; did you mean 'X'?" and a fix-it that replaces `at`
  /// with X when X, the closest of `candidates` to `name`, is close enough. Every "unknown
  /// something" diagnostic goes through here; the returned builder takes notes.
  DiagBuilder suggest(DiagKind kind, llvm::SMRange at, std::string message, llvm::StringRef name,
                      const std::vector<std::string> &candidates);

  /// Folds `a op b` for the binary expression `e` (units, exact integers, overflow).
  ConstValue arith(const Expr &e, const ConstValue &a, const ConstValue &b);

  DiagnosticEngine &diags;

private:
  friend struct PlanResolver; // frontend/SemaPlans.cpp: the plan settings' handlers
  friend struct TargetReader; // frontend/SemaTargets.cpp: the target settings' handlers
  std::optional<Dtype> dtypeSetting(const ConstValue &v, const char *what);
  bool precision(const ConstValue &v, PrecisionPolicy &out);
  /// A precision record's `base = nf4` or `base = { dtype = nf4, block = 64, scale = fp32,
  /// double_quant = 256 }` (double_quant: true = 256, false = none, or a block size).
  bool frozenStorage(const ConstValue &v, QuantSpec &out);
  /// A precision record's `fp8 = hybrid` or `fp8 = { format = hybrid, amax_history = 1024,
  /// scaling = delayed | mxfp8 | current, keep_first_last_bf16 = true }` (Transformer Engine's recipe).
  bool fp8Recipe(const ConstValue &v, Fp8Recipe &out);
  /// A train plan's `lora = { r = 16, alpha = 32, targets = [q, v] }`.
  bool lora(const ConstValue &v, LoraSpec &out);
  bool optimizer(const ConstValue &v, OptimizerSpec &out);
  bool parallel(const Program &p, const ConstValue &v, Plan &plan);
  std::optional<Target> userTarget(const TargetDecl &d);
  /// A list of (FLOPs per call, efficiency) pairs, FLOPs increasing, efficiencies in (0, 1];
  /// an invalid-value diagnostic naming `what` at `r` otherwise.
  bool curvePoints(const ConstValue &list, llvm::SMRange r, const char *what, std::vector<CurvePoint> &points);
  bool matmulCurves(const ConstValue &rec, Target &t);
  ConstValue number(const Expr &e);
};


} // namespace tally
