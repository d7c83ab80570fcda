// Dispatch to the subcommands defined outside main.cpp: each file defines its llvm::cl
// SubCommand and options, a `...Selected()` test and a `run...()` function declared here.
#include "tools/tally/Commands.h"

namespace tally {

bool solveSelected(); // tools/tally/Solve.cpp
int runSolve();

int runExtraCommand() {
  if (int rc = runExplain(); rc >= 0)
    return rc;
  if (int rc = runImportHF(); rc >= 0)
    return rc;
  if (int rc = runBuild(); rc >= 0)
    return rc;
  if (int rc = runLsp(); rc >= 0)
    return rc;
  if (int rc = runCalibrate(); rc >= 0)
    return rc;
  if (solveSelected())
    return runSolve();
  return -1;
}

} // namespace tally
