// `tally lsp`: a minimal Language Server Protocol server over standard input and output, so an
// editor shows tally's diagnostics as you type and a block's parameters on hover.
//
// 1. Messages are JSON-RPC 2.0 framed by a "Content-Length: N" header and a blank line, read
//    from stdin and written to stdout (llvm::json).
// 2. initialize answers the capabilities: full-text sync, hover. shutdown answers null; exit
//    ends the process (0 after shutdown, 1 without). Other requests get MethodNotFound;
//    unknown notifications are ignored.
// 3. textDocument/didOpen and didChange (full text) recompile the document exactly as
//    `tally check` does — parse, then lower and analyze every plan — and publish every
//    diagnostic located in it (0-based lines, UTF-16 columns as LSP counts them; diagnostics
//    without a location go on the first line), with the document version it holds. The
//    compiles run on a worker thread, never on the thread that answers requests: a change
//    is compiled once no newer one came for kDebounce; a newer version makes an older
//    compile stop at its next plan, and what an outdated compile found is never published.
//    Requests answer at once from the newest finished compile (its hover texts, names,
//    definitions and fix-its), whatever is being compiled meanwhile.
// 4. textDocument/hover on the name of a block or model: its instances in the first plan with
//    their parameters and forward FLOPs per step (from the analysis); a name the plan does not
//    instantiate, or a file without a plan, says so. On a member name (`attn = ...`, `h`), the
//    same for the instances that member creates.
// 5. textDocument/definition on a block or model name: its declaration in the document.
// 6. textDocument/completion: block and model names, plan settings, targets, precision
//    presets, optimizers and the primitive ops with their signatures (ir/Primitives.cpp);
//    not filtered by context (editors filter by prefix).
// 7. textDocument/codeAction: each fix-it of a diagnostic overlapping the range (the "did you
//    mean" replacements, a missing setting) as a quick fix with its edit.
#include "driver/Compiler.h"
#include "ir/Plan.h"
#include "ir/Primitives.h"
#include "ir/Target.h"
#include "ir/Units.h"
#include "report/Sections.h"
#include "tools/tally/Commands.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

using namespace llvm;

namespace tally {
namespace lspopts {

cl::SubCommand Lsp("lsp", "A Language Server over stdio: diagnostics as you type, hover on blocks");

} // namespace lspopts

namespace {

/// What one compile of one version of a document found: the hover text of each block name
/// the first plan instantiates, the program's names, their definitions and the fix-its of the
/// published diagnostics, with the text and version they belong to.
struct Compiled {
  std::string text;                         ///< the text compiled (fix-it offsets are into it)
  int64_t version = 0;                      ///< its LSP document version
  std::map<std::string, std::string> hover; ///< block or model name → Markdown
  std::map<std::string, std::string> memberHover; ///< member name ("attn", "h") → Markdown
  std::string noHover;                      ///< what hover says for a block with no entry
  std::vector<std::string> blockNames;      ///< every block and model the program knows
  std::map<std::string, std::pair<size_t, size_t>> definitions; ///< block → its name's bytes in the text
  /// One per fix-it of a published diagnostic: the diagnostic's bytes in the text, the
  /// diagnostic as published, and the code action that applies the fix-it.
  struct Fix {
    size_t from, to;
    json::Value diagnostic;
    std::string title;
    size_t editFrom, editTo;
    std::string replacement;
  };
  std::vector<Fix> fixes;
};

/// One open document: its newest text and the newest finished compile (null before the
/// first), which requests read.
struct Document {
  std::string text;
  int64_t version = 0;
  uint64_t generation = 0; ///< counts the changes; a compile of an older one is outdated
  std::chrono::steady_clock::time_point changed; ///< when the newest change came
  std::shared_ptr<const Compiled> compiled;
};

/// Reads one framed message; false at end of input or on a malformed header.
bool readMessage(std::string &body) {
  size_t length = 0;
  bool sawLength = false;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    if (line.empty()) {
      if (!sawLength)
        continue; // stray blank line between messages
      break;
    }
    StringRef l(line);
    if (l.consume_front_insensitive("Content-Length:")) {
      unsigned long long n = 0;
      if (l.trim().getAsInteger(10, n) || n > (64u << 20))
        return false;
      length = static_cast<size_t>(n);
      sawLength = true;
    }
  }
  if (!sawLength)
    return false;
  body.assign(length, '\0');
  std::cin.read(&body[0], static_cast<std::streamsize>(length));
  return static_cast<size_t>(std::cin.gcount()) == length;
}

/// Messages go out whole, one at a time: the worker publishes while the request loop replies.
std::mutex outputMutex;

void send(json::Value message) {
  std::lock_guard<std::mutex> lock(outputMutex);
  std::string body;
  raw_string_ostream os(body);
  os << message;
  os.flush();
  std::printf("Content-Length: %zu\r\n\r\n%s", body.size(), body.c_str());
  std::fflush(stdout);
}

void reply(const json::Value &id, json::Value result) {
  send(json::Object{{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}});
}

void replyError(const json::Value &id, int64_t code, const std::string &message) {
  send(json::Object{{"jsonrpc", "2.0"},
                    {"id", id},
                    {"error", json::Object{{"code", code}, {"message", message}}}});
}

/// "file:///a/b%20c.tally" → "/a/b c.tally"; other URIs are kept as they are.
std::string uriToPath(StringRef uri) {
  if (!uri.consume_front("file://"))
    return uri.str();
  std::string out;
  for (size_t i = 0; i < uri.size(); ++i) {
    unsigned v = 0;
    if (uri[i] == '%' && i + 2 < uri.size() && !uri.substr(i + 1, 2).getAsInteger(16, v)) {
      out += static_cast<char>(v);
      i += 2;
    } else {
      out += uri[i];
    }
  }
  return out;
}

/// The LSP position (0-based line, UTF-16 column) of a byte offset in `text`.
json::Object positionOf(StringRef text, size_t offset) {
  offset = std::min(offset, text.size());
  int64_t line = 0, column = 0;
  for (size_t i = 0; i < offset; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      ++line;
      column = 0;
    } else if ((c & 0xC0) != 0x80) {
      column += c >= 0xF0 ? 2 : 1; // a 4-byte UTF-8 sequence is a surrogate pair in UTF-16
    }
  }
  return json::Object{{"line", line}, {"character", column}};
}

/// The byte offset of an LSP position in `text` (clamped to the line's end).
size_t offsetOf(StringRef text, int64_t line, int64_t character) {
  size_t i = 0;
  for (int64_t l = 0; l < line && i < text.size(); ++i)
    if (text[i] == '\n')
      ++l;
  int64_t column = 0;
  while (i < text.size() && text[i] != '\n' && column < character) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    column += c >= 0xF0 ? 2 : 1;
    ++i;
    while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80)
      ++i;
  }
  return i;
}

/// The LSP diagnostics of one compilation that lie in the document's buffer (a diagnostic
/// raised in the standard library is reported at the user's call or declaration by the
/// engine), with each fix-it in the document kept in `fixes` for textDocument/codeAction.
json::Array lspDiagnostics(const Compilation &c, unsigned docBuffer, StringRef text,
                           std::vector<Compiled::Fix> &fixes) {
  json::Array out;
  fixes.clear();
  const char *start = c.sm.getMemoryBuffer(docBuffer)->getBufferStart();
  const char *end = c.sm.getMemoryBuffer(docBuffer)->getBufferEnd();
  auto inDoc = [&](SMLoc l) { return l.isValid() && l.getPointer() >= start && l.getPointer() <= end; };
  for (const Diagnostic &d : c.diags.diagnostics()) {
    size_t from = 0, to = 0;
    if (inDoc(d.loc)) {
      from = to = static_cast<size_t>(d.loc.getPointer() - start);
      to = from + 1;
      for (const SMRange &r : d.ranges)
        if (inDoc(r.Start) && inDoc(r.End) && r.Start.getPointer() <= d.loc.getPointer() &&
            d.loc.getPointer() < r.End.getPointer()) {
          from = static_cast<size_t>(r.Start.getPointer() - start);
          to = static_cast<size_t>(r.End.getPointer() - start);
          break;
        }
    } else if (d.loc.isValid()) {
      continue; // in the standard library: not this document's
    }
    std::string message = d.message;
    for (const DiagNote &n : d.notes)
      message += "\nnote: " + n.message;
    json::Object diagnostic{
        {"range", json::Object{{"start", positionOf(text, from)}, {"end", positionOf(text, to)}}},
        {"severity", d.severity == Severity::Error ? 1 : 2},
        {"code", codeOf(d.kind).str()},
        {"source", "tally"},
        {"message", message}};
    for (const SMFixIt &f : d.fixits) {
      SMRange r = f.getRange();
      if (!inDoc(r.Start) || !inDoc(r.End))
        continue;
      std::string shown = f.getText().str();
      std::string title = r.Start == r.End ? "insert '" + shown + "'" : "replace with '" + shown + "'";
      if (StringRef(shown).trim().empty() || shown.find('\n') != std::string::npos)
        title = "insert " + StringRef(shown).trim().str();
      fixes.push_back({from, to, json::Value(json::Object(diagnostic)), title,
                       static_cast<size_t>(r.Start.getPointer() - start),
                       static_cast<size_t>(r.End.getPointer() - start), f.getText().str()});
    }
    out.push_back(std::move(diagnostic));
  }
  return out;
}

void describe(const Analysis &a,
              const std::map<std::string, std::vector<const Analysis::BlockCount *>> &groups,
              std::map<std::string, std::string> &out, const std::string &what);

/// The member name an instance path ends with: "h[3].attn" → "attn", "h" → "h"; "" for a
/// repeat copy ("h[3]") or the model itself.
std::string memberName(StringRef path) {
  StringRef last = path.rsplit('.').second.empty() ? path : path.rsplit('.').second;
  if (last.empty() || last.endswith("]"))
    return "";
  return last.str();
}

/// Hover texts for the blocks the analysis instantiates, by block name and by member name.
void collectHover(const Analysis &a, Compiled &doc) {
  std::map<std::string, std::vector<const Analysis::BlockCount *>> byName, byMember;
  for (const Analysis::BlockCount &b : a.params.byBlock) {
    const Instance &in = a.graph->instances[b.instance];
    if (*in.block != "repeat")
      byName[*in.block].push_back(&b);
    std::string member = memberName(a.graph->instancePath(b.instance));
    if (!member.empty())
      byMember[member].push_back(&b);
  }
  describe(a, byName, doc.hover, "");
  describe(a, byMember, doc.memberHover, "member ");
}

/// One hover text per name: its instances' parameters and forward FLOPs per step.
void describe(const Analysis &a,
              const std::map<std::string, std::vector<const Analysis::BlockCount *>> &groups,
              std::map<std::string, std::string> &out, const std::string &what) {
  for (const auto &[name, list] : groups) {
    const Analysis::BlockCount &first = *list.front();
    const Instance &in = a.graph->instances[first.instance];
    std::string path = a.graph->instancePath(first.instance);
    std::string text = what + "**" + name + "**" +
                       (what.empty() ? "" : " (" + *in.block + ")") + " in plan `" +
                       a.plan->name + "`: ";
    if (list.size() == 1) {
      text += groupDigits(first.count) + " parameters";
      if (!path.empty())
        text += " (`" + path + "`)";
    } else {
      double total = 0;
      bool same = true;
      for (const auto *b : list) {
        total += b->count;
        same = same && b->count == first.count;
      }
      text += std::to_string(list.size()) + " instances, " +
              (same ? groupDigits(first.count) + " parameters each, " : "") +
              groupDigits(total) + " in all (first `" + path + "`)";
    }
    text += "; forward " + formatFlops(first.forwardFlops) + " per step" +
            (list.size() > 1 ? " each" : "");
    out[name] = text;
  }
}

/// Step 3: compiles `text` like `tally check`: what requests read and the diagnostics to
/// publish; null when `outdated` says a newer version came, checked before each plan.
std::shared_ptr<Compiled> compile(const std::string &uri, const std::string &text,
                                  int64_t version, json::Array &diagnostics,
                                  const std::function<bool()> &outdated) {
  auto doc = std::make_shared<Compiled>();
  doc->text = text;
  doc->version = version;
  Compilation c;
  c.diags.setOutput(nullptr);
  std::string path = uriToPath(uri);
  bool parsed = c.addSource(path, doc->text);
  unsigned buffer = c.sm.getNumBuffers(); // the document is the last buffer added
  const char *bufStart = c.sm.getMemoryBuffer(buffer)->getBufferStart();
  const char *bufEnd = c.sm.getMemoryBuffer(buffer)->getBufferEnd();
  for (const auto &entry : c.program.blocks) {
    doc->blockNames.push_back(entry.getKey().str());
    SMRange r = entry.getValue()->nameRange;
    if (!entry.getValue()->fromStdlib && r.isValid() && r.Start.getPointer() >= bufStart &&
        r.End.getPointer() <= bufEnd)
      doc->definitions[entry.getKey().str()] = {static_cast<size_t>(r.Start.getPointer() - bufStart),
                                                static_cast<size_t>(r.End.getPointer() - bufStart)};
  }
  std::sort(doc->blockNames.begin(), doc->blockNames.end());
  bool analyzed = false;
  if (parsed && !c.diags.hasErrors()) {
    bool first = true;
    for (const PlanDecl *p : c.program.planOrder) {
      if (outdated())
        return nullptr;
      std::optional<Analysis> a = c.analyzePlan(*p);
      if (a && first) {
        collectHover(*a, *doc);
        doc->noHover = "not instantiated by plan `" + a->plan->name + "`";
        analyzed = true;
      }
      first = false;
    }
    if (!c.diags.hasErrors())
      c.checkModelsWithoutPlan();
  }
  if (!analyzed)
    doc->noHover = c.program.planOrder.empty() && !c.diags.hasErrors()
                       ? "no train or infer plan instantiates it"
                       : "the file has errors; its parameters show once they are fixed";
  diagnostics = lspDiagnostics(c, buffer, doc->text, doc->fixes);
  return doc;
}

/// publishDiagnostics for a document version (its diagnostics, or none when it closed).
void publish(const std::string &uri, std::optional<int64_t> version, json::Array diagnostics) {
  json::Object params{{"uri", uri}, {"diagnostics", std::move(diagnostics)}};
  if (version)
    params["version"] = *version;
  send(json::Object{{"jsonrpc", "2.0"},
                    {"method", "textDocument/publishDiagnostics"},
                    {"params", std::move(params)}});
}

/// Step 7: the code actions for a range: every fix-it of a diagnostic that overlaps it, as a
/// quick fix that edits the document.
json::Array codeActions(const std::string &uri, const Compiled &doc, size_t from, size_t to) {
  json::Array out;
  for (const Compiled::Fix &f : doc.fixes) {
    if (f.to < from || f.from > to)
      continue;
    json::Object edit{{"range", json::Object{{"start", positionOf(doc.text, f.editFrom)},
                                             {"end", positionOf(doc.text, f.editTo)}}},
                      {"newText", f.replacement}};
    out.push_back(json::Object{
        {"title", f.title},
        {"kind", "quickfix"},
        {"isPreferred", true},
        {"diagnostics", json::Array{f.diagnostic}},
        {"edit", json::Object{{"changes", json::Object{{uri, json::Array{std::move(edit)}}}}}}});
  }
  return out;
}

/// The identifier around an LSP position: its bytes [b, e) in the text (b == e: none).
std::pair<size_t, size_t> wordAt(StringRef text, int64_t line, int64_t character) {
  size_t at = offsetOf(text, line, character);
  auto isIdent = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  size_t b = at, e = at;
  while (b > 0 && isIdent(text[b - 1]))
    --b;
  while (e < text.size() && isIdent(text[e]))
    ++e;
  return {b, e};
}

/// Step 4: the hover of the identifier under the position in `text`, or null.
json::Value hover(StringRef text, const Compiled &doc, int64_t line, int64_t character) {
  auto [b, e] = wordAt(text, line, character);
  if (b == e)
    return nullptr;
  std::string word = text.substr(b, e - b).str();
  std::string value;
  if (auto it = doc.hover.find(word); it != doc.hover.end())
    value = it->second;
  else if (std::find(doc.blockNames.begin(), doc.blockNames.end(), word) != doc.blockNames.end())
    value = "**" + word + "**: " + doc.noHover;
  else if (auto m = doc.memberHover.find(word); m != doc.memberHover.end())
    value = m->second;
  else
    return nullptr;
  return json::Object{
      {"contents", json::Object{{"kind", "markdown"}, {"value", value}}},
      {"range", json::Object{{"start", positionOf(text, b)}, {"end", positionOf(text, e)}}}};
}

/// Step 5: where the block or model named under the position is declared in this document
/// (blocks of the standard library have no file to go to), or null.
json::Value definition(const std::string &uri, StringRef text, const Compiled &doc,
                       int64_t line, int64_t character) {
  auto [b, e] = wordAt(text, line, character);
  auto it = doc.definitions.find(text.substr(b, e - b).str());
  if (b == e || it == doc.definitions.end())
    return nullptr;
  return json::Object{{"uri", uri},
                      {"range", json::Object{{"start", positionOf(doc.text, it->second.first)},
                                             {"end", positionOf(doc.text, it->second.second)}}}};
}

/// Step 6: completion items: the program's blocks and models, the plan settings (as
/// frontend/Sema.cpp accepts them), the targets of the catalogue, the precision presets, the
/// optimizers and the primitives (their signatures as details).
json::Value completion(const Compiled &doc) {
  json::Array items;
  auto add = [&](const std::string &label, int64_t kind, const std::string &detail) {
    items.push_back(json::Object{{"label", label}, {"kind", kind}, {"detail", detail}});
  };
  // LSP CompletionItemKind: Class 7, Property 10, Constant 21, Function 3.
  for (const std::string &b : doc.blockNames)
    add(b, 7, "block");
  for (const char *key : {"model", "batch", "seq", "micro_batch", "tokens", "optimizer",
                          "precision", "checkpoint", "target", "prompt", "generate"})
    add(key, 10, "plan setting");
  for (const Target &t : targetCatalogue())
    add(t.name, 21, "target: " + t.description);
  for (const std::string &p : precisionPresetNames())
    add(p, 21, "precision preset");
  for (const std::string &o : optimizerNames())
    add(o, 3, "optimizer");
  for (const Primitive &p : primitives())
    add(p.name().str(), 3, "primitive: " + p.signature());
  return json::Object{{"isIncomplete", false}, {"items", std::move(items)}};
}

/// A change is compiled once no newer one has come for this long: typing does not queue a
/// compile per keystroke.
constexpr std::chrono::milliseconds kDebounce(75);

/// The open documents and the compile worker. The request loop (serve) and the worker share
/// `docs` under `mutex`; the worker compiles outside it.
class Server {
public:
  Server() : worker_([this] { work(); }) {}
  ~Server() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      ++generation_; // the compile under way stops at its next plan
    }
    wake_.notify_all();
    worker_.join();
  }

  /// didOpen or didChange: the new text, compiled after kDebounce without a newer one.
  void change(const std::string &uri, std::string text, int64_t version) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Document &doc = docs_[uri];
      doc.text = std::move(text);
      doc.version = version;
      doc.generation = ++generation_;
      doc.changed = std::chrono::steady_clock::now();
      pending_[uri] = doc.generation;
    }
    wake_.notify_all();
  }
  void close(const std::string &uri) {
    std::lock_guard<std::mutex> lock(mutex_);
    docs_.erase(uri);
    pending_.erase(uri);
    ++generation_;
  }
  /// The document's newest text and newest finished compile (an empty one before the first),
  /// or nullopt for a document not open.
  std::optional<std::pair<std::string, std::shared_ptr<const Compiled>>> read(const std::string &uri) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = docs_.find(uri);
    if (it == docs_.end())
      return std::nullopt;
    std::shared_ptr<const Compiled> c = it->second.compiled;
    if (!c) {
      auto none = std::make_shared<Compiled>();
      none->noHover = "still being compiled";
      c = none;
    }
    return std::make_pair(it->second.text, c);
  }

private:
  /// The worker: waits for a pending change, lets kDebounce pass without a newer one,
  /// compiles the newest text outside the lock, and publishes only if nothing newer came.
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
      if (stopping_)
        return;
      auto [uri, generation] = *pending_.begin();
      Document &doc = docs_[uri];
      auto due = doc.changed + kDebounce;
      if (std::chrono::steady_clock::now() < due) {
        wake_.wait_until(lock, due); // a newer change moves `due`; the loop looks again
        continue;
      }
      pending_.erase(pending_.begin());
      std::string text = doc.text;
      int64_t version = doc.version;
      lock.unlock();
      auto outdated = [this, uri = uri, generation = generation] {
        std::lock_guard<std::mutex> l(mutex_);
        auto it = docs_.find(uri);
        return stopping_ || it == docs_.end() || it->second.generation != generation;
      };
      json::Array diagnostics;
      std::shared_ptr<Compiled> compiled = compile(uri, text, version, diagnostics, outdated);
      lock.lock();
      auto it = docs_.find(uri);
      if (!compiled || stopping_ || it == docs_.end() || it->second.generation != generation)
        continue; // a newer version (or a close) came: its own compile publishes
      it->second.compiled = std::move(compiled);
      publish(uri, version, std::move(diagnostics)); // under the lock: a close cannot overtake it
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<std::string, Document> docs_;
  std::map<std::string, uint64_t> pending_; ///< documents changed since their last compile
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

/// The document a request names and its position, or nullopt (the request then gets null).
struct AtPosition {
  std::string uri, text;
  std::shared_ptr<const Compiled> compiled;
  int64_t line = 0, character = 0;
};
std::optional<AtPosition> requestTarget(Server &server, const json::Object *params) {
  const json::Object *td = params ? params->getObject("textDocument") : nullptr;
  const json::Object *pos = params ? params->getObject("position") : nullptr;
  auto uri = td ? td->getString("uri") : None;
  if (!uri || !pos)
    return std::nullopt;
  auto doc = server.read(uri->str());
  if (!doc)
    return std::nullopt;
  return AtPosition{uri->str(), std::move(doc->first), std::move(doc->second),
                pos->getInteger("line").getValueOr(0), pos->getInteger("character").getValueOr(0)};
}

int serve() {
  Server server;
  bool shutdown = false;
  std::string body;
  while (readMessage(body)) {
    Expected<json::Value> msg = json::parse(body);
    if (!msg) {
      consumeError(msg.takeError());
      send(json::Object{{"jsonrpc", "2.0"},
                        {"id", nullptr},
                        {"error", json::Object{{"code", -32700}, {"message", "parse error"}}}});
      continue;
    }
    const json::Object *o = msg->getAsObject();
    if (!o)
      continue;
    std::string method = o->getString("method").getValueOr("").str();
    const json::Value *id = o->get("id");
    const json::Object *params = o->getObject("params");
    if (method == "initialize" && id) {
      reply(*id, json::Object{{"capabilities", json::Object{{"textDocumentSync", 1},
                                                            {"hoverProvider", true},
                                                            {"definitionProvider", true},
                                                            {"codeActionProvider", true},
                                                            {"completionProvider", json::Object{}}}},
                              {"serverInfo", json::Object{{"name", "tally"}, {"version", "0.1"}}}});
    } else if (method == "shutdown" && id) {
      shutdown = true;
      reply(*id, nullptr);
    } else if (method == "exit") {
      return shutdown ? 0 : 1;
    } else if (method == "textDocument/didOpen" || method == "textDocument/didChange") {
      const json::Object *td = params ? params->getObject("textDocument") : nullptr;
      if (!td || !td->getString("uri"))
        continue;
      std::string text;
      if (method == "textDocument/didOpen") {
        text = td->getString("text").getValueOr("").str();
      } else if (auto current = server.read(td->getString("uri")->str())) {
        text = current->first;
        if (const json::Array *changes = params->getArray("contentChanges"))
          for (const json::Value &ch : *changes)
            if (const json::Object *co = ch.getAsObject())
              if (auto t = co->getString("text"))
                text = t->str(); // full sync: each change is the whole text
      }
      server.change(td->getString("uri")->str(), std::move(text),
                    td->getInteger("version").getValueOr(0));
    } else if (method == "textDocument/didClose") {
      if (const json::Object *td = params ? params->getObject("textDocument") : nullptr)
        if (auto uri = td->getString("uri")) {
          server.close(uri->str());
          publish(uri->str(), std::nullopt, json::Array{});
        }
    } else if (method == "textDocument/hover" && id) {
      std::optional<AtPosition> t = requestTarget(server, params);
      reply(*id, t ? hover(t->text, *t->compiled, t->line, t->character) : json::Value(nullptr));
    } else if (method == "textDocument/codeAction" && id) {
      const json::Object *range = params ? params->getObject("range") : nullptr;
      const json::Object *b = range ? range->getObject("start") : nullptr;
      const json::Object *e = range ? range->getObject("end") : nullptr;
      const json::Object *td = params ? params->getObject("textDocument") : nullptr;
      auto uri = td ? td->getString("uri") : None;
      auto doc = uri && b && e ? server.read(uri->str()) : std::nullopt;
      if (!doc) {
        reply(*id, nullptr);
        continue;
      }
      StringRef text = doc->first;
      if (doc->second->text != text) { // the fix-its are of an older text: none until it compiles
        reply(*id, json::Array{});
        continue;
      }
      reply(*id, codeActions(uri->str(), *doc->second,
                             offsetOf(text, b->getInteger("line").getValueOr(0),
                                      b->getInteger("character").getValueOr(0)),
                             offsetOf(text, e->getInteger("line").getValueOr(0),
                                      e->getInteger("character").getValueOr(0))));
    } else if (method == "textDocument/completion" && id) {
      std::optional<AtPosition> t = requestTarget(server, params);
      reply(*id, t ? completion(*t->compiled) : json::Value(nullptr));
    } else if (method == "textDocument/definition" && id) {
      std::optional<AtPosition> t = requestTarget(server, params);
      reply(*id, t ? definition(t->uri, t->text, *t->compiled, t->line, t->character)
                   : json::Value(nullptr));
    } else if (id) {
      replyError(*id, -32601, "method not found: " + method);
    }
  }
  return shutdown ? 0 : 1;
}

} // namespace

int runLsp() {
  if (!lspopts::Lsp)
    return -1;
  return serve();
}

} // namespace tally
