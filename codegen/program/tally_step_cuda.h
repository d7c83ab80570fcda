// tally generated steps, CUDA only: what a generated step.cu gives its driver (driver_cuda.cu)
// beyond driver/tally_step.h. The kernels' CUDA-event times come back with the op path that
// was in ctx.where when they launched; kOpSites gives each path's op class, so the driver files
// kernel times by op class as the CPU driver does (the CPU step sets the op_class global).
//
// The CUDA graph (passes/CudaGraph.h, docs/cuda.md "CUDA graphs"): train_step() runs its graph
// region, forward_backward(), through step_graph.run(). Off (the warm-up, --no-graph, or kGraph
// not captured) it runs the region's calls; on, the first call captures them on the step's
// stream (cudaStreamCaptureModeThreadLocal: a host synchronisation or allocation inside the
// region fails the capture, naming the call) and instantiates the graph, and every call
// launches it once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tally_step {

/// One op path that ctx.where takes in the step, and its op class ("matmul", "attention", …).
struct OpSite {
  const char *path;
  const char *op_class;
};
extern const OpSite kOpSites[];
extern const int kNumOpSites;

/// 256 bytes of device memory the driver allocates beside the regions, for scalars the host reads
/// back: the fp16 overflow check's sum of squares (rt::sum_squares writes its result there).
extern float *device_scalars;

/// 8 bytes per micro-batch of device memory (the driver allocates kLayout.microSteps slots): the
/// loss of micro-batch m is copied to slot m inside the graph region, and read_losses() reads
/// them after it.
extern uint8_t *device_losses;

/// What the generated step says of its graph (passes/CudaGraph.h): whether its graph region is
/// captured, else why not, and what runs outside the region with the reason, {null, null} last.
struct GraphPlan {
  bool captured;
  const char *why_not;
  struct Outside {
    const char *what, *why;
  } outside[8];
};
extern const GraphPlan kGraph;

/// The graph region's runner (see the banner). on: set by the driver after the warm-up when
/// kGraph.captured and not --no-graph.
struct StepGraph {
  bool on = false;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  size_t nodes = 0; ///< kernels, copies and collectives in the captured graph
  /// Called after each launch of the graph captured earlier (not the capturing call, whose
  /// region ran on the host): the driver counts the captured collectives' bytes again.
  void (*on_replay)() = nullptr;

  template <class F> void run(rt::Ctx &ctx, F &&region) {
    if (!on) {
      region();
      return;
    }
    const bool replay = exec != nullptr;
    if (!exec) {
      const char *saved = ctx.where;
      const bool timing = ctx.timing;
      ctx.timing = false; // no per-kernel events inside the graph
      rt::cu::check(cudaStreamBeginCapture(ctx.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture",
                    "train_step (CUDA graph)", ctx.where);
      region();
      rt::cu::check(cudaStreamEndCapture(ctx.stream, &graph), "cudaStreamEndCapture", "train_step (CUDA graph)",
                    ctx.where);
      rt::cu::check(cudaGraphGetNodes(graph, nullptr, &nodes), "cudaGraphGetNodes", "train_step (CUDA graph)",
                    ctx.where);
      rt::cu::check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate", "train_step (CUDA graph)",
                    ctx.where);
      ctx.timing = timing;
      ctx.where = saved;
    }
    rt::cu::check(cudaGraphLaunch(exec, ctx.stream), "cudaGraphLaunch", "train_step (CUDA graph)", ctx.where);
    if (replay && on_replay)
      on_replay();
  }

  ~StepGraph() {
    if (exec)
      cudaGraphExecDestroy(exec);
    if (graph)
      cudaGraphDestroy(graph);
  }
};
extern StepGraph step_graph;

} // namespace tally_step
