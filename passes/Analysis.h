// The Analysis: everything the passes compute about one plan, and the only thing reports
// read. Passes run in order (passes/Pipeline.cpp) and each fills its own part; a report
// never computes a number, it formats one from here.
//
// Units: FLOPs and bytes are doubles (a whole run reaches 1e25 FLOPs: past int64, and doubles
// are exact integers below 2^53, which covers every per-op count); times are seconds.
// "Per step" means per optimizer step of the whole plan (all devices, all accumulation
// micro-steps); "per device" means one device's share.
#pragma once

#include "ir/Graph.h"
#include "ir/OpRules.h"
#include "ir/Plan.h"
#include "passes/Collectives.h"
#include "passes/HeadPadding.h"
#include "passes/Stack.h"
#include "passes/OpTable.h"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace tally {

/// Fusion.cpp: the bytes and kernel launches that fused kernels save one forward op's forward
/// and its backward ops (values read from registers instead of memory; one launch per fused
/// run). Kept apart from OpAnalysis, and only when kernels are fused (Analysis::fusion.savings):
/// four zeros in every op's record were a sixth of a deep model's per-op table.
struct FusedSavings {
  double forwardBytes = 0, forwardCalls = 0, backwardBytes = 0, backwardCalls = 0;
};

/// One step of the training schedule: the forward of op `op`, its backward, or its recompute.
struct ScheduleStep {
  enum Kind : uint8_t { Forward, Backward, Recompute } kind;
  OpId op;
};

/// A live buffer of the memory plan: an activation (or extra saved buffer) from the step that
/// creates it to the last step that needs it, at an offset in one arena.
struct Buffer { // 48 bytes: a 100,000-layer plan has 4.5 million
  TensorId tensor = kNone;       ///< kNone for extra saved buffers (masks, statistics)
  OpId op = kNone;               ///< the op that created it
  int64_t bytes = 0;             ///< exact bytes of the tensor on one device (0 when size ≥ 2^63)
  double size = 0;               ///< the same as a double (what the analysis sums): = bytes
                                 ///< whenever it fits int64; above it, the plan cannot hold it
  uint32_t first = 0, last = 0;  ///< schedule step indexes, inclusive
  int64_t offset = 0;            ///< arena offset in bytes, a multiple of kAlignment
  Label what;
  /// Saved: kept for the backward (counts as activations); Transient: a forward output or
  /// recomputed value that no backward keeps; Gradient: an activation's gradient (both workspace).
  enum Kind : uint8_t { Saved, Transient, Gradient } kind = Saved;
};

/// Every buffer of the memory plan, and every tensor in a flat region, starts at a multiple
/// of this many bytes and takes a multiple of it (cudaMalloc aligns to 256 too).
constexpr int64_t kAlignment = 256;
/// `bytes` rounded up to a multiple of kAlignment; nullopt when that does not fit int64 (bytes
/// above INT64_MAX - 255 rounded up) or bytes < 0. The memory plan sizes everything with this.
inline std::optional<int64_t> checkedAlignUp(int64_t bytes) {
  if (bytes < 0 || bytes > INT64_MAX - (kAlignment - 1))
    return std::nullopt;
  return (bytes + (kAlignment - 1)) / kAlignment * kAlignment; // never bytes + 256 first
}
/// The same for sizes known to fit once rounded, 0 ≤ bytes ≤ INT64_MAX - 255 (a buffer or
/// tensor of a plan whose planOverflow is empty: planMemory checked them all; small constants).
inline int64_t alignUp(int64_t bytes) { return (bytes + (kAlignment - 1)) / kAlignment * kAlignment; }

/// One flat region of the memory plan (llm.c style): each tensor at an aligned offset.
struct Region {
  struct Entry { // 24 bytes: a region lists every parameter (issue 12)
    TensorId tensor = kNone;       ///< a parameter (its gradient, master copy or state for those regions)
    unsigned state = 0;            ///< optimizer region: which state (0: first moment, 1: second)
    int64_t offset = 0, bytes = 0;
  };
  Dtype dtype = Dtype::Invalid;
  int64_t bytes = 0;               ///< the region's size, aligned
  std::vector<Entry> tensors;
};

/// One forward or backward of one micro-batch through one chunk (virtual stage) of a pipeline
/// device (pipelineOrder, PipelineTimeline.cpp).
struct PipelineUnit {
  int32_t microBatch, chunk;
  bool backward;
};

/// One step of the training step as codegen runs it, over ops of Analysis::step.
struct StepEntry {
  enum Kind : uint8_t { Forward, Backward, Recompute, Optimizer } kind;
  OpId op;                         ///< an op of Analysis::step
};

/// Activations.cpp: the liveness walks done on one graph (Analysis::walks).
struct WalkMemo;
struct TensorParallelMemo;
struct LayoutFactsMemo;
struct OpTimesMemo;
struct MfuGraphFacts;
class GradientSharesOnce; // passes/GradientShares.h

/// How the generated tensor-parallel step cuts one parameter over its t ranks: `dim` (-1:
/// whole on every rank) viewed as [parts, t, size / (parts·t)], rank r holding [:, r, :] (a
/// fused qkv weight's 3 parts each give every rank its heads of q, k and v).
struct TensorShardOf {
  int dim = -1;
  int64_t parts = 1;
};

/// What a caller reads of an analysis beyond its numbers and diagnostics (analyze's `wants`;
/// docs/design.md, "Analyses on demand"). Each pass computes what a requested result or a
/// diagnostic needs and no more: nothing is skipped by naming a mode.
enum class Result : unsigned {
  /// The budgets checked, with their fix notes. A solver's candidate asks none: its fixes
  /// would search again, without end.
  Budgets = 1u << 0,
  /// The checkpoint trade-off curve, which only the reports print (4 walks of the whole step,
  /// 12% of a 10,000-layer check). Auto's budget note reads it whenever budgets are asked for.
  Curve = 1u << 1,
  /// The memory plan's lists: every buffer, the step's schedule of ops and each region's
  /// entries (--emit=memory-plan, build, run, explain).
  MemoryPlan = 1u << 2,
  /// The buffers placed in the arena (--emit=memory-plan, build, run; the placement was 17% of
  /// a 1,000-layer check).
  Offsets = 1u << 3,
  /// The training step kept after the analysis (--emit=ir and whatever lists the memory plan;
  /// half of a deep model's memory when nothing reads it).
  Step = 1u << 4,
  /// The applied plan per copy (checkpoint.perBlock: re-runs and the bytes each copy keeps),
  /// which only the reports print: its walk lists every instance made (a 100,000-layer
  /// check's largest list), where `check` needs only the peak.
  BlockPlan = 1u << 5,
};

/// A set of Results.
class Results {
public:
  constexpr Results() = default; ///< the numbers and diagnostics alone: a what-if
  constexpr Results(Result r) : bits_(static_cast<unsigned>(r)) {}
  constexpr Results operator|(Results o) const { return fromBits(bits_ | o.bits_); }
  constexpr bool has(Result r) const { return (bits_ & static_cast<unsigned>(r)) != 0; }
  /// Everything: what build, run, explain and the solvers' base plans read.
  static constexpr Results all() { return fromBits((1u << 6) - 1); }
  /// A solver's candidate: its numbers only.
  static constexpr Results whatIf() { return {}; }
  /// `tally check`: the budgets (no curve: it prints diagnostics only), and the memory plan
  /// and the step only when it prints them (--emit=memory-plan, --emit=ir).
  static Results check(bool memoryPlan, bool ir) {
    Results r = Result::Budgets;
    if (memoryPlan)
      r = r | Result::MemoryPlan | Result::Offsets | Result::Step;
    if (ir)
      r = r | Result::Step;
    return r;
  }
  /// `tally report`: the budgets and the curve; the memory plan and the step only when it
  /// prints the memory plan.
  static Results report(bool memoryPlan) {
    Results r = Results(Result::Budgets) | Result::Curve | Result::BlockPlan;
    return memoryPlan ? r | Result::MemoryPlan | Result::Offsets | Result::Step : r;
  }

private:
  static constexpr Results fromBits(unsigned b) {
    Results r;
    r.bits_ = b;
    return r;
  }
  unsigned bits_ = 0;
};

struct Analysis {
  const Graph *graph = nullptr;
  const Plan *plan = nullptr;
  /// The padded LM head of the generated step (passes/HeadPadding.h), set by analyzeGraph: the
  /// step (a.step) holds the padded head, the forward graph (graph) the real one.
  HeadPadding headPad;
  /// What the caller reads of this analysis (analyze's `wants`): the passes compute what a
  /// requested result or a diagnostic needs and skip the rest.
  Results wants = Results::all();
  bool wanted(Result r) const { return wants.has(r); }
  /// Whether the buffers are placed in the arena (MemoryPlan.cpp): their offsets are asked for
  /// (Result::Offsets), or kernel fusion reads them (aliasing), so a plan that fuses is placed
  /// anyway. Unplaced, the plan is still checked to fit 64-bit offsets.
  bool placesBuffers() const { return wanted(Result::Offsets) || (plan && plan->fuseKernels); }
  /// Whether the memory plan is listed (Activations.cpp, MemoryPlan.cpp): asked for
  /// (Result::MemoryPlan), or read by the placement or kernel fusion. Unlisted, only whether
  /// the plan fits 64-bit byte offsets is checked, which sums say without the lists (the
  /// buffer list of a 100,000-layer check was 4.5 million records).
  bool listsPlan() const { return wanted(Result::MemoryPlan) || placesBuffers(); }
  /// Whether this analysis's memory plan was listed (listsPlan, or when the sums did not prove
  /// the plan fits, so that the listed plan says what does not): the buffers, schedule and
  /// region entries are empty when it was not.
  bool planListed = true;
  /// The aligned bytes of the local gradients the memory plan would add (an upper bound,
  /// localGradientBound; nullopt past INT64_MAX), taken from the step when the plan is not
  /// listed (listsPlan), before the step may be released.
  std::optional<int64_t> localGradientBytes;
  /// Whether `step` was released once verified and priced (Result::Step not asked for: `tally
  /// check` reads nothing more of it when it lists no memory plan; half of a deep model's
  /// memory): null from then on, unless the memory plan must be listed after all (it does not
  /// fit int64), which builds it again (the same step: buildTrainingStep is deterministic).
  bool stepReleased = false;
  /// A candidate priced by the layout passes alone (analyzeLayout): no memory plan follows, so
  /// the activation walk lists no buffers and no per-copy rows, and the reports' checkpoint
  /// note and kept paths stay empty (Activations.cpp).
  bool priceOnly = false;
  /// A candidate whose memory and FLOPs alone were priced (analyzeLayout's `timed` false): its
  /// time is 0 until priceLayoutTime prices it.
  bool timePending = false;
  /// A candidate whose time is never priced (AnalysisManager::trial under memoryOnly: it reads
  /// the peak and FLOPs and drops the analysis): its walk is a comparison walk (periodic where
  /// it may be) and no schedule is made (`schedule` stays empty; the step time reads it).
  bool scheduleUnread = false;
  /// The liveness walks already done on this graph (passes/Activations.cpp), keyed by what the
  /// walk reads and by the policy: made by analyzeGraph and shared by every analysis copied
  /// from that graph part (the budget fixes' and the layout search's candidates try the same
  /// checkpoint policies on one graph again and again).
  std::shared_ptr<WalkMemo> walks;
  /// The graph's gradient shares (passes/GradientShares.h), made once for the training step
  /// and the walks' facts and shared by the analyses of the same graph (a fix search's graph
  /// part and its trials); null for an inference plan.
  std::shared_ptr<GradientSharesOnce> gradientShares;
  /// The graph part (analyzeGraph) of a plan's own analysis as made, before any layout pass
  /// wrote it, without the step and the per-block counts: kept by `analyze` for a compact
  /// step, where a fix search's checkpoint candidates (the same plan but for its checkpoint
  /// policy, which no graph-only pass reads) take it instead of analysing the graph again
  /// (AnalysisManager::trial's `checkpointOnly`). Null elsewhere.
  std::shared_ptr<const Analysis> graphOnly;
  /// The tensor-parallel splits of this graph part's candidates (passes/TensorParallel.h):
  /// made by AnalysisManager for its graph parts and shared by every analysis copied from
  /// one; null elsewhere (each pass then makes the split it reads).
  std::shared_ptr<TensorParallelMemo> tensorParallelMemo;
  /// The walks' layout facts last made for this graph part's candidates
  /// (passes/ActivationsInternal.h, LayoutFactsMemo): set by an AnalysisManager that keeps
  /// them (the layout search) on its graph parts, beside tensorParallelMemo; null elsewhere.
  std::shared_ptr<LayoutFactsMemo> layoutFacts;
  /// The step time's per-op times of the last candidates (passes/StepTime.cpp, OpTimesMemo):
  /// set beside layoutFacts; null elsewhere.
  std::shared_ptr<OpTimesMemo> opTimesMemo;
  /// The whole training step (passes/Backward.cpp): graph's forward ops with the same ids,
  /// then backward and optimizer ops. For infer plans, a copy of the forward graph.
  std::shared_ptr<const Graph> step;
  /// The graph's repeat-block copies (ir/Graph.h), found once by analyzeGraph and shared by
  /// every analysis copied from that graph part: the activation walk's segments, the step
  /// time's pipeline boundary and per-layer collectives.
  std::shared_ptr<const RepeatCopies> copies;

  // ---- parameters ----
  /// Per block instance (its path, block name and depth are the graph's Instance: a copy of
  /// two strings per instance was most of what a layout candidate copied, issue 12).
  struct BlockCount {
    uint32_t instance = 0;       ///< index into Graph::instances (0 is the model)
    double count = 0;            ///< parameters declared in this instance and below it
    double forwardFlops = 0;     ///< model FLOPs per step of the ops in and below it (BlockTotals)
    double backwardFlops = 0;
    double time = 0;             ///< forward + backward seconds per step on one device (over the pipeline stages it spans)
    double selfForwardFlops = 0, selfBackwardFlops = 0, selfTime = 0; ///< ops written in this block itself
  };
  struct {
    double total = 0, trainable = 0;
    double expert = 0, expertTrainable = 0; ///< of those, the MoE experts' weights (moe inputs 3-5)
    /// The parameters one token reads (ParamCount.cpp, step 3): `total` less, for each moe op,
    /// its experts' weights times (E − k)/E, the experts a token is not routed to. `total` for
    /// a model without experts.
    double active = 0;
    /// Where pipeline stages put them (StaticMemory.cpp): the parameters read by ops before the
    /// first repeat-block copy (the embedding, a stem, a tied head's weight: the first stage's
    /// own) and those read by the copies (split over the stages), all and trainable. Without
    /// copies `beforeCopies` is everything.
    double beforeCopies = 0, beforeCopiesTrainable = 0;
    double inCopies = 0, inCopiesTrainable = 0;
    /// The unit ZeRO 3 gathers whole besides the root (ParamCount.cpp, step 7): the largest
    /// repeat-block copy's parameters, all and trainable.
    double largestCopy = 0, largestCopyTrainable = 0;
    /// The most trainable parameters whose spans of readers (first to last op reading each)
    /// overlap at one op: the gradients tally's ZeRO 2 and 3 step holds at once (ParamCount.cpp, step 8).
    double gradientSpanPeak = 0;
    /// Of `total`, the parameters an op outside the block that declares them reads too (a head
    /// tied to the embedding): counted once, however many blocks read them.
    double tied = 0;
    /// Of `total`, the frozen parameters stored block-quantized (int8, int4, nf4: QLoRA's base
    /// weights), and their bytes with the block scales (quantBitsPerElement, ParamCount.cpp).
    double quantized = 0, quantizedBytes = 0;
    std::vector<BlockCount> byBlock; ///< every instance, in instance order
  } params;

  /// Quantized base weights (StepTime.cpp, step 2): the dequantization kernel before each
  /// matmul that reads one, per micro-batch on one device: its bytes (the packed weight and
  /// its scales read, the activation-dtype copy written), FLOPs (one multiply per element, one
  /// per block to restore a double-quantized scale) and seconds in the forward and in the
  /// backward (the data gradient reads the weight again). `spec` is the plan's storage.
  struct {
    QuantSpec spec;
    double bytes = 0, flops = 0, forward = 0, backward = 0;
    double matmuls = 0; ///< matmul ops that read a quantized weight
  } dequant;

  /// FP8 training as Transformer Engine runs it (passes/Fp8.cpp; Plan::precision.fp8): which
  /// matmuls run in fp8 and what that costs. Per micro-batch on one device unless marked.
  struct Fp8 {
    bool active = false;
    Fp8Storage storage;                    ///< the recipe's bytes and copies on this target
    /// Per op of the forward graph: 1 an fp8 GEMM, 2 a weight matmul the recipe keeps in bf16
    /// (the first and last layers), 0 anything else.
    std::vector<uint8_t> gemm;
    /// Per op: this fp8 GEMM casts its activation input (the first fp8 GEMM to read it: GEMMs
    /// that share an input, q, k and v, share one cast, as TE's fused QKV does).
    std::vector<uint8_t> castsInput;
    /// Per tensor: its bytes as the backward keeps it (an input kept only by fp8 GEMMs in
    /// fp8; one kept by other ops too in its dtype plus the fp8 copy); null without fp8.
    std::shared_ptr<const std::vector<double>> savedBytes;
    OpId firstGemm = kNone;                ///< the first fp8 GEMM (it runs the amax updates)
    double gemms = 0, keptBf16 = 0;        ///< op counts
    double weightElements = 0;             ///< parameters the fp8 GEMMs read (whole model)
    double weightCopyBytes = 0;            ///< their fp8 copies (whole model)
    double scaledTensors = 0;              ///< tensors with an amax history (3 forward + 2 backward per GEMM)
    double metaBytes = 0;                  ///< amax histories, scales and inverse scales (whole model)
    double savedBytesBf16 = 0, savedBytesFp8 = 0; ///< GEMM inputs kept for the backward, before and after (one micro-batch, whole model)
    // StepTime.cpp: seconds per micro-batch on one device, each GEMM at the fp8 rate and the same
    // GEMMs at the activation dtype's (the comparison the report prints), the cast kernels
    // (inputs and the amax update in the forward, output gradients in the backward) and their
    // bytes; the weights' casts once per step.
    double gemmForward = 0, gemmBackward = 0, gemmForwardBf16 = 0, gemmBackwardBf16 = 0;
    double castForward = 0, castBackward = 0, castBytes = 0;
    double weightCast = 0, weightCastBytes = 0; ///< per step, one device
    double otherForward = 0, otherBackward = 0; ///< every other op's time (unchanged by fp8)
  } fp8;

  OpTable ops;
  /// What each op's backward keeps (from the op rule; Autodiff.cpp), op after op: op o's list
  /// is items[from[o], from[o + 1]) (savedOf). Kept apart from the per-op records, which are
  /// plain numbers shared between equal ops (OpTable), where a saved list names the op's own
  /// tensors. Every copy of this analysis shares it.
  struct SavedLists {
    std::vector<SavedTensor> items;
    std::vector<uint32_t> from;
    bool fusedGates = false; ///< built for a fused gated unit (passes/Stack.h fusedGates)
  };
  std::shared_ptr<const SavedLists> saved;
  /// The saved lists of this graph part's candidates by fusedGates, each made once by the
  /// first candidate whose stack needs it (a layout search's stacks fuse both ways): made by
  /// AnalysisManager for its graph parts and shared by every analysis copied from one; null
  /// elsewhere (a candidate then makes the lists it reads).
  struct SavedListsMemo {
    std::mutex lock;
    std::shared_ptr<const SavedLists> byGates[2];
  };
  std::shared_ptr<SavedListsMemo> savedMemo;
  llvm::ArrayRef<SavedTensor> savedOf(OpId o) const {
    if (!saved || o + 1 >= saved->from.size())
      return {};
    return llvm::ArrayRef<SavedTensor>(saved->items).slice(saved->from[o], saved->from[o + 1] - saved->from[o]);
  }

  // ---- FLOPs per optimizer step (model FLOPs unless named executed) ----
  struct {
    double forward = 0, backward = 0;
    double backwardInputGrad = 0, backwardWeightGrad = 0;
    double forwardMatmul = 0;    ///< the matmul part of forward (incl. attention's products)
    double recompute = 0;        ///< re-executed forward FLOPs of activation checkpointing
    double optimizer = 0;        ///< the update itself (a few FLOPs per parameter)
    double step = 0;             ///< forward + backward + optimizer (model FLOPs)
    double executed = 0;         ///< what kernels run: causal skipping, recompute
    double sixND = 0;            ///< 6 × trainable params × tokens per step
    double ratioToSixND = 0;     ///< (forward + backward) / sixND
    double tokensPerStep = 0;    ///< batch × seq
    /// Whether an input has a `seq` axis: a language task, counted in tokens with a 6·N·D
    /// comparison; otherwise (images, feature vectors) the report counts samples and has none.
    bool sequence = true;
    bool attention = false;      ///< some op is attention (the dense s² count applies)
    bool causalAttention = false; ///< some attention is causal (the executed count skips half)
  } flops;

  // ---- memory per device, bytes ----
  struct {
    double params = 0, grads = 0, master = 0, optimizer = 0;
    double activations = 0;      ///< activation bytes live at the peak of the schedule
    double workspace = 0;        ///< everything else live at the activation peak: unsaved forward outputs, recompute leftovers, activation gradients
    double peak = 0;             ///< everything resident at the worst moment
    double hostTotal = 0;        ///< host memory per device for tensor classes placed on the host
    double bytesPerParam = 0;    ///< (params + grads + master + optimizer) / params per device
    /// Framework memory (StaticMemory.cpp): the f32 gradient-accumulation buffer, the CUDA
    /// context, the communicators' buffers and the caching allocator's reserve; all in `peak`.
    double gradAccum = 0, context = 0, commBuffers = 0, allocatorReserve = 0;
    /// ZeRO's transients (StaticMemory.cpp, zeroTransients): under ZeRO 3 the full parameters
    /// of the units gathered at once; under ZeRO 2 and 3 the unsharded gradients held before
    /// their reduce-scatter, as tally's own step holds them (docs/memory.md, "ZeRO's
    /// transients"); in `peak`.
    double zeroGathered = 0, unshardedGrads = 0;
    /// tally's generated CUDA step (Plan::cudaStep): its cuBLASLt and kernel scratch workspace.
    double libraryWorkspace = 0;
    /// FP8 training (passes/Fp8.cpp): the fp8 copies of the weights its GEMMs read, and the
    /// amax histories and scales of delayed scaling; both in `peak`.
    double fp8Weights = 0, fp8Meta = 0;
    /// Its cuDNN fused attention's workspace (passes/CudnnAttention.h): the backward graph's dQ
    /// accumulator and softmax sums, the largest over the attention ops cuDNN runs; 0 if none.
    double cudnnWorkspace = 0;
  } memory;

  // ---- time ----
  /// One MFU convention (passes/MfuConventions.cpp).
  struct MfuConvention {
    const char *name = "";     ///< "graph", "six_nd", "palm", "palm_causal", "megatron", "hfu"
    const char *formula = "";  ///< the formula, in words
    const char *source = "";   ///< where it is published
    double flops = 0;          ///< per optimizer step, all devices
    double mfu = 0;
  };
  struct {
    double forward = 0, backward = 0, recompute = 0, optimizer = 0; ///< seconds per step, one device
    double communication = 0, hostTransfer = 0, bubble = 0;
    double step = 0, run = 0, runDays = 0;
    double mfu = 0, hfu = 0;
    double steps = 0;            ///< optimizer steps for `tokens`
    int64_t accumulationSteps = 1;
    /// One micro-batch's forward, backward and recompute op times summed over every op, all
    /// pipeline stages together (StepTime.cpp's F + B + R; the layout search's computeBound).
    double microBatchCompute = 0;
    // StepTime.cpp: the parts of `communication`, seconds per step on one device.
    double dataParallelComm = 0, tensorParallelComm = 0, pipelineComm = 0;
    double contextParallelComm = 0; ///< ring attention's K/V passes not hidden by attention
    double expertParallelComm = 0;  ///< the all-to-alls of routed tokens (expert parallelism)
    /// Of dataParallelComm: the compute the hidden collectives slowed, on the multiprocessors
    /// NCCL's blocks held while they ran (passes/Collectives.h, overlapInterference).
    double overlapInterference = 0;
    /// MFU by each published convention (passes/MfuConventions.cpp), train plans only: the
    /// FLOPs per optimizer step each counts, over step × peak × devices with the same dense
    /// peak. `mfu` above is the "graph" convention's.
    std::vector<MfuConvention> mfuConventions;
    /// What the conventions read of the graph alone (passes/MfuConventions.cpp,
    /// MfuGraphFacts): made by analyzeGraph, shared by the analyses copied from its graph part.
    std::shared_ptr<const MfuGraphFacts> mfuFacts;
    double mfuPeak = 0;          ///< FLOP/s per device the conventions divide by: the dense peak
                                 ///< (ir/Target.h: every catalogue rate is dense, no 2:4 sparsity)
  } time;

  /// StepTime.cpp: the framework that runs the step (its buckets and overlap), and every kind of
  /// collective one device runs in a step, each priced as NCCL runs it (passes/Collectives.h),
  /// for `tally explain --collectives` and the JSON report's `collectives`.
  StackFacts stack;
  struct CollectiveUse {
    std::string what;        ///< "gradient reduce-scatter", "forward all-reduce", ...
    char group = 'd';        ///< 't' tensor, 'c' context, 'p' pipeline, 'd' data, 'e' expert,
                             ///< 'x' the data ranks holding the same experts
    CollectiveCost cost;     ///< one call
    double perStep = 0;      ///< calls per step on one device
    bool overlapped = false; ///< runs beside compute (only what it does not hide is exposed)
    /// The pipeline stage whose ranks run it (the generated step's data x pipeline: each
    /// stage's data group reduces that stage's gradients); -1: every rank.
    int64_t stage = -1;
  };
  std::vector<CollectiveUse> collectives;

  /// The pipeline schedule of one optimizer step (PipelineTimeline.cpp), train plans with
  /// pipeline > 1 only: every forward and backward (recompute included) of every micro-batch
  /// on every stage, at the start and end the schedule's order and dependencies give.
  struct PipelineSlot {
    int32_t stage = 0;       ///< device of the pipeline, 0 first
    int32_t chunk = 0;       ///< virtual stage on that device (interleave), 0 first
    int32_t microBatch = 0;
    bool backward = false;
    double start = 0, end = 0; ///< seconds from the step's start
  };
  struct {
    std::vector<PipelineSlot> slots;
    int64_t stages = 0, interleave = 1;
    int64_t microBatches = 0;      ///< what the step runs
    int64_t shownMicroBatches = 0; ///< what `slots` holds (at most a few rounds; the middle repeats)
    double makespan = 0;           ///< end of the last slot
    double bubble = 0;             ///< makespan − the busiest stage's compute, for the shown micro-batches
    std::vector<double> idle;      ///< per device: makespan − its compute, for the shown micro-batches
    /// Per virtual stage (chunk c of device s is c·p + s), one micro-batch's forward and its
    /// backward with recompute (StepTime.cpp, step 4): the slots' lengths. Empty when the
    /// stages are taken as balanced (no repeat copies to split, or fewer than p·v of them).
    std::vector<double> stageForward, stageBackward;
  } pipeline;

  struct {
    std::string policy = "none";
    std::vector<std::string> saved; ///< op or block paths whose outputs are kept
    double recomputeFlops = 0;
    // Activations.cpp: what the policy decided (recomputeFlops is per optimizer step).
    std::string requested = "none"; ///< the plan's setting; `policy` is what was applied
    std::string note;            ///< why a requested policy changed nothing (no repeat blocks)
    std::string error;           ///< a policy that cannot apply (a keep path naming nothing)
    int64_t blocks = 0;          ///< repeat-block copies that could be checkpointed
    int64_t checkpointed = 0;    ///< of those, how many are recomputed in the backward
    int64_t segment = 0;         ///< copies per recomputed segment (1 full, ⌈√L⌉ sqrt)
    double limitBytes = 0;       ///< auto: activations + workspace per device had to fit in this
    /// One point of the trade-off curve: a policy, its recompute FLOPs per step and the
    /// activations + workspace per device it needs.
    struct Option {
      std::string policy;
      int64_t checkpointed = 0;
      double recomputeFlops = 0, bytes = 0;
      double recomputeSeconds = 0; ///< roofline seconds of the re-run ops per step, one device
    };
    std::vector<Option> options; ///< auto: store-all, evenly spaced partial counts, full, sqrt (by recompute)
    /// The trade-off curve: the Pareto front of (peak memory per device, recompute time) over
    /// the plans measured (for auto its candidates and nested plans under smaller budgets; for
    /// other policies none, partial counts, full and the plan itself), by falling peak.
    struct Point {
      std::string policy;
      int64_t checkpointed = 0;
      double peakBytes = 0, recomputeFlops = 0, recomputeSeconds = 0;
    };
    std::vector<Point> curve;
    /// The applied plan per repeat copy: how many times its forward re-runs in the backward
    /// and the bytes its first forward keeps for the backward.
    struct BlockPlan {
      std::string path;
      int64_t reruns = 0;     ///< times the whole copy's forward runs again
      int64_t reselected = 0; ///< its ops re-run alone besides (selective: norms, GELU, …)
      double keptBytes = 0;
    };
    std::vector<BlockPlan> perBlock;
  } checkpoint;

  double ridge = 0;              ///< the target's ridge intensity at the activation dtype
  double peakFlops = 0;          ///< Roofline: FLOP/s matrix products run at (MFU's peak per device)

  // ---- inference (Inference.cpp, infer plans only): FLOPs and bytes of the whole model,
  // cache bytes per device, times on one model replica (its tensor × pipeline devices) ----
  /// One op of a decode step (one new token for each sequence) at the mean context.
  struct DecodeOp {
    OpId op = kNone;
    double flops = 0, bytes = 0, intensity = 0, time = 0;
    bool computeBound = false;
  };
  struct {
    bool active = false;         ///< an infer plan was analyzed
    /// The model is an encoder: it has attention and none of it is causal (BERT). Without a
    /// causal mask a new token changes every earlier position's output, so nothing is cached
    /// and nothing decoded: the plan is its forward (the prefill) alone.
    bool encoder = false;
    int64_t bidirectionalLayers = 0; ///< an encoder's attention ops (causal = false)
    double forwardTokensPerSecond = 0; ///< batch × prompt / prefillTime: tokens through the forward
    double forwardTokensPerSecondPerGpu = 0; ///< that over the replica's tensor × pipeline devices
    int64_t layers = 0;          ///< attention ops with a growing KV cache (self-attention)
    int64_t windowedLayers = 0;  ///< those of them with a sliding window: their cache stops at w positions
    int64_t latentLayers = 0;    ///< those of them caching a latent (MLA's attention(latent = r)), not K and V
    int64_t latentWidth = 0;     ///< the widest such op's latent + RoPE key values per token (kv_lora_rank + qk_rope_head_dim)
    double kvBytesPerToken = 0;  ///< K and V of one token of one sequence, all layers, per device
    double kvCacheBytes = 0;     ///< the cache for prompt + generate tokens of every sequence, per device
    double prefillFlops = 0, prefillTime = 0; ///< the graph's forward over the prompt
    double decodeSteps = 0;      ///< generate − 1: the prefill already yields the first token
    double meanContext = 0;      ///< prompt + generate / 2: the mean context of the decode steps
    double decodeFlops = 0, decodeBytes = 0; ///< per decode step at the mean context
    double decodeIntensity = 0;
    bool decodeMemoryBound = true; ///< decodeIntensity below the ridge
    double decodeTime = 0;       ///< mean seconds per decode step
    double firstDecodeTime = 0, lastDecodeTime = 0;
    double tokensPerSecond = 0;  ///< generated tokens per second, all sequences of the batch
    double totalTime = 0;        ///< prefill + every decode step
    double twoNFlops = 0;        ///< 2 × params × batch: the usual estimate of decodeFlops
    std::vector<DecodeOp> ops;   ///< every op a decode step runs (views and the loss left out)
    // Serving capacity (issue 45): sequences of maxContext tokens held in a paged cache of
    // kvBlock-token blocks, as vLLM keeps it; bytes per device. Times from inference,
    // memory from servingCapacity (after the allocator reserve).
    Dtype kvDtype = Dtype::Invalid; ///< the cache's dtype (kv_dtype, else the activations')
    double maxContext = 0;       ///< tokens a sequence may reach (max_context)
    double kvBlock = 0;          ///< tokens per block (kv_block)
    int64_t kvHeads = 0;         ///< key/value heads of the widest self-attention op
    double kvReplication = 1;    ///< copies of each KV head over the tensor ranks (tensor / kv
                                 ///< heads when the tensor degree exceeds the KV heads)
    double kvBlocksPerSequence = 0; ///< ceil(maxContext / kvBlock): a full-context layer's blocks
    double kvBlockBytes = 0;     ///< kvBlock × kvBytesPerToken
    double kvBytesPerSequence = 0; ///< one sequence at maxContext, in whole blocks; a windowed
                                   ///< layer's blocks cover at most its window
    double peakWithoutKv = 0;    ///< memory.peak before the plan's cache (inference) was added
    double kvMemoryBytes = 0;    ///< what the cache may take: (limit − the rest) / (1 + reserve)
    double kvBlocksTotal = 0;    ///< floor(kvMemoryBytes / kvBlockBytes)
    double maxConcurrent = 0;    ///< floor(kvMemoryBytes / kvBytesPerSequence)
    double timeToFirstToken = 0; ///< the prefill of the batch's prompts
    double interTokenLatency = 0; ///< a decode step with every sequence at maxContext
    double tokensPerSecondPerGpu = 0; ///< batch / interTokenLatency / (tensor × pipeline)
    int64_t modelMaxContext = 0; ///< rows of a learned positional table read at positions(n); 0: none
    OpId positionsOp = kNone;    ///< the positions op whose rows that table gives
  } inference;

  // ---- the forward/backward schedule and the memory plan (Activations.cpp) ----
  /// Every step in order; for a candidate priced alone (priceOnly) only its Recompute steps,
  /// in order, which is all its step time reads.
  std::vector<ScheduleStep> schedule;
  std::vector<Buffer> buffers;
  // MemoryPlan.cpp: the schedule over the step's ops (each backward step expanded into its
  // backward ops; optimizer ops last), where each schedule step starts in it, and the flat
  // regions of parameters, gradients, master weights and optimizer state (what the generated
  // step of one device allocates: one replica, unsharded, except under ZeRO ≥ 1 below).
  std::vector<StepEntry> stepSchedule;
  std::vector<uint32_t> stepIndexOf;   ///< per schedule step: its first index in stepSchedule
  /// Fusion.cpp (Plan::fuseKernels): runs of stepSchedule entries that one generated kernel
  /// runs, and what they save per micro-batch on one device (whole tensors, before any
  /// tensor-parallel split): reads of values kept in registers, and kernel launches.
  struct FusedKernel {
    uint32_t first = 0, count = 0; ///< stepSchedule entries [first, first + count), count ≤ 64
    double bytesSaved = 0;
    /// Bit i: op i's output is not written to memory (no op after the run reads it; its
    /// buffer stays in the plan, unused).
    uint64_t unwritten = 0;
    /// The last entry is a layer or RMS norm forward whose input the run computes: one kernel
    /// runs the elementwise ops on each row, then normalises it (x is read back from cache).
    bool norm = false;
    /// A matmul then the add of a bias over its last dimension: one matmul with a bias
    /// epilogue writing the add's output (count 2; the matmul's own output is not written).
    bool epilogue = false;
  };
  struct {
    bool enabled = false;        ///< the plan asked for fused kernels and the pass ran
    std::vector<FusedKernel> kernels;
    double ops = 0;              ///< step ops run inside fused kernels
    double bytesSaved = 0, launchesSaved = 0;
    double elementwiseOps = 0;   ///< elementwise step ops (fusable kinds) in the schedule
    double epilogues = 0;        ///< of the kernels, matmuls with a bias epilogue
    std::vector<FusedSavings> savings; ///< per forward op when enabled, else empty
  } fusion;
  /// What fused kernels save op `o` (FusedSavings): zeros when kernels are not fused.
  const FusedSavings &fusedOf(OpId o) const {
    static const FusedSavings none;
    return o < fusion.savings.size() ? fusion.savings[o] : none;
  }
  struct {
    Region params, grads, master, optimizer;
    /// ZeRO ≥ 1 over data = d > 1 ranks: rank r owns elements [r·shard, (r+1)·shard) of the
    /// grads region (its padding included; the last rank's share may be shorter). Master and
    /// optimizer then hold that shard only, element k of the shard at element k of master and
    /// of each state (state s at byte s·alignUp(shard · its dtype's bytes)), and list no
    /// tensors. 0: no sharding.
    int64_t shard = 0;
    /// ZeRO 2 or 3 over data = d > 1 ranks (the stage; 0 otherwise): each tensor of the grads,
    /// master and optimizer regions (at stage 3 the params region too) is cut into d pieces of
    /// ⌈n/d⌉ elements, rank r owning elements [r·⌈n/d⌉, min(n, (r+1)·⌈n/d⌉)) of it (DeepSpeed
    /// stage 3 partitions each parameter so), and the region holds one piece per tensor at an
    /// aligned offset (Entry::bytes: the piece's). `shard` is then 0.
    int tensorShards = 0;
  } regions;
  /// Plan::tensorStep: per parameter (Graph::params order) how the step cuts it over the
  /// tensor-parallel ranks (TensorShard.cpp), and why the step cannot run the split ("" when
  /// it can; codegen refuses with it).
  std::vector<TensorShardOf> tensorShards;
  std::string tensorStepError;
  OpId tensorStepOp = kNone; ///< the op tensorStepError names, if any
  /// Plan::tensorStep with sequence_parallel: per tensor of the step graph, the dimension its
  /// shape was cut along the sequence to one rank's 1/t (shardSequence), or -1.
  std::vector<int8_t> sequenceDim;
  /// ZeRO 2 and 3 (regions.tensorShards; MemoryPlan.cpp step 4): where the generated step moves
  /// each tensor's pieces, in stepSchedule entries. A parameter's gradient of one micro-batch
  /// is an arena buffer (kind Gradient, tensor the parameter) zeroed before entry `first` and
  /// reduce-scattered into the rank's piece in G after entry `last`; under ZeRO 3 every unit
  /// (each repeat-block copy, FSDP's wrapped block, and the root: every other parameter) is
  /// gathered into arena buffers (kind Transient, tensor the parameter) before the first entry
  /// of the forward that reads one of its parameters and again before the first of the
  /// backward (recompute included), freed after the phase's last read.
  struct ZeroMoves {
    struct Reduce {
      TensorId param = kNone;
      uint32_t first = 0, last = 0;
    };
    struct Gather {
      uint32_t entry = 0;            ///< gathered before this entry
      uint32_t last = 0;             ///< the last entry of the phase (and chunk) reading one
      uint32_t unit = 0;             ///< index into the repeat copies; kNone: the root
      bool backward = false;
      std::vector<TensorId> params;
    };
    std::vector<Reduce> reduces;     ///< in the order of their `last`
    std::vector<Gather> gathers;     ///< in the order of their entry
  } zero;
  /// Plan::generatedStep on the CPU with pipeline = p > 1 (PipelineStep.cpp): how the generated
  /// step runs the stages. Chunk (virtual stage) k runs on rank k mod p; the forward ops are in
  /// the chunks chunkOfOps gives (the estimate's stages), each backward op in its forward op's,
  /// the loss gradient's fill in the last. Each chunk's arena holds `slots` micro-batches at
  /// once (the most the order runs forward and not yet backward), each slot the buffers its
  /// entries use, placed again on their own; a rank's arena is its chunks' slots one after
  /// another and its regions the parameters its chunks read. Empty `chunks` when not planned.
  struct PipelineStep {
    std::string error;           ///< why the step cannot run the stages ("" when it can)
    OpId errorOp = kNone;        ///< the op `error` names, if any
    int64_t stages = 0, interleave = 1, microBatches = 0;
    std::vector<uint32_t> chunkOfOp; ///< per op of the step (kNone: the optimizer phase)
    struct Chunk {
      int64_t slots = 0, slotBytes = 0, base = 0; ///< base: slot 0's offset in its rank's arena
      std::map<uint32_t, int64_t> offset;         ///< buffer index → its offset in a slot
      std::vector<TensorId> inputs;   ///< storages received from chunk − 1 (their gradients go back)
      std::vector<TensorId> outputs;  ///< storages sent to chunk + 1
    };
    std::vector<Chunk> chunks;
    struct Rank {
      int64_t arenaBytes = 0;
      Region params, grads, master, optimizer;
      /// Data x pipeline under ZeRO-1: the elements of the stage's grads region each rank of its
      /// data group owns, ⌈E / data⌉ (the optimizer region holds that run per state); else 0.
      int64_t shard = 0;
      std::vector<bool> holds;        ///< per Graph::params index: in this rank's regions
      std::vector<TensorId> shared;   ///< parameters whose gradient is summed with `peer`'s
      std::vector<int64_t> peers;
    };
    std::vector<Rank> ranks;
    std::vector<std::vector<PipelineUnit>> order; ///< per rank (pipelineOrder)
    double boundaryBytes = 0;       ///< per micro-batch and boundary (stageBoundaryBytes)
    /// Data x pipeline under ZeRO 2 and 3: `zero`'s moves, each within one chunk (a tied
    /// parameter's gradient is reduced by each chunk that writes it, the root unit gathered by
    /// each chunk that reads it).
    ZeroMoves zero;
  } pipelineStep;
  /// "" when every size and offset of the memory plan (each buffer, the arena, each region and
  /// each tensor in it) fits int64 bytes; else what first did not, and the plan is not
  /// representable: planMemory leaves the arena, the offsets and the regions at 0, the pipeline
  /// reports an [overflow] error at the plan, the memory-plan report prints only that, and
  /// codegen refuses it. The analytic numbers (doubles: memory, livePeakBytes, ...) stand.
  std::string planOverflow;
  // Activations.cpp: one micro-batch on one device's tensor-parallel share.
  int64_t arenaBytes = 0;        ///< size of the arena the buffers are placed in (≥ livePeakBytes; 0 and no offsets when not placed: placeBuffers)
  double livePeakBytes = 0;      ///< the most bytes live at once in the schedule
  uint32_t peakStep = 0;         ///< the schedule step where that peak is reached
  /// What each repeat-block copy's backward keeps with no checkpointing (each tensor once,
  /// charged to the first op that saves it; parameters and input data left out).
  struct BlockActivations {
    std::string path;            ///< "h[3]"
    double savedBytes = 0, inputBytes = 0, forwardFlops = 0;
  };
  std::vector<BlockActivations> blockActivations;
};

/// The framework memory outside the caching allocator: the CUDA context, the communication
/// buffers and tally's CUDA step workspace (staticMemory's numbers).
inline double unallocatedBytes(const Analysis &a) {
  return a.memory.context + a.memory.commBuffers + a.memory.libraryWorkspace + a.memory.cudnnWorkspace;
}
/// The caching allocator's reserve as a fraction of what it hands out: the target's, or 0 for
/// tally's CUDA step, which allocates its regions and arena once (Plan::cudaStep).
inline double reserveFraction(const Plan &p) { return p.cudaStep ? 0 : p.target.allocatorReserve; }
/// The peak per device when `allocated` bytes go through the caching allocator: its reserve on
/// them, and the memory outside it (unallocatedBytes) as is (allocatorReserve's rule, for
/// peaks the passes have not reached yet: the floor of the model states, the curve's points).
inline double reservedPeak(const Analysis &a, double allocated) {
  return unallocatedBytes(a) + allocated * (1 + reserveFraction(*a.plan));
}

} // namespace tally
