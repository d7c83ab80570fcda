// Parsing: .tally text → AST.
//
// 1. Check the raw bytes: NUL bytes and invalid UTF-8 are reported at their offset (ANTLR's
//    input stream throws on invalid UTF-8, so this must come first).
// 2. Lex with the generated lexer and scan the tokens once for nesting depth and operator
//    chains that would overflow the stack in the recursive-descent parser.
// 3. Parse with the generated parser; our error listener turns each syntax error into a located
//    diagnostic (ANTLR recovers, so one run reports several).
// 4. Walk the parse tree into our own AST (one function per area of the grammar).
// ANTLR indexes characters by code point; an offset table maps them back to byte offsets.
#include "frontend/Parser.h"

#include "support/Diagnostics.h"

#include "TallyLexer.h"
#include "TallyParser.h"
#include "antlr4-runtime.h"

#include "llvm/Support/ConvertUTF.h"
#include "llvm/Support/SourceMgr.h"

#include <cmath>
#include <cstdlib>

using namespace antlr4;
using tally::gen::TallyLexer;
using tally::gen::TallyParser;

namespace tally {
namespace {

/// Maps ANTLR's code-point indexes to SMLocs in the buffer.
class Locator {
public:
  explicit Locator(llvm::StringRef text) : text(text) {
    bool ascii = true;
    for (unsigned char c : text)
      if (c >= 0x80) { ascii = false; break; }
    if (ascii)
      return;
    for (size_t i = 0; i < text.size(); ++i)
      if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80)
        byteOfCodePoint.push_back(i);
  }
  llvm::SMLoc at(size_t codePoint) const {
    size_t byte = codePoint;
    if (!byteOfCodePoint.empty())
      byte = codePoint < byteOfCodePoint.size() ? byteOfCodePoint[codePoint] : text.size();
    if (byte > text.size())
      byte = text.size();
    return llvm::SMLoc::getFromPointer(text.data() + byte);
  }
  llvm::SMRange token(const Token *t) const {
    if (!t || t->getType() == Token::EOF)
      return {at(t ? t->getStartIndex() : text.size()), at(t ? t->getStartIndex() : text.size())};
    return {at(t->getStartIndex()), at(t->getStopIndex() + 1)};
  }
  llvm::SMRange range(ParserRuleContext *c) const {
    llvm::SMRange s = token(c->getStart());
    const Token *stop = c->getStop();
    if (!stop || stop->getStopIndex() + 1 < c->getStart()->getStartIndex())
      return s;
    return {s.Start, token(stop).End};
  }

private:
  llvm::StringRef text;
  std::vector<size_t> byteOfCodePoint; // empty for pure-ASCII text
};

/// Turns ANTLR's syntax errors into our diagnostics; counts them itself (the parser's own
/// count misses lexer errors).
class ErrorListener : public BaseErrorListener {
public:
  ErrorListener(DiagnosticEngine &diags, const Locator &loc, unsigned bufferID)
      : diags(diags), loc(loc), bufferID(bufferID) {}
  unsigned errors = 0;

  void syntaxError(Recognizer *, Token *bad, size_t line, size_t column, const std::string &msg,
                   std::exception_ptr) override {
    ++errors;
    if (!bad) {
      diags.report(DiagKind::SyntaxError, lineColumn(line, column), msg);
      return;
    }
    llvm::SMRange r = loc.token(bad);
    std::string text = bad->getType() == Token::EOF ? "end of file" : "'" + bad->getText() + "'";
    std::string message;
    if (bad->getType() == TallyLexer::ERROR_CHAR)
      message = "unexpected character " + text;
    else
      message = tidy(msg, text);
    diags.report(DiagKind::SyntaxError, r.Start, message).range(r);
  }

private:
  DiagnosticEngine &diags;
  const Locator &loc;
  unsigned bufferID; ///< the buffer being parsed (not the main file: that is std.tally)

  llvm::SMLoc lineColumn(size_t line, size_t column) {
    return diags.sourceMgr().FindLocForLineAndColumn(bufferID, line, column + 1);
  }
  /// ANTLR's messages name every token it could accept; long lists help nobody.
  static std::string tidy(const std::string &msg, const std::string &text) {
    size_t expecting = msg.find(" expecting ");
    std::string head = msg.substr(0, expecting);
    std::string tail = expecting == std::string::npos ? "" : msg.substr(expecting + 11);
    size_t commas = std::count(tail.begin(), tail.end(), ',');
    std::string message;
    if (head.rfind("mismatched input", 0) == 0 || head.rfind("extraneous input", 0) == 0 ||
        head.rfind("no viable alternative", 0) == 0)
      message = "unexpected " + text;
    else if (head.rfind("missing ", 0) == 0)
      message = head + " before " + text;
    else
      message = head;
    if (!tail.empty() && commas < 6)
      message += "; expected " + tail;
    return message;
  }
};

/// Reports NUL bytes and invalid UTF-8; returns false if any were found.
bool checkBytes(llvm::StringRef text, DiagnosticEngine &diags) {
  size_t nul = text.find('\0');
  if (nul != llvm::StringRef::npos) {
    diags.report(DiagKind::NulByte, llvm::SMLoc::getFromPointer(text.data() + nul),
                 "source file contains a NUL byte (is this a binary file?)");
    return false;
  }
  const auto *begin = reinterpret_cast<const llvm::UTF8 *>(text.data());
  const auto *p = begin;
  const auto *end = begin + text.size();
  if (!llvm::isLegalUTF8String(&p, end)) {
    diags.report(DiagKind::InvalidUtf8,
                 llvm::SMLoc::getFromPointer(text.data() + (p - begin)),
                 "source file is not valid UTF-8");
    return false;
  }
  return true;
}

/// One pass over the tokens: bracket depth, chains of unary minus, operators per statement.
bool checkNesting(const std::vector<Token *> &tokens, const Locator &loc,
                  DiagnosticEngine &diags) {
  unsigned depth = 0, unary = 0, ops = 0;
  size_t prevType = 0;
  for (Token *t : tokens) {
    std::string s = t->getText();
    size_t type = t->getType();
    bool isOp = s == "+" || s == "-" || s == "*" || s == "/" || s == "@" || s == "." ||
                s == "(" || s == "[";
    if (s == "(" || s == "[" || s == "{")
      ++depth;
    else if ((s == ")" || s == "]" || s == "}") && depth > 0)
      --depth;
    unary = (s == "-" && (prevType == 0 || !(prevType == TallyLexer::ID ||
                                              prevType == TallyLexer::NUMBER)))
                ? unary + 1
                : 0;
    if (s == "=" || s == "{" || s == "}" || type == TallyLexer::RETURN)
      ops = 0;
    else if (isOp)
      ++ops;
    if (depth + unary > kMaxNesting) {
      diags.report(DiagKind::NestingTooDeep, loc.token(t).Start,
                   "nesting is deeper than " + std::to_string(kMaxNesting) + " levels")
          .range(loc.token(t));
      return false;
    }
    if (ops > kMaxOperatorsPerStatement) {
      diags.report(DiagKind::NestingTooDeep, loc.token(t).Start,
                   "expression has more than " + std::to_string(kMaxOperatorsPerStatement) +
                       " operators")
          .range(loc.token(t));
      return false;
    }
    if (s != ")" && s != "]")
      prevType = type;
    else
      prevType = TallyLexer::ID; // a closing bracket ends an operand: `(a) - b` is binary
  }
  return true;
}

/// Parse tree → AST. Only called on trees without syntax errors.
class TreeBuilder {
public:
  explicit TreeBuilder(const Locator &loc) : loc(loc) {}

  std::unique_ptr<Module> file(TallyParser::FileContext *ctx) {
    auto m = std::make_unique<Module>();
    for (auto *d : ctx->decl()) {
      if (auto *b = d->blockDecl())
        m->blocks.push_back(block(b));
      else if (auto *p = d->planDecl())
        m->plans.push_back(plan(p));
      else if (auto *t = d->targetDecl())
        m->targets.push_back(target(t));
    }
    return m;
  }
  /// One expression alone (parseExpression).
  ExprPtr expression(TallyParser::ExprContext *ctx) { return expr(ctx); }

private:
  const Locator &loc;

  llvm::SMRange r(ParserRuleContext *c) { return loc.range(c); }
  llvm::SMRange r(Token *t) { return loc.token(t); }
  llvm::SMRange r(tree::TerminalNode *n) { return loc.token(n->getSymbol()); }

  std::unique_ptr<BlockDecl> block(TallyParser::BlockDeclContext *ctx) {
    auto b = std::make_unique<BlockDecl>();
    b->range = r(ctx);
    b->isModel = ctx->kw->getType() == TallyLexer::MODEL;
    b->name = ctx->name->getText();
    b->nameRange = r(ctx->name);
    for (auto *p : ctx->blockParam()) {
      BlockParamAST param;
      param.range = r(p);
      param.name = p->name->getText();
      if (p->expr())
        param.defaultValue = expr(p->expr());
      b->params.push_back(std::move(param));
    }
    for (auto *item : ctx->blockItem())
      b->items.push_back(blockItem(item));
    return b;
  }

  std::unique_ptr<TensorTypeAST> tensorType(TallyParser::TensorTypeContext *ctx) {
    auto t = std::make_unique<TensorTypeAST>();
    t->range = r(ctx);
    if (ctx->dtype) {
      t->dtype = ctx->dtype->getText();
      t->dtypeRange = r(ctx->dtype);
    }
    for (auto *e : ctx->expr())
      t->dims.push_back(expr(e));
    return t;
  }

  BlockItemPtr blockItem(TallyParser::BlockItemContext *ctx) {
    if (auto *p = dynamic_cast<TallyParser::ParamDeclContext *>(ctx)) {
      auto item = std::make_unique<BlockItem>(BlockItemKind::Param, r(ctx));
      item->name = p->name->getText();
      item->nameRange = r(p->name);
      item->frozen = p->FROZEN() != nullptr;
      item->type = tensorType(p->tensorType());
      return item;
    }
    if (auto *m = dynamic_cast<TallyParser::MemberDeclContext *>(ctx)) {
      auto item = std::make_unique<BlockItem>(BlockItemKind::Member, r(ctx));
      item->name = m->name->getText();
      item->nameRange = r(m->name);
      item->frozen = m->FROZEN() != nullptr;
      item->value = expr(m->expr());
      return item;
    }
    if (auto *f = dynamic_cast<TallyParser::ForwardDeclContext *>(ctx)) {
      auto item = std::make_unique<BlockItem>(BlockItemKind::Forward, r(ctx));
      item->name = "forward";
      item->nameRange = r(f->FORWARD());
      item->forward = std::make_unique<ForwardAST>();
      item->forward->range = r(ctx);
      for (auto *p : f->fwdParam()) {
        ForwardParam param;
        param.range = r(p);
        param.name = p->name->getText();
        if (p->tensorType())
          param.type = tensorType(p->tensorType());
        item->forward->params.push_back(std::move(param));
      }
      item->forward->body = body(f->body());
      return item;
    }
    auto *i = dynamic_cast<TallyParser::BlockIfContext *>(ctx);
    auto item = std::make_unique<BlockItem>(BlockItemKind::If, r(ctx));
    item->value = expr(i->expr());
    for (auto *sub : i->blockItem()) {
      bool isElse = std::find(i->elseItems.begin(), i->elseItems.end(), sub) != i->elseItems.end();
      (isElse ? item->elseItems : item->thenItems).push_back(blockItem(sub));
    }
    return item;
  }

  std::vector<StmtPtr> body(TallyParser::BodyContext *ctx) {
    std::vector<StmtPtr> out;
    for (auto *s : ctx->stmt())
      out.push_back(stmt(s));
    return out;
  }

  StmtPtr stmt(TallyParser::StmtContext *ctx) {
    if (auto *a = dynamic_cast<TallyParser::AssignStmtContext *>(ctx)) {
      auto s = std::make_unique<Stmt>(StmtKind::Assign, r(ctx));
      for (auto *id : a->ID()) {
        s->targets.push_back(id->getText());
        s->targetRanges.push_back(r(id));
      }
      s->value = expr(a->expr());
      return s;
    }
    if (auto *ret = dynamic_cast<TallyParser::ReturnStmtContext *>(ctx)) {
      auto s = std::make_unique<Stmt>(StmtKind::Return, r(ctx));
      s->value = expr(ret->expr());
      return s;
    }
    auto *i = dynamic_cast<TallyParser::IfStmtContext *>(ctx);
    auto s = std::make_unique<Stmt>(StmtKind::If, r(ctx));
    s->value = expr(i->expr());
    s->thenBody = body(i->body(0));
    if (i->elseBody)
      s->elseBody = body(i->elseBody);
    return s;
  }

  std::unique_ptr<PlanDecl> plan(TallyParser::PlanDeclContext *ctx) {
    auto p = std::make_unique<PlanDecl>();
    p->range = r(ctx);
    p->isTrain = ctx->kw->getType() == TallyLexer::TRAIN;
    p->name = ctx->name->getText();
    p->nameRange = r(ctx->name);
    for (auto *item : ctx->planItem()) {
      if (auto *s = dynamic_cast<TallyParser::SettingContext *>(item)) {
        SettingAST setting;
        setting.range = r(s);
        setting.key = s->key->getText();
        setting.keyRange = r(s->key);
        setting.value = expr(s->expr());
        p->settings.push_back(std::move(setting));
        continue;
      }
      auto *b = dynamic_cast<TallyParser::BudgetBlockContext *>(item);
      for (auto *bi : b->budgetItem()) {
        BudgetItemAST budget;
        budget.range = r(bi);
        for (auto *word : bi->ID())
          budget.metric += (budget.metric.empty() ? "" : " ") + word->getText();
        budget.op = bi->op->getText();
        budget.value = expr(bi->expr());
        p->budgets.push_back(std::move(budget));
      }
    }
    return p;
  }

  std::unique_ptr<TargetDecl> target(TallyParser::TargetDeclContext *ctx) {
    auto t = std::make_unique<TargetDecl>();
    t->range = r(ctx);
    t->name = ctx->name->getText();
    t->nameRange = r(ctx->name);
    for (auto *item : ctx->targetItem()) {
      SettingAST setting;
      setting.range = r(item);
      if (auto *s = dynamic_cast<TallyParser::TargetSettingContext *>(item)) {
        setting.key = s->key->getText();
        setting.keyRange = r(s->key);
        setting.value = expr(s->expr());
      } else {
        auto *rec = dynamic_cast<TallyParser::TargetRecordContext *>(item);
        setting.key = rec->key->getText();
        setting.keyRange = r(rec->key);
        setting.value = record(rec->record());
      }
      t->settings.push_back(std::move(setting));
    }
    return t;
  }

  ExprPtr record(TallyParser::RecordContext *ctx) {
    auto e = std::make_unique<Expr>(ExprKind::Record, r(ctx));
    for (auto *f : ctx->field()) {
      e->argNames.push_back(f->key->getText());
      e->argNameRanges.push_back(r(f->key));
      e->args.push_back(expr(f->expr()));
      e->placements.push_back(f->where ? f->where->getText() : "");
    }
    return e;
  }

  /// Splits a NUMBER token's text into its value and glued suffix.
  static void number(const std::string &text, Expr &e) {
    size_t end = 0;
    std::string digits;
    bool integer = true;
    for (; end < text.size(); ++end) {
      char c = text[end];
      if (std::isdigit(static_cast<unsigned char>(c)))
        digits += c;
      else if (c == '_')
        continue;
      else if (c == '.') {
        digits += c;
        integer = false;
      } else if ((c == 'e' || c == 'E') && end + 1 < text.size() &&
                 (std::isdigit(static_cast<unsigned char>(text[end + 1])) ||
                  ((text[end + 1] == '+' || text[end + 1] == '-') && end + 2 < text.size() &&
                   std::isdigit(static_cast<unsigned char>(text[end + 2]))))) {
        digits += c;
        digits += text[++end];
        integer = false;
      } else
        break;
    }
    e.number = std::strtod(digits.c_str(), nullptr);
    e.isInteger = integer;
    e.suffix = text.substr(end);
  }

  ExprPtr expr(TallyParser::ExprContext *ctx) {
    llvm::SMRange range = r(ctx);
    if (auto *c = dynamic_cast<TallyParser::CallExprContext *>(ctx)) {
      auto e = std::make_unique<Expr>(ExprKind::Call, range);
      e->lhs = expr(c->expr());
      e->opLoc = e->lhs->range.End;
      for (auto *a : c->arg()) {
        e->argNames.push_back(a->name ? a->name->getText() : "");
        e->argNameRanges.push_back(a->name ? r(a->name) : r(a));
        e->args.push_back(expr(a->expr()));
      }
      return e;
    }
    if (auto *m = dynamic_cast<TallyParser::MemberExprContext *>(ctx)) {
      auto e = std::make_unique<Expr>(ExprKind::Member, range);
      e->lhs = expr(m->expr());
      e->text = m->ID()->getText();
      e->opLoc = r(m->ID()).Start;
      return e;
    }
    if (auto *i = dynamic_cast<TallyParser::IndexExprContext *>(ctx)) {
      auto e = std::make_unique<Expr>(ExprKind::Index, range);
      e->lhs = expr(i->expr());
      for (auto *sub : i->subscript()) {
        if (auto *one = dynamic_cast<TallyParser::IndexSubContext *>(sub)) {
          e->args.push_back(expr(one->expr()));
          continue;
        }
        auto *sl = dynamic_cast<TallyParser::SliceSubContext *>(sub);
        auto part = std::make_unique<Expr>(ExprKind::Slice, r(sub));
        part->opLoc = part->range.Start;
        for (TallyParser::ExprContext *b : {sl->lo, sl->hi, sl->step})
          part->args.push_back(b ? expr(b) : nullptr);
        e->args.push_back(std::move(part));
      }
      e->opLoc = e->lhs->range.End;
      return e;
    }
    if (auto *n = dynamic_cast<TallyParser::NegExprContext *>(ctx)) {
      auto e = std::make_unique<Expr>(ExprKind::Neg, range);
      e->args.push_back(expr(n->expr()));
      e->opLoc = range.Start;
      return e;
    }
    if (auto *m = dynamic_cast<TallyParser::MulExprContext *>(ctx))
      return binary(range, m->op, m->expr(0), m->expr(1));
    if (auto *a = dynamic_cast<TallyParser::AddExprContext *>(ctx))
      return binary(range, a->op, a->expr(0), a->expr(1));
    if (auto *rep = dynamic_cast<TallyParser::RepeatExprContext *>(ctx)) {
      auto e = std::make_unique<Expr>(ExprKind::Repeat, range);
      e->args.push_back(expr(rep->expr(0)));
      e->lhs = expr(rep->expr(1));
      e->opLoc = range.Start;
      return e;
    }
    if (auto *d = dynamic_cast<TallyParser::DeviceExprContext *>(ctx)) {
      auto e = std::make_unique<Expr>(ExprKind::Device, range);
      number(d->NUMBER()->getText(), *e);
      if (e->suffix == "x") // `8x H100_SXM`: the x is glued to the count
        e->suffix.clear();
      e->unitRange = r(d->NUMBER());
      e->text = d->device->getText();
      e->opLoc = r(d->device).Start;
      if (d->record())
        e->lhs = record(d->record());
      return e;
    }
    if (auto *n = dynamic_cast<TallyParser::NumberExprContext *>(ctx)) {
      auto e = std::make_unique<Expr>(ExprKind::Number, range);
      number(n->NUMBER()->getText(), *e);
      llvm::SMRange tok = r(n->NUMBER());
      if (!e->suffix.empty())
        e->unitRange = {llvm::SMLoc::getFromPointer(tok.End.getPointer() - e->suffix.size()),
                         tok.End};
      if (auto *u = n->unit()) {
        for (auto *id : u->ID())
          e->unit += (e->unit.empty() ? "" : "/") + id->getText();
        e->unitRange = r(u);
      }
      if (auto *g = n->gluedRate()) { // `3.35TB/s`: the glued suffix goes on to "/s"
        e->suffix += "/" + g->ID()->getText();
        e->unitRange.End = r(g).End;
      }
      return e;
    }
    if (auto *n = dynamic_cast<TallyParser::NameExprContext *>(ctx)) {
      auto e = std::make_unique<Expr>(ExprKind::Name, range);
      e->text = n->ID()->getText();
      return e;
    }
    if (auto *s = dynamic_cast<TallyParser::StringExprContext *>(ctx)) {
      auto e = std::make_unique<Expr>(ExprKind::String, range);
      std::string t = s->STRING()->getText();
      e->text = t.size() >= 2 ? t.substr(1, t.size() - 2) : t;
      return e;
    }
    if (auto *p = dynamic_cast<TallyParser::ParenExprContext *>(ctx)) {
      ExprPtr inner = expr(p->expr());
      inner->range = range;
      return inner;
    }
    if (auto *t = dynamic_cast<TallyParser::TupleExprContext *>(ctx)) {
      auto e = std::make_unique<Expr>(ExprKind::Tuple, range);
      for (auto *sub : t->expr())
        e->args.push_back(expr(sub));
      return e;
    }
    if (auto *l = dynamic_cast<TallyParser::ListExprContext *>(ctx)) {
      auto e = std::make_unique<Expr>(ExprKind::List, range);
      for (auto *sub : l->expr())
        e->args.push_back(expr(sub));
      return e;
    }
    auto *rec = dynamic_cast<TallyParser::RecordExprContext *>(ctx);
    return record(rec->record());
  }

  ExprPtr binary(llvm::SMRange range, Token *op, TallyParser::ExprContext *a,
                 TallyParser::ExprContext *b) {
    auto e = std::make_unique<Expr>(ExprKind::Binary, range);
    e->text = op->getText();
    e->opLoc = r(op).Start;
    e->args.push_back(expr(a));
    e->args.push_back(expr(b));
    return e;
  }
};

} // namespace

namespace {

/// Lexes buffer `bufferID` (after the byte and nesting checks) and hands `parse` the token
/// stream and a parser, both reporting to `diags` at the buffer's locations; null (after a
/// diagnostic) where a check fails or the runtime throws. `parse` returns null after errors.
template <class Result, class Parse>
Result withParser(unsigned bufferID, DiagnosticEngine &diags, Parse parse) {
  const llvm::MemoryBuffer *buffer = diags.sourceMgr().getMemoryBuffer(bufferID);
  llvm::StringRef text = buffer->getBuffer();
  if (!checkBytes(text, diags))
    return nullptr;
  Locator loc(text);
  ErrorListener listener(diags, loc, bufferID);
  try {
    ANTLRInputStream input(text.data(), text.size());
    TallyLexer lexer(&input);
    lexer.removeErrorListeners();
    lexer.addErrorListener(&listener);
    CommonTokenStream tokens(&lexer);
    tokens.fill();
    if (!checkNesting(tokens.getTokens(), loc, diags))
      return nullptr;
    TallyParser parser(&tokens);
    parser.removeErrorListeners();
    return parse(tokens, parser, listener, loc);
  } catch (std::exception &e) {
    diags.report(DiagKind::SyntaxError, llvm::SMLoc::getFromPointer(text.data()),
                 std::string("the parser failed: ") + e.what());
    return nullptr;
  }
}

} // namespace

std::unique_ptr<Module> parseBuffer(unsigned bufferID, DiagnosticEngine &diags) {
  std::string name = diags.sourceMgr().getMemoryBuffer(bufferID)->getBufferIdentifier().str();
  return withParser<std::unique_ptr<Module>>(
      bufferID, diags,
      [&](CommonTokenStream &tokens, TallyParser &parser, ErrorListener &listener,
          Locator &loc) -> std::unique_ptr<Module> {
        // SLL prediction first (fast), silent and bailing out at the first problem; then full
        // LL with recovery, reporting every error. The first stage has no listener: it may fail
        // where LL succeeds, and an error it saw is seen (and reported once) again by the
        // second.
        parser.getInterpreter<atn::ParserATNSimulator>()->setPredictionMode(atn::PredictionMode::SLL);
        parser.setErrorHandler(std::make_shared<BailErrorStrategy>());
        TallyParser::FileContext *tree = nullptr;
        try {
          tree = parser.file();
        } catch (ParseCancellationException &) {
          tokens.seek(0);
          parser.reset();
          parser.addErrorListener(&listener);
          parser.setErrorHandler(std::make_shared<DefaultErrorStrategy>());
          parser.getInterpreter<atn::ParserATNSimulator>()->setPredictionMode(
              atn::PredictionMode::LL);
          tree = parser.file();
        }
        if (listener.errors > 0)
          return nullptr;
        auto module = TreeBuilder(loc).file(tree);
        module->bufferName = name;
        return module;
      });
}

ExprPtr parseExpression(unsigned bufferID, DiagnosticEngine &diags) {
  return withParser<ExprPtr>(
      bufferID, diags,
      [&](CommonTokenStream &tokens, TallyParser &parser, ErrorListener &listener,
          Locator &loc) -> ExprPtr {
        parser.addErrorListener(&listener);
        TallyParser::ExprContext *tree = parser.expr();
        if (listener.errors > 0)
          return nullptr;
        if (Token *rest = tokens.LT(1); rest && rest->getType() != Token::EOF) {
          // A record the expression could not take (`{ tensor = 8 data = }`): its own syntax
          // error says what is wrong inside it.
          if (rest->getText() == "{") {
            size_t at = rest->getTokenIndex();
            TallyParser again(&tokens); // a fresh parser: the first one's recovery state is spent
            again.removeErrorListeners();
            again.addErrorListener(&listener);
            tokens.seek(at);
            again.record();
            if (listener.errors > 0)
              return nullptr;
          }
          llvm::SMRange r = loc.token(rest);
          diags.report(DiagKind::SyntaxError, r.Start,
                       "unexpected '" + rest->getText() + "' after the value")
              .range(r);
          return nullptr;
        }
        return TreeBuilder(loc).expression(tree);
      });
}

} // namespace tally
