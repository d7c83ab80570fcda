// The optimizer phase of the generated step and its data-parallel collectives (the walk:
// codegen/EmitStep.cpp, section 3 and 4). update() runs the optimizer entries of the schedule
// over the flat regions one parameter at a time (kUpdate: the regions pad each tensor to 256
// bytes, which is a different element count per dtype, so a single flat loop over params and
// master would not line up); zero_grad() clears the gradients. Data parallel (data = N > 1):
// reduce_gradients() averages G over the N ranks in 25 MiB buckets, overlapped with the
// backward (start_bucket) or after it; under ZeRO-1 (the memory plan's shard) a
// reduce-scatter, the update of this rank's pieces (kUpdate by data rank) and
// gather_parameters() (docs/codegen.md; under data × tensor both collectives are counted rings
// over the data group, dp_reduce_scatter and dp_all_gather).
#include "codegen/EmitInternal.h"

#include <algorithm>

namespace tally::codegen::emit {

// ---- data parallelism ----------------------------------------------------------------------

std::vector<std::pair<int64_t, int64_t>> Emitter::gradientBuckets() const {
  constexpr int64_t kBucketBytes = 25 * 1024 * 1024;
  int64_t bg = static_cast<int64_t>(bytesOf(plan.precision.grads)), bucket = kBucketBytes / bg;
  int64_t elems = regions.grads.bytes / bg;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t b0 = 0; b0 < elems; b0 += bucket)
    out.push_back({b0, std::min(elems, b0 + bucket)});
  return out;
}

std::map<size_t, std::vector<size_t>> Emitter::overlappedBuckets() const {
  std::map<size_t, std::vector<size_t>> out;
  if (!overlap())
    return out;
  auto buckets = gradientBuckets();
  int64_t bg = static_cast<int64_t>(bytesOf(plan.precision.grads));
  std::vector<size_t> lastWriter(buckets.size(), SIZE_MAX);
  for (size_t e = 0; e < a.stepSchedule.size(); ++e) {
    const StepEntry &se = a.stepSchedule[e];
    if (se.kind != StepEntry::Backward)
      continue;
    for (TensorId t : s.ops[se.op].outputs) {
      const Tensor &bt = s.tensors[s.storageOf(t)];
      if (bt.role != TensorRole::Gradient || bt.gradOf == kNone)
        continue;
      auto g = gradOffset.find(bt.gradOf);
      if (g == gradOffset.end())
        continue;
      int64_t lo = g->second / bg, hi = lo + n(bt.gradOf);
      for (size_t k = 0; k < buckets.size(); ++k)
        if (lo < buckets[k].second && buckets[k].first < hi)
          lastWriter[k] = e;
    }
  }
  for (size_t k = 0; k < buckets.size(); ++k)
    if (lastWriter[k] != SIZE_MAX)
      out[lastWriter[k]].push_back(k);
  return out;
}

std::string Emitter::communication(int64_t gradElems) {
  if (!dataParallel())
    return "";
  if (pieced()) // the gradients moved in micro_step (EmitZero.cpp)
    return pieceGather();
  std::string T = ctype(plan.precision.grads);
  int64_t d = plan.parallel.data;
  const std::vector<std::pair<int64_t, int64_t>> bs = gradientBuckets();
  // Data × tensor and data × pipeline: each bucket is summed over the rank's data group by a
  // counted ring (tally_comm::dp_all_reduce, blocking), so the bytes sent to the data group are
  // measured beside the tensor group's or the pipeline's; data parallelism alone keeps MPI's
  // all-reduce.
  const bool ring = tensorParallel() || pipelined();
  if (overlap()) {
    std::string out = llvm::formatv("/// Data parallel over {0} ranks ({1}; runtime/{2}), overlapped with the backward: the\n"
                                    "/// gradients in {3} bucket(s) of at most 25 MiB of G, each divided by {0} and its sum\n"
                                    "/// over the ranks started as soon as the last micro-batch's backward has written it\n"
                                    "/// (start_bucket, called from micro_step); reduce_gradients() waits for them all.\n",
                                    d, be.parallelEngine, be.commHeader, bs.size())
                          .str();
    if (ring)
      out += "/// Data × tensor: over this rank's data group, each bucket's ring all-reduce runs to its end\n"
             "/// where it starts (the CPU's MPI moves data only inside its calls), so the wait finds none.\n";
    out += "static const int64_t kBuckets[][2] = {\n";
    for (auto [b0, b1] : bs)
      out += llvm::formatv("    {{{0}, {1}},\n", b0, b1).str();
    out += "};\n\nstatic void start_bucket(rt::Ctx &ctx, int k) {\n" +
           siteText("data_parallel.reduce_gradients", "communication") +
           llvm::formatv("  rt::scale<{0}>(ctx, G<{0}>(0) + kBuckets[k][0], {1}, kBuckets[k][1] - kBuckets[k][0]);\n", T,
                         number(1.0 / static_cast<double>(d)))
               .str() +
           (ring ? llvm::formatv("  tally_comm::dp_all_reduce<{0}>(ctx, G<{0}>(0), kBuckets[k][0], kBuckets[k][1]);\n}\n\n", T)
                 : llvm::formatv("  tally_comm::all_reduce_start<{0}>(ctx, G<{0}>(0), kBuckets[k][0], kBuckets[k][1], k);\n}\n\n", T))
               .str();
    out += "static void reduce_gradients(rt::Ctx &ctx) {\n";
    std::vector<bool> started(bs.size(), false);
    for (const auto &[entry, ks] : overlappedBuckets())
      for (size_t k : ks)
        started[k] = true;
    for (size_t k = 0; k < bs.size(); ++k)
      if (!started[k])
        out += "  start_bucket(ctx, " + std::to_string(k) + "); // no backward op writes it\n";
    out += siteText("data_parallel.reduce_gradients", "communication") + "  tally_comm::all_reduce_wait(ctx);\n}\n\n";
    return out;
  }
  auto each = [&](const char *what) {
    std::string out;
    for (auto [b0, b1] : bs)
      out += llvm::formatv("  tally_comm::{0}<{1}>(ctx, G<{1}>(0), {2}, {3}{4});\n", what, T, b0, b1,
                           sharded() ? ", kShard" : "")
                 .str();
    return out;
  };
  std::string out = llvm::formatv("/// Data parallel over {0} ranks ({3}; runtime/{4}): the gradients averaged\n"
                                  "/// after the backward in {1} bucket(s) of at most 25 MiB of G, divided by {0} and then\n"
                                  "/// summed{2}.\n",
                                  d, bs.size(), sharded() ? " by reduce-scatters (ZeRO-1: rank r keeps elements [r·kShard, (r+1)·kShard))"
                                                        : " by all-reduces",
                                  be.parallelEngine, be.commHeader)
                        .str();
  if (sharded())
    out += "constexpr int64_t kShard = " + std::to_string(regions.shard) + ";\n";
  out += "static void reduce_gradients(rt::Ctx &ctx) {\n"
         "  // The wait for the slowest rank's backward (load imbalance, not transfer) is its own class.\n" +
         siteText("data_parallel.barrier", "wait") + "  tally_comm::barrier(ctx);\n" +
         siteText("data_parallel.reduce_gradients", "communication");
  out += llvm::formatv("  rt::scale<{0}>(ctx, G<{0}>(0), {1}, {2});\n", T, number(1.0 / static_cast<double>(d)), gradElems)
             .str();
  // ZeRO-1 on MPI: the reduce-scatter and the gathers are counted rings over the data group
  // (dp_reduce_scatter, dp_all_gather), rank r's shard by its data rank, with data parallelism
  // alone too: OpenMPI's MPI_Reduce_scatter and MPI_Allgatherv took 14-17 ms a step for GPT
  // d = 256 on 2 ranks, the ring 13 ms (the estimate, from MPI_Allreduce's rate, 4.5 ms).
  // (NCCL's reduce-scatter and all-gather are rings already: the CUDA step calls them.)
  const bool shardRing = ring || !be.device;
  out += each(sharded() ? (shardRing ? "dp_reduce_scatter" : "reduce_scatter") : ring ? "dp_all_reduce" : "all_reduce") +
         "}\n\n";
  if (!sharded())
    return out;
  out += "/// ZeRO: every rank's shard of the averaged gradients to every rank (--dump-grads).\n"
         "static void gather_gradients(rt::Ctx &ctx) {\n" + siteText("data_parallel.gather", "communication") +
         each("all_gather") + "}\n\n"; // a diagnostic outside the step's traffic: not counted
  bool hasMaster = plan.precision.master != Dtype::Invalid;
  int64_t bp = static_cast<int64_t>(bytesOf(plan.precision.params));
  std::string gather = "/// ZeRO: per trainable parameter, its byte offsets in P and G and its bytes.\n"
                       "struct GatherEntry { int64_t p, g, bytes; };\n"
                       "static const GatherEntry kGather[] = {\n";
  size_t count = 0;
  for (const ParamInfo &pi : s.params)
    if (pi.trainable && gradOffset.count(pi.tensor)) { // pipeline: this stage's parameters
      gather += llvm::formatv("    {{{0}, {1}, {2}}, // {3}\n", paramOffset.at(pi.tensor), gradOffset.at(pi.tensor),
                              bp * n(pi.tensor), commentSafe(s.paramPath(pi)))
                    .str();
      ++count;
    }
  if (count == 0)
    gather += "    {0, 0, 0},\n";
  out += gather + "};\n\n";
  out += "/// ZeRO: the updated parameters of every rank's shard to every rank, through G.\n"
         "static void gather_parameters(rt::Ctx &ctx) {\n" + siteText("data_parallel.gather", "communication") +
         "  const int me = tally_comm::" + std::string(be.device ? "rank" : "data_rank") + "();\n"
         "  for (const UpdateEntry &e : kUpdate)\n"
         "    if (e.n > 0 && e.rank == me)\n" +
         llvm::formatv("      tally_comm::copy(ctx, G<uint8_t>(e.g), P<uint8_t>(e.{0}), e.n * {1});\n",
                       hasMaster ? "pm" : "p", bp)
             .str() +
         each(shardRing ? "dp_all_gather" : "all_gather") +
         "  for (const GatherEntry &e : kGather)\n"
         "    tally_comm::copy(ctx, P<uint8_t>(e.p), G<uint8_t>(e.g), e.bytes);\n}\n\n";
  return out;
}

// ---- the optimizer phase ---------------------------------------------------------------------

bool Emitter::updateTypes(UpdateTypes &u) {
  Dtype gd = plan.precision.grads, pd = plan.precision.params, md = plan.precision.master;
  std::string G = ctype(gd);
  if (G.empty() || !isFloat(gd))
    return fail("gradients in " + nameOf(gd).str() + " are not supported by the " + title() + " runtime");
  bool hasMaster = md != Dtype::Invalid;
  if (hasMaster && md != Dtype::F32)
    return fail("a " + nameOf(md).str() + " master copy: the " + title() + " optimizers keep fp32 master weights");
  // 16-bit parameters without a master copy (precision = bf16 / fp16): the CPU optimizers
  // update each weight in fp32 and round it back once; the device runtime has no such kernels.
  bool pure16 = !hasMaster && pd != Dtype::F32;
  if (pure16 && (be.device || pd != gd || ctype(pd).empty() || !isFloat(pd)))
    return fail("parameters in " + nameOf(pd).str() + " without an fp32 master copy" +
                (be.device ? ": the " + title() + " optimizers update fp32 weights"
                           : " and gradients in " + nameOf(gd).str() + ": the " + title() +
                                 " optimizers update 16-bit weights with gradients of their type"));
  if (hasMaster && pd != gd)
    return fail("parameters in " + nameOf(pd).str() + " with gradients in " + nameOf(gd).str() +
                ": the " + title() + " optimizers refresh the model copy in the gradients' type");
  if (plan.precision.optimizer != Dtype::F32)
    return fail("optimizer state in " + nameOf(plan.precision.optimizer).str() + ": the " + title() + " optimizers keep fp32 state");
  u.G = G;
  u.hasMaster = hasMaster;
  u.pure16 = pure16;
  return true;
}

bool Emitter::updateTable(const UpdateTypes &u, std::string &table, size_t &count) {
  Dtype gd = plan.precision.grads, pd = plan.precision.params;
  bool hasMaster = u.hasMaster;
  unsigned states = optimizerStates(plan.optimizer);
  // The table: per trainable parameter, its element count and its offsets.
  table = "/// Per trainable parameter: elements, then byte offsets of the weights updated (the fp32\n"
          "/// master, or the params region in the params' dtype), the model copy (-1: none), the gradient and each optimizer state.\n"
          "struct UpdateEntry { int64_t n, p, pm, g, s0, s1; };\n"
          "static const UpdateEntry kUpdate[] = {\n";
  count = 0;
  bool zero = sharded() || pieced();
  if (zero) {
    if (pd != gd)
      return fail("ZeRO with parameters in " + nameOf(pd).str() + " and gradients in " + nameOf(gd).str() +
                  ": the " + title() + " step gathers the updated parameters through the gradients region, "
                  "so they must have one dtype");
    table = "/// ZeRO: per piece of a trainable parameter that one rank updates (rank r owns elements\n"
            "/// [r·kShard, (r+1)·kShard) of G): that rank, elements, then byte offsets of the fp32 weights\n"
            "/// (this rank's master shard, or the params region), the model copy (-1: none), the\n"
            "/// gradient and each optimizer state (in this rank's shard of O).\n"
            "struct UpdateEntry { int rank; int64_t n, p, pm, g, s0, s1; };\n"
            "static const UpdateEntry kUpdate[] = {\n";
    table += pieced() ? pieceUpdateRows(hasMaster, states, count) : zeroUpdateRows(hasMaster, states, count);
  }
  for (const ParamInfo &pi : s.params) {
    if (!pi.trainable || zero || !paramOffset.count(pi.tensor)) // pipeline: another rank's
      continue;
    TensorId t = pi.tensor;
    int64_t p = hasMaster ? masterOffset.at(t) : paramOffset.at(t);
    int64_t pm = hasMaster ? paramOffset.at(t) : -1;
    int64_t s0 = states > 0 ? stateOffset.at({t, 0}) : -1, s1 = states > 1 ? stateOffset.at({t, 1}) : -1;
    table += llvm::formatv("    {{{0}, {1}, {2}, {3}, {4}, {5}}, // {6}\n", updated(t), p, pm, gradOffset.at(t), s0, s1,
                           commentSafe(s.paramPath(pi)))
                 .str();
    ++count;
  }
  if (count == 0)
    table += zero ? "    {0, 0, 0, -1, 0, -1, -1},\n" : "    {0, 0, -1, 0, -1, -1},\n";
  table += "};\n\n";
  return true;
}

std::string Emitter::zeroUpdateRows(bool hasMaster, unsigned states, size_t &count) {
  Dtype gd = plan.precision.grads, pd = plan.precision.params;
  std::string rows;
  int64_t S = regions.shard, bg = static_cast<int64_t>(bytesOf(gd)), bp = static_cast<int64_t>(bytesOf(pd));
  int64_t stateBytes = alignUp(S * 4);
  for (const ParamInfo &pi : s.params) {
    if (!pi.trainable || !gradOffset.count(pi.tensor)) // pipeline: another stage's
      continue;
    TensorId t = pi.tensor;
    int64_t g0 = gradOffset.at(t) / bg, total = updated(t);
    for (int64_t r = 0; r < plan.parallel.data; ++r) {
      int64_t lo = std::max(g0, r * S), hi = std::min(g0 + total, (r + 1) * S);
      if (lo >= hi)
        continue;
      int64_t j = lo - g0, k = lo - r * S;
      int64_t p = hasMaster ? 4 * k : paramOffset.at(t) + 4 * j;
      int64_t pm = hasMaster ? paramOffset.at(t) + bp * j : -1;
      int64_t s0 = states > 0 ? 4 * k : -1, s1 = states > 1 ? stateBytes + 4 * k : -1;
      rows += llvm::formatv("    {{{0}, {1}, {2}, {3}, {4}, {5}, {6}}, // {7} [{8}, {9})\n", r, hi - lo, p, pm,
                            gradOffset.at(t) + bg * j, s0, s1, commentSafe(s.paramPath(pi)), j, j + hi - lo)
                  .str();
      ++count;
    }
  }
  return rows;
}

bool Emitter::optimizerCall(const UpdateTypes &u, std::string &call) {
  const OptimizerSpec &o = plan.optimizer;
  unsigned states = optimizerStates(o);
  const std::string &G = u.G;
  bool hasMaster = u.hasMaster, pure16 = u.pure16;
  std::string gscale = "gscale";
  float lr = static_cast<float>(o.lr), wd = static_cast<float>(o.weightDecay);
  std::string P = hasMaster ? "M<float>(e.p)" : "P<" + (pure16 ? G : std::string("float")) + ">(e.p)";
  std::string PM = hasMaster ? "e.pm < 0 ? nullptr : P<" + G + ">(e.pm)" : "static_cast<" + G + "*>(nullptr)";
  std::string g = "G<" + G + ">(e.g)", s0 = "O<float>(e.s0)", s1 = "O<float>(e.s1)";
  if (o.name == "AdamW" || o.name == "Adam")
    call = llvm::formatv("rt::adam_update<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, e.n, {6}, {7}, {8}, {9}, {10}, {11}, step, gscale);",
                         G, P, PM, g, s0, s1, number(lr), number(o.beta1), number(o.beta2), number(o.eps),
                         number(wd), o.name == "AdamW" ? "true" : "false")
               .str();
  else if (o.name == "SGD")
    call = llvm::formatv("rt::sgd_update<{0}>(ctx, {1}, {2}, {3}, {4}, e.n, {5}, {6}, {7}, gscale);", G, P, PM, g,
                         states > 0 ? s0 : "nullptr", number(lr), number(o.momentum), number(wd))
               .str();
  else if (o.name == "AdaGrad")
    call = llvm::formatv("rt::adagrad_update<{0}>(ctx, {1}, {2}, {3}, {4}, e.n, {5}, {6}, {7}, gscale);", G, P, PM,
                         g, s0, number(lr), number(o.eps), number(wd))
               .str();
  else if (o.name == "RMSprop")
    call = llvm::formatv("rt::rmsprop_update<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, e.n, {6}, {7}, {8}, {9}, {10}, gscale);",
                         G, P, PM, g, s0, states > 1 ? s1 : "nullptr", number(lr),
                         number(o.beta2 > 0 ? o.beta2 : 0.99), number(o.eps), number(wd), number(o.momentum))
               .str();
  else if (o.name == "Lion")
    call = llvm::formatv("rt::lion_update<{0}>(ctx, {1}, {2}, {3}, {4}, e.n, {5}, {6}, {7}, {8}, gscale);", G, P, PM,
                         g, s0, number(lr), number(o.beta1), number(o.beta2), number(wd))
               .str();
  else
    return fail("optimizer " + o.name + " has no " + title() + " update");
  return true;
}

void Emitter::sumSquares(const std::string &G, int64_t gradElems) {
  bool zero = sharded();
  if (be.device && zero) { // this rank's shard of the averaged gradients: Σg² over the ranks
    line(llvm::formatv("const int64_t from = std::min<int64_t>({0}, tally_comm::rank() * kShard);", gradElems).str());
    line(llvm::formatv("rt::sum_squares<{0}>(ctx, G<{0}>(0) + from, std::min<int64_t>(kShard, {1} - from), device_scalars);",
                       G, gradElems)
             .str());
    line("const double sumsq = tally_comm::sum(device_load(ctx, device_scalars));");
  } else if (be.device) { // Σg² lands in device memory; the host reads it back to decide
    line(llvm::formatv("rt::sum_squares<{0}>(ctx, G<{0}>(0), {1}, device_scalars);", G, gradElems).str());
    line("const double sumsq = device_load(ctx, device_scalars);");
  } else if (pieced()) { // each rank holds its pieces of the averaged gradients: Σg² over all
    line("float sumsq = 0;");
    line(llvm::formatv("rt::sum_squares<{0}>(ctx, G<{0}>(0), {1}, &sumsq);", G, gradElems).str());
    line("sumsq = static_cast<float>(tally_comm::sum(sumsq));");
  } else if (zero) { // each rank holds its shard of the averaged gradients: Σg² over all
    line("float sumsq = 0;");
    line(llvm::formatv("const int64_t from = std::min<int64_t>({0}, tally_comm::data_rank() * kShard);", gradElems).str());
    line(llvm::formatv("rt::sum_squares<{0}>(ctx, G<{0}>(0) + from, std::min<int64_t>(kShard, {1} - from), &sumsq);",
                       G, gradElems)
             .str());
    line("sumsq = static_cast<float>(tally_comm::sum(sumsq));");
  } else {
    line("float sumsq = 0;");
    line(llvm::formatv("rt::sum_squares<{0}>(ctx, G<{0}>(0), {1}, &sumsq);", G, gradElems).str());
  }
  line("if (!std::isfinite(sumsq))");
  line("  return false; // skip the step: a gradient overflowed");
}

bool Emitter::update(std::string &updateText, std::string &zeroText) {
  UpdateTypes u;
  std::string table, call;
  size_t count = 0;
  if (!updateTypes(u) || !updateTable(u, table, count) || !optimizerCall(u, call))
    return false;
  const std::string &G = u.G;
  bool zero = sharded();
  int64_t gradElems = regions.grads.bytes / static_cast<int64_t>(bytesOf(plan.precision.grads));
  body.clear();
  for (const StepEntry &se : a.stepSchedule) {
    if (se.kind != StepEntry::Optimizer)
      continue;
    op = &s.ops[se.op];
    std::string path = s.opPath(*op);
    // Each kind's code is its entry's (the end of this file); a micro-batch kind has none.
    const OpEmit &e = emitFor(op->kind);
    if (!e.optimizer)
      return fail("no " + title() + " code for optimizer-phase op " + opName(op->kind).str());
    if (!(this->*e.optimizer)(OptimizerPhase{path, G, gradElems, call}))
      return false;
  }
  op = nullptr;
  if (zero || (pieced() && regions.tensorShards < 3))
    body += "\n  // ZeRO: every rank's updated parameters to every rank\n  gather_parameters(ctx);\n";
  updateText = table + communication(gradElems) +
               "/// The optimizer phase: false when the step was skipped (fp16 overflow).\n"
               "static bool update(rt::Ctx &ctx, int64_t step) {\n" +
               body + "  return true;\n}\n";
  body.clear();
  site("zero_grad", "optimizer");
  zeroText = llvm::formatv("/// zero_grad: the whole gradient region (padding included) back to zero.\n"
                           "static void zero_grad(rt::Ctx &ctx) {{\n{0}"
                           "  rt::fill<{1}>(ctx, G<{1}>(0), 0.0f, {2});\n}\n",
                           body, G, gradElems)
                 .str();
  if (count == 0)
    zeroText = "static void zero_grad(rt::Ctx &) {}\n";
  return true;
}

bool Emitter::updateSumSquares(const OptimizerPhase &p) {
  body += "\n  // " + commentSafe(p.path) + ": the overflow check of fp16 loss scaling\n";
  site(p.path, "reduction");
  sumSquares(p.G, p.gradElems);
  return true;
}

bool Emitter::updateParameters(const OptimizerPhase &p) {
  body += "\n  // " + commentSafe(p.path) + ": " + commentSafe(plan.optimizer.name) + " over every trainable parameter\n";
  site(p.path, "optimizer");
  line("const float gscale = " + std::string(plan.precision.lossScaling ? "1.0f / kLossScale" : "1.0f") + ";");
  if (sharded() || pieced()) { // ZeRO: rank r's shard or pieces by its data rank (data × tensor)
    line(std::string("const int me = tally_comm::") + (be.device ? "rank" : "data_rank") + "();");
    line("for (const UpdateEntry &e : kUpdate)");
    line("  if (e.n > 0 && e.rank == me)");
  } else {
    line("for (const UpdateEntry &e : kUpdate)");
    line("  if (e.n > 0)");
  }
  line("    " + p.call);
  return true;
}

bool Emitter::updateZeroGrad(const OptimizerPhase &) { return true; } // zero_grad() prints it

// ---- the table's entries (EmitTable.cpp) ----------------------------------------------------

EMIT_OPTIMIZER(SumSquares, updateSumSquares)
EMIT_OPTIMIZER(OptimizerUpdate, updateParameters)
EMIT_OPTIMIZER(ZeroGrad, updateZeroGrad)
NO_EMIT_OPTIMIZER(Scale, "nothing adds a scale op to a step: the loss scale is the seed's "
                         "(passes/Backward.cpp) and update()'s gscale")

} // namespace tally::codegen::emit
