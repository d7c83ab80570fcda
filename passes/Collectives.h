// Collectives as NCCL runs them: for one collective over one group of devices, the algorithm
// and protocol NCCL's tuner would pick, its latency and bandwidth terms, and its time. The step
// time (StepTime.cpp) prices every data-, tensor-, context- and pipeline-parallel transfer with
// it, and `tally explain --collectives` prints its terms. docs/time.md, "Collectives as NCCL
// runs them", states the model and where each number comes from.
#pragma once

#include "ir/Plan.h"
#include "ir/Target.h"

#include <string>

namespace tally {

/// How one parallel group sits on the nodes: `n` members, `k` of them in one node, spread
/// over `r` nodes (docs/time.md, "Placement").
struct Placement {
  double n = 1, k = 1, r = 1;
};

/// The group of dimension `dim` of `plan` ('t' tensor, 'c' context, 'p' pipeline, 'd' data,
/// 'e' the expert group, 'x' the data ranks holding the same experts).
Placement place(const Plan &plan, char dim);

/// Where the plan puts its ranks (Parallelism::order, innermost first): rank q sits at
/// coordinate (q / stride) % degree along dimension `dim` ('t', 'c', 'p', 'd'), the stride being
/// the product of the degrees of the dimensions inside it. place() groups the ranks by this
/// stride and the generated step splits its MPI groups by it (codegen/EmitStep.cpp, kLayout).
int64_t rankStride(const Plan &plan, char dim);
int64_t rankCoordinate(const Plan &plan, int64_t rank, char dim);

enum class Collective { AllReduce, ReduceScatter, AllGather, AllToAll };

/// NCCL's algorithms (src/include/device.h's NCCL_ALGO_*), and Direct for the grouped
/// point-to-point sends an all-to-all is made of.
enum class CollAlgorithm { Ring, Tree, Nvls, NvlsTree, Pat, CollNet, Direct };
/// NCCL's protocols: LL (8-byte flag+data stores, the lowest latency, half the bandwidth or
/// less), LL128 (128-byte lines, 120 of data), Simple (bulk copies behind a fence).
enum class CollProtocol { LL, LL128, Simple };

const char *collectiveName(Collective c);   ///< "all-reduce", ...
const char *algorithmName(CollAlgorithm a); ///< "ring", "tree", "nvls", "nvls-tree", ...
const char *protocolName(CollProtocol p);   ///< "LL", "LL128", "Simple"

/// One collective as priced: the chosen algorithm and protocol and the terms of its time,
/// time = latency + bytes / algorithmBandwidth.
struct CollectiveCost {
  Collective kind = Collective::AllReduce;
  CollAlgorithm algorithm = CollAlgorithm::Ring;
  CollProtocol protocol = CollProtocol::Simple;
  Placement group;
  double bytes = 0;          ///< the buffer: an all-reduce's, a reduce-scatter's input, an
                             ///< all-gather's output, an all-to-all's send buffer
  double intraSteps = 0;     ///< latency steps inside a node (ring hops, tree levels)
  double interSteps = 0;     ///< latency steps across nodes
  double latency = 0;        ///< seconds: the algorithm's base plus every step's
  double busBandwidth = 0;   ///< B/s a device moves at (NCCL's busBw), after efficiency
  double algBandwidth = 0;   ///< B/s of `bytes` (NCCL's algBw): transfer = bytes / algBandwidth
  double transfer = 0;       ///< seconds
  double time = 0;           ///< latency + transfer
};

/// One collective of `bytes` over group `g` on target `t`: NCCL's candidates for the kind
/// (ring and, for an all-reduce, tree; NVLS and NVLS-tree on NVLink-switch nodes; PAT for an
/// all-gather or reduce-scatter with one member per node; CollNet where the target has
/// in-network reduction), each with each protocol NCCL would enable, and the fastest of them,
/// as NCCL's tuner picks (src/graph/tuning.cc). An all-to-all is grouped sends. A group of one
/// or no bytes costs nothing (time 0).
CollectiveCost collectiveCost(const Target &t, const Placement &g, Collective c, double bytes);

/// Seconds of collectiveCost(...).time.
double collectiveTime(const Target &t, const Placement &g, Collective c, double bytes);

/// The bytes each member of the group sends in one collective `c` as a ring runs it (NCCL's
/// ring algorithm, and the generated CPU step's ZeRO 2 and 3 collectives, codegen/program/
/// tally_comm.h): a reduce-scatter or all-gather of B bytes over n members sends (n − 1)/n · B
/// from every member, an all-reduce (a reduce-scatter, then an all-gather) twice that, an
/// all-to-all the (n − 1)/n of its send buffer that leaves the member.
double ringSentBytes(const CollectiveCost &c);

/// A point-to-point send of `bytes` over the link, or the network when `network`: one Simple
/// step's latency of that tier plus bytes / bandwidth.
double sendTime(const Target &t, bool network, double bytes);

/// The fraction of a GPU's compute a collective takes while it runs beside compute: NCCL runs
/// each channel as one CUDA block, which holds a multiprocessor for the collective's duration
/// (NCCL's documentation, NCCL_NCHANNELS / NCCL_MIN_CTAS: "one CTA per channel"), so kernels
/// overlapped with it run on the other multiprocessors: channels / multiprocessors (16 of 132
/// on an H100, 12.1%; 16 of 108 on an A100, 14.8%). On a GPU whose matmuls are persistent
/// kernels (persistentGemms) a matmul loses more: it launches one block per multiprocessor,
/// each owning 1/SMs of the tiles, so with NCCL's blocks resident the blocks that find no free
/// multiprocessor run as a second wave as long as the first — the matmul progresses at
/// 1 / ceil(SMs / (SMs − channels)) of its rate (one half on an H100). `matmulShare` is the
/// part of the overlapped compute's time that is matmuls. 0 for a target that states no
/// multiprocessors (a CPU, a user GPU without them). docs/time.md, "Overlap is not free".
double overlapInterference(const Target &t, double matmulShare);

/// Whether the target's matmul library launches persistent kernels, one block per
/// multiprocessor looping over output tiles: Hopper (compute capability 9.x), whose cuBLAS and
/// CUTLASS 3 GEMMs use the SM90 persistent tile scheduler (CUTLASS
/// include/cutlass/gemm/kernel/tile_scheduler_params.h, `get_grid_shape`: the launch grid is
/// min(sm_count, output tiles)). Ampere's launch a block per tile; Blackwell's schedulers
/// (cluster launch control) hand tiles to whichever blocks run, so neither makes a second wave.
bool persistentGemms(const Target &t);

/// PCIe 4.0 x16, per direction: the host link assumed when a user target states none.
constexpr double kDefaultHostLink = 32e9;

/// The host link after efficiency (the default when the target states none): what copies
/// between host and device memory (offload, the inference KV cache's spill) move at.
double hostLinkBandwidth(const Target &t);
/// The device-to-device bandwidth after efficiency: the interconnect, or the host link when a
/// target states no interconnect (traffic then crosses PCIe).
double commBandwidth(const Target &t);
/// The inter-node bandwidth per device after efficiency: the network, or the host link when
/// the target states no network.
double networkBandwidth(const Target &t);

} // namespace tally
