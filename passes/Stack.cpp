// The framework stack of a plan and its facts (passes/Stack.h, docs/time.md "Framework stacks").
#include "passes/Stack.h"

#include "passes/Passes.h"

#include <algorithm>

namespace tally {

bool fusedGates(const Plan &plan) {
  return plan.isTrain && !plan.generatedStep && (plan.parallel.compiled || stackName(plan) == "megatron");
}

std::string attentionKernel(const Plan &plan) {
  if (!plan.parallel.attentionKernel.empty())
    return plan.parallel.attentionKernel;
  return plan.target.nativeAttention > 0 && stackName(plan) == "megatron" ? "native" : "flash2";
}

bool runsNativeAttention(const Plan &plan) {
  return plan.target.nativeAttention > 0 && attentionKernel(plan) == "native";
}

double attentionSlowdown(const Plan &plan, bool backward) {
  if (attentionKernel(plan) != "flash1_triton")
    return 1;
  // FlashAttention-2 (Dao 2023, arXiv:2307.08691, §4.1, A100): "around 1.3-1.5x faster than
  // FlashAttention in Triton in the forward pass and around 2x faster in the backward pass".
  // The middle of the forward's range; the backward's stated value.
  return backward ? 2.0 : 1.4;
}

StackFacts stackFacts(const Plan &plan, double gradBytes, double paramBytes) {
  const Parallelism &par = plan.parallel;
  StackFacts f;
  f.name = stackName(plan, &f.why);
  f.chosen = par.stack.empty();
  f.nativeAttention = runsNativeAttention(plan);
  f.compiled = plan.fuseKernels;
  f.crossEntropy = crossEntropyKernelName(crossEntropyKernel(plan, &f.crossEntropySource));
  f.normKernel = normKernelName(normKernel(plan, &f.normKernelSource));
  std::string kernel = attentionKernel(plan);
  f.attentionKernel =
      f.nativeAttention ? "the GPU's own fused attention (Transformer Engine's cuDNN kernel)"
      : kernel == "flash1_triton"
          ? "the FlashAttention-1-era Triton kernel (MPT's attn_impl: triton): FlashAttention-2's "
            "time x 1.4 forward, x 2 backward"
          : "FlashAttention-2 (what PyTorch's scaled_dot_product_attention and flash-attn run)";
  if (!plan.parallel.attentionKernel.empty())
    f.attentionKernel += " (attention_kernel)";
  const double d = degree(par.data);
  if (f.name == "megatron") {
    // megatron/core/distributed/distributed_data_parallel_config.py, bucket_size: "max(40000000,
    // 1000000 * dp_size) parameters (larger DP sizes need larger buckets ...)";
    // overlap_grad_reduce defaults to False (--overlap-grad-reduce turns it on).
    double elements = std::max(40e6, 1e6 * d);
    f.gradientBucket = elements * gradBytes;
    f.bucketSource = "Megatron DistributedDataParallelConfig.bucket_size, max(40M, 1M x dp) elements";
    f.gatherBucket = elements * paramBytes;
    f.overlap = false;
    f.overlapSource = "Megatron's overlap_grad_reduce default (False)";
  } else if (f.name == "deepspeed") {
    // deepspeed/runtime/zero/config.py: reduce_bucket_size and allgather_bucket_size 5e8
    // elements, stage3_prefetch_bucket_size 5e7; overlap_comm None, which it turns into True
    // for stage 3 and False below.
    f.gradientBucket = 5e8 * gradBytes;
    f.bucketSource = "DeepSpeed reduce_bucket_size, 5e8 elements";
    f.gatherBucket = 5e7 * paramBytes;
    f.overlap = par.zero == 3;
    f.overlapSource = par.zero == 3 ? "DeepSpeed's overlap_comm default under ZeRO 3 (true)"
                                    : "DeepSpeed's overlap_comm default under ZeRO 1 and 2 (false)";
  } else if (f.name == "fsdp" || f.name == "fsdp2") {
    // torch.distributed.fsdp: one flat parameter (FSDP2: one group of DTensor shards) per
    // wrapped module, gathered before its forward and backward and reduce-scattered once per
    // backward, each on its own stream beside the compute (prefetched).
    f.gradientBucket = 0;
    f.gatherBucket = 0;
    f.bucketSource = "FSDP's flat parameter per wrapped block";
    f.overlap = true;
    f.overlapSource = "FSDP runs its collectives on their own streams";
  } else { // ddp
    // torch.nn.parallel.DistributedDataParallel: bucket_cap_mb = 25; buckets are all-reduced as
    // the backward fills them.
    f.gradientBucket = 25.0 * 1024 * 1024;
    f.bucketSource = "PyTorch DDP bucket_cap_mb = 25";
    f.gatherBucket = f.gradientBucket / gradBytes * paramBytes; // as many elements
    f.overlap = true;
    f.overlapSource = "DDP reduces each bucket as the backward fills it";
  }
  if (par.bucketBytes > 0) {
    f.gradientBucket = par.bucketBytes;
    f.bucketSource = "bucket";
  }
  f.reshardAfterForward = par.reshardAfterForward;
  f.prefetch = par.prefetch;
  f.reduceEveryMicroBatch = reducesEveryMicroBatch(par);
  f.reduceSource = par.reduceEveryGiven ? "reduce_every_micro_batch"
                   : par.zero >= 2   ? "ZeRO " + std::to_string(par.zero) + ": the gradients are sharded"
                                     : "no_sync / gradient accumulation below ZeRO 2";
  if (par.overlapGiven) {
    f.overlap = par.overlap;
    f.overlapSource = "overlap";
  }
  return f;
}

ZeroTransients zeroTransients(const Plan &plan, const ZeroUnits &u) {
  const Parallelism &par = plan.parallel;
  ZeroTransients z;
  if (!plan.isTrain || par.zero < 2 || par.data <= 1)
    return z;
  const double bp = bytesOf(plan.precision.params), bg = bytesOf(plan.precision.grads);
  // A framework stack: what it holds for one block at the activation peak is not counted yet
  // (docs/memory.md, "ZeRO's transients", says why), but with reshard_after_forward = false
  // (FSDP's reshard_after_forward=False, FSDP1's SHARD_GRAD_OP) every block's gathered
  // parameters stay from its forward to its backward: at the peak, between the last forward and
  // the first backward, the whole model's beside the shards.
  if (!plan.generatedStep) {
    if (par.zero >= 3 && !par.reshardAfterForward) {
      z.gathered = u.all * bp;
      z.gatheredWhy = "every block's parameters, gathered in its forward and kept until its backward "
                      "(reshard_after_forward = false)";
    }
    return z;
  }
  // tally's step (passes/ZeroShards.cpp): the root is gathered from the first forward op that
  // reads it to the last (the embedding to the head), each copy around its own ops, nothing
  // prefetched; a parameter's gradient of one micro-batch lives from the backward of the
  // last op that reads the parameter to that of the first (a tied weight's from the head to
  // the embedding), so at most the parameters whose spans of readers overlap at one op.
  z.gathered = par.zero >= 3 ? std::min(u.all, u.root + u.block) * bp : 0;
  z.grads = std::min(u.trainable, u.gradientSpan) * bg;
  z.gatheredWhy = "the root and one block (tally's step: ZeRO 3's gathers, nothing prefetched)";
  z.gradsWhy = "the gradients whose parameters' readers overlap at one op (tally's step)";
  return z;
}

} // namespace tally
