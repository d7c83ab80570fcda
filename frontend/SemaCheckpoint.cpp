// Semantic analysis: the `checkpoint` setting of a train plan (and --checkpoint): one policy
// word or every(k), a block policy + selective, or keep [paths], each checked and stored as
// the text the activation pass reads (docs/memory.md). Sema.cpp has the constant evaluator
// these read their values with; SemaPlans.cpp calls checkpointPolicy for the setting.
#include "frontend/Sema.h"
#include "support/Suggest.h"

#include "llvm/ADT/StringExtras.h"

#include <algorithm>
#include <cctype>

namespace tally {

/// One policy word or call: none, full, auto, sqrt, recompute_all, selective, every(k) (a call
/// in a file, the word "every(k)" on the command line). Stored as written, every(k) with k a
/// positive integer.
std::optional<std::string> Sema::singleCheckpointPolicy(const ConstValue &v) {
  if (v.kind == ConstValue::Call && v.text == "every") {
    if (v.elems.size() != 1 || (!v.names.empty() && !v.names[0].empty())) {
      diags.report(DiagKind::InvalidValue, v.range.Start,
                   "every(k) takes one positional argument: the copies per segment")
          .range(v.range);
      return std::nullopt;
    }
    auto k = positiveInt(v.elems[0], "the segment length of every(k)");
    if (!k)
      return std::nullopt;
    return "every(" + std::to_string(*k) + ")";
  }
  if (v.kind == ConstValue::Word && v.text.rfind("every(", 0) == 0) {
    std::string digits = v.text.substr(6);
    bool closed = !digits.empty() && digits.back() == ')';
    if (closed)
      digits.pop_back();
    bool allDigits = !digits.empty() && digits.size() <= 18 &&
                     std::all_of(digits.begin(), digits.end(),
                                 [](char c) { return c >= '0' && c <= '9'; });
    int64_t k = allDigits ? std::stoll(digits) : 0;
    if (!closed || !allDigits || k <= 0) {
      diags.report(DiagKind::InvalidValue, v.range.Start,
                   "checkpoint every(k) needs a positive whole number k of copies per "
                   "segment, not '" + v.text + "'")
          .range(v.range);
      return std::nullopt;
    }
    return "every(" + std::to_string(k) + ")";
  }
  if (v.kind == ConstValue::Word && llvm::StringRef(v.text).startswith("keep"))
    return keepPolicy(v.text, v.range);
  static const std::vector<std::string> policies = {"none",          "full",      "auto",
                                                    "sqrt",          "every",     "recompute_all",
                                                    "selective",     "selective_wide", "keep"};
  if (v.kind != ConstValue::Word ||
      std::find(policies.begin(), policies.end(), v.text) == policies.end() || v.text == "every") {
    if (v.kind == ConstValue::Word && v.text == "every")
      diags.report(DiagKind::InvalidValue, v.range.Start,
                   "checkpoint every needs its segment length: every(k)")
          .range(v.range);
    else if (v.kind == ConstValue::Word)
      unknownChoice(v.range, "checkpoint policy", "checkpoint policies", v.text, policies);
    else
      diags.report(DiagKind::TypeMismatch, v.range.Start,
                   "checkpoint is none, full, every(k), sqrt, recompute_all, selective, "
                   "selective_wide, a block policy + selective, keep [paths], or auto")
          .range(v.range);
    return std::nullopt;
  }
  return v.text;
}

/// Two policies joined by `+`: a block policy (full, every(k), sqrt) with selective (or
/// selective_wide), stored as "full + selective" whichever order they were written in; none +
/// selective is selective.
std::optional<std::string> Sema::combinedCheckpointPolicy(const std::string &a,
                                                          const std::string &b,
                                                          llvm::SMRange r) {
  auto isSel = [](const std::string &p) { return p == "selective" || p == "selective_wide"; };
  bool aSel = isSel(a), bSel = isSel(b);
  const std::string &other = aSel ? b : a;
  const std::string &sel = aSel ? a : b;
  if (aSel == bSel || other == "auto" || other == "recompute_all") {
    std::string why =
        aSel && bSel ? "selective is given twice"
        : !aSel && !bSel
            ? "two block policies cannot be combined ('" + a + "' and '" + b + "')"
        : other == "auto"
            ? "auto already weighs selective recompute against the block policies"
            : "recompute_all keeps nothing inside the blocks, so selective has nothing to add";
    diags.report(DiagKind::InvalidValue, r.Start,
                 "checkpoint combines a block policy (full, every(k), sqrt) with selective, "
                 "as in full + selective: " + why)
        .range(r);
    return std::nullopt;
  }
  return other == "none" ? sel : other + " + " + sel;
}

namespace {

/// The path an expression names in a keep list: `h`, `h[0]`, `h[4].mlp`, `lnf`; "" when it is
/// not such a path.
std::string pathOf(const Expr &e) {
  if (e.kind == ExprKind::Name)
    return e.text;
  if (e.kind == ExprKind::Member && e.lhs) {
    std::string base = pathOf(*e.lhs);
    return base.empty() ? "" : base + "." + e.text;
  }
  if (e.kind == ExprKind::Index && e.lhs && e.args.size() == 1 && e.args[0] &&
      e.args[0]->kind == ExprKind::Number && e.args[0]->isInteger && e.args[0]->suffix.empty() &&
      e.args[0]->unit.empty() && e.args[0]->number >= 0 && e.args[0]->number < 1e15) {
    std::string base = pathOf(*e.lhs);
    return base.empty() ? "" : base + "[" + std::to_string(static_cast<int64_t>(e.args[0]->number)) + "]";
  }
  return "";
}

/// Whether `p` is a path as pathOf writes it: names joined by '.', each with optional [n].
bool isPath(llvm::StringRef p) {
  if (p.empty())
    return false;
  llvm::SmallVector<llvm::StringRef, 8> parts;
  p.split(parts, '.');
  for (llvm::StringRef part : parts) {
    llvm::StringRef name = part.take_until([](char c) { return c == '['; });
    llvm::StringRef rest = part.drop_front(name.size());
    if (name.empty() || !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') ||
        !llvm::all_of(name, [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }))
      return false;
    while (!rest.empty()) {
      if (!rest.consume_front("["))
        return false;
      llvm::StringRef digits = rest.take_until([](char c) { return c == ']'; });
      rest = rest.drop_front(digits.size());
      if (digits.empty() || digits.size() > 15 || !llvm::all_of(digits, llvm::isDigit) ||
          !rest.consume_front("]"))
        return false;
    }
  }
  return true;
}

std::string keepText(const std::vector<std::string> &paths) {
  return "keep [" + llvm::join(paths, ", ") + "]";
}

} // namespace

/// `keep [h[0], h[4].mlp]`: the blocks or ops that keep their activations; every other
/// repeat copy (or the rest of it) is recomputed (Activations.cpp checks the paths exist).
std::optional<std::string> Sema::keepPolicy(const Expr &e) {
  std::vector<std::string> paths;
  for (const ExprPtr &arg : e.args) {
    std::string path = arg ? pathOf(*arg) : "";
    if (path.empty()) {
      llvm::SMRange r = arg ? arg->range : e.range;
      diags.report(DiagKind::InvalidValue, r.Start,
                   "a keep list names blocks or ops by path, like h[0] or h[4].mlp")
          .range(r);
      return std::nullopt;
    }
    paths.push_back(path);
  }
  if (paths.empty()) {
    diags.report(DiagKind::InvalidValue, e.range.Start,
                 "keep [] names nothing to keep: write checkpoint = full to recompute every block")
        .range(e.range);
    return std::nullopt;
  }
  return keepText(paths);
}

/// The same from the command line: "keep [h[0], h[4].mlp]" as one word.
std::optional<std::string> Sema::keepPolicy(const std::string &text, llvm::SMRange r) {
  llvm::StringRef rest = llvm::StringRef(text).trim();
  bool ok = rest.consume_front("keep");
  rest = rest.trim();
  ok = ok && rest.consume_front("[") && rest.consume_back("]");
  std::vector<std::string> paths;
  if (ok) {
    llvm::SmallVector<llvm::StringRef, 8> parts;
    rest.split(parts, ',');
    for (llvm::StringRef part : parts) {
      ok = ok && isPath(part.trim());
      paths.push_back(part.trim().str());
    }
  }
  if (!ok || paths.empty()) {
    diags.report(DiagKind::InvalidValue, r.Start,
                 "checkpoint keep needs a list of block or op paths, like keep [h[0], h[4].mlp], "
                 "not '" + text + "'")
        .range(r);
    return std::nullopt;
  }
  return keepText(paths);
}

std::optional<std::string> Sema::checkpointPolicy(const Expr &e, ConstEnv &env) {
  if (e.kind == ExprKind::Index && e.lhs && e.lhs->kind == ExprKind::Name && e.lhs->text == "keep")
    return keepPolicy(e);
  if (e.kind == ExprKind::Binary && e.text == "+" && e.args.size() == 2) {
    auto a = checkpointPolicy(*e.args[0], env);
    auto b = checkpointPolicy(*e.args[1], env);
    if (!a || !b)
      return std::nullopt;
    if (a->find('+') != std::string::npos || b->find('+') != std::string::npos) {
      diags.report(DiagKind::InvalidValue, e.range.Start,
                   "checkpoint combines at most one block policy with selective")
          .range(e.range);
      return std::nullopt;
    }
    return combinedCheckpointPolicy(*a, *b, e.range);
  }
  ConstValue v = eval(e, env);
  if (v.kind == ConstValue::Invalid)
    return std::nullopt;
  // The command line gives one word: "full+selective" or "full + selective".
  if (v.kind == ConstValue::Word && v.text.find('+') != std::string::npos &&
      !llvm::StringRef(v.text).trim().endswith("]")) {
    size_t plus = v.text.find('+');
    auto trimmed = [&](std::string w) {
      ConstValue part = v;
      part.text = llvm::StringRef(w).trim().str();
      return part;
    };
    ConstValue left = trimmed(v.text.substr(0, plus)), right = trimmed(v.text.substr(plus + 1));
    if (right.text.find('+') != std::string::npos) {
      diags.report(DiagKind::InvalidValue, v.range.Start,
                   "checkpoint combines at most one block policy with selective, not '" +
                       v.text + "'")
          .range(v.range);
      return std::nullopt;
    }
    auto a = singleCheckpointPolicy(left), b = singleCheckpointPolicy(right);
    if (!a || !b)
      return std::nullopt;
    return combinedCheckpointPolicy(*a, *b, v.range);
  }
  return singleCheckpointPolicy(v);
}

} // namespace tally
