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
  planActivations(a); // [activations]
  planMemory(a);
  roofline(a); // [roofline]
  stepTime(a); // [steptime]
  checkAccumulation(a, diags); // [steptime]
  checkExperts(a, diags);
  inference(a); // [inference]
  precisionLints(a, diags); // [lints]
  unusedParams(a, diags);
  checkBudgets(a, diags, relower); // [budgets]
  blockTotals(a);
  return a;
}

} // namespace tally
