// SarifRules.cpp — the text of tally's SARIF rules: for every diagnostic kind of
// support/DiagnosticKinds.def, a short description, a full description and help. Code
// scanning shows these next to each finding. Looked up by code name, so the table's order does
// not matter; tests/sarif/validate_sarif.py (run by tests/lit/sarif-*.tally) fails when a
// kind has no entry here.
#include "report/Sarif.h"

#include <cstring>

namespace tally {

namespace {

const SarifRuleText kSarifRules[] = {
    // ---- input text ----
    {"syntax-error", "The text does not follow tally's grammar.",
     "The parser met a token it did not expect; it recovers and may report several syntax "
     "errors in one run.",
     "Fix the text at the caret; docs/language.md gives the grammar of each construct."},
    {"invalid-utf8", "The file is not valid UTF-8.",
     "tally reads source files as UTF-8 and refuses byte sequences that are not.",
     "Save the file as UTF-8."},
    {"nul-byte", "The file contains a NUL byte.",
     "A NUL byte in a source file is almost always a binary file read by mistake.",
     "Remove the NUL byte or check that the right file was given."},
    {"nesting-too-deep", "Expressions, blocks or calls are nested too deeply.",
     "tally limits the depth of nesting in the text and of block instantiation so that no "
     "input can exhaust the stack.",
     "Flatten the expression or the block structure."},
    // ---- names, calls, types, units ----
    {"unknown-name", "A name, block, model or member is not defined.",
     "The name is not visible where it is used: not a parameter, local, member, block of the "
     "file or of the standard library.",
     "Use the suggested name when there is one, or declare the name."},
    {"duplicate-name", "A name is declared twice in the same scope.",
     "Two declarations (blocks, members, parameters, plans or settings) share one name.",
     "Rename or remove one of the declarations."},
    {"wrong-arg-count", "A call passes the wrong number of arguments.",
     "A block, op or function was called with more or fewer arguments than it takes.",
     "Pass the arguments the callee declares."},
    {"unknown-argument", "A call names an argument the callee does not have.",
     "A keyword argument does not match any parameter of the block or op.",
     "Use one of the callee's parameter names."},
    {"type-mismatch", "A value has the wrong type for where it is used.",
     "For example a tensor where a constant is needed, or a number where a block is needed.",
     "Pass a value of the expected type."},
    {"unit-mismatch", "A quantity has the wrong unit.",
     "Units are checked: bytes, seconds, FLOP/s and ratios cannot be mixed or given where "
     "another dimension is expected.",
     "Write the quantity with a unit of the expected dimension."},
    {"unknown-unit", "A unit is not one tally knows.",
     "Units are case-sensitive (GiB, GB, TB/s, s, ms, days, ...).",
     "Use the suggested unit or one listed in docs/language.md section 9."},
    // ---- shapes and blocks ----
    {"shape-mismatch", "Tensor shapes do not agree.",
     "An op received tensors whose shapes it cannot combine.",
     "Check the dimensions of the op's inputs."},
    {"matmul-shape", "A matrix product's inner dimensions differ.",
     "In a @ b the last dimension of a must equal the first matrix dimension of b.",
     "Transpose or reshape an operand, or fix the layer sizes."},
    {"broadcast-shape", "Tensor shapes cannot be broadcast together.",
     "Elementwise ops broadcast trailing dimensions that are equal or 1; these are neither.",
     "Make the shapes broadcast-compatible."},
    {"recursive-block", "A block instantiates itself.",
     "Instantiating the block would never end: it contains itself directly or through others.",
     "Break the cycle of block members."},
    // ---- constants and values ----
    {"overflow", "A constant or a shape overflows 64-bit integers.",
     "Dimension and parameter arithmetic is checked; this result does not fit in int64.",
     "Use smaller sizes; the model is far larger than anything trainable."},
    {"division-by-zero", "A constant expression divides by zero.",
     "The divisor of a constant division or modulo evaluates to zero.",
     "Fix the divisor."},
    {"not-integer", "A value that must be an integer is not.",
     "Dimensions, counts and some settings must be whole numbers.",
     "Make the value (or the division producing it) exact."},
    {"invalid-value", "A value is out of the range a setting or argument accepts.",
     "For example a negative size, a probability outside [0, 1] or a device count that does "
     "not match the parallel layout.",
     "Give a value in the accepted range; the message states it."},
    {"missing-return", "A forward function does not return a value.",
     "Every forward function must end with a return; a model needs a forward.",
     "Add a return statement."},
    // ---- plans, settings, targets ----
    {"missing-setting", "A plan lacks a required setting.",
     "train and infer plans need a model, a batch and a target, and more depending on the "
     "question asked.",
     "Add the setting named in the message."},
    {"unknown-setting", "A plan names a setting tally does not know.",
     "The setting is not one of the train/infer settings, budget metrics or parallel keys.",
     "Use the suggested setting name."},
    {"unknown-plan", "No plan has the requested name.",
     "--plan named a train or infer plan that the file does not declare.",
     "Pick one of the plans the file declares."},
    {"no-plan", "The file has no plan to analyze.",
     "A report needs a train or infer plan; the file only declares blocks and models.",
     "Add a train or infer plan."},
    {"unknown-target", "The target is not in the catalogue.",
     "Targets name built-in devices (tally targets lists them) or a target declared in the file.",
     "Use the suggested target or declare one."},
    {"unknown-dtype", "A dtype name is not one tally knows.",
     "Dtypes are f64, f32, tf32, f16, bf16, fp8_e4m3, fp8_e5m2, i64, i32, i8, u8, bool and "
     "their aliases.",
     "Use the suggested dtype."},
    {"io-error", "A file could not be read or written.",
     "The file does not exist, is not readable, or is too large.",
     "Check the path and permissions."},
    {"calibrate-failed", "tally calibrate's measurements failed.",
     "tally calibrate runs its measurements in the program tally-measure, built beside the tally "
     "binary (or the one TALLY_MEASURE names); it was missing, exited with an error, was killed, "
     "or printed something other than its JSON result.",
     "Rebuild tally (which builds tally-measure), unset TALLY_MEASURE, and read the program's "
     "own messages above the error."},
    {"calibrate-busy", "tally calibrate kept a calibration made at a lower load.",
     "The new measurement was made under load (the 1-minute load average above the core count: "
     "other processes competed for the cores, so its numbers are low), and the existing "
     "calibration records a lower load; tally calibrate does not replace it.",
     "Calibrate again when the machine is idle, or pass --force to replace it anyway."},
    {"out-of-memory", "tally ran out of memory.",
     "An allocation failed: the model's graph, training step and schedule need more memory than "
     "the process may use (a 100,000-layer GPT needs about 1 GiB). tally stops at once with exit "
     "code 2 and prints nothing else.",
     "Raise the memory limit (ulimit -v, a container's limit) or analyse a smaller model."},
    // ---- budgets ----
    {"budget-memory", "Peak memory per device exceeds the budget.",
     "The memory plan's peak per device (parameters, gradients, optimizer state, activations, "
     "workspace) is above the memory budget.",
     "Shard more (ZeRO, tensor or pipeline parallelism), checkpoint activations or reduce the "
     "micro-batch."},
    {"device-memory", "Peak memory per device exceeds the device's memory.",
     "The memory plan's peak per device (parameters, gradients, optimizer state, activations, "
     "workspace) is above the memory of one device of the target, with or without a memory "
     "budget: the plan cannot run as written.",
     "Shard more (ZeRO, tensor or pipeline parallelism), checkpoint activations, reduce the "
     "micro-batch or pick a target with more memory."},
    {"budget-step-time", "The estimated step time exceeds the budget.",
     "The roofline estimate of one optimizer step is above the step-time budget.",
     "Use more devices or a faster target, or lower the batch."},
    {"budget-mfu", "The estimated MFU is below the budget.",
     "Model FLOPs utilization (model FLOPs per step over step time times peak) is below the "
     "required ratio.",
     "Raise the micro-batch, reduce communication or recompute, or relax the budget."},
    {"budget-run-time", "The estimated run time exceeds the budget.",
     "Steps for the planned tokens times the step time is above the run-time budget.",
     "Use more devices, fewer tokens or a faster target."},
    {"accumulation-not-integer", "The batch does not split into whole micro-batches.",
     "batch / (micro_batch x data-parallel degree) must be a whole number of accumulation "
     "steps.",
     "Choose a batch that is a multiple of micro_batch times the data-parallel degree."},
    // ---- warnings ----
    {"precision-underflow", "A value underflows the dtype it is stored in.",
     "A constant such as an epsilon is below the smallest normal number of the dtype and "
     "flushes to zero or loses precision.",
     "Store the value in a wider dtype or choose a larger constant."},
    {"precision-overflow", "A value overflows the dtype it is stored in.",
     "A constant is above the largest finite number of the dtype.",
     "Store the value in a wider dtype."},
    {"fp16-no-loss-scaling", "fp16 training without loss scaling.",
     "Gradients in fp16 underflow without loss scaling; the mixed_fp16 preset enables it.",
     "Use precision = mixed_fp16, or bf16."},
    {"low-precision-optimizer-state", "Optimizer state is kept in a low-precision dtype.",
     "Adam's moments in 16 bits lose small updates; mixed-precision recipes keep them in fp32.",
     "Keep optimizer state in fp32."},
    {"unused-value", "A parameter or value is never used.",
     "A declared parameter takes memory (and counts as parameters) but no op reads it.",
     "Use it in the forward function or remove it."},
    {"unaligned-matmul", "A matmul's rows do not start on 16 bytes.",
     "GPU tensor-core GEMMs load rows 16 bytes at a time; a K or N that is not a multiple of 16 "
     "bytes (8 bf16 or fp16 elements) sends cuBLAS to slower kernels.",
     "Pad the dimension to a multiple of 64, as nanoGPT pads GPT-2's vocabulary to 50304."},
};

} // namespace

const SarifRuleText *sarifRuleText(DiagKind kind) {
  llvm::StringRef code = codeOf(kind);
  for (const SarifRuleText &r : kSarifRules)
    if (code == r.code)
      return &r;
  return nullptr;
}

} // namespace tally
