// Subcommands that live in their own files (solve, explain, ...). Each file declares its
// llvm::cl::SubCommand and options and a run function; runExtraCommand dispatches to the one
// the user named.
#pragma once

namespace tally {

/// Runs the subcommand given on the command line if it is one of the extra ones; returns its
/// exit code, or -1 when none of them was given.
int runExtraCommand();

/// tools/tally/Explain.cpp: `tally explain`; its exit code, or -1 when it was not the command.
int runExplain();

/// tools/tally/ImportHF.cpp: `tally import-hf`; its exit code, or -1 when it was not the command.
int runImportHF();

/// tools/tally/Build.cpp: `tally build` and `tally run`; the exit code, or -1 when neither was the command.
int runBuild();

/// tools/tally/Calibrate.cpp: `tally calibrate`; its exit code, or -1 when it was not the command.
int runCalibrate();

/// tools/tally/Calibrate.cpp: lets Sema load `host` (the cached calibration) and target files.
void installTargetLoader();

/// tools/tally/Lsp.cpp: `tally lsp`; its exit code, or -1 when it was not the command.
int runLsp();

} // namespace tally
