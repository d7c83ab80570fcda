// Which attention the generated CUDA step runs (issue 38): cuDNN's fused scaled-dot-product
// attention (codegen/runtime/cuda/cudnn_attention.cuh, cuDNN 9's graph API) or the runtime's own
// kernels (attention.cuh). One rule, read by the estimate (passes/StepTime.cpp prices the kernel
// the step will run, passes/StaticMemory.cpp the workspace cuDNN's graphs need) and by the
// emitter (codegen/EmitLayers.cpp prints the call and names the choice in `tally build`'s
// output), so the estimate and the step cannot disagree.
#pragma once

#include "ir/Graph.h"

#include <cstdint>
#include <string>

namespace tally {

/// "" when cuDNN's fused attention runs attention op `op` of graph `g` (forward and backward),
/// else why the runtime's own kernels run it: fp32 (cuDNN's flash engines take bf16 and fp16),
/// materialised scores (fused = false), dropout (cuDNN draws its own Philox mask, not the
/// plan's stream the CPU step replays), a sliding window, a soft cap, ALiBi or a padding mask,
/// a head size that is not a multiple of 8 or above 128, q/k/v rows not on 16 bytes, or a causal
/// mask over Skv ≠ S (cuDNN's causal diagonal is top-left; tally's is bottom-right).
std::string cudnnAttentionRefusal(const Graph &g, const Op &op);

/// The device bytes the cuDNN backward graph of one attention keeps in the workspace besides
/// the plan's own: its fp32 dQ accumulator [B, H, S, hd] and its softmax-sum rows [B, H, S],
/// each rounded up to 256 bytes (the frontend's layout of the same graph keeps the same two).
double cudnnAttentionScratchBytes(int64_t B, int64_t H, int64_t S, int64_t hd);

/// The largest cudnnAttentionScratchBytes over the attention ops cuDNN runs in `g` (0 if none):
/// the cuDNN workspace the CUDA step's context allocates (a memory line beside cuBLASLt's).
double cudnnAttentionWorkspace(const Graph &g);

} // namespace tally
