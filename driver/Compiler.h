// One compilation: the standard library and the user's files in one SourceMgr, parsed and
// named by Sema, then one plan resolved and lowered to the IR graph. The CLI and the tests
// both go through this, so they see the same pipeline.
#pragma once

#include "support/Diagnostics.h"
#include "frontend/Parser.h"
#include "frontend/Sema.h"
#include "ir/Graph.h"
#include "ir/Plan.h"
#include "passes/Passes.h"

#include "llvm/Support/SourceMgr.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tally {

/// Files larger than this are refused (a configuration is a few kilobytes).
constexpr size_t kMaxSourceBytes = 64u << 20;

class Compilation {
public:
  Compilation();

  /// Reads and parses a file ("-" is standard input). False on I/O or syntax errors.
  bool addFile(llvm::StringRef path);
  /// Parses text held in memory under the given buffer name.
  bool addSource(llvm::StringRef name, llvm::StringRef text);

  /// The plan to analyze: by name, or the only/first one when `name` is empty. Reports
  /// unknown-plan / no-plan.
  const PlanDecl *pickPlan(llvm::StringRef name);
  /// Resolves and lowers a plan; fills `plan` and `graph`. False on errors.
  bool lower(const PlanDecl &decl, const PlanOverrides &overrides = {});
  /// Re-lowers `decl` for another plan with diagnostics muted (for budgets and solvers).
  Relower relowerer(const PlanDecl &decl);
  /// Lowers the plan and runs every pass; null on errors.
  std::optional<Analysis> analyzePlan(const PlanDecl &decl, const PlanOverrides &overrides = {});

  /// Type-checks each model of the user's files that no plan runs: lowers it under a stand-in
  /// inference plan (batch 1, prompt 1, H100_SXM) with its parameters' defaults, so a shape or
  /// type error in it is reported without a plan. Returns the models left unchecked because a
  /// parameter has no default, each as "Name (d, heads)".
  std::vector<std::string> checkModelsWithoutPlan();

  llvm::SourceMgr sm;
  DiagnosticEngine diags;
  Sema sema;
  Program program;
  std::optional<Plan> plan;
  std::optional<Graph> graph;

private:
  bool parse(unsigned bufferID);
  /// The stand-in plans of checkModelsWithoutPlan (their buffers are library buffers).
  std::vector<std::unique_ptr<Module>> standIns_;
};

} // namespace tally
