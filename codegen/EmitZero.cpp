// ZeRO 2 and 3 in the generated step (CPU, MPI): the moves of passes/ZeroShards.cpp
// (Analysis::zero) printed into micro_step, and the optimizer's pieces (docs/codegen.md, "ZeRO
// 2 and 3"). Rank r owns elements [r·c, min(n, (r+1)·c)) of each tensor of n elements,
// c = ⌈n/d⌉; the grads, master and optimizer regions (and under ZeRO 3 the params region) hold
// that piece of every tensor at the tensor's offset.
// - Each micro-batch: before the first backward entry that writes a parameter's gradient its
//   arena buffer is zeroed; after the last one it is divided by d and reduce-scattered
//   (tally_comm::reduce_scatter_piece), the rank's piece added into G.
// - ZeRO 3: before the first forward entry that reads a parameter of a unit (a repeat-block
//   copy, or the root: the other parameters), every parameter of the unit is all-gathered from
//   the ranks' pieces in P into its arena buffer (tally_comm::all_gather_piece); again before
//   the first backward or recompute entry; the buffers end with the phase (the memory plan
//   reuses their bytes).
// - update(): each rank updates its pieces (kUpdate by rank); under ZeRO 2 gather_parameters()
//   then all-gathers every trainable parameter in place in P. Under ZeRO 3 P stays sharded.
#include "codegen/EmitInternal.h"

namespace tally::codegen::emit {

int64_t Emitter::pieceOf(TensorId t) const {
  int64_t d = plan.parallel.data, e = n(t);
  return e / d + (e % d != 0);
}

void Emitter::indexZeroMoves() {
  const Analysis::ZeroMoves &z = zeroPlan();
  for (size_t i = 0; i < z.gathers.size(); ++i)
    gathersAt[z.gathers[i].entry].push_back(i);
  for (size_t i = 0; i < z.reduces.size(); ++i) {
    zeroAt[z.reduces[i].first].push_back(i);
    reduceAt[z.reduces[i].last].push_back(i);
  }
}

std::string Emitter::zeroBuffer(TensorId key, uint32_t entry, const std::string &type) {
  const Buffer *b = buffers.liveAt(key, buffers.stepOf(entry));
  if (!b) {
    fail("internal error: a ZeRO buffer of tensor %" + std::to_string(key) + " is not live at schedule entry " +
         std::to_string(entry) + " (the step and the memory plan disagree)");
    return "nullptr";
  }
  return arenaAt(b, type, 0, "the ZeRO buffer of tensor %" + std::to_string(key));
}

void Emitter::zeroBefore(size_t e) {
  std::string P = ctype(plan.precision.params), G = ctype(plan.precision.grads);
  auto g = gathersAt.find(e);
  if (g != gathersAt.end())
    for (size_t i : g->second) {
      const Analysis::ZeroMoves::Gather &m = zeroPlan().gathers[i];
      std::string unit = m.unit == kNone || !a.copies || m.unit >= a.copies->copies.size()
                             ? std::string("the root unit") : commentSafe(a.copies->copies[m.unit].path);
      body += "\n  // ZeRO 3: " + unit + "'s parameters gathered for its " + (m.backward ? "backward" : "forward") + "\n";
      site("data_parallel.gather", "communication");
      for (TensorId t : m.params) {
        std::string at = zeroBuffer(t, m.entry, P);
        line(llvm::formatv("tally_comm::all_gather_piece<{0}>(ctx, {1}, {2}, {3}, P<{0}>({4})); // {5}", P, at,
                           n(t), pieceOf(t), paramOffset.at(t), commentSafe(s.tensorName(t)))
                 .str());
      }
    }
  auto z = zeroAt.find(e);
  if (z != zeroAt.end())
    for (size_t i : z->second) {
      TensorId t = zeroPlan().reduces[i].param;
      std::string at = zeroBuffer(s.gradient[t], static_cast<uint32_t>(e), G);
      body += "\n  // ZeRO: this micro-batch's gradient of " + commentSafe(s.tensorName(t)) + " starts at zero\n";
      site("zero_grad", "optimizer");
      line(llvm::formatv("rt::fill<{0}>(ctx, {1}, 0.0f, {2});", G, at, n(t)).str());
    }
}

void Emitter::zeroAfter(size_t e) {
  auto r = reduceAt.find(e);
  if (r == reduceAt.end())
    return;
  std::string G = ctype(plan.precision.grads);
  for (size_t i : r->second) {
    TensorId t = zeroPlan().reduces[i].param;
    std::string at = zeroBuffer(s.gradient[t], static_cast<uint32_t>(e), G);
    body += "\n  // ZeRO: " + commentSafe(s.tensorName(t)) + "'s gradient is complete: averaged into the ranks' pieces\n";
    site("data_parallel.reduce_gradients", "communication");
    line(llvm::formatv("rt::scale<{0}>(ctx, {1}, {2}, {3});", G, at, number(1.0 / static_cast<double>(plan.parallel.data)),
                       n(t))
             .str());
    line(llvm::formatv("tally_comm::reduce_scatter_piece<{0}>(ctx, {1}, {2}, {3}, G<{0}>({4}));", G, at, n(t),
                       pieceOf(t), gradOffset.at(t))
             .str());
  }
}

std::string Emitter::pieceUpdateRows(bool hasMaster, unsigned states, size_t &count) {
  std::string rows;
  int64_t bp = static_cast<int64_t>(bytesOf(plan.precision.params));
  bool zero3 = regions.tensorShards >= 3;
  for (const ParamInfo &pi : s.params) {
    if (!pi.trainable || !gradOffset.count(pi.tensor)) // pipeline: another stage's
      continue;
    TensorId t = pi.tensor;
    int64_t c = pieceOf(t), total = n(t);
    for (int64_t r = 0; r < plan.parallel.data; ++r) {
      int64_t lo = std::min(total, r * c), hi = std::min(total, lo + c);
      if (lo >= hi)
        continue;
      // ZeRO 2 updates its piece inside the whole P; ZeRO 3's P holds the piece.
      int64_t inP = paramOffset.at(t) + (zero3 ? 0 : bp * lo);
      int64_t p = hasMaster ? masterOffset.at(t) : inP, pm = hasMaster ? inP : -1;
      int64_t s0 = states > 0 ? stateOffset.at({t, 0}) : -1, s1 = states > 1 ? stateOffset.at({t, 1}) : -1;
      rows += llvm::formatv("    {{{0}, {1}, {2}, {3}, {4}, {5}, {6}}, // {7} [{8}, {9})\n", r, hi - lo, p, pm,
                            gradOffset.at(t), s0, s1, commentSafe(s.paramPath(pi)), lo, hi)
                  .str();
      ++count;
    }
  }
  return rows;
}

std::string Emitter::pieceGather() {
  if (regions.tensorShards >= 3)
    return "";
  std::string T = ctype(plan.precision.params);
  std::string out = "/// ZeRO 2: every rank's updated piece of each trainable parameter to every rank, in place in P.\n"
                    "static void gather_parameters(rt::Ctx &ctx) {\n" +
                    siteText("data_parallel.gather", "communication");
  for (const ParamInfo &pi : s.params)
    if (pi.trainable && gradOffset.count(pi.tensor)) // pipeline: this stage's parameters
      out += llvm::formatv("  tally_comm::all_gather_piece<{0}>(ctx, P<{0}>({1}), {2}, {3}, static_cast<const {0} *>(nullptr)); // {4}\n",
                           T, paramOffset.at(pi.tensor), n(pi.tensor), pieceOf(pi.tensor), commentSafe(s.paramPath(pi)))
                 .str();
  return out + "}\n\n";
}

} // namespace tally::codegen::emit
