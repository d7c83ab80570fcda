// How a model is run: a `train` or `infer` declaration after semantic analysis, with every
// setting a checked constant in base units (bytes, seconds, FLOP/s, counts), the precision
// policy, the optimizer, the parallel layout and the budgets. Source ranges are kept so that
// passes can point their diagnostics at the line the user wrote.
#pragma once

#include "ir/Dtype.h"
#include "ir/Graph.h"
#include "ir/Target.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/SMLoc.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tally {

/// Which dtype each class of tensor is stored in, and where it lives.
/// FP8 training as NVIDIA's Transformer Engine runs it (`precision = fp8_hybrid`, or a record's
/// `fp8 = { format = hybrid, amax_history = 1024, scaling = delayed, keep_first_last_bf16 =
/// true }`): the matrix products by weights run on the FP8 tensor cores, everything else in the
/// activation dtype. passes/Fp8.cpp picks the GEMMs and prices the casts; docs/precision.md.
struct Fp8Recipe {
  /// None: no fp8 GEMMs. Hybrid: e4m3 forward (activations, weights), e5m2 gradients (TE's
  /// Format.HYBRID); E4M3: e4m3 throughout (Format.E4M3).
  enum class Format : uint8_t { None, Hybrid, E4M3 };
  /// Delayed: one scale per tensor from an amax history (TE's DelayedScaling); Block: MXFP8,
  /// one 8-bit power-of-two scale per 32 elements (TE's MXFP8BlockScaling, Blackwell only);
  /// Current: one scale per tensor from that tensor's own amax (TE's Float8CurrentScaling,
  /// torchao's tensorwise dynamic scaling): a reduction over the tensor before each cast, no
  /// history.
  enum class Scaling : uint8_t { Delayed, Block, Current };
  Format format = Format::None;
  Scaling scaling = Scaling::Delayed;
  int64_t amaxHistory = 1024;      ///< TE's DelayedScaling default amax_history_len
  bool keepFirstLastBf16 = false;  ///< the first and last layers' GEMMs stay in bf16
  /// The fp8 GEMMs' weights are held and all-gathered in fp8 only, no 16-bit copy (Megatron's
  /// --fp8-param-gather, TE's fp8_model_init; Megatron-Bridge's current-scaling recipes).
  bool paramGather = false;
  llvm::SMRange range;
  bool enabled() const { return format != Format::None; }
  /// The dtype of the gradients fed to the backward GEMMs.
  Dtype gradDtype() const { return format == Format::Hybrid ? Dtype::FP8E5M2 : Dtype::FP8E4M3; }
  bool operator==(const Fp8Recipe &o) const {
    return format == o.format && scaling == o.scaling && amaxHistory == o.amaxHistory &&
           keepFirstLastBf16 == o.keepFirstLastBf16 && paramGather == o.paramGather;
  }
};

struct PrecisionPolicy {
  std::string preset;              ///< "fp32", "mixed_bf16", ... or "custom" for a record
  Dtype params = Dtype::F32;
  Dtype grads = Dtype::F32;
  Dtype activations = Dtype::F32;
  Dtype master = Dtype::Invalid;   ///< Invalid: no separate master copy of the weights
  Dtype optimizer = Dtype::F32;    ///< dtype of optimizer state (moments)
  bool lossScaling = false;        ///< mixed_fp16 scales the loss to keep gradients representable
  Dtype gradAccum = Dtype::Invalid; ///< `grad_dtype`: gradients accumulated in this dtype (Invalid: in `grads`)
  bool paramsOnHost = false, gradsOnHost = false, masterOnHost = false, optimizerOnHost = false;
  /// `base = nf4` (or a record `{ dtype = nf4, block = 64, scale = fp32, double_quant = 256 }`):
  /// the storage of frozen weights that only matrix products read (QLoRA's base weights);
  /// dtype Invalid: frozen weights keep `params`. A tensor type's nf4/int4/int8 on a frozen
  /// parameter uses this record's blocks when the dtypes agree, else defaultQuant's.
  QuantSpec frozen;
  llvm::SMRange frozenRange;
  Fp8Recipe fp8;                   ///< fp8 GEMMs (Transformer Engine); format None: none
  llvm::SMRange range;
};

/// The block quantization of a parameter stored in `d` (int8, int4, nf4): the precision
/// record's `base` storage when it names `d`, else defaultQuant(d).
inline QuantSpec quantSpecFor(const PrecisionPolicy &p, Dtype d) {
  return p.frozen.dtype == d ? p.frozen : defaultQuant(d);
}

/// `lora = { r = 16, alpha = 32, targets = [q, v] }`: low-rank adapters (Hu et al. 2021) on the
/// model's Linear instances whose member name is in `targets`, every other parameter frozen.
/// The lowering instantiates the standard library's LoRALinear in place of each such Linear
/// (frontend/LowerInstantiate.cpp). r 0: no LoRA.
struct LoraSpec {
  int64_t r = 0;
  double alpha = 0;
  std::vector<std::string> targets;
  std::vector<llvm::SMRange> targetRanges;
  bool operator==(const LoraSpec &o) const {
    return r == o.r && alpha == o.alpha && targets == o.targets;
  }
};

/// The optimizer and its hyper-parameters; `states` is the number of per-parameter state
/// tensors it keeps (SGD 0, SGD with momentum 1, AdaGrad 1, RMSprop 1, Adam/AdamW 2, Lion 1).
struct OptimizerSpec {
  std::string name = "SGD";
  unsigned states = 0;
  double lr = 0, momentum = 0, beta1 = 0, beta2 = 0, eps = 0, weightDecay = 0;
  llvm::SMRange range, epsRange;
};

/// The devices and how the work is split over them.
struct Parallelism {
  int64_t devices = 1;
  int64_t data = 1;
  int64_t tensor = 1;
  int64_t pipeline = 1;
  int64_t context = 1;             ///< context parallelism: the sequence split over c ranks
                                   ///< (ring attention); devices = data × tensor × pipeline × c
  int64_t expert = 1;              ///< expert parallelism: the MoE experts split over e ranks
                                   ///< carved out of the data group (data % e == 0), or with
                                   ///< expertTensor 1 of the tensor × data ranks
  /// The MoE layers' tensor degree (Megatron-Core's --expert-tensor-parallel-size, whose default
  /// is the tensor degree): 0 or the tensor degree, the experts split as a Megatron MLP over the
  /// tensor group; 1 under tensor > 1, MoE parallel folding: the experts whole on each rank and
  /// the expert group drawn from the tensor × context × data ranks (below,
  /// expertLayout).
  int64_t expertTensor = 0;
  int zero = 0;                    ///< ZeRO stage 0..3 over the data-parallel group
  int64_t interleave = 1;          ///< virtual pipeline stages per device (Megatron's
                                   ///< interleaved 1F1B); 1: plain 1F1B
  bool sequenceParallel = false;   ///< Korthikanti et al.: the ops outside the tensor-parallel
                                   ///< regions split their tokens over the tensor group
  bool overlap = true;             ///< the data-parallel gradient reduction (and ZeRO-3 gathers)
                                   ///< overlap the backward (forward), bucketed
  bool overlapGiven = false;       ///< `overlap` was written (else the stack's default holds)
  /// `reshard_after_forward = false` (ZeRO 3 only): each block's gathered parameters stay until
  /// its backward, as FSDP's reshard_after_forward=False (FSDP1's SHARD_GRAD_OP) keeps them:
  /// one gather per block and micro-batch instead of two, and the gathered parameters held at
  /// the activation peak (passes/StaticMemory.cpp, passes/DataParallelTime.cpp).
  bool reshardAfterForward = true;
  /// `prefetch = false` (ZeRO 3 only): no block's gather is issued before its compute needs it
  /// (FSDP's forward_prefetch / backward_prefetch off), so every gather waits, exposed
  /// (passes/DataParallelTime.cpp); by default each is prefetched under the previous block's.
  bool prefetch = true;
  /// `reduce_every_micro_batch = true | false`: whether the data-parallel gradient reduction runs
  /// after every micro-batch's backward or once, after the last; unwritten (`reduceEveryGiven`
  /// false), the ZeRO stage's rule: every micro-batch under ZeRO 2 and 3 (the gradients are
  /// sharded), once below (DDP's no_sync, Megatron's main_grad). reducesEveryMicroBatch reads it.
  bool reduceEveryMicroBatch = false;
  bool reduceEveryGiven = false;
  /// `compiled = true`: the framework compiles the step (torch.compile, Megatron's fused
  /// kernels): elementwise chains run fused, priced as `--fuse` prices them (Plan::fuseKernels).
  bool compiled = false;
  /// Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm): the forward of
  /// micro-batch i+1 paired with the backward of micro-batch i, each one's expert all-to-alls
  /// run beside the other's compute (passes/StepTime.cpp, exposedExpertComm).
  bool expertOverlap = false;
  bool tensorOverlap = false;      ///< Megatron's asynchronous tensor-parallel backward: each
                                   ///< input gradient's all-reduce (reduce-scatter) overlaps the
                                   ///< weight-gradient GEMMs of the matmuls that read the input
  /// The framework that runs the step (docs/time.md, "Framework stacks"): megatron, deepspeed,
  /// fsdp, fsdp2 or ddp; empty: chosen from the layout (passes/Collectives.cpp, stackFacts).
  std::string stack;
  /// `attention_kernel = flash2 | native | flash1_triton`: the fused attention kernel the step
  /// runs, in place of the stack's (empty: the stack's; passes/Stack.cpp, attentionKernel).
  std::string attentionKernel;
  /// `cross_entropy = fused | eager | megatron`: how the step runs its loss, in place of the
  /// stack's (empty: the stack's; crossEntropyKernel below).
  std::string crossEntropy;
  /// `norm_kernel = fused | eager`: how the step runs rms_norm, in place of the stack's (empty:
  /// the stack's; normKernel below).
  std::string normKernel;
  /// `bucket = 100 MiB`: the bytes of gradients each data-parallel reduction carries, in place
  /// of the stack's own bucket (0: the stack's).
  double bucketBytes = 0;
  /// Rank placement, innermost first: 't' tensor, 'c' context, 'p' pipeline, 'd' data. "tcpd"
  /// puts a tensor group inside a node, then the context ranks, the pipeline stages and the
  /// data replicas.
  std::string order = "tcpd";
  llvm::SMRange range;
};

/// The MoE layers' parallel mapping (Megatron-Core, megatron/core/transformer/moe/README.md,
/// "MoE Parallel Folding"): the attention's ranks of a pipeline stage are tp × cp × dp; the MoE
/// layers' are etp × ep × edp over the same ranks. Without folding the expert tensor degree is
/// the tensor degree and the expert group is carved out of the data × context ranks; with
/// folding (expert_tensor = 1 under tensor > 1) the experts run whole (etp 1) and the expert
/// group is drawn from the tensor, context and data ranks together (the tensor's innermost
/// first: the generator's order tp-ep-dp). A device holds the experts' weights over
/// pipeline × etp × ep and ZeRO shards them over edp, the ranks that hold the same experts.
struct ExpertLayout {
  double etp = 1, ep = 1, edp = 1;
  bool folded = false;
};
inline ExpertLayout expertLayout(const Parallelism &par) {
  ExpertLayout l;
  auto degree = [](int64_t x) { return static_cast<double>(x > 1 ? x : 1); };
  // The data × context ranks hold the same parameters (passes/Passes.h, zeroShardRanks).
  double t = degree(par.tensor), ranks = t * degree(par.data) * degree(par.context);
  l.ep = degree(par.expert);
  l.folded = par.expertTensor == 1 && t > 1;
  l.etp = l.folded ? 1 : t;
  l.edp = std::max(1.0, ranks / (l.etp * l.ep));
  return l;
}

/// Whether the expert layout of `par` is one tally models (Megatron-Core's rules), else why not.
/// Sema reports each reason at the setting it names; the layout search skips such candidates,
/// so it never prices a layout a plan could not state.
enum class ExpertFit : uint8_t {
  Ok,
  TensorNotModelled,         ///< expert_tensor is neither 1 nor the tensor degree
  FoldNeedsSequenceParallel, ///< expert_tensor = 1 under tensor > 1 without sequence_parallel
  OverlapNeedsExperts,       ///< expert_overlap with expert = 1
  OverlapNeedsInterleave,    ///< expert_overlap under a pipeline without interleave
  GroupDoesNotDivide,        ///< expert ∤ the ranks the expert group is drawn from
};
ExpertFit expertFit(const Parallelism &par);

/// Whether the data-parallel gradients are reduced after every micro-batch (else once per step,
/// after the last): `reduce_every_micro_batch` when written, else ZeRO 2 and 3 do (their
/// gradients are sharded) and lower stages do not (docs/time.md, "Framework stacks").
inline bool reducesEveryMicroBatch(const Parallelism &par) {
  return par.reduceEveryGiven ? par.reduceEveryMicroBatch : par.zero >= 2;
}

enum class BudgetMetric : uint8_t { MemoryPerDevice, StepTime, Mfu, RunTime };

struct BudgetSpec {
  BudgetMetric metric;
  bool atMost = true;              ///< `<=` / `<` (true) or `>=` / `>` (false)
  double value = 0;                ///< bytes, seconds, or a fraction for MFU
  llvm::SMRange range;
};

struct Plan {
  bool isTrain = true;
  std::string name;
  llvm::SMRange range;
  std::string modelName;
  int64_t batch = 1;               ///< sequences per optimizer step, all devices together
  int64_t seq = 1;                 ///< sequence length (training), prompt length (inference)
  int64_t microBatch = 1;          ///< sequences per device per forward/backward pass
  bool microBatchGiven = false;
  double tokens = 0;               ///< training tokens for the whole run (0: not given)
  int64_t prompt = 0, generate = 0; ///< inference
  /// Serving (infer plans; passes/Inference.cpp, servingCapacity): the context a sequence may
  /// reach (max_context; 0 until resolvePlan sets prompt + generate), the paged KV cache's
  /// block in tokens (kv_block, vLLM's block_size) and the cache's dtype (kv_dtype; Invalid:
  /// the activations').
  int64_t maxContext = 0;
  int64_t kvBlock = 16;
  Dtype kvDtype = Dtype::Invalid;
  OptimizerSpec optimizer;
  PrecisionPolicy precision;
  LoraSpec lora;
  std::string checkpoint = "none"; ///< none | full | auto | sqrt
  Target target;
  Parallelism parallel;
  std::vector<BudgetSpec> budgets;
  /// Price (and generate) the step with elementwise chains fused into one kernel each
  /// (passes/Fusion.cpp): the CUDA backend's step, or --fuse. Not a setting of the language.
  bool fuseKernels = false;
  /// Price the memory of tally's generated CUDA step (`tally build/run --backend cuda`): its
  /// cuBLASLt workspace and no caching allocator (it allocates exactly its regions and arena).
  bool cudaStep = false;
  /// Pad the LM head of tally's generated step to a multiple of 64 rows (passes/HeadPadding.h):
  /// `tally build/run --backend cuda` (the default there), or `--pad-head`. Not a setting of
  /// the language.
  bool padHead = false;
  /// Price and generate tally's CPU step with tensor parallelism (`tally build/run --backend
  /// cpu` of a plan with tensor > 1; passes/TensorShard.cpp): the output head and its cross
  /// entropy run whole on every rank (not vocabulary-parallel), and the step graph holds one
  /// rank's shard of every split tensor. Not a setting of the language.
  bool tensorStep = false;
  /// Price the memory of tally's own generated step, CPU or CUDA (`tally build/run`; implied
  /// by cudaStep): ZeRO's gathered parameters and unsharded gradients as its memory plan holds
  /// them (passes/ZeroShards.cpp) instead of as the plan's framework stack does.
  bool generatedStep = false;
  std::map<std::string, llvm::SMRange> settingRanges; ///< where each setting was written
};

/// The precision presets a plan may name (fp32, tf32, bf16, fp16, mixed_bf16, mixed_fp16).
const std::vector<std::string> &precisionPresetNames();
/// The policy of a preset: bf16 and fp16 keep every class in 16 bits but the optimizer state
/// in fp32 with no master copy; mixed_* add an fp32 master copy (mixed_fp16 also loss
/// scaling). nullopt for any other name.
std::optional<PrecisionPolicy> precisionPreset(llvm::StringRef name);
/// Optimizer names accepted (case-insensitive); SGDM is SGD with momentum 0.9.
const std::vector<std::string> &optimizerNames();
/// An optimizer with its canonical name, default hyper-parameters and state count.
std::optional<OptimizerSpec> optimizerPreset(llvm::StringRef name);
/// Per-parameter state tensors: SGD 0 (1 with momentum), Adam/AdamW 2, AdaGrad, RMSprop and
/// Lion 1.
unsigned optimizerStates(const OptimizerSpec &o);

/// What of a plan its lowered graph depends on. Lowering (frontend/Lower.cpp) reads these and,
/// for the places its messages point at, the plan's setting ranges, nothing else: two plans
/// with equal keys lower to the same graph, which the solvers then share (issue 6: they kept
/// their own list of the fields lowering read).
struct LoweringKey {
  bool isTrain = true;
  int64_t microBatch = 1; ///< the value of `batch` in the model
  int64_t seq = 1;        ///< the value of `seq`
  bool seqGiven = false;  ///< the plan sets `seq` (a train plan whose model uses it must)
  Dtype params = Dtype::F32, activations = Dtype::F32;
  Dtype frozen = Dtype::Invalid; ///< PrecisionPolicy::frozen's dtype
  LoraSpec lora;
  CrossEntropyKernel loss = CrossEntropyKernel::Fused; ///< crossEntropyKernel(plan)
  NormKernel norm = NormKernel::Fused;                 ///< normKernel(plan)
  bool operator==(const LoweringKey &o) const {
    return isTrain == o.isTrain && microBatch == o.microBatch && seq == o.seq &&
           seqGiven == o.seqGiven && params == o.params && activations == o.activations &&
           frozen == o.frozen && lora == o.lora && loss == o.loss && norm == o.norm;
  }
  bool operator!=(const LoweringKey &o) const { return !(*this == o); }
};
LoweringKey loweringKey(const Plan &plan);

/// The framework that runs the plan's step (docs/time.md, "Framework stacks"): its `stack`,
/// or the one its layout implies (ZeRO 3 → fsdp; tensor, pipeline, context or expert
/// parallelism → megatron; ZeRO 1 or 2 → deepspeed; else ddp); `why` gets the reason when the
/// layout chose it, "" when the plan wrote it.
std::string stackName(const Plan &plan, std::string *why = nullptr);

/// How the plan's step runs cross_entropy (CrossEntropyKernel; docs/memory.md, "The loss as
/// frameworks run it"): its `cross_entropy`; else fused for tally's own step
/// (Plan::generatedStep) and a compiled one (torchtitan compiles its loss with the model,
/// torchtitan/components/loss.py build_cross_entropy_loss); else megatron under Megatron-LM
/// and under DeepSpeed with tensor or pipeline parallelism (Megatron-DeepSpeed); else eager
/// (PyTorch's F.cross_entropy on an fp32 copy). `why` gets where it came from.
CrossEntropyKernel crossEntropyKernel(const Plan &plan, std::string *why = nullptr);

/// How the plan's step runs rms_norm (NormKernel; docs/time.md, "The norm as frameworks run
/// it"): its `norm_kernel`; else fused for tally's own step, a compiled step or `--fuse`,
/// Megatron (its Transformer Engine or Apex norm; Megatron-DeepSpeed's too) and an inference
/// plan (a serving engine's kernel); else eager (a PyTorch stack running the model's own
/// RMSNorm module).
/// `why` gets where it came from.
NormKernel normKernel(const Plan &plan, std::string *why = nullptr);

/// The bytes one device may hold: the target's memory, or less where a `memory <=` (or `<`)
/// budget says so; 0 when neither is known. The one definition auto's activation room, the
/// budget fixes and `tally solve` start from (issue 6: they computed it three ways).
double memoryLimit(const Plan &plan);

/// Replaces the plan's budgets of each metric in `flags` by the one in `flags` (command-line
/// budgets win over the file's); budgets of other metrics stay.
void overrideBudgets(Plan &plan, const std::vector<BudgetSpec> &flags);

} // namespace tally
