// The tally AST: our own nodes, built from ANTLR's parse tree by frontend/Parser.cpp.
// Every node carries its source range first, so every later diagnostic can point at the text
// the user wrote. The AST is a faithful picture of the file: no names are resolved here.
#pragma once

#include "llvm/Support/SMLoc.h"

#include <memory>
#include <string>
#include <vector>

namespace llvm {
class raw_ostream;
}

namespace tally {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  Number,  ///< `1024`, `10B`, `80 GiB`, `40%`: value in `number`, glued suffix in `suffix`, unit word in `unit`
  Name,    ///< `x`, `fp32`, `true`: the identifier in `text`
  String,  ///< `"..."`: contents in `text`
  Call,    ///< `callee(args...)`: callee in `lhs`, arguments in `args` with names in `argNames`
  Member,  ///< `lhs.text`
  Index,   ///< `lhs[args...]`: each subscript an index expression or a Slice
  Slice,   ///< `lo:hi:step` inside a subscript: args[0..2], each null when left out
  Neg,     ///< `-args[0]`
  Binary,  ///< `args[0] text args[1]`, text one of + - * / @
  Tuple,   ///< `(a, b)`
  List,    ///< `[a, b]`
  Record,  ///< `{ k = v on host, ... }`: values in `args`, keys in `argNames`, placements in `placements`
  Repeat,  ///< `repeat(args[0]) lhs`
  Device,  ///< `8 x H100_SXM { data = 8 }`: count in `number`, target name in `text`, record in `lhs` (may be null)
};

/// One expression node. A single node type with a kind keeps the evaluator a plain switch.
struct Expr {
  llvm::SMRange range;
  ExprKind kind;
  llvm::SMLoc opLoc;                  ///< the operator or the callee's opening paren, for carets
  std::string text;                   ///< name, member, operator, string contents, target name
  double number = 0;                  ///< numeric literal value before any suffix or unit
  bool isInteger = false;             ///< the literal was written without '.', or exponent
  std::string suffix;                 ///< glued suffix of a number literal: "B", "T", "%", "GiB"
  std::string unit;                   ///< separate unit word(s) after a number: "GiB", "TFLOP/s"
  llvm::SMRange unitRange;            ///< where the suffix or unit was written
  ExprPtr lhs;
  std::vector<ExprPtr> args;
  std::vector<std::string> argNames;  ///< "" for positional arguments
  std::vector<llvm::SMRange> argNameRanges;
  std::vector<std::string> placements; ///< record fields: "" or the word after `on`

  Expr(ExprKind k, llvm::SMRange r) : range(r), kind(k) {}
};

/// `f32[batch, D]` or `[D, K]`: an optional dtype word and dimension expressions.
struct TensorTypeAST {
  llvm::SMRange range;
  std::string dtype;                  ///< "" when not written
  llvm::SMRange dtypeRange;
  std::vector<ExprPtr> dims;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;

enum class StmtKind { Assign, Return, If };

struct Stmt {
  llvm::SMRange range;
  StmtKind kind;
  std::vector<std::string> targets;   ///< Assign: one name, or several for tuple assignment
  std::vector<llvm::SMRange> targetRanges;
  ExprPtr value;                      ///< Assign/Return value, If condition
  std::vector<StmtPtr> thenBody, elseBody;

  Stmt(StmtKind k, llvm::SMRange r) : range(r), kind(k) {}
};

struct ForwardParam {
  llvm::SMRange range;
  std::string name;
  std::unique_ptr<TensorTypeAST> type; ///< null when the input is untyped (a block's inner input)
};

struct ForwardAST {
  llvm::SMRange range;
  std::vector<ForwardParam> params;
  std::vector<StmtPtr> body;
};

struct BlockItem;
using BlockItemPtr = std::unique_ptr<BlockItem>;

enum class BlockItemKind { Param, Member, Forward, If };

/// One item of a block body: `param w: [D, K]`, `fc = Linear(d, h)`, `forward(...) {...}`,
/// or `if cond { items } else { items }` (conditions are compile-time constants).
struct BlockItem {
  llvm::SMRange range;
  BlockItemKind kind;
  std::string name;
  llvm::SMRange nameRange;
  bool frozen = false;
  std::unique_ptr<TensorTypeAST> type; ///< Param
  ExprPtr value;                      ///< Member initializer, If condition
  std::unique_ptr<ForwardAST> forward; ///< Forward
  std::vector<BlockItemPtr> thenItems, elseItems;

  BlockItem(BlockItemKind k, llvm::SMRange r) : range(r), kind(k) {}
};

struct BlockParamAST {
  llvm::SMRange range;
  std::string name;
  ExprPtr defaultValue;               ///< null when the argument is required
};

/// `block Name(params) { ... }` or `model Name(params) { ... }`.
struct BlockDecl {
  llvm::SMRange range;
  llvm::SMRange nameRange;
  bool isModel = false;
  bool fromStdlib = false;
  std::string name;
  std::vector<BlockParamAST> params;
  std::vector<BlockItemPtr> items;
};

struct BudgetItemAST {
  llvm::SMRange range;
  std::string metric;                 ///< the words before the comparison, joined by spaces
  std::string op;                     ///< <=, >=, <, >
  ExprPtr value;
};

struct SettingAST {
  llvm::SMRange range;
  llvm::SMRange keyRange;
  std::string key;
  ExprPtr value;
};

/// `train name { ... }` or `infer name { ... }`.
struct PlanDecl {
  llvm::SMRange range;
  llvm::SMRange nameRange;
  bool isTrain = true;
  std::string name;
  std::vector<SettingAST> settings;
  std::vector<BudgetItemAST> budgets;
};

/// `target Name { memory = 96 GiB  peak { bf16 = ... } ... }`; a record item has a Record value.
struct TargetDecl {
  llvm::SMRange range;
  llvm::SMRange nameRange;
  std::string name;
  std::vector<SettingAST> settings;
};

/// One parsed file (the standard library is one too).
struct Module {
  std::string bufferName;
  std::vector<std::unique_ptr<BlockDecl>> blocks;
  std::vector<std::unique_ptr<PlanDecl>> plans;
  std::vector<std::unique_ptr<TargetDecl>> targets;
};

/// Prints the AST as an indented tree for `--emit=ast`.
void printAST(const Module &m, llvm::raw_ostream &os);

} // namespace tally
