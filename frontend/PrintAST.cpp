// `--emit=ast`: the AST as an indented tree, one node per line. Numbers print as written
// (integers whole, others with up to 15 significant digits), with their suffix or unit.
#include "frontend/AST.h"
#include "support/Format.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cstdio>

namespace tally {

namespace {

class Printer {
public:
  explicit Printer(llvm::raw_ostream &os) : os(os) {}

  void module(const Module &m) {
    for (const auto &b : m.blocks)
      block(*b);
    for (const auto &p : m.plans)
      plan(*p);
    for (const auto &t : m.targets)
      target(*t);
  }

private:
  llvm::raw_ostream &os;
  unsigned depth = 0;

  llvm::raw_ostream &line() {
    os.indent(depth * 2);
    return os;
  }

  static std::string kindName(ExprKind k) {
    switch (k) {
    case ExprKind::Number: return "Number";
    case ExprKind::Name: return "Name";
    case ExprKind::String: return "String";
    case ExprKind::Call: return "Call";
    case ExprKind::Member: return "Member";
    case ExprKind::Index: return "Index";
    case ExprKind::Slice: return "Slice";
    case ExprKind::Neg: return "Neg";
    case ExprKind::Binary: return "Binary";
    case ExprKind::Tuple: return "Tuple";
    case ExprKind::List: return "List";
    case ExprKind::Record: return "Record";
    case ExprKind::Repeat: return "Repeat";
    case ExprKind::Device: return "Device";
    }
    return "?";
  }

  /// A literal's value: `1024`, `0.0006`, `3.35` (never rounded to two decimals).
  static std::string number(const Expr &e) {
    if (e.isInteger && e.number >= 0x1p53 && e.range.isValid()) {
      // Past 2^53 the double is not exact: print the digits as written (without `_`).
      llvm::StringRef text(e.range.Start.getPointer(),
                           e.range.End.getPointer() - e.range.Start.getPointer());
      std::string digits;
      for (char c : text.substr(std::min(text.size(), text.find_first_of("0123456789")))) {
        if (c == '_')
          continue;
        if (c < '0' || c > '9')
          break;
        digits += c;
      }
      if (!digits.empty())
        return digits;
    }
    if (e.isInteger && e.number < 9.2e18)
      return std::to_string(static_cast<int64_t>(e.number));
    return significant(e.number, 15);
  }

  void expr(const Expr &e, llvm::StringRef label = "") {
    auto &o = line();
    if (!label.empty())
      o << label << ": ";
    o << kindName(e.kind);
    switch (e.kind) {
    case ExprKind::Number:
      o << " " << number(e);
      if (!e.suffix.empty())
        o << " suffix=" << e.suffix;
      if (!e.unit.empty())
        o << " unit=" << e.unit;
      break;
    case ExprKind::Name:
    case ExprKind::Member:
    case ExprKind::Binary:
      o << " '" << e.text << "'";
      break;
    case ExprKind::String:
      o << " \"" << e.text << "\"";
      break;
    case ExprKind::Device:
      o << " " << number(e) << " x " << e.text;
      break;
    default:
      break;
    }
    o << "\n";
    ++depth;
    if (e.kind == ExprKind::Repeat) { // `repeat(count) block`: the count first, both labelled
      expr(*e.args[0], "count");
      expr(*e.lhs, "block");
      --depth;
      return;
    }
    if (e.lhs)
      expr(*e.lhs, e.kind == ExprKind::Call ? "callee" : "");
    for (size_t i = 0; i < e.args.size(); ++i) {
      if (!e.args[i]) // a slice bound left out
        continue;
      std::string name = e.kind == ExprKind::Slice ? (i == 0 ? "lo" : i == 1 ? "hi" : "step")
                         : i < e.argNames.size() ? e.argNames[i] : "";
      if (i < e.placements.size() && !e.placements[i].empty())
        name += " on " + e.placements[i];
      expr(*e.args[i], name);
    }
    --depth;
  }

  void type(const TensorTypeAST &t) {
    line() << "Type " << (t.dtype.empty() ? "(any)" : t.dtype) << "\n";
    ++depth;
    for (const auto &d : t.dims)
      expr(*d, "dim");
    --depth;
  }

  void stmts(const std::vector<StmtPtr> &body) {
    for (const StmtPtr &s : body) {
      switch (s->kind) {
      case StmtKind::Assign: {
        std::string targets;
        for (const std::string &t : s->targets)
          targets += (targets.empty() ? "" : ", ") + t;
        line() << "Assign " << targets << "\n";
        ++depth;
        expr(*s->value);
        --depth;
        break;
      }
      case StmtKind::Return:
        line() << "Return\n";
        ++depth;
        expr(*s->value);
        --depth;
        break;
      case StmtKind::If:
        line() << "If\n";
        ++depth;
        expr(*s->value, "cond");
        line() << "Then\n";
        ++depth;
        stmts(s->thenBody);
        --depth;
        if (!s->elseBody.empty()) {
          line() << "Else\n";
          ++depth;
          stmts(s->elseBody);
          --depth;
        }
        --depth;
        break;
      }
    }
  }

  void items(const std::vector<BlockItemPtr> &list) {
    for (const BlockItemPtr &it : list) {
      switch (it->kind) {
      case BlockItemKind::Param:
        line() << "Param " << it->name << (it->frozen ? " frozen" : "") << "\n";
        ++depth;
        type(*it->type);
        --depth;
        break;
      case BlockItemKind::Member:
        line() << "Member " << it->name << (it->frozen ? " frozen" : "") << "\n";
        ++depth;
        expr(*it->value);
        --depth;
        break;
      case BlockItemKind::Forward: {
        line() << "Forward\n";
        ++depth;
        for (const ForwardParam &p : it->forward->params) {
          line() << "Input " << p.name << "\n";
          if (p.type) {
            ++depth;
            type(*p.type);
            --depth;
          }
        }
        stmts(it->forward->body);
        --depth;
        break;
      }
      case BlockItemKind::If:
        line() << "If\n";
        ++depth;
        expr(*it->value, "cond");
        line() << "Then\n";
        ++depth;
        items(it->thenItems);
        --depth;
        if (!it->elseItems.empty()) {
          line() << "Else\n";
          ++depth;
          items(it->elseItems);
          --depth;
        }
        --depth;
        break;
      }
    }
  }

  void block(const BlockDecl &b) {
    line() << (b.isModel ? "Model " : "Block ") << b.name << "\n";
    ++depth;
    for (const BlockParamAST &p : b.params) {
      line() << "Arg " << p.name << "\n";
      if (p.defaultValue) {
        ++depth;
        expr(*p.defaultValue, "default");
        --depth;
      }
    }
    items(b.items);
    --depth;
  }

  void plan(const PlanDecl &p) {
    line() << (p.isTrain ? "Train " : "Infer ") << p.name << "\n";
    ++depth;
    for (const SettingAST &s : p.settings) {
      line() << "Setting " << s.key << "\n";
      ++depth;
      expr(*s.value);
      --depth;
    }
    for (const BudgetItemAST &b : p.budgets) {
      line() << "Budget '" << b.metric << "' " << b.op << "\n";
      ++depth;
      expr(*b.value);
      --depth;
    }
    --depth;
  }

  void target(const TargetDecl &t) {
    line() << "Target " << t.name << "\n";
    ++depth;
    for (const SettingAST &s : t.settings) {
      line() << "Setting " << s.key << "\n";
      ++depth;
      expr(*s.value);
      --depth;
    }
    --depth;
  }
};

} // namespace

void printAST(const Module &m, llvm::raw_ostream &os) { Printer(os).module(m); }

} // namespace tally
