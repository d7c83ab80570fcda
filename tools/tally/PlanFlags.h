// The command-line overrides of a plan's settings (--target, --precision, --checkpoint, --batch,
// --micro-batch) and --fuse, declared once for every subcommand that analyzes a plan: each command file
// defines one PlanFlags for its subcommands and reads overrides() from it.
#pragma once

#include "frontend/Sema.h"
#include "support/Diagnostics.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

namespace tally {

struct PlanFlags {
  llvm::cl::opt<std::string> target, precision, checkpoint;
  llvm::cl::opt<int64_t> batch, microBatch;
  llvm::cl::opt<bool> fuse, padHead;

  /// The seven options, registered for each of `subs` under `cat`. Define a PlanFlags after
  /// its subcommands in the same file (static construction runs in definition order there).
  template <class... Subs>
  explicit PlanFlags(llvm::cl::OptionCategory &cat, Subs &...subs)
      : target("target", llvm::cl::desc("Override the target, e.g. H100_SXM or '8 x H100_SXM'"),
               llvm::cl::value_desc("target"), llvm::cl::sub(subs)..., llvm::cl::cat(cat)),
        precision("precision", llvm::cl::desc("Override the precision preset"), llvm::cl::value_desc("preset"),
                  llvm::cl::sub(subs)..., llvm::cl::cat(cat)),
        checkpoint("checkpoint",
                   llvm::cl::desc("Override the checkpoint policy (none, full, every(k), sqrt, selective, "
                                  "recompute_all, auto, full+selective, or \"keep [h[0], h[4].mlp]\")"),
                   llvm::cl::value_desc("policy"), llvm::cl::sub(subs)..., llvm::cl::cat(cat)),
        batch("batch", llvm::cl::desc("Override the batch size"), llvm::cl::init(0), llvm::cl::sub(subs)...,
              llvm::cl::cat(cat)),
        microBatch("micro-batch", llvm::cl::desc("Override the micro-batch size"), llvm::cl::init(0),
                   llvm::cl::sub(subs)..., llvm::cl::cat(cat)),
        fuse("fuse",
             llvm::cl::desc("Price (and generate) the step with chains of elementwise ops fused into one kernel "
                            "each, as the CUDA backend runs it (default: on for tally build/run --backend cuda)"),
             llvm::cl::sub(subs)..., llvm::cl::cat(cat)),
        padHead("pad-head",
                llvm::cl::desc("Pad the generated step's LM head to a multiple of 64 rows (a vocabulary of 50257 "
                               "runs as 50304; the loss masks the padded logits; files and parameter counts keep "
                               "the real shape) and price it so (default: on for --backend cuda)"),
                llvm::cl::sub(subs)..., llvm::cl::cat(cat)) {}

  /// What was given: a batch or micro-batch given at all is passed on (0 and -5 are errors
  /// that Sema reports, not "unset"). `cudaStep`: the plan as tally's CUDA step runs it
  /// (`--backend cuda`: its memory, and fused kernels unless --fuse=false says otherwise).
  PlanOverrides overrides(bool cudaStep = false) const {
    PlanOverrides o;
    o.target = target;
    o.precision = precision;
    o.checkpoint = checkpoint;
    if (batch.getNumOccurrences())
      o.batch = batch;
    if (microBatch.getNumOccurrences())
      o.microBatch = microBatch;
    o.cudaStep = cudaStep;
    o.fuseKernels = fuse.getNumOccurrences() ? bool(fuse) : cudaStep;
    o.padHead = padHead.getNumOccurrences() ? bool(padHead) : cudaStep;
    return o;
  }
};

/// `--backend framework|cuda` of the commands that price a plan (check, report, explain): as a
/// framework (PyTorch, Megatron) runs it, or as tally's generated CUDA step runs it (fused
/// kernels, its workspace, its own attention kernel; PlanOverrides::cudaStep). tally build/run
/// have their own --backend (cpu|cuda: where the step runs).
struct PricingBackend {
  enum Step { Framework, Cuda };
  llvm::cl::opt<Step> step;

  template <class... Subs>
  explicit PricingBackend(llvm::cl::OptionCategory &cat, Subs &...subs)
      : step("backend",
             llvm::cl::desc("Price the plan as it runs: in a framework (PyTorch, Megatron: the default), or "
                            "as tally's generated CUDA step (fused kernels, its workspace and attention "
                            "kernel, no caching allocator)"),
             llvm::cl::values(clEnumValN(Framework, "framework", "a framework's run (default)"),
                              clEnumValN(Cuda, "cuda", "tally build/run --backend cuda's step")),
             llvm::cl::init(Framework), llvm::cl::sub(subs)..., llvm::cl::cat(cat)) {}

  bool cuda() const { return step == Cuda; }
};

/// -W, -w and --no-color, declared once for the subcommands that print a file's diagnostics
/// (check, report, explain): each command file defines one for its subcommands and applies it to
/// its compilation's diagnostics.
struct DiagnosticFlags {
  llvm::cl::list<std::string> warnings;
  llvm::cl::opt<bool> noWarnings, noColor;

  template <class... Subs>
  explicit DiagnosticFlags(llvm::cl::OptionCategory &cat, Subs &...subs)
      : warnings("W", llvm::cl::Prefix, llvm::cl::desc("Warning control: -Werror, -Wno-NAME, -Werror=NAME"),
                 llvm::cl::value_desc("option"), llvm::cl::sub(subs)..., llvm::cl::cat(cat)),
        noWarnings("w", llvm::cl::desc("Silence all warnings"), llvm::cl::sub(subs)..., llvm::cl::cat(cat)),
        noColor("no-color", llvm::cl::desc("Do not color diagnostics"), llvm::cl::sub(subs)..., llvm::cl::cat(cat)) {}

  /// Sets `diags` as the flags say; false, after printing why, for an unknown warning option.
  bool apply(DiagnosticEngine &diags) const {
    for (const std::string &w : warnings)
      if (!diags.applyWarningOption("-W" + w)) {
        llvm::errs() << "tally: error: unknown warning option '-W" << w << "'\n";
        return false;
      }
    if (noWarnings)
      diags.applyWarningOption("-w");
    if (noColor)
      diags.setShowColors(false);
    return true;
  }
};

} // namespace tally
