// The pass pipeline: every pass in order on one lowered plan.
#include "passes/Passes.h"

namespace tally {

Analysis analyze(const Graph &g, const Plan &plan, DiagnosticEngine &diags,
                 const Relower &relower) {
  Analysis a;
  a.graph = &g;
  a.plan = &plan;
  a.ridge = plan.target.ridge(plan.precision.activations);
  a.checkpoint.policy = plan.checkpoint;
  countParams(a);
  costOps(a);
  differentiate(a); // [autodiff]
  staticMemory(a);
  // [activations] planActivations(a);
  // [roofline] roofline(a);
  // [steptime] stepTime(a);
  // [inference] inference(a);
  // [lints] precisionLints(a, diags);
  // [budgets] checkBudgets(a, diags, relower);
  blockTotals(a);
  return a;
}

} // namespace tally
