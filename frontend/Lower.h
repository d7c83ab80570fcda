// Lowering: a model instantiated for one plan becomes the IR graph.
#pragma once

#include "frontend/Sema.h"
#include "ir/Graph.h"

#include <optional>

namespace tally {

/// Instantiates the plan's model (block arguments, parameters, submodules, repeats) and
/// evaluates its forward function with the plan's symbols bound (`batch` = micro-batch,
/// `seq`), producing a graph of primitive ops. Reports errors and returns nullopt on failure.
std::optional<Graph> lowerPlan(Sema &sema, const Program &program, const PlanDecl &decl,
                               const Plan &plan);

/// Deepest nesting of block instances (a guard against runaway instantiation).
constexpr unsigned kMaxInstanceDepth = 64;
/// Most ops one graph may hold (a 10,000-layer GPT has 150,000); a model past this is reported
/// rather than counted slowly or out of memory (lowering takes about 2 KB per op).
constexpr size_t kMaxOps = 2'000'000;
/// Most parameter tensors (a 100,000-layer GPT has 1.2 million): every copy of a repeated block
/// declares its own, so the bound on instances alone let a block of many parameters fill the
/// memory (issue 12).
constexpr size_t kMaxParams = 2'000'000;
/// Most tensors (a GPT at the op bound has 4.5 million): an op may make up to 4,096 (a split),
/// so the op bound alone let a repeated split fill the memory (issue 12).
constexpr size_t kMaxTensors = 8'000'000;

} // namespace tally
