// The trace `tally run --trace FILE` writes (issue 42): the measured step and the estimate side
// by side in the Trace Event Format (the JSON Chrome's trace viewer reads; Perfetto opens it at
// ui.perfetto.dev). docs/codegen.md describes the file.
#pragma once

#include "passes/Analysis.h"

#include "llvm/Support/JSON.h"

#include <string>
#include <vector>

namespace tally {

/// The measured traced step plus the estimate, from `ranks`: the trace each rank of the
/// generated step wrote (codegen/program/driver_cpu.cpp, writeTrace: a process per rank, one
/// "X" slice per kernel call named "op path (kernel)", microseconds from that rank's step start,
/// which its otherData's step_start_s gives on the machine's steady clock). The ranks are
/// aligned on one axis (0 = the first rank's start); each kernel call of a step-graph op gets
/// the op's FLOPs and bytes from its rule (an op of several calls: op_flops and op_bytes on
/// each; a fused kernel: its ops' FLOPs and their bytes less what fusion saved); the estimate
/// (estimatedTimeline) is one more process, "tally estimate", from 0, a thread per track, its
/// totals in otherData.estimate. `medianS` is the measured median step. False with `error`
/// set when a rank's trace is not the step's.
bool runTrace(const Analysis &a, std::vector<llvm::json::Value> &ranks, double medianS, llvm::json::Object &out,
              std::string &error);

} // namespace tally
