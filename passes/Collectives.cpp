// Collectives as NCCL runs them (docs/time.md, "Collectives as NCCL runs them").
//
// NCCL prices each (algorithm, protocol) pair of a collective with a latency and a bandwidth and
// runs the fastest (its tuner's model, src/graph/tuning.cc: ncclTopoTuneModel and
// ncclTopoGetAlgoTime). This file does the same with the target's bandwidths:
// 1. The group's placement: n members, k per node, r nodes, ppn = n/r (place()).
// 2. The bus bandwidth B a member moves data at: its link inside one node; across nodes the
//    node's way out, min(link, k × network) (k × network when k = 1), after efficiency.
// 3. Per candidate (ring for every kind; tree for an all-reduce; NVLS inside an NVLink-switch
//    node and NVLS-tree across such nodes; PAT for an all-gather or reduce-scatter with one
//    member per node; CollNet for an all-reduce where the target has in-network reduction) and
//    per protocol (LL, LL128, Simple, as NCCL enables them), NCCL's refinements of B (LL halves
//    it and is capped, LL128 keeps 120 of 128 bytes, a tree keeps 0.92), its conversion from bus
//    to algorithm bandwidth, and its latency: a base per algorithm and protocol plus each step
//    of the chain at the latency of the tier it crosses (ring: n − 1 steps per phase, r − 1 of
//    them across nodes; tree: the chain inside a node and log2 r levels across, up and down).
// 4. time = latency + bytes / algorithm bandwidth; the fastest candidate is the cost.
// Each step's latency is NCCL's table scaled by the target's own: link_latency and
// network_latency are the Simple protocol's ring step on each tier (3.4 us on NVLink, 5.7 us
// on PCIe, 14 us across nodes in NCCL's table), and the other entries keep their ratio to it.
#include "passes/Collectives.h"

#include "passes/Passes.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>

namespace tally {

namespace {

constexpr double us = 1e-6;

/// Tiers of NCCL's latency table (NCCL_HW_NVLINK, NCCL_HW_PCI, NCCL_HW_NET).
enum Tier { NVLink, PCI, Net };

/// Per-step latencies in us of NCCL's tuner (tuning.cc, ncclTunerConstantsDefaults.hwLatencies)
/// by tier, for ring, tree, NVLS, NVLS-tree, PAT and CollNet-direct, each {LL, LL128, Simple}.
struct StepLatency {
  double ring[3], tree[3], nvls[3], nvlsTree[3], pat[3], collnet[3];
};
constexpr StepLatency kStep[3] = {
    /* NVLink */ {{0.6, 1.9, 3.4}, {0.6, 1.25, 4.0}, {0, 0, 25}, {0, 0, 25}, {0, 0, 4.0}, {0, 0, 3.7}},
    /* PCI */ {{1.0, 2.5, 5.7}, {1.0, 1.9, 4.0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 4.0}, {0, 0, 3.7}},
    /* Net */ {{2.7, 4.0, 14.0}, {5.0, 8.5, 14.0}, {0, 0, 18}, {0, 0, 20.9}, {0, 0, 14}, {0, 0, 31}},
};
/// The base latency in us of an algorithm's launch (baseLatencies): ring and tree per protocol,
/// PAT; NVLS, NVLS-tree and CollNet have none.
constexpr double kBaseRing[3] = {6.6, 14.0, 8.4};
constexpr double kBaseTree[3] = {6.8, 14.0, 8.4};
constexpr double kBasePat = 8.0;
/// PAT's linear term per rank, in us (tuning.cc: "still a linear part").
constexpr double kPatPerRank = 2.8;
/// The CPU's cost of posting one network operation (getNetOverhead, x86): a ring step across
/// nodes takes at least this inside the node too, three times under Simple.
constexpr double kNetOverhead = 1.0;
/// Channels NCCL opens (an assumption: 16, as Target's communication buffers count them): only
/// the ring's plateau test and NVLS's (channels − 1)/channels read it.
constexpr double kChannels = 16;
/// Simple-protocol ring step per tier, the targets' default link and network latencies.
constexpr double kSimpleRing[3] = {3.4, 5.7, 14.0};

/// NCCL's tree correction by message size (treeCorrectionFactor, powers of two from 64 B),
/// per protocol: trees fall short of their model at medium sizes.
constexpr double kTreeCorrection[3][24] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9},
};

/// NCCL's architecture index (Volta, Ampere, Hopper, Blackwell) of a compute capability; a
/// target that states none is taken as Ampere.
int archIndex(const Target &t) {
  int cc = t.computeCapability > 0 ? t.computeCapability : 80;
  return cc >= 100 ? 3 : cc >= 90 ? 2 : cc >= 80 ? 1 : 0;
}

/// The LL protocol's bandwidth cap in B/s (llMaxBws): one node by architecture; across 2 or
/// more nodes by the host CPU (x86 Intel taken).
double llMaxBandwidth(const Target &t, double nodes) {
  constexpr double single[4] = {39.0, 87.7, 141.0, 282.0};
  double gbs = nodes <= 1 ? single[archIndex(t)] : nodes <= 2 ? 39.0 : 20.4;
  return gbs * 1e9;
}

int log2i(double x) { return x >= 1 ? static_cast<int>(std::floor(std::log2(x))) : 0; }

/// Whether the node's devices are joined by NVLink (faster than the host's PCIe) rather than
/// PCIe, the tier of NCCL's intra-node latencies.
Tier intraTier(const Target &t) {
  double host = t.hostLink > 0 ? t.hostLink : kDefaultHostLink;
  return t.interconnect > 0 && t.interconnect > host ? NVLink : PCI;
}

struct LatencyScale {
  double intra = 1, net = 1;
};
/// The target's latencies over NCCL's: link_latency and network_latency are the Simple ring
/// step on each tier; every other entry of the tier scales with them (0: no latency).
LatencyScale latencyScale(const Target &t) {
  LatencyScale s;
  s.intra = t.linkLatency / (kSimpleRing[intraTier(t)] * us);
  s.net = t.networkLatency / (kSimpleRing[Net] * us);
  return s;
}

} // namespace

const char *collectiveName(Collective c) {
  switch (c) {
  case Collective::AllReduce: return "all-reduce";
  case Collective::ReduceScatter: return "reduce-scatter";
  case Collective::AllGather: return "all-gather";
  case Collective::AllToAll: return "all-to-all";
  }
  return "?";
}

const char *algorithmName(CollAlgorithm a) {
  switch (a) {
  case CollAlgorithm::Ring: return "ring";
  case CollAlgorithm::Tree: return "tree";
  case CollAlgorithm::Nvls: return "nvls";
  case CollAlgorithm::NvlsTree: return "nvls-tree";
  case CollAlgorithm::Pat: return "pat";
  case CollAlgorithm::CollNet: return "collnet";
  case CollAlgorithm::Direct: return "direct";
  }
  return "?";
}

const char *protocolName(CollProtocol p) {
  switch (p) {
  case CollProtocol::LL: return "LL";
  case CollProtocol::LL128: return "LL128";
  case CollProtocol::Simple: return "Simple";
  }
  return "?";
}

bool persistentGemms(const Target &t) { return t.computeCapability / 10 == 9; }

double overlapInterference(const Target &t, double matmulShare) {
  if (t.multiprocessors <= 0)
    return 0;
  double sms = static_cast<double>(t.multiprocessors);
  double blocks = std::min(1.0, kChannels / sms);
  if (!persistentGemms(t) || kChannels >= sms)
    return blocks;
  double waves = std::ceil(sms / (sms - kChannels));
  double share = std::clamp(matmulShare, 0.0, 1.0);
  return share * (1 - 1 / waves) + (1 - share) * blocks;
}

double hostLinkBandwidth(const Target &t) {
  return (t.hostLink > 0 ? t.hostLink : kDefaultHostLink) * t.efficiency.hostLink;
}

double commBandwidth(const Target &t) {
  double link = t.interconnect > 0 ? t.interconnect : t.hostLink > 0 ? t.hostLink : kDefaultHostLink;
  return link * t.efficiency.communication;
}

double networkBandwidth(const Target &t) {
  double link = t.network > 0 ? t.network : t.hostLink > 0 ? t.hostLink : kDefaultHostLink;
  return link * t.efficiency.communication;
}

namespace {
/// The degree of dimension `c` ('t', 'p', 'c', else data), at least 1.
int64_t rankDegree(const Parallelism &par, char c) {
  int64_t d = c == 't' ? par.tensor : c == 'p' ? par.pipeline : c == 'c' ? par.context : par.data;
  return d > 1 ? d : 1;
}
} // namespace

int64_t rankStride(const Plan &plan, char dim) {
  const Parallelism &par = plan.parallel;
  int64_t stride = 1;
  for (char c : par.order) {
    if (c == dim)
      break;
    int64_t d = rankDegree(par, c);
    stride = stride > INT64_MAX / d ? INT64_MAX : stride * d; // the plan's devices bound it
  }
  return stride;
}

int64_t rankCoordinate(const Plan &plan, int64_t rank, char dim) {
  return rank / rankStride(plan, dim) % rankDegree(plan.parallel, dim);
}

Placement place(const Plan &plan, char dim) {
  const Parallelism &par = plan.parallel;
  auto deg = [&](char c) { return static_cast<double>(rankDegree(par, c)); };
  // The expert group ('e') is the innermost e of the data ranks, the expert-data group ('x')
  // the data ranks that hold the same experts, e apart. Under MoE parallel folding
  // (expertLayout) the MoE layers' ranks are ordered tp-ep-dp from the innermost tensor rank:
  // the expert group is e consecutive ranks of the tensor × data ranks, and the expert-data
  // group the t·d/e ranks e apart.
  const ExpertLayout experts = expertLayout(par);
  double e = experts.ep;
  bool expertDim = dim == 'e' || dim == 'x';
  double stride = static_cast<double>(rankStride(plan, expertDim ? (experts.folded ? 't' : 'd') : dim));
  Placement g;
  g.n = deg(dim);
  if (expertDim) {
    g.n = dim == 'e' ? e : experts.folded ? experts.edp : std::max(1.0, deg('d') / e);
    stride *= dim == 'x' ? e : 1;
  }
  g.k = g.n;
  if (plan.target.network <= 0)
    return g;
  double node = static_cast<double>(std::max<int64_t>(1, plan.target.gpusPerNode));
  g.k = stride < node ? std::min(g.n, std::floor((node - 1) / stride) + 1) : 1;
  g.r = std::ceil(g.n / g.k);
  return g;
}

namespace {

/// Grouped sends (NCCL runs an all-to-all as one group of point-to-point sends): each member
/// sends 1/n of its buffer to every other member at once, k − 1 parts over the link and n − k
/// through its share of the network, the two in parallel; one latency of the slowest tier.
CollectiveCost allToAll(const Target &t, const Placement &g, double bytes) {
  CollectiveCost c;
  c.kind = Collective::AllToAll;
  c.algorithm = CollAlgorithm::Direct;
  c.group = g;
  c.bytes = bytes;
  double inside = (g.k - 1) / g.n * bytes / commBandwidth(t);
  double outside = g.r > 1 ? (g.n - g.k) / g.n * bytes / networkBandwidth(t) : 0;
  c.intraSteps = g.r > 1 ? 0 : 1;
  c.interSteps = g.r > 1 ? 1 : 0;
  c.latency = g.r > 1 ? t.networkLatency : t.linkLatency;
  c.transfer = std::max(inside, outside);
  c.busBandwidth = g.r > 1 ? networkBandwidth(t) : commBandwidth(t);
  c.algBandwidth = c.transfer > 0 ? bytes / c.transfer : 0;
  c.time = c.latency + c.transfer;
  return c;
}

} // namespace

CollectiveCost collectiveCost(const Target &t, const Placement &g, Collective kind,
                              double bytes) {
  CollectiveCost best;
  best.kind = kind;
  best.group = g;
  best.bytes = bytes;
  if (g.n <= 1 || bytes <= 0)
    return best;
  if (kind == Collective::AllToAll)
    return allToAll(t, g, bytes);

  const double n = g.n, r = g.r, ppn = g.n / g.r;
  const bool multiNode = r > 1;
  const bool allReduce = kind == Collective::AllReduce;
  const Tier intra = intraTier(t);
  const LatencyScale scale = latencyScale(t);
  const int arch = archIndex(t);
  // Step 2: the bus bandwidth.
  double link = commBandwidth(t), B = link;
  if (multiNode) {
    double out = g.k * networkBandwidth(t);
    B = g.k > 1 ? std::min(link, out) : out;
  }
  const double nsteps = allReduce ? 2 * (n - 1) : n - 1;
  const double llMax = llMaxBandwidth(t, r);
  // LL128 needs NVLink inside the node (NCCL enables it up to NVLink paths).
  const bool ll128 = intra == NVLink;

  best.time = std::numeric_limits<double>::infinity();
  auto consider = [&](CollAlgorithm a, CollProtocol p, double busBw, double algBw,
                      double latency, double intraSteps, double interSteps) {
    if (busBw <= 0 || algBw <= 0)
      return;
    double transfer = bytes / algBw;
    if (a == CollAlgorithm::Tree) { // NCCL's correction for medium sizes
      int logSize = log2i(bytes / 64);
      if (bytes >= 64 && logSize < 23)
        transfer /= kTreeCorrection[static_cast<int>(p)][logSize];
    }
    double time = latency + transfer;
    if (time >= best.time)
      return;
    best.algorithm = a;
    best.protocol = p;
    best.busBandwidth = busBw;
    best.algBandwidth = bytes / transfer;
    best.latency = latency;
    best.intraSteps = intraSteps;
    best.interSteps = interSteps;
    best.transfer = transfer;
    best.time = time;
  };

  for (int pi = 0; pi < 3; ++pi) {
    CollProtocol p = static_cast<CollProtocol>(pi);
    if (p == CollProtocol::LL128 && !ll128)
      continue;
    bool simple = p == CollProtocol::Simple;
    // Ring: every kind. Across nodes each step costs at least the CPU's network post.
    {
      double busBw = p == CollProtocol::LL      ? std::min(llMax, 0.5 * B)
                     : p == CollProtocol::LL128 ? 0.92 * B
                                                : B;
      double intraLat = kStep[intra].ring[pi] * us * scale.intra;
      if (multiNode)
        intraLat = std::max(intraLat, kNetOverhead * (simple ? 3 : 1) * us * scale.net);
      double interLat =
          (ppn <= 1 ? kStep[Net].tree[pi] : kStep[Net].ring[pi]) * us * scale.net;
      double interSteps = !multiNode ? 0 : allReduce ? 2 * (r - 1) : r - 1;
      double latency = kBaseRing[pi] * us * (multiNode ? scale.net : scale.intra) +
                       (nsteps - interSteps) * intraLat + interSteps * interLat;
      // The ring's plateau across nodes (ncclTopoGetAlgoTime), for all but tiny messages.
      if (allReduce && simple && multiNode && bytes / (kChannels * n) >= 64)
        latency *= arch >= 1 ? 1.4 : 1.9;
      consider(CollAlgorithm::Ring, p, busBw, busBw * n / nsteps, latency, nsteps - interSteps,
               interSteps);
    }
    // Tree: all-reduce only; a chain inside each node, a double binary tree across nodes.
    if (allReduce) {
      double busBw = p == CollProtocol::LL      ? std::min(B / 3.8, llMax)
                     : p == CollProtocol::LL128 ? B * (multiNode ? 120.0 / 128 : 7.0 / 9)
                                                : 0.92 * B;
      double intraLat = kStep[intra].tree[pi] * us * scale.intra;
      double interLat = kStep[Net].tree[pi] * us * scale.net;
      double chain = ppn - 1, levels = log2i(r);
      double latency = kBaseTree[pi] * us * (multiNode ? scale.net : scale.intra) +
                       2 * (chain * intraLat + levels * interLat);
      consider(CollAlgorithm::Tree, p, busBw, busBw * 0.5, latency, 2 * chain, 2 * levels);
    }
    if (!simple)
      continue;
    // NVLS: the NVLink switch reduces and multicasts (Hopper and later, Simple only); across
    // nodes only with in-network reduction (CollNet) as well.
    double nvlsEfficiency = arch == 3 ? 0.74 : 0.85;
    if (t.nvlinkSwitch && arch >= 2 && (!multiNode || t.collnet)) {
      double intraBw = link * nvlsEfficiency * (kChannels - 1) / kChannels *
                       (allReduce ? 2 : (ppn - 1) / ppn);
      double busBw = multiNode ? std::min(intraBw, g.k * networkBandwidth(t)) : intraBw;
      double latency = kStep[NVLink].nvls[2] * us * scale.intra +
                       (multiNode ? kStep[Net].nvls[2] * us * scale.net : 0);
      consider(CollAlgorithm::Nvls, p, busBw, allReduce ? busBw * n / nsteps : busBw, latency, 1,
               multiNode ? 1 : 0);
    }
    // NVLS-tree: an all-reduce across NVLink-switch nodes, NVLS inside, a tree across.
    if (allReduce && multiNode && t.nvlinkSwitch && arch >= 2) {
      double intraBw = link * nvlsEfficiency * (kChannels - 1) / kChannels * 2;
      double interBw = g.k * networkBandwidth(t) * (r <= 2 ? 2 : 1);
      constexpr double perChannelCap[2] = {45.5e9, 80.0e9}; // Hopper, Blackwell, > 2 nodes
      constexpr double perChannelCap2[2] = {57.7e9, 96.0e9}; // 2 nodes
      double cap = kChannels * (r <= 2 ? perChannelCap2 : perChannelCap)[arch == 3 ? 1 : 0];
      double busBw = std::min({intraBw, interBw, cap});
      double levels = log2i(r);
      double latency = kStep[NVLink].nvlsTree[2] * us * scale.intra +
                       2 * levels * kStep[Net].nvlsTree[2] * us * scale.net;
      consider(CollAlgorithm::NvlsTree, p, busBw, busBw * n / nsteps, latency, 1, 2 * levels);
    }
    // PAT: an all-gather or reduce-scatter with one member per node (NCCL 2.23 and later):
    // log2 r network levels and a term linear in the ranks; three quarters of the bandwidth.
    if (!allReduce && multiNode && ppn <= 1) {
      double busBw = 0.75 * B;
      double interLat = kStep[Net].tree[2] * us * scale.net;
      double latency = (kBasePat + kPatPerRank * n) * us * scale.net + log2i(r) * interLat / 3.5;
      consider(CollAlgorithm::Pat, p, busBw, busBw, latency, 0, log2i(r));
    }
    // CollNet (SHARP): the switches of the network reduce an all-reduce; one network step.
    if (allReduce && multiNode && t.collnet) {
      double busBw = B * (arch >= 2 ? 0.85 : 1);
      double intraLat = kStep[intra].collnet[2] * us * scale.intra;
      double latency = 2 * (std::min(1.0, ppn - 1) * intraLat + (ppn - 1) * 0.4 * us * scale.intra) +
                       kStep[Net].collnet[2] * us * scale.net;
      consider(CollAlgorithm::CollNet, p, busBw, busBw * 0.5, latency, 2 * (ppn - 1), 1);
    }
  }
  return best;
}

double ringSentBytes(const CollectiveCost &c) {
  double n = c.group.n;
  if (n <= 1)
    return 0;
  double share = c.bytes * (n - 1) / n;
  return c.kind == Collective::AllReduce ? 2 * share : share;
}

double dataParallelSentBytes(const Analysis &a, int64_t stage) {
  double sent = 0;
  for (const Analysis::CollectiveUse &u : a.collectives)
    if ((u.group == 'd' || u.group == 'x') && (u.stage < 0 || u.stage == stage))
      sent += u.perStep * ringSentBytes(u.cost);
  return sent;
}

/// Records the collectives of `messages` (bytes each, over group `group`) in
/// Analysis::collectives, one entry per distinct size, `times` calls per step for each message
/// (under pipeline stage `stage`; -1: every rank's).
void recordMessages(Analysis &a, const char *what, char group, Collective c, const std::vector<double> &messages,
                    double divisor, double times, bool overlapped, int64_t stage) {
  if (messages.empty() || times <= 0)
    return;
  Placement g = place(*a.plan, group);
  if (g.n <= 1)
    return;
  std::map<double, double> count;
  for (double bytes : messages)
    count[bytes / divisor] += 1;
  for (auto &[bytes, k] : count)
    a.collectives.push_back({what, group, collectiveCost(a.plan->target, g, c, bytes), k * times, overlapped, stage});
}

double tensorParallelSentBytes(const Analysis &a, int64_t stage) {
  double sent = 0;
  for (const Analysis::CollectiveUse &u : a.collectives)
    if (u.group == 't' && (u.stage < 0 || u.stage == stage))
      sent += u.perStep * ringSentBytes(u.cost);
  return sent;
}

double collectiveTime(const Target &t, const Placement &g, Collective c, double bytes) {
  return collectiveCost(t, g, c, bytes).time;
}

double sendTime(const Target &t, bool network, double bytes) {
  if (bytes <= 0)
    return 0;
  return network ? t.networkLatency + bytes / networkBandwidth(t)
                 : t.linkLatency + bytes / commBandwidth(t);
}

} // namespace tally
