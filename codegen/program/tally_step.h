// tally generated steps: the interface between a generated training step (step.cpp, written by
// `tally build`) and the driver that runs it (driver_cpu.cpp, the same for every model). The
// step describes its memory plan in kLayout; the driver allocates exactly those regions, fills
// the parameters and the data, runs train_step and prints what it measured as JSON.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
// The CUDA runtime's context is rt::cu::Ctx, spelled rt::Ctx through an alias (cuda/ctx.cuh).
namespace rt {
namespace cu {
struct Ctx;
}
using Ctx = cu::Ctx;
} // namespace rt
#else
namespace rt {
struct Ctx;
}
#endif

namespace tally_step {

constexpr int kMaxRank = 8;

/// A tensor the driver reads or writes by name: parameters and input data.
struct TensorInfo {
  const char *name;      ///< "h.0.attn.qkv.weight" (safetensors naming: `h[0]` is `h.0`)
  const char *dtype;     ///< "F32", "BF16", "F16", "I32"
  int rank;
  int64_t shape[kMaxRank];
  int64_t numel;
};

/// How the driver initialises a parameter when no --init file is given.
enum class Init : int { Normal002, Ones, Zeros };

struct ParamInfo {
  TensorInfo t;
  int64_t offset;        ///< byte offset in the params region
  bool trainable;
  int64_t grad;          ///< byte offset in the grads region (-1: frozen)
  int64_t master;        ///< byte offset in the master region (-1: no master copy); under ZeRO
                         ///< (Layout::shard > 0) in the whole master laid out in the grads
                         ///< region's element order, of which the region holds this rank's shard
  Init init;
  /// Tensor parallel (Layout::tensor > 1): `t` is the whole parameter, of which this rank's
  /// regions hold one cut: dimension tpDim (-1: whole on every rank) viewed as [tpParts,
  /// tensor, size / (tpParts·tensor)], rank r holding [:, r, :] (passes/TensorShard.cpp).
  int tpDim;
  int64_t tpParts;
};

struct InputInfo {
  TensorInfo t;          ///< the shape of one micro-batch
  int64_t offset;        ///< byte offset in the data region
  bool batched;          ///< the first dimension is the batch: micro-batch m reads rows m·mb..
  int64_t vocab;         ///< integer inputs without --data: drawn uniformly in [0, vocab)
};

/// The memory plan in bytes, the step's shape and the tables above.
struct Layout {
  const char *model, *plan, *source, *backend;
  int64_t arenaBytes, paramsBytes, gradsBytes, masterBytes, optimizerBytes, dataBytes;
  const char *gradsDtype, *masterDtype; ///< masterDtype "" when there is no master copy
  int64_t batch, microBatch;
  int64_t microSteps;    ///< micro-batches of one rank per step: batch / (microBatch × ranks)
  double lossScale;      ///< 1 unless fp16 loss scaling
  double modelFlops;     ///< model FLOPs of one optimizer step (forward + backward + update)
  int nparams, ninputs;
  const ParamInfo *params;
  const InputInfo *inputs;
  /// Data parallelism: the step runs on `ranks` processes (MPI), rank r training on rows
  /// [r·batch/ranks, (r+1)·batch/ranks) of each batch; zero = 1 shards master and optimizer:
  /// rank r owns elements [r·shard, (r+1)·shard) of the grads region (shard 0: no sharding);
  /// zero = 2 and 3 cut every tensor of grads, master and optimizer (3: and params) into
  /// pieces, rank r holding elements [r·c, min(n, (r+1)·c)), c = ⌈n/ranks⌉, at the offsets of
  /// kParams (driver_host.h, WholeModel).
  int64_t ranks;
  int zero;
  int64_t shard;
  /// Tensor parallelism: the step runs on ranks × tensor processes, rank q being tensor rank
  /// (q / tensorStride) % tensor of data rank (q / dataStride) % ranks, the strides of the
  /// plan's rank order (passes/Collectives.h, rankStride; the default order puts the tensor
  /// group innermost: tensorStride 1, dataStride tensor); 1 without.
  int64_t tensor;
  /// Pipeline parallelism: the step runs on `pipeline` processes (times `ranks` under data ×
  /// pipeline), a rank running stage s (its chunks s, s + pipeline, ...; s its pipeline
  /// coordinate by the plan's rank order) with its own regions and arena: this layout is stage
  /// `stage`'s (select_stage); 1 and 0 without. A parameter of another stage has offset -1 (its grad and
  /// master offsets are then placeholders, so that every rank lays the whole model out alike).
  int64_t pipeline;
  int64_t stage;
  int64_t tensorStride, dataStride;
};
/// The layout of this process's stage (the only one without pipeline parallelism).
extern Layout kLayout;
/// Selects rank `rank`'s stage layout into kLayout (before anything reads it); a no-op without
/// pipeline parallelism.
void select_stage(int rank);

/// The regions, allocated by the driver (aligned to 256 bytes, zero-filled) before any call.
struct Memory {
  uint8_t *arena, *params, *grads, *master, *optimizer, *data;
};
extern Memory mem;

/// The op class of the kernel running now ("matmul", "attention", ..., "optimizer"): the kernel
/// timer files each kernel's time under it.
extern const char *op_class;
/// CPU steps: the path of the op running now ("h[0].attn.qkv.matmul", "zero_grad") and its
/// index in the step graph (`tally report --emit=ir`; -1 for a site that is no op of it, or
/// whose op has another path): set beside op_class before every call, read by the kernel
/// timer only while the driver traces a step (--trace).
extern const char *op_path;
extern int op_id;

/// One optimizer step: for each micro-batch, load_micro_batch(m) fills the data region and
/// the forward and backward run; then the update (skipped when fp16 gradients overflowed) and,
/// after before_zero (may be null), zero-grad. Returns the mean loss of the micro-batches;
/// *updated says whether the update ran. `step` is 1-based (Adam's bias correction); `seed`
/// keys the random streams (dropout), micro-batch m using seed + m. With ranks > 1 the
/// gradients are averaged over the ranks before the update (and before before_zero, which
/// then sees the averaged gradients); the returned loss is this rank's. check_gradients (may
/// be null) runs once the gradients are complete (averaged, under data parallelism) and before
/// the update: the driver's non-finite gradient check.
double train_step(rt::Ctx &ctx, int64_t step, uint64_t seed, void (*load_micro_batch)(int64_t m),
                  void (*before_zero)(), bool *updated, void (*check_gradients)());

} // namespace tally_step
