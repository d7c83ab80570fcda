// One compilation from files to the IR graph; see Compiler.h.
#include "driver/Compiler.h"
#include "support/Suggest.h"

#include "frontend/Lower.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"

namespace tally {

namespace {
const char kStdlib[] =
#include "StdLib.inc"
    ;
} // namespace

Compilation::Compilation() : diags(sm), sema(diags) {
  auto buffer = llvm::MemoryBuffer::getMemBuffer(kStdlib, "std.tally");
  unsigned id = sm.AddNewSourceBuffer(std::move(buffer), llvm::SMLoc());
  diags.setLibraryBuffer(id);
  parse(id);
}

bool Compilation::parse(unsigned bufferID) {
  auto module = parseBuffer(bufferID, diags);
  if (!module)
    return false;
  unsigned before = diags.errorCount();
  sema.addModule(std::move(module), program);
  return diags.errorCount() == before;
}

/// Reads `path` ("-" is stdin) but never more than `limit` + 1 bytes, so an endless input
/// (/dev/zero, a pipe that never closes its end early) is refused as soon as it is too large
/// instead of after it has filled memory. Directories are refused up front; other non-regular
/// files (pipes, character devices) are read the same bounded way.
static llvm::Expected<std::string> readBounded(llvm::StringRef path, size_t limit) {
  namespace fs = llvm::sys::fs;
  fs::file_t fd;
  bool isStdin = path == "-";
  if (isStdin) {
    fd = fs::getStdinHandle();
  } else {
    if (fs::is_directory(path))
      return llvm::createStringError(std::errc::is_a_directory, "Is a directory");
    auto opened = fs::openNativeFileForRead(path);
    if (!opened)
      return opened.takeError();
    fd = *opened;
  }
  std::string text;
  char chunk[1 << 16];
  llvm::Error err = llvm::Error::success();
  while (text.size() <= limit) {
    auto n = fs::readNativeFile(fd, llvm::MutableArrayRef<char>(chunk, sizeof chunk));
    if (!n) {
      err = n.takeError();
      break;
    }
    if (*n == 0)
      break;
    text.append(chunk, *n);
  }
  if (!isStdin)
    fs::closeFile(fd);
  if (err)
    return err;
  return text;
}

bool Compilation::addFile(llvm::StringRef path) {
  auto text = readBounded(path, kMaxSourceBytes);
  if (!text) {
    diags.report(DiagKind::IoError, llvm::SMLoc(),
                 "cannot read '" + path.str() + "': " + llvm::toString(text.takeError()));
    return false;
  }
  if (text->size() > kMaxSourceBytes) {
    diags.report(DiagKind::IoError, llvm::SMLoc(),
                 "'" + path.str() + "' is larger than " + std::to_string(kMaxSourceBytes >> 20) +
                     " MiB; is it really a tally file?");
    return false;
  }
  // Old Mac line endings: a lone CR ends a line too. Replaced in place (same length, so every
  // column stays put), so diagnostics count lines as the editor shows them.
  for (size_t i = 0; i < text->size(); ++i)
    if ((*text)[i] == '\r' && (i + 1 == text->size() || (*text)[i + 1] != '\n'))
      (*text)[i] = '\n';
  return addSource(path, *text);
}

bool Compilation::addSource(llvm::StringRef name, llvm::StringRef text) {
  unsigned id = sm.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBufferCopy(text, name),
                                      llvm::SMLoc());
  return parse(id);
}

const PlanDecl *Compilation::pickPlan(llvm::StringRef name) {
  if (!name.empty()) {
    auto it = program.plans.find(name);
    if (it != program.plans.end())
      return it->second;
    std::vector<std::string> names;
    for (const PlanDecl *p : program.planOrder)
      names.push_back(p->name);
    std::string close = closestName(name, names);
    std::string list;
    for (const std::string &n : names)
      list += (list.empty() ? "" : ", ") + n;
    diags.report(DiagKind::UnknownPlan, llvm::SMLoc(),
                 "no plan named '" + name.str() + "'" +
                     didYouMean(close) +
                     (list.empty() ? "" : " (plans: " + list + ")"));
    return nullptr;
  }
  if (program.planOrder.empty()) {
    diags.report(DiagKind::NoPlan, llvm::SMLoc(),
                 "no train or infer plan to analyze; declare one, such as "
                 "`train run { model = M() batch = 8 target = H100_SXM }`");
    return nullptr;
  }
  return program.planOrder.front();
}

bool Compilation::lower(const PlanDecl &decl, const PlanOverrides &overrides) {
  plan = sema.resolvePlan(program, decl, overrides);
  if (!plan)
    return false;
  graph = lowerPlan(sema, program, decl, *plan);
  return graph.has_value();
}

std::vector<std::string> Compilation::checkModelsWithoutPlan() {
  llvm::StringSet<> planned;
  for (const PlanDecl *p : program.planOrder)
    for (const SettingAST &s : p->settings)
      if (s.key == "model" && s.value)
        planned.insert(s.value->kind == ExprKind::Call && s.value->lhs ? s.value->lhs->text
                                                                        : s.value->text);
  std::vector<std::string> open;
  for (const auto &m : program.modules)
    for (const auto &b : m->blocks) {
      if (!b->isModel || b->fromStdlib || planned.count(b->name))
        continue;
      std::string missing;
      for (const BlockParamAST &p : b->params)
        if (!p.defaultValue)
          missing += (missing.empty() ? "" : ", ") + p.name;
      if (!missing.empty()) {
        open.push_back(b->name + " (" + missing + ")");
        continue;
      }
      std::string text = "infer check_" + b->name + " { model = " + b->name +
                         "() batch = 1 prompt = 1 target = H100_SXM }\n";
      auto buffer = llvm::MemoryBuffer::getMemBufferCopy(text, "<check of model " + b->name + ">");
      unsigned id = sm.AddNewSourceBuffer(std::move(buffer), llvm::SMLoc());
      diags.setLibraryBuffer(id);
      auto standIn = parseBuffer(id, diags);
      if (!standIn || standIn->plans.size() != 1)
        continue;
      const PlanDecl &decl = *standIn->plans.front();
      standIns_.push_back(std::move(standIn));
      if (std::optional<Plan> p = sema.resolvePlan(program, decl, {}))
        lowerPlan(sema, program, decl, *p);
    }
  return open;
}

Relower Compilation::relowerer(const PlanDecl &decl) {
  return [this, &decl](const Plan &p) -> std::optional<Graph> {
    DiagnosticEngine quiet(sm);
    quiet.setOutput(nullptr);
    Sema s(quiet);
    return lowerPlan(s, program, decl, p);
  };
}

std::optional<Analysis> Compilation::analyzePlan(const PlanDecl &decl,
                                                 const PlanOverrides &overrides) {
  if (!lower(decl, overrides))
    return std::nullopt;
  return analyze(*graph, *plan, diags, relowerer(decl));
}

} // namespace tally
