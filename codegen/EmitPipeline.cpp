// Pipeline parallelism in the generated step (CPU, MPI; Analysis::pipelineStep, planned by
// passes/PipelineStep.cpp; docs/codegen.md, "Pipeline parallel under MPI"). One step file holds
// every rank's code, each rank's in a namespace stage<r>: its parameter table, one forward and
// one backward function per chunk it runs (the schedule's entries of that chunk, every arena
// operand at the chunk's slot `cb`), its update over its own regions, and train(), which runs
// the rank's units in pipelineOrder's order (the order passes/PipelineTimeline.cpp simulates),
// each in slot mb mod slots of its chunk. At a chunk boundary the forward sends the activations
// the next chunk reads (tally_comm::pp_send, counted) and the next chunk's forward receives
// them (pp_recv, timed as the rank's idle time, op class "bubble"); the backward sends their
// gradients back the same way. A tied parameter's gradient is summed between its two ranks
// after the last backward (pp_sum_with). With data = d > 1 (data × pipeline) the stage's
// gradients are then averaged over its data group (reduce_gradients, a counted ring; EmitUpdate.cpp).
// With tensor = t > 1 (tensor x pipeline) each stage's code is the tensor-parallel shard's with
// its all-reduces (tensorParallelAfter), and a boundary moves as pieces: pp_send_piece sends the
// tensor rank's 1/t, pp_recv_piece receives it and tp_all_gather fills in the rest from the
// tensor group (Megatron's scatter/gather, as the estimate prices it). With both (data x tensor
// x pipeline) each data rank's grid runs that code and each rank's data group (its stage and
// tensor rank on every data rank) reduces its cut's grads region as data x pipeline does.
// kStageLayouts holds every stage's regions and arena; select_stage picks this process's by its
// pipeline coordinate (the plan's rank order).
#include "codegen/EmitInternal.h"

namespace tally::codegen::emit {

void Emitter::selectRank(int64_t r) {
  const auto &rank = a.pipelineStep.ranks[static_cast<size_t>(r)];
  regions.params = rank.params;
  regions.grads = rank.grads;
  regions.master = rank.master;
  regions.optimizer = rank.optimizer;
  regions.shard = rank.shard; // data x pipeline under ZeRO-1: the stage's optimizer shard
  // Data x pipeline under ZeRO 2 and 3: the stage's regions hold pieces (PipelineStep.cpp).
  regions.tensorShards = plan.parallel.data > 1 && plan.parallel.zero >= 2 ? plan.parallel.zero : 0;
  index();
}

bool Emitter::checkPipeline() {
  const auto &ps = a.pipelineStep;
  const Parallelism &par = plan.parallel;
  std::string what = "pipeline = " + std::to_string(par.pipeline) +
                     (par.interleave > 1 ? ", interleave = " + std::to_string(par.interleave) : "");
  if (be.device && par.interleave > 1) // NCCL pairs a rank's sends with its peer's receives in issue order
    return fail(what + ": the " + title() + " backend runs the 1F1B schedule (interleave = 1), not the interleaved "
                       "one yet (the CPU backend runs it, under MPI)");
  if (be.device && par.data > 1) // tally_comm_nccl.h splits no pipeline groups
    return fail(what + ": the " + title() + " backend runs pipeline parallelism on its own, not with data "
                       "parallelism yet (the CPU backend runs data x pipeline, under MPI)");
  if (!ps.error.empty()) {
    op = ps.errorOp < s.ops.size() ? &s.ops[ps.errorOp] : nullptr;
    return fail(what + ": " + ps.error);
  }
  if (ps.chunks.empty() || ps.ranks.size() != static_cast<size_t>(par.pipeline))
    return fail(what + ": the plan was not analyzed as the generated step runs it");
  return true;
}

int64_t Emitter::boundaryEntry(int64_t k, TensorId t, bool backward, bool first) {
  const auto &chunkOf = a.pipelineStep.chunkOfOp;
  int64_t found = -1;
  for (size_t e = 0; e < a.stepSchedule.size(); ++e) {
    const StepEntry &se = a.stepSchedule[e];
    if (se.kind == StepEntry::Optimizer || chunkOf[se.op] != k || (se.kind != StepEntry::Forward) != backward)
      continue;
    bool touches = false;
    for (const auto *list : {&s.ops[se.op].inputs, &s.ops[se.op].outputs})
      for (TensorId x : *list)
        touches = touches || s.storageOf(x) == t;
    if (!touches)
      continue;
    found = static_cast<int64_t>(e);
    if (first)
      break;
  }
  return found;
}

bool Emitter::chunkFunction(int64_t k, bool backward, std::string &out) {
  const auto &ps = a.pipelineStep;
  const auto &ch = ps.chunks[static_cast<size_t>(k)];
  const int64_t p = ps.stages, chunks = p * ps.interleave, m = ps.microBatches;
  chunkNow = k;
  body.clear();
  gatheredNow.clear(); // a unit gathers afresh: another unit may have written the buffers since
  inBackward = false;
  // A boundary move of storage x: at the entry where it is addressed, to or from rank `peer`.
  auto move = [&](TensorId x, int64_t entry, bool send, int64_t peer, int64_t boundary, int dir, const char *why) {
    if (entry < 0)
      return fail("internal error: pipeline stage " + std::to_string(k) + " does not use " + s.tensorName(x) +
                  ", which crosses its boundary");
    step = buffers.stepOf(static_cast<size_t>(entry));
    body += std::string("\n  // pipeline: ") + why + "\n";
    site(send ? "pipeline.send" : "pipeline.recv", send ? "communication" : "bubble");
    std::string p0 = ptr(x);
    // Tensor x pipeline: each tensor rank moves its 1/t piece, the receiver all-gathers the rest
    // from its tensor group (Megatron's scatter/gather, as boundarySend prices it); under
    // sequence parallelism the boundary is already the rank's 1/t of the tokens: moved as it is.
    const bool scatter = tensorParallel() && !sequenceParallel();
    const char *piece = scatter ? "_piece" : "";
    line(llvm::formatv("tally_comm::pp_{0}{7}<{1}>(ctx, {2}, {3}, {4}, {5} + static_cast<int>(mb){6});",
                       send ? "send" : "recv", T(x), p0, n(x), peer, (2 * boundary + dir) * m, send ? ", key" : "", piece)
             .str());
    if (scatter && !send) {
      site("pipeline.tensor_all_gather", "communication");
      line(llvm::formatv("tally_comm::tp_all_gather<{0}>(ctx, {1}, {2});", T(x), p0, n(x)).str());
    }
    return error.empty();
  };
  auto grad = [&](TensorId x) { return s.storageOf(s.gradient[x]); };
  if (!backward && k > 0)
    for (TensorId x : ch.inputs)
      if (!move(x, boundaryEntry(k, x, false, true), false, (k - 1) % p, k, 0, "the activation from the stage before"))
        return false;
  if (backward && k + 1 < chunks)
    for (TensorId x : ch.outputs)
      if (!move(grad(x), boundaryEntry(k, grad(x), true, true), false, (k + 1) % p, k + 1, 1,
                "the gradient of an activation sent on, from the stage after"))
        return false;
  for (size_t e = 0; e < a.stepSchedule.size(); ++e) {
    const StepEntry &se = a.stepSchedule[e];
    if (se.kind == StepEntry::Optimizer || ps.chunkOfOp[se.op] != k || (se.kind != StepEntry::Forward) != backward)
      continue;
    if (!scheduleEntry(e, [](size_t, size_t) {})) // no overlapped buckets in a pipeline
      return false;
  }
  op = nullptr;
  if (!backward && k + 1 < chunks)
    for (TensorId x : ch.outputs)
      if (!move(x, boundaryEntry(k, x, false, true), true, (k + 1) % p, k + 1, 0, "the activation to the stage after"))
        return false;
  if (backward && k > 0)
    for (TensorId x : ch.inputs)
      if (!move(grad(x), boundaryEntry(k, grad(x), true, false), true, (k - 1) % p, k, 1,
                "the gradient of a received activation, to the stage before"))
        return false;
  chunkNow = -1;
  out += llvm::formatv("/// Stage {0} (rank {1}, chunk {2}): the {3} of micro-batch `mb` in the slot at arena offset `cb`{4}.\n"
                       "static double {5}{0}(rt::Ctx &ctx, [[maybe_unused]] uint64_t seed, [[maybe_unused]] int64_t mb, "
                       "[[maybe_unused]] int64_t cb, [[maybe_unused]] int64_t key) {{\n  double loss = 0;\n{7}{6}"
                       "  return loss;\n}\n\n",
                       k, k % p, k / p, backward ? "backward" : "forward",
                       backward ? "" : "; its loss (the last stage's)", backward ? "backward" : "forward", body,
                       be.device ? "  [[maybe_unused]] const int64_t m = mb; // the loss's slot (store_loss)\n" : "")
             .str();
  body.clear();
  return true;
}

bool Emitter::pipelineSource(std::string &stages, std::string &tail) {
  const auto &ps = a.pipelineStep;
  const int64_t p = ps.stages, v = ps.interleave, m = ps.microBatches;
  std::string G = ctype(plan.precision.grads);
  if (be.device) // the last stage's forward stores each micro-batch's loss; train() reads them back
    lossType = ctype(stored(s.loss));
  stages = "/// One unit of a rank's pipeline order: micro-batch, chunk on this rank, backward or forward.\n"
           "struct PipeUnit {\n  int64_t mb, chunk;\n  bool backward;\n};\n\n";
  std::string layouts;
  for (int64_t r = 0; r < p; ++r) {
    selectRank(r);
    if (!error.empty())
      return false;
    std::string text = "namespace stage" + std::to_string(r) + " {\n\n" + tables() + "\n";
    for (int64_t c = 0; c < v; ++c)
      if (!chunkFunction(c * p + r, false, text) || !chunkFunction(c * p + r, true, text))
        return false;
    std::string upd, zero;
    if (!update(upd, zero))
      return false;
    text += upd + "\n" + zero + "\n";
    // The order (pipelineOrder) and each chunk's slots.
    text += "/// The order this rank runs its units in (passes/PipelineTimeline.cpp, pipelineOrder).\n"
            "static const PipeUnit kOrder[] = {";
    for (const PipelineUnit &u : ps.order[static_cast<size_t>(r)])
      text += llvm::formatv("{{{0}, {1}, {2}}, ", u.microBatch, u.chunk, boolean(u.backward)).str();
    text += "};\n";
    std::string slots, bytes, base, cases;
    for (int64_t c = 0; c < v; ++c) {
      const auto &ch = ps.chunks[static_cast<size_t>(c * p + r)];
      slots += (c ? ", " : "") + std::to_string(std::max<int64_t>(1, ch.slots));
      bytes += (c ? ", " : "") + std::to_string(ch.slotBytes);
      base += (c ? ", " : "") + std::to_string(ch.base);
      int64_t k = c * p + r;
      cases += llvm::formatv("    case {0}: loss += forward{1}(ctx, s, u.mb, cb, key); break;\n"
                             "    case {2}: backward{1}(ctx, s, u.mb, cb, key); break;\n",
                             2 * c, k, 2 * c + 1)
                   .str();
    }
    text += "/// Per chunk on this rank: the micro-batches it holds at once, one slot's bytes, slot 0's offset.\n"
            "static const int64_t kSlots[] = {" + slots + "}, kSlotBytes[] = {" + bytes + "}, kBase[] = {" + base +
            "};\n\n";
    std::string shared;
    const auto &rank = ps.ranks[static_cast<size_t>(r)];
    for (size_t i = 0; i < rank.shared.size(); ++i) {
      TensorId w = rank.shared[i];
      shared += "  // pipeline: the gradient of " + commentSafe(s.tensorName(w)) + ", read on rank " +
                std::to_string(rank.peers[i]) + " too: the two ranks' summed (Megatron's embedding all-reduce),\n"
                "  // once both got here (the wait is the drain of the pipeline: idle)\n" +
                siteText("pipeline.shared_gradient", "bubble") +
                "  tally_comm::pp_sync(ctx, " + std::to_string(rank.peers[i]) + ");\n" +
                siteText("pipeline.shared_gradient", "communication") +
                // ZeRO 2 and 3: this data rank's piece of it, on both ranks (its stage's regions).
                llvm::formatv("  tally_comm::pp_sum_with<{0}>(ctx, G<{0}>({1}), {2}, {3});\n", G, gradOffset.at(w),
                              pieced() ? pieceOf(w) : n(w), rank.peers[i])
                    .str();
    }
    text += "/// One optimizer step of this rank: its units in order, the shared gradients summed, the update.\n"
            "static double train(rt::Ctx &ctx, int64_t step, uint64_t seed, void (*load_micro_batch)(int64_t m),\n"
            "                    void (*before_zero)(), bool *updated, void (*check_gradients)()) {\n"
            "  double loss = 0;\n"
            "  for (const PipeUnit &u : kOrder) {\n"
            "    const int64_t slot = u.mb % kSlots[u.chunk], cb = kBase[u.chunk] + slot * kSlotBytes[u.chunk];\n"
            "    const int64_t key = u.chunk * " + std::to_string(m) + " + slot;\n" +
            siteText("pipeline.send_wait", "bubble") +
            "    tally_comm::pp_wait(ctx, key); // this slot's sends are taken before it is written again\n"
            "    load_micro_batch(u.mb);\n"
            "    const uint64_t s = seed + static_cast<uint64_t>(u.mb);\n"
            "    switch (2 * u.chunk + (u.backward ? 1 : 0)) {\n" + cases + "    }\n  }\n" +
            siteText("pipeline.send_wait", "bubble") + "  tally_comm::pp_wait_all(ctx);\n" + shared +
            (dataParallel() && !pieced() ? std::string(tensorParallel() ? "  // data x tensor x pipeline: this rank's cut of its stage's gradients "
                                                             "averaged over its data group"
                                                           : "  // data x pipeline: this stage's gradients averaged over its data group") +
                                  (sharded() ? " (ZeRO-1: reduce-scattered, each rank keeping its shard)\n"
                                             : "\n") +
                                  "  reduce_gradients(ctx);\n"
                            : std::string()) +
            sequenceGradients() + // sequence parallel: this stage's norms' gradients over its tensor group
            (be.device ? "  loss = read_losses<" + lossType + ">(ctx); // the last stage's losses (0 elsewhere)\n"
                       : std::string()) +
            "  if (check_gradients) // every rank: the ranks agree by an all-reduce\n    check_gradients();\n" +
            (sharded() ? "  if (before_zero) {\n    gather_gradients(ctx);\n    before_zero();\n  }\n"
                       : "  if (before_zero)\n    before_zero();\n") +
            "  *updated = update(ctx, step);\n  zero_grad(ctx);\n"
            "  return loss / static_cast<double>(kLayout.microSteps);\n}\n\n} // namespace stage" +
            std::to_string(r) + "\n\n";
    stages += text;
    std::string ns = "stage" + std::to_string(r) + "::";
    layouts += "    " + layoutRow(ns + "kParams", ns + "kInputs", rank.arenaBytes, r) + ",\n";
  }
  stages = functors + stages; // the fused kernels' functors, which every rank's units may call
  regions = a.regions;
  index();
  std::string cases;
  for (int64_t r = 0; r < p; ++r)
    cases += "  case " + std::to_string(r) + ": return stage" + std::to_string(r) +
             "::train(ctx, step, seed, load_micro_batch, before_zero, updated, check_gradients);\n";
  // The rank's stage by the plan's rank order (passes/Collectives.h, rankStride): its pipeline
  // coordinate; the stages are the innermost ranks unless `order` puts the data ranks inside.
  const int64_t stageStride = rankStride(plan, 'p');
  const std::string stride = stageStride == 1 ? "" : " / " + std::to_string(stageStride);
  tail = (be.device ? graphPlan() : std::string()) +
         "/// Every pipeline rank's layout: its regions and arena (passes/PipelineStep.cpp).\n"
         "static const Layout kStageLayouts[] = {\n" + layouts + "};\n" +
         "Layout kLayout = kStageLayouts[0];\n"
         "void select_stage(int rank) { kLayout = kStageLayouts[rank" + stride + " % " + std::to_string(p) + "]; }\n\n"
         "double train_step(rt::Ctx &ctx, int64_t step, uint64_t seed, void (*load_micro_batch)(int64_t m),\n"
         "                  void (*before_zero)(), bool *updated, void (*check_gradients)()) {\n"
         "  switch (kLayout.stage) {\n" + cases + "  }\n  return 0;\n}\n\n";
  return error.empty();
}

} // namespace tally::codegen::emit
