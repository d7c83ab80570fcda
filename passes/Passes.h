// The passes, one per file, in two kinds (architecture.md):
// - transforms, Graph → Graph: lowering (frontend/) builds the forward graph and verifies it;
//   Backward.cpp builds the training step from it, which the pipeline verifies (verifyGraph
//   and verifyOpTypes) before any analysis reads it;
// - analyses, Graph → Analysis: each fills its part of the Analysis, in the order listed here
//   (passes/Pipeline.cpp); each may read what earlier ones computed, none changes a graph.
#pragma once

#include "passes/Analysis.h"

#include <functional>
#include <optional>

namespace tally {

class DiagnosticEngine;

/// Lowers the same model again for a changed plan (another micro-batch, say), so budgets and
/// solvers can try alternatives; diagnostics of the attempt are not shown. Empty when no
/// re-lowering is possible (unit tests on hand-built graphs).
using Relower = std::function<std::optional<Graph>(const Plan &)>;

/// A parallel degree as a divisor: 1 for an unset (0) or 1 setting (Parallelism's fields).
inline double degree(int64_t x) { return static_cast<double>(x > 1 ? x : 1); }

/// The ranks ZeRO shards the model states over: the data-parallel ranks times the context ranks,
/// which hold the same parameters. Megatron's distributed optimizer shards over its data-parallel
/// group with context parallelism (megatron/core/distributed/distributed_data_parallel.py: the
/// dense parameters' buffers on intra_dp_cp_group), FSDP2 in NeMo Automodel and torchtitan over the
/// flattened dp_shard_cp mesh (docs/memory.md, "ZeRO").
inline double zeroShardRanks(int64_t data, int64_t context) { return degree(data) * degree(context); }

/// The static loss scale of fp16 loss scaling (PyTorch's GradScaler starts at 2^16).
constexpr double kLossScale = 65536;
/// The device workspace of tally's generated CUDA step: cuBLASLt's and the kernels' scratch
/// (codegen/runtime/cuda/launch.h kDefaultWorkspaceBytes; EmitCuda.cpp asserts they agree).
constexpr int64_t kCudaStepWorkspaceBytes = 64LL << 20;

// ---- transforms ---------------------------------------------------------------------------

/// Backward.cpp: the whole training step of a train plan — the forward ops (same ids), the
/// backward ops (phase Backward, each naming its forward op), then the optimizer phase. An
/// infer plan's graph comes back unchanged. The pipeline verifies it (Pipeline.cpp, checkStep).
/// With `compact` (the forward graph's repeat copies), the backward ops of the copies that
/// provably repeat another copy's are not made (Graph::Skipped): a step only to price and
/// check (differentiate, checkStep, localGradientBound read it), never to print or run.
/// `shares`: the forward graph's gradient shares, made once (GradientSharesOnce), else made
/// here; the same step either way.
Graph buildTrainingStep(const Graph &forward, const Plan &plan, const RepeatCopies *compact = nullptr,
                        GradientSharesOnce *shares = nullptr);
/// Whether buildTrainingStep makes the same step of one forward graph for both plans: the
/// same training flag, gradient dtype, loss scaling and optimizer update. Only the loss
/// gradient's seed, 1 / (micro-batches per rank), may differ, which no pass prices (the
/// budget fixes price candidates with the base's step; code generation builds its own).
bool sameStep(const Plan &a, const Plan &b);
/// FLOPs per trainable parameter of the optimizer_update op (the update, and unscaling the
/// gradient under loss scaling).
double optimizerFlopsPerParam(const OptimizerSpec &o, bool lossScaling);

// ---- analyses ----------------------------------------------------------------------------

/// ParamCount.cpp: total and trainable parameters, and the count under every block instance.
void countParams(Analysis &a);
/// OpCosts.cpp: each op's forward FLOPs and bytes from its rule; forward totals per step.
void costOps(Analysis &a);
/// Autodiff.cpp: runs the Backward.cpp transform (Analysis::step), then prices the backward
/// of every op — gradient FLOPs split into weight and input gradients, none for tensors that
/// need no gradient — the optimizer's FLOPs, the step's model and executed FLOPs and the 6ND
/// comparison. `compact`: the step it builds is compact (buildTrainingStep).
void differentiate(Analysis &a, bool compact = false);
/// Autodiff.cpp: what each op's backward keeps (its rule's saved tensors, for the inputs that
/// need a gradient), op after op (Analysis::saved); differentiate makes it when the caller has
/// not. Reads only the forward graph.
std::shared_ptr<const Analysis::SavedLists> savedLists(const Graph &g, bool fusedGates = false);
/// StaticMemory.cpp: bytes per device of params, grads, master weights and optimizer state,
/// from the precision policy, the optimizer and the parallel layout (ZeRO sharding).
void staticMemory(Analysis &a);
/// StaticMemory.cpp: the caching allocator's reserve (the target's fraction of the peak less
/// the CUDA context and communication buffers), added to the peak; after the KV cache.
void allocatorReserve(Analysis &a);
/// StaticMemory.cpp: the least peak per device any micro-batch and checkpoint plan of `plan`
/// can have: the model states and framework memory of staticMemory (from `counted`'s
/// parameter counts) with the allocator's reserve on the states. Activations, workspace and
/// the KV cache only add to a peak, so when this exceeds a limit nothing under it fits (the
/// layout search and the budget fixes prune on it without pricing the plan).
double modelStatesFloor(const Analysis &counted, const Plan &plan);
/// Activations.cpp: the forward-then-backward schedule, the checkpoint policy (which block
/// outputs are kept, what is recomputed), the liveness walk over saved tensors, the memory
/// plan (buffers with offsets), activation bytes at the peak and the peak per device.
/// `curveLater`: on a graph of kThreadedOps ops or more, the trade-off curve's walks are not
/// made here but left in it, to be run (on another thread) before anything reads
/// Analysis::checkpoint.curve; they read only the facts they keep, the plan, the saved lists and
/// the model states' bytes, which the passes after this one do not write.
void planActivations(Analysis &a, std::function<void()> *curveLater = nullptr);
/// An empty Analysis::walks for a new graph part (analyzeGraph).
std::shared_ptr<WalkMemo> newWalkMemo();
/// An empty Analysis::layoutFacts keeping the `keep` newest entries (AnalysisManager), and
/// the entries it made and read again.
std::shared_ptr<LayoutFactsMemo> newLayoutFactsMemo(size_t keep);
std::pair<size_t, size_t> layoutFactsCounts(const LayoutFactsMemo &memo);
/// StepTime.cpp: an empty Analysis::opTimesMemo (passes/PricingMemo.h) keeping the `keep`
/// newest entries of each kind.
std::shared_ptr<OpTimesMemo> newOpTimesMemo(size_t keep);
/// Activations.cpp: the walks' facts that depend only on the graph, its saved lists
/// (Analysis::saved, made) and the training flag, built into Analysis::walks, where
/// planActivations finds them (analyzeGraph builds them beside the training step).
void prepareWalks(Analysis &a);
/// What a memo holds: the walks done (each once), the times one was answered from it, and
/// the sets of facts it keeps apart (tests; docs/performance.md).
struct WalkMemoStats {
  size_t walks = 0, reused = 0, variants = 0;
  size_t chainSolves = 0; ///< auto's chain programs solved (not read off an earlier solution)
  size_t structures = 0;  ///< the facts' graph part built (once per graph and training flag)
};
WalkMemoStats walkMemoStats(const WalkMemo &memo);
/// MemoryPlan.cpp: the schedule over the step graph's ops and the flat regions (params,
/// grads, master weights, optimizer state) with an aligned offset per tensor.
void planMemory(Analysis &a);
/// Collectives.cpp: the bytes one device sends per step in the data-parallel collectives the
/// step time priced (Analysis::collectives of the data groups), each as a ring sends them
/// (ringSentBytes). The generated CPU step counts what each rank sends under ZeRO 2 and 3.
/// `stage`: a rank of that pipeline stage (data x pipeline prices each stage's data group
/// apart, CollectiveUse::stage); 0 without pipeline parallelism.
double dataParallelSentBytes(const Analysis &a, int64_t stage = 0);
/// ZeroShards.cpp (step 4 of planMemory): under ZeRO 2 and 3 with data > 1, each parameter's
/// gradient of one micro-batch as an arena buffer and, under ZeRO 3, each unit's gathered
/// parameters in the forward and again in the backward (Analysis::zero); nothing otherwise.
/// `stepOfEntry`: the schedule step of each stepSchedule entry.
void zeroMoves(Analysis &a, const std::vector<uint32_t> &stepOfEntry);
/// ZeroShards.cpp: the moves alone, each within one chunk of `chunkOfOp` (per step op; empty:
/// one chunk, Analysis::zero's). Data x pipeline under ZeRO 2 and 3 (PipelineStep.cpp) splits
/// a move that spans chunks into one per chunk.
Analysis::ZeroMoves zeroMovesOf(const Analysis &a, const std::vector<uint32_t> &chunkOfOp);
/// MemoryPlan.cpp: an upper bound on the aligned bytes of the local gradients planMemory adds
/// to the buffers (every dense gradient tensor the step made after `forwardTensors`); nullopt
/// past INT64_MAX. With the walk's buffers summed, it says the plan fits without listing it.
std::optional<int64_t> localGradientBound(const Graph &step, size_t forwardTensors);
/// Fusion.cpp (declared in passes/Fusion.h with what codegen shares of it): fuseKernels, with
/// Plan::fuseKernels only — the runs of elementwise entries, norm prologues and matmul bias
/// epilogues that one kernel runs, and the bytes and launches that saves per op. After
/// planMemory (it reads the buffers' offsets), before stepTime (which prices it).
/// Roofline.cpp: each op's compute rate, the target's ridge, and compute- or memory-bound.
void roofline(Analysis &a);
/// StepTime.cpp: per-op times, communication (data/tensor/pipeline parallel), host
/// transfers, accumulation, step time, MFU, HFU and run time.
void stepTime(Analysis &a);
/// DataParallelTime.cpp, step 6 of stepTime: the data-parallel (and context-group) gradient and
/// parameter traffic of one device per step, exposed after overlap (Time::dataParallelComm);
/// records each message in Analysis::collectives and sets Time::overlapInterference. `m`: the
/// micro-batches per step; `backwardOne`, `computeOne`: one micro-batch's backward (with its
/// recompute) and whole compute on the device, the windows a reduction may hide behind (ZeRO
/// 0/1: the last backward, 2: every backward, 3: all compute); `layers`: the stage's repeat
/// copies (FSDP's units); `matmulShare`: matmuls' share of that compute.
double dataParallelTime(Analysis &a, double m, double backwardOne, double computeOne, double layers,
                        double matmulShare);
/// StepTime.cpp: the parameter tensors that get a gradient (the step's optimizer updates each
/// with one call, and tally's ZeRO-1 step copies each out of the gradients region); with
/// `above`, those of more elements than it (the calls that start a team of threads).
double trainableTensors(const Graph &g, double above = -1);
/// PipelineTimeline.cpp: the 1F1B (or interleaved 1F1B) schedule of the pipeline stages as
/// timed slots, for the report's timeline; the step time keeps StepTime's closed-form bubble.
void pipelineTimeline(Analysis &a);
/// PipelineStages.cpp: one micro-batch's forward, backward and recompute time of each of
/// `chunks` virtual pipeline stages: the repeat copies split over them in balanced counts,
/// the ops outside the copies with the copy before them (or chunk 0 before any). `recompute`
/// lists the ops the schedule recomputes; `recomputeRatio` prices recompute as that fraction
/// of the forward where the schedule lists none. Empty when there are fewer copies than chunks.
struct StageTimes {
  std::vector<double> forward, backward, recompute;
};
StageTimes stageTimes(const Analysis &a, int64_t chunks, const std::vector<OpId> &recompute,
                      double recomputeRatio);
/// PipelineStages.cpp: the virtual stage (chunk) of each op of `g` over `chunks` of them, as
/// stageTimes assigns them (the one rule the estimate and the generated step share); empty
/// when there are fewer repeat copies than chunks.
std::vector<uint32_t> chunkOfOps(const Graph &g, const RepeatCopies &rc, int64_t chunks);
/// PipelineTimeline.cpp: the order in which device `s` of `p` runs its forwards and backwards
/// of `m` micro-batches over `v` chunks (1F1B; Megatron's interleaved 1F1B for v > 1): what the
/// timeline simulates and the generated pipeline step runs.
std::vector<PipelineUnit> pipelineOrder(int32_t s, int32_t p, int32_t m, int32_t v);
/// StepTime.cpp: the elements of the gradients of sequence-split parameters `params` (forward
/// graph tensors) that the tensor group all-reduces once per step: all of them, or in the
/// generated step under ZeRO 2 and 3 the data rank's piece of each (⌈n/d⌉; codegen's
/// sequenceGradients).
double sequenceGradientElements(const Analysis &a, const std::vector<TensorId> &params);
/// PipelineStep.cpp: Plan::generatedStep on the CPU with pipeline > 1, after planMemory:
/// Analysis::pipelineStep (each rank's chunks, regions, arena and sends); its error says why
/// the generated step cannot run the plan's stages.
void planPipelineStep(Analysis &a);
/// MemoryPlan.cpp: places `buffers` in one arena as planMemory does (first fit in creation
/// order); false past INT64_MAX.
bool placeArena(std::vector<Buffer> &buffers, int64_t &arena);
/// MemoryPlan.cpp: the regions of the parameters `holds` marks (Graph::params order), as
/// planMemory lays out all of them: unsharded, or under ZeRO 2 and 3 (`pieces` = data > 1) one
/// piece of each tensor in grads, master and optimizer (at ZeRO 3 in params too); false past
/// INT64_MAX.
bool layStageRegions(const Analysis &a, const std::vector<bool> &holds, Region &params, Region &grads, Region &master,
                     Region &optimizer, int64_t pieces = 1);
/// PipelineStep.cpp: the bytes pipeline rank `rank` sends per step in the generated step, as
/// the estimate prices them: each micro-batch's boundary activations forward and their
/// gradients backward (StepTime.cpp step 7, stageBoundaryBytes) for each of its chunks that
/// has a neighbour, and the gradients of parameters it shares with another stage (a tied head:
/// Megatron's embedding all-reduce). 0 without Analysis::pipelineStep.
double pipelineSentBytes(const Analysis &a, int64_t rank);
/// StepTime.cpp: bytes sent across a pipeline stage boundary per micro-batch (the activations
/// the first repeat-block copy reads from outside itself).
double stageBoundaryBytes(const Graph &g, const RepeatCopies &rc);
/// PipelineStages.cpp: the trainable parameters that ops on more than one of the `p` devices
/// read (chunk k on device k mod p; `chunkOfOp` from chunkOfOps): a tied head's weight, whose
/// gradient the devices sum (Megatron's embedding all-reduce).
std::vector<TensorId> sharedStageParams(const Graph &g, const std::vector<uint32_t> &chunkOfOp, int64_t p);
/// StepTime.cpp: an error when batch is not a multiple of micro_batch × data-parallel devices
/// (the gradient accumulation steps would not be a whole number). Runs right after stepTime.
void checkAccumulation(Analysis &a, DiagnosticEngine &diags);
/// StepTime.cpp: an error when expert = e does not divide the experts of some moe op.
void checkExperts(Analysis &a, DiagnosticEngine &diags);
/// The work of an op's kernels: its forward, or its backward ops together.
struct KernelWork {
  double flops = 0, bytes = 0;
  double transcendentals = 0; ///< exp/erf/tanh/sin/cos evaluations (ForwardCost::transcendentals)
  double calls = 1;           ///< kernel calls, each paying the target's kernelOverhead and
                              ///< taking at least its kernelLaunch
  double forks = 0;           ///< of `calls`, those that start a team of threads on the host
                              ///< (forkingCalls), each paying forkOverhead in place of kernelOverhead
  /// A kernel known by measurement rather than by its op class (tally's own CUDA attention,
  /// forwardWork): the rate its arithmetic runs at (Invalid: the op's compute dtype's) and the
  /// fraction of it that it reaches (0: the target's efficiency for the op class).
  Dtype rate = Dtype::Invalid;
  double efficiency = 0;
  /// Bytes the kernel moves outside its main loop, where nothing overlaps them (flash
  /// attention's query tiles in, its output and logsumexp out: flashOutsideBytes): their time at
  /// the memory bandwidth adds to the compute side.
  double outsideBytes = 0;
  /// `efficiency` is the target's native fused attention's (Target::nativeAttention, whose exps
  /// overlap its matmuls), which the stack runs, not a measured kernel of tally's own.
  bool nativeAttention = false;
  /// A kernel known as a multiple of the one the op class prices (the FlashAttention-1-era
  /// Triton attention: FlashAttention-2's time × 1.4 forward, × 2 backward; attentionSlowdown):
  /// the kernel's time, its host terms apart, is multiplied by it.
  double slowdown = 1;
  /// Replayed from the CUDA step's graph (passes/CudaGraph.h): no launch floor.
  bool inGraph = false;
  /// Seconds of the kernel's arithmetic measured as that kernel on the target (a unary op on a
  /// calibrated host: unaryArithmetic); when > 0 it is the compute side, in place of the FLOPs
  /// at the peak and the transcendentals.
  double measuredArithmetic = 0;
};
/// KernelTime.cpp: of op `op`'s `calls` (its tensors split `split` ways), those that start a
/// team of threads on the host (KernelWork::forks): all when its largest input or output has
/// more than kForkElements elements (the elementwise, row and optimizer kernels' rule), a
/// matmul more than kForkMatmulWork multiply-adds, a fused attention more than
/// kForkAttentionWork (the runtime's own rules, codegen/runtime/cpu), else none; none on a
/// target without forkOverhead (every GPU), where the graph is not read. `tokens`: the graph's
/// activations hold that many times a call's (a decode step's ops run on one token of each
/// prompt's; parameters are whole).
double forkingCalls(const Target &t, const Graph &g, const Op &op, double split, double calls,
                    double tokens = 1);
/// KernelTime.cpp: the seconds of unary op `op`'s arithmetic (its gradient's when `backward`)
/// as the target measured its kind (Target::unaryTimes: elements × seconds per element), of a
/// dropout's forward (its random numbers and mask), and of a row kernel (a layer or RMS norm,
/// softmax, the fused loss: rows × seconds per row + elements × seconds per element, row_time
/// and elementwise_time); 0 for another op, a dropout's backward (it reads the mask), or a
/// kind the target did not measure.
double unaryArithmetic(const Target &t, const Graph &g, const Op &op, bool backward);
/// KernelTime.cpp: the name of the CPU runtime's row kernel for op kind `kind` (one of
/// Target::rowKernelNames, the op's own name), or null for another kind.
const char *rowKernelName(OpKind kind);
/// StepTime.cpp: seconds an op's kernels take on `t`: max(flops / peakFor(computeDtype), bytes /
/// bandwidth) divided by the efficiency of its op class (matmul, attention, elementwise for
/// the rest), with transcendentals × transcendentalTime added to the compute side
/// (transcendentalSeconds), plus the host terms (hostCallTime, hostBandwidth): calls ×
/// kernelOverhead added after, the cache's bandwidth for calls that fit in it; and no less
/// than calls × kernelLaunch, the time the CPU takes to launch them (GPUs). Shared by the
/// training step and inference so both price ops the same way.
double kernelTime(const Target &t, OpClass c, Dtype computeDtype, const KernelWork &w);
/// The terms kernelTime adds up, for reports that show how a time was made (tally explain):
/// total() is kernelTime's result.
struct KernelTimeTerms {
  double peak = 0, bandwidth = 0; ///< the rates used (bandwidth: the cache's for a call in it)
  double efficiency = 1;          ///< the op class's, or its measured curve's at these FLOPs
  double byteEfficiency = 1;      ///< the bytes': efficiency, or the elementwise one under a curve
  bool fromCurve = false;         ///< whether efficiency came from a measured curve
  bool measuredKernel = false;    ///< whether it came from KernelWork (a measured kernel)
  bool nativeAttention = false;   ///< whether it is the target's native attention kernel's
                                  ///< (then the exps overlap the compute: max, not sum)
  bool measuredArithmetic = false; ///< compute is KernelWork::measuredArithmetic (no FLOPs, no exps)
  double compute = 0;             ///< FLOPs / peak / efficiency (× shareFactor)
  /// On a rank of a shared host, a curve-priced call's factor on `compute`: its calls that
  /// start the team at the rank's share of the machine, the rest (one thread, as calibrated)
  /// at the whole machine's rate; 1 elsewhere (KernelTime.cpp).
  double shareFactor = 1;
  double transcendental = 0;      ///< transcendentals × transcendentalTime
  double outside = 0;             ///< outsideBytes / bandwidth, beside the arithmetic
  double memory = 0;              ///< bytes / bandwidth / byteEfficiency
  double calls = 0;               ///< calls × kernelOverhead (forks × forkOverhead in place)
  double threadedCalls = 0;       ///< of the calls, those priced as starting a team of threads
  double launch = 0;              ///< calls × kernelLaunch: the floor under the total
  double slowdown = 1;            ///< KernelWork::slowdown: multiplies the kernel's own time
  /// The host's calls that start no team run on one thread: multiplies the kernel's own time
  /// (serialFactor in KernelTime.cpp); 1 when every call is threaded, and on GPUs.
  double serial = 1;
  double total() const;
};
KernelTimeTerms kernelTimeTerms(const Target &t, OpClass c, Dtype computeDtype,
                                const KernelWork &w);
/// The kernels' work of op `i`'s forward and of its backward per micro-batch on one device, as
/// the step's time prices them: its FLOPs and bytes over its tensor split
/// (OpAnalysis::tensorSplit), less what its fused kernels save (Analysis::fusedOf); under
/// Plan::cudaStep an attention runs tally's own CUDA kernel (StepTime.cpp,
/// kCudaRuntimeAttention) and an unaligned matmul cuBLASLt's slower one
/// (kCudaRuntimeUnalignedMatmul).
/// An fp8 GEMM's bytes are its fp8 bytes (passes/Fp8.cpp) unless `asFp8` is false (the same
/// GEMM in the activation dtype, which the fp8 report compares against).
KernelWork forwardWork(const Analysis &a, OpId i, const OpAnalysis &o, bool asFp8 = true);
KernelWork backwardWork(const Analysis &a, OpId i, const OpAnalysis &o, bool asFp8 = true);

/// The activation and the weight operand of a matmul of one activation by one parameter
/// (Megatron's column/row-parallel matmuls, Transformer Engine's fp8 GEMMs); {kNone, kNone}
/// for any other op (passes/Fp8.cpp).
std::pair<TensorId, TensorId> weightMatmulOperands(const Graph &g, const Op &op);

// ---- FP8 training as Transformer Engine runs it (passes/Fp8.cpp) ----
/// The recipe's storage of an fp8 operand on the plan's target (bytes per element, copies).
Fp8Storage fp8Storage(const Plan &plan);
/// Step 1-3 (with the graph's part, after differentiate): which matmuls run in fp8, which of
/// them casts its input, and the bytes the backward keeps of each tensor (Analysis::fp8).
void selectFp8Gemms(Analysis &a);
/// Whether op `i` is an fp8 GEMM of this analysis.
bool isFp8Gemm(const Analysis &a, OpId i);
/// Op `i`'s fp8 bytes (ir/ops/Matmul.cpp, fp8GemmBytes) on the plan's target; empty when it is
/// not an fp8 GEMM.
Fp8GemmBytes fp8GemmOf(const Analysis &a, OpId i);
/// Step 5: the cast kernels around fp8 GEMM `i` per micro-batch, before its tensor split: the
/// forward's (its input's cast when it makes it, its tensors' amax histories) or the
/// backward's (its output gradient's cast and histories); no work for other ops.
KernelWork fp8CastWork(const Analysis &a, OpId i, bool backward);
/// Step 5: the cast of fp8 GEMM `i`'s weight, once per optimizer step.
KernelWork fp8WeightCastWork(const Analysis &a, OpId i);
/// StepTime.cpp, step 2c: fp8 GEMM `i` adds its casts to its times `o` (per micro-batch, after
/// its tensor split) and Analysis::fp8 records its GEMM times, the same GEMM's at the
/// activation dtype, the casts and the weights' casts per step; any other op's times are
/// recorded as the other ops'. resetFp8Times zeroes those records first.
void fp8Times(Analysis &a, OpId i, OpAnalysis &o);
void resetFp8Times(Analysis &a);
/// Step 4 (from staticMemory): the weights' fp8 copies and the amax histories per device.
void fp8Memory(Analysis &a);
/// StepTime.cpp: the bytes flash attention op `i` moves outside its main loop, which its
/// arithmetic does not hide: forward, each query tile's Q in and its output and logsumexp out
/// once; backward (FlashAttention-2's loop over key tiles), K and V in and dK and dV out once.
/// 0 for other ops, materialised attention, and on a target with a measured attention curve
/// (the calibrated host's holds the whole kernel).
double flashOutsideBytes(const Analysis &a, OpId i, bool backward);
/// The factor on op `i`'s FLOPs for the scores a calibrated host's attention tiles compute
/// (Target::attentionTile, tiledScoreRatio): > 1 for a fused causal attention on a host whose
/// curve counts the tiles' FLOPs, 1 for any other op or target. asRun prices it; tally explain
/// prints it.
double hostAttentionTiles(const Analysis &a, OpId i);
/// Per op, what the step time divides its work by on one device (StepTime.cpp, step 1): the
/// tensor degree for the ops tensor parallelism splits (every op under sequence parallelism),
/// times the context degree.
std::vector<double> opWorkSplits(const Graph &g, const Plan &plan);
/// Tensor parallelism's split of the forward graph, the one rule the estimate prices
/// (StepTime.cpp, step 1), the activation planner sizes (ActivationFacts.cpp) and the
/// generated step runs (TensorShard.cpp): which storages each rank holds 1/t of, which weight
/// matmuls are row-parallel (their output all-reduced in the forward) and column-parallel, and
/// the storages read by column-parallel matmuls whose gradients are all-reduced in the backward
/// (once per storage). Empty lists of `t` entries, all false, without tensor parallelism.
struct TensorSplit {
  std::vector<bool> split;          ///< per storage
  std::vector<bool> rowParallel;    ///< per op
  std::vector<bool> columnParallel; ///< per op
  std::vector<TensorId> columnInputs;
  /// Sequence parallelism (empty without): per storage, each rank holds 1/t of its tokens.
  std::vector<bool> sequenceSplit;
  /// Sequence parallelism: the trainable parameters whose gradients are per-rank partial sums
  /// (only sequence-split ops read them), all-reduced over the tensor group once per step.
  std::vector<TensorId> sequenceParams;
};
TensorSplit tensorSplit(const Graph &g, const Plan &plan);
/// Plan::tensorStep: the forward graph as one tensor-parallel rank of the generated step holds
/// it (TensorShard.cpp): each split tensor's last dimension, each split weight's, and
/// attention's heads divided by t; the same ops and tensor ids. "" on success, else why the
/// step cannot run this split (the op is named, and `at` set to it); `shards` gets each
/// parameter's cut.
/// Plan::tensorStep with sequence_parallel: the step graph built from that shard with each
/// sequence-split tensor (TensorSplit::sequenceSplit of the forward graph `g`; a gradient as its
/// forward tensor, a shared gradient as the one it shares) cut along its `seq` dimension to one
/// rank's 1/t, that dimension in `dim` (-1 elsewhere; views keep their whole shapes: the step
/// reads them gathered). "" on success, else why not.
std::string shardSequence(const Graph &g, const Plan &plan, Graph &step, std::vector<int8_t> &dim);
std::string shardForTensorParallel(const Graph &g, const Plan &plan, Graph &out,
                                   std::vector<TensorShardOf> &shards, OpId &at);
/// The bytes one rank sends per step in the tensor-parallel collectives the step time prices,
/// as a ring sends them (2(t−1)/t of each all-reduce's message; Collectives.cpp): those every
/// rank runs and, under the generated tensor x pipeline step, those of pipeline stage `stage`.
double tensorParallelSentBytes(const Analysis &a, int64_t stage = 0);
/// `w` over a tensor split of `split` devices: its FLOPs, bytes, transcendentals and outside
/// bytes divided, the same calls on each.
KernelWork splitWork(KernelWork w, double split);
/// Whether `op`'s backward runs (and is priced): a train plan, and an input that needs a
/// gradient.
bool hasBackward(const Graph &g, const Plan &plan, const Op &op);
/// Model FLOPs utilisation of a training step that takes `stepSeconds`: the model FLOPs of all
/// devices (forward + backward) over stepSeconds × each device's peak × the devices. The
/// estimate's a.time.mfu, and `tally run`'s for the measured step.
double modelFlopsUtilization(const Analysis &a, double stepSeconds);
/// The peak MFU and HFU divide by: the datasheet's dense peak of the rate matrix products run
/// at, at the datasheet clock.
double utilizationPeak(const Analysis &a);
/// StepTime.cpp: the expert all-to-alls a train step exposes of `all` seconds on one device
/// over its `m` micro-batches beside `compute` seconds of its compute (expert_overlap:
/// Megatron-Core's combined 1F1B; else all of them).
double exposedExpertComm(const Plan &plan, double all, double m, double compute);
/// MfuConventions.cpp: a.time.mfuConventions for a train plan, after stepTime; what they read
/// of the graph alone (Analysis::time.mfuFacts, made by analyzeGraph for a train plan).
void mfuConventions(Analysis &a);
std::shared_ptr<const MfuGraphFacts> mfuGraphFacts(const Graph &g);
/// Inference.cpp: for infer plans, prefill and per-token decode, KV cache, tokens/s, and the
/// serving numbers that are times (time to first token, inter-token latency at max_context).
void inference(Analysis &a);
/// Inference.cpp: for infer plans, after allocatorReserve: the memory the paged KV cache may
/// take and how many sequences of max_context tokens fit in it (max_concurrent).
void servingCapacity(Analysis &a);
/// Inference.cpp: an error when max_context passes the rows of the model's learned positional
/// table.
void checkServing(const Analysis &a, DiagnosticEngine &diags);
/// PrecisionLints.cpp: literals that underflow or overflow the dtype they are used in, fp16
/// without loss scaling, optimizer state below fp32.
void precisionLints(Analysis &a, DiagnosticEngine &diags);
/// MatmulAlignment.cpp: matmuls on a GPU whose rows (K or N elements) are not a multiple of 16
/// bytes, which tensor-core kernels need (the unaligned-matmul warning).
void matmulAlignment(const Analysis &a, DiagnosticEngine &diags);
/// MatmulAlignment.cpp: whether op `i` is such a matmul (StepTime prices it under cudaStep),
/// whatever its time.
bool unalignedMatmul(const Analysis &a, OpId i);
/// UnusedParams.cpp: parameters that no op reads (the unused-value warning).
void unusedParams(Analysis &a, DiagnosticEngine &diags);
/// UnusedParams.cpp: computed locals whose value reaches no output (unused-value, with the
/// forward FLOPs spent on them).
void unusedLocals(const Analysis &a, DiagnosticEngine &diags);
/// Budgets.cpp: the plan's budgets against the analysis, with fixes computed by the solvers.
void checkBudgets(Analysis &a, DiagnosticEngine &diags, const Relower &relower);

/// BlockTotals.cpp: per block instance, the FLOPs and time of the ops written in it and in
/// the blocks below it (the "FLOPs by block" of the report).
void blockTotals(Analysis &a);

// ---- the pipeline (Pipeline.cpp) -----------------------------------------------------------

/// The graph size from which an analysis uses a second thread (analyzeGraph's pricing,
/// planActivations' curve): starting a thread costs tens of microseconds, what pricing ~700
/// ops does.
constexpr size_t kThreadedOps = 4096;

/// The passes that depend only on the graph, the precision and the optimizer (parameters,
/// op costs, the backward): the part of an analysis every layout of the same graph shares.
/// `step`: the training step already built for this graph and an equal plan (sameStep), used
/// instead of building it again. `compactStep`: build a compact step (buildTrainingStep) when
/// nothing but these passes and the step's check will read it. On a graph of kThreadedOps ops
/// or more, the step is built on this thread while another counts the parameters and prices
/// the ops (they read the same graph and write nothing the other reads), and, with `prepare`
/// (a plan's own analysis, which walks next), makes the saved lists and the walks' graph
/// facts (prepareWalks).
/// `sameGraph`: an analysis of the same graph whose gradient shares, and saved lists when its
/// stack fuses gates alike, are taken instead of made again (AnalysisManager's graph parts).
Analysis analyzeGraph(const Graph &g, const Plan &plan, std::shared_ptr<const Graph> step = nullptr,
                      bool compactStep = false, bool prepare = false,
                      const Analysis *sameGraph = nullptr);
/// analyzeGraph, then the training step verified (an internal-error diagnostic if not): the
/// pipeline as far as `--emit=ir` needs, without the layout passes, lints or budgets.
Analysis analyzeStep(const Graph &g, const Plan &plan, DiagnosticEngine &diags, bool compactStep = false,
                     bool prepare = false);
/// The passes that price a layout (static memory, activations, roofline, step time, the
/// allocator reserve) on a copy of `graphPart` (analyzeGraph of the same graph) for `plan`,
/// which may differ from its plan in the target, the parallel layout and the checkpoint
/// policy only. Its memory and time equal analyze's; the memory plan, lints, budgets, block
/// totals and the checkpoint trade-off curve are not computed (a what-if analysis). With
/// `timed` false a train plan's memory and FLOPs alone are priced: the passes after the
/// activations that write neither (roofline, step time, their checks) are skipped, and the
/// time is left 0 (the memory fixes read the peak and FLOPs only; issue 41).
/// `final` (with `timed` false): the caller never prices its time (Analysis::scheduleUnread).
Analysis analyzeLayout(const Analysis &graphPart, const Plan &plan, DiagnosticEngine &diags,
                       bool timed = true, bool final = false);
/// The rest of analyzeLayout: the time of a candidate priced untimed (Analysis::timePending),
/// the same numbers analyzeLayout's `timed` gives; a search prices memory first and the time
/// of only the candidates that fit (issue 41).
void priceLayoutTime(Analysis &a, DiagnosticEngine &diags);
/// Runs every pass in order on a lowered graph and its plan, computing what `wants` names
/// (passes/Analysis.h, Results) and what the diagnostics need.
Analysis analyze(const Graph &g, const Plan &plan, DiagnosticEngine &diags,
                 const Relower &relower = {}, Results wants = Results::all());

} // namespace tally
