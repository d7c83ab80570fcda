// The framework that runs the step — Megatron, DeepSpeed, PyTorch FSDP (1 or 2) or DDP — and
// what it decides that the time model prices: the size of its gradient and parameter
// messages, whether they overlap compute, and which attention kernel runs. docs/time.md,
// "Framework stacks", gives every fact with the option or source file it comes from.
#pragma once

#include "ir/Plan.h"

#include <string>

namespace tally {

/// The framework that runs the step (Parallelism::stack) and what it does with its
/// collectives (docs/time.md, "Framework stacks"), each fact from the framework's option or
/// source named in stackFacts.
struct StackFacts {
  std::string name;        ///< "megatron", "deepspeed", "fsdp", "fsdp2", "ddp"
  bool chosen = false;     ///< the plan did not say: the layout chose it
  std::string why;         ///< why the layout chose it ("ZeRO 3"), empty when written
  /// Gradient bytes per data-parallel reduction (0: one reduction per repeat-block copy, as
  /// FSDP's flat parameter per wrapped block does); Parallelism::bucketBytes replaces it.
  double gradientBucket = 0;
  std::string bucketSource; ///< the option the bucket comes from, or "bucket" when written
  /// ZeRO 3: parameter bytes per gather (0: one gather per repeat-block copy).
  double gatherBucket = 0;
  /// Whether the gradient reduction overlaps the backward: the plan's `overlap` when written,
  /// else the framework's default.
  bool overlap = true;
  std::string overlapSource; ///< the option or default the overlap comes from
  /// ZeRO 3: whether a block's gathered parameters are freed after its forward and gathered
  /// again for its backward (every stack's default; `reshard_after_forward = false` keeps them).
  bool reshardAfterForward = true;
  bool prefetch = true; ///< ZeRO 3: each block's gather issued under the previous block's compute
  /// Whether the gradients are reduced after every micro-batch or once per step
  /// (reducesEveryMicroBatch), and what decided it.
  bool reduceEveryMicroBatch = false;
  std::string reduceSource;
  /// Whether its fused attention is the target's native kernel (Target::nativeAttention:
  /// Megatron runs Transformer Engine's cuDNN attention) rather than FlashAttention-2 (what
  /// PyTorch's scaled_dot_product_attention and flash-attn 2 run); and which, in words.
  bool nativeAttention = false;
  std::string attentionKernel;
  /// Whether its kernels are compiled (`compiled = true`: elementwise chains fused, as --fuse
  /// prices them) or run eagerly, one kernel per op (the default of every stack).
  bool compiled = false;
  /// How its loss runs (ir/Plan.h crossEntropyKernel): "fused", "eager" or "megatron", and
  /// what decided it ("cross_entropy" when written).
  std::string crossEntropy, crossEntropySource;
  /// How its rms_norm runs (ir/Plan.h normKernel): "fused" or "eager", and what decided it
  /// ("norm_kernel" when written).
  std::string normKernel, normKernelSource;
};

/// stackName (the stack's name) is declared in ir/Plan.h: lowering reads it (crossEntropyKernel).

/// Whether the step runs a gated unit's activation and multiply (`silu(a) * b`, `gelu(a) * b`)
/// as one fused kernel that keeps only its inputs and recomputes the activation in its backward:
/// Megatron's (bias_activation_fusion, megatron/core/fusions/fused_bias_swiglu.py:
/// SwiGLUFunction saves its input; on by default, `--no-bias-swiglu-fusion` turns it off) and a
/// compiled step's (`compiled = true`: torch.compile's min-cut partitioner recomputes pointwise
/// ops in the backward rather than saving them, torch/_functorch/partitioners.py,
/// min_cut_rematerialization_partition). Not tally's own generated step (Plan::generatedStep),
/// whose backward reads the activation's output. docs/memory.md §3.
bool fusedGates(const Plan &plan);

/// The fused attention kernel the plan's step runs: its `attention_kernel`, else the stack's:
/// "native" (the target's own, Target::nativeAttention > 0) under megatron, "flash2"
/// (FlashAttention-2, what PyTorch's scaled_dot_product_attention runs) otherwise.
std::string attentionKernel(const Plan &plan);
/// Whether the plan's fused attention runs as the target's native kernel (attentionKernel is
/// "native" on a target that has one).
bool runsNativeAttention(const Plan &plan);
/// How many times FlashAttention-2's time the plan's fused attention takes, forward or
/// backward: 1, or for the FlashAttention-1-era Triton kernel ("flash1_triton") FlashAttention-2
/// paper's measured ratios (Dao 2023, §4.1): 1.4 forward, 2 backward.
double attentionSlowdown(const Plan &plan, bool backward);

/// The units of parameters ZeRO moves, in elements per device (passes/StaticMemory.cpp fills
/// them from Analysis::params): the root (every parameter outside the repeat-block copies:
/// the embedding, the final norm, a tied head), the largest copy (a wrapped block), and all
/// parameters; each with its trainable part.
struct ZeroUnits {
  double root = 0, rootTrainable = 0;
  double block = 0, blockTrainable = 0;
  double all = 0, trainable = 0;
  double gradientSpan = 0; ///< Analysis::params.gradientSpanPeak per device
};

/// What tally's own step (Plan::generatedStep) holds beside its shards under ZeRO
/// (docs/memory.md, "ZeRO's transients"), bytes per device: under ZeRO 3 the parameters
/// gathered at once, under ZeRO 2 and 3 the gradients held unsharded before their
/// reduce-scatter; 0 below those stages, with one data-parallel rank, or for a plan priced as
/// a framework stack runs it. `gatheredWhy` and `gradsWhy` say what each counts.
struct ZeroTransients {
  double gathered = 0, grads = 0;
  std::string gatheredWhy, gradsWhy;
};
ZeroTransients zeroTransients(const Plan &plan, const ZeroUnits &u);

/// The stack of `plan`: its `stack` setting, or the one its layout implies (ZeRO 3 → fsdp;
/// tensor, pipeline, context or expert parallelism → megatron; ZeRO 1 or 2 → deepspeed; else
/// ddp), with its buckets for `gradBytes` bytes per gradient element and `paramBytes` per
/// parameter.
StackFacts stackFacts(const Plan &plan, double gradBytes, double paramBytes);

} // namespace tally
