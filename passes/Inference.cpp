// Inference: the prefill, the per-token decode, the KV cache and tokens per second of an infer
// plan. The graph is lowered with seq = prompt and batch = the plan's batch, so its forward is
// the prefill; a decode step (one new token for each of the b sequences) is derived from the
// same ops. docs/time.md works the formulas through on GPT-2.
//
// 1. Prefill = the graph's forward as lowered (it includes the loss when the model's forward
//    returns one): flops.forward model FLOPs; its time is time.forward + time.communication +
//    time.hostTransfer (passes/StepTime.cpp: kernels, tensor-parallel all-reduces, pipeline
//    sends, the prompt's upload).
// 2. The KV cache, from the Attention ops, not from names: a self-attention op (k as long as
//    q) keeps K and V of every token, 2 × d_kv × b(activations) bytes per token and sequence,
//    with d_kv the width of its k input; its count is the number of layers. A cross-attention
//    op (k of another length s_kv) keeps its fixed K and V, 2 × s_kv × d_kv per sequence. The
//    cache is sized for prompt + generate tokens; tensor parallelism splits it with the heads.
//    A self-attention op with a sliding window of w keys keeps only the last w positions:
//    min(w, prompt + generate) of them (kvBytesPerToken still counts its K and V of a token).
// 3. A decode step at context c (the tokens attended to, the new one included), per op:
//    - self-attention: FLOPs (4·dh + 5)·b·h·c = 4·b·d·c + 5·b·h·c (QKᵀ and P·V over the
//      cache, scale and softmax); bytes: q and the output (2·b·d), the cache read
//      (2·b·c·d_kv) and the new K and V appended (2·b·d_kv), at the activation dtype.
//      Cross-attention is the same with c = s_kv and nothing appended; a sliding window of w
//      keys attends to min(c, w) of them.
//    - every other op works token by token: its FLOPs are its prefill FLOPs / prompt; it reads
//      its weights whole (the bytes of inputs stored as parameters; an embedding gathers
//      rows, which scale with tokens) and the rest of its bytes / prompt.
//    - views move nothing; the loss and next_tokens are left out: decoding produces logits.
//    Each op's time is kernelTime (passes/StepTime.cpp) of its FLOPs, bytes and
//    transcendentals (attention: an exp per score; the rest: the prefill's / prompt) divided
//    by its tensor-parallel split, one kernel call each, so decode mat-vecs, at about one FLOP
//    per weight byte, are memory-bound. Without attention the sum is the familiar 2 × params
//    FLOPs per token and the weight bytes; twoNFlops shows that estimate beside the exact
//    count. The all-reduces, pipeline sends and uploads of a step are the prefill's / prompt:
//    they carry one token; parameters kept on the host cross the host link whole at every
//    step.
// 4. Decode steps: the prefill yields the first generated token, so generate − 1 steps follow,
//    step j at context c = prompt + j. FLOPs and bytes grow linearly in c, so their mean over
//    the steps is their value at the mean context prompt + generate / 2; the time of each
//    attention op is summed step by step (max(compute, memory) is not linear), the other ops
//    cost the same at every step. decodeTime is the mean step; tokens/s = b / decodeTime;
//    total = prefill + every step. A plan with generate ≤ 1 reports one step at prompt + 1.
// 5. Analysis fields: time.step = the mean decode step, time.steps = decode steps, time.run
//    = total; MFU (= HFU: a decode step skips and recomputes nothing) = decode FLOPs / (mean
//    step × peak × the replica's tensor × pipeline devices); memory.peak adds the device's
//    share of the KV cache to the parameters and
//    the prefill's working set (an upper bound: the prefill's transients and the full cache
//    are not live at once).
// 6. Serving capacity (issue 45), vLLM's paged cache (Kwon et al. 2023, "Efficient Memory
//    Management for Large Language Model Serving with PagedAttention"; vllm/core/block_manager
//    and vllm/worker/cache_engine.py): a sequence of max_context = C tokens holds ceil(C/B)
//    blocks of B = kv_block tokens in every growing layer (a windowed layer the blocks of its
//    last w tokens, a cross-attention those of its s_kv keys), K and V in kv_dtype. The device
//    gives the cache what the plan leaves: (limit − context − comm buffers − (1 + reserve) ×
//    (weights + the prefill's activations and workspace)) / (1 + reserve) (servingCapacity,
//    after allocatorReserve); max_concurrent = floor(that / one sequence's bytes), kv blocks
//    = floor(that / (B × kv bytes per token)). Time to first token = the prefill of the batch's
//    prompts; inter-token latency = the decode step with every sequence at C (the slowest:
//    weights + every sequence's whole cache read); tokens/s per GPU = batch / that step /
//    (tensor × pipeline). Tensor parallelism splits the KV heads over its ranks; with more
//    ranks than KV heads each rank keeps a copy of one (vLLM replicates them), so the cache
//    per device is 1/kv_heads of it, not 1/t.
// 7. Multi-head latent attention (DeepSeek-V2's MLA, `attention(..., latent = r, latent_rope =
//    p)`): the cache holds each token's compressed c_kv (r values) and its decoupled RoPE key
//    (p values, shared by the heads), r + p per token and layer, not K and V (DeepSeek-V2,
//    arXiv:2405.04434, §2.1.2-2.1.3 and Table 1: (d_c + d_h^R)·l elements per token); it is one
//    "KV head" that every tensor rank keeps whole. The decode step is priced in the absorbed
//    form DeepSeek's inference runs: W_UK folded into the query and W_UV into the output, each
//    head scores the cached latent and RoPE key (2·(r + p) per score) and sums the latent
//    (2·r per score), reading the cache once for all heads. The graph's up-projection of c_kv
//    (kv_b: r → h·(nope + v)) stays a token-wise op: on the new token its FLOPs and weight bytes
//    equal the absorbed per-token products (q_nope·W_UK and o·W_UV read the same r × h·(nope + v)
//    weights), so the step counts them once. The prefill (the graph) is the non-absorbed form.
// 8. Encoders (BERT: attention everywhere and none of it causal): without the causal mask a
//    new token changes the output at every earlier position, so an encoder neither keeps K and
//    V nor decodes; it runs its forward over the whole input. Its plan is the prefill alone: no
//    KV cache, no decode steps, the step and the request are the forward, throughput is
//    batch × prompt tokens / the forward's time (per GPU: over the replica's devices) and MFU
//    the forward's FLOPs over that time at the replica's peak. A plan that asks such a model
//    to generate tokens is an error (checkServing).
// Pipeline parallelism does not shorten a token's latency: a token passes every stage in
// turn, so the times are sums over all ops; each stage holds 1/p of the cache.
#include "passes/Collectives.h"
#include "passes/Passes.h"
#include "support/Diagnostics.h"
#include "support/Format.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace tally {

namespace {

/// Step 2-3: one attention op of the graph, as a decode step sees it.
struct AttentionOp {
  OpId op;
  bool self;            ///< k as long as q: the cache grows with the context
  double b, h, d, dkv, skv;
  double dOut;          ///< the output's width, h·dv (d unless the value heads differ: MLA)
  double cacheWidth;    ///< values cached per token: K and V (d_kv + d_v), or MLA's latent + RoPE key
  double latent = 0, latentRope = 0; ///< MLA's kv_lora_rank and qk_rope_head_dim (0: K and V cached)
  double window;        ///< a sliding window's keys; 0: none
  double kvHeads;       ///< key/value heads (grouped-query attention: fewer than h)
  double replication;   ///< copies of each KV head over the tensor ranks (1: none)
  double kvSplit;       ///< what the cache divides by on one device
};

/// Step 2: tensor parallelism splits the heads over t ranks (op.tensorSplit = t × the context
/// degree). With more ranks than KV heads, each rank keeps a copy of the KV head its query
/// heads read, as vLLM replicates them (its QKVParallelLinear: num_kv_head_replicas = t /
/// kv heads): the cache splits over only the KV heads' ranks.
AttentionOp attentionOf(const Graph &g, OpId i, const OpAnalysis &o, const Parallelism &par) {
  const Op &op = g.ops[i];
  const Shape &q = g.tensors[op.inputs[0]].shape, &k = g.tensors[op.inputs[1]].shape;
  AttentionOp at;
  at.op = i;
  at.self = k[1].size == q[1].size;
  at.b = static_cast<double>(q[0].size);
  at.h = static_cast<double>(op.attrs->heads);
  at.d = static_cast<double>(q[2].size);
  at.dkv = static_cast<double>(k[2].size);
  at.skv = static_cast<double>(k[1].size);
  at.dOut = static_cast<double>(g.tensors[op.outputs[0]].shape[2].size);
  at.cacheWidth = at.dkv + static_cast<double>(g.tensors[op.inputs[2]].shape[2].size);
  at.window = static_cast<double>(op.attrs->attnWindow);
  at.kvHeads = static_cast<double>(op.attrs->kvHeads > 0 ? op.attrs->kvHeads : op.attrs->heads);
  if (op.attrs->latent > 0) { // MLA: one latent per token, read by every head (absorbed: MQA)
    at.latent = static_cast<double>(op.attrs->latent);
    at.latentRope = static_cast<double>(op.attrs->latentRope);
    at.cacheWidth = at.latent + at.latentRope;
    at.kvHeads = 1;
  }
  double t = degree(par.tensor);
  bool headsSplit = t > 1 && o.tensorSplit >= t;
  at.replication = headsSplit && at.kvHeads > 0 && t > at.kvHeads ? t / at.kvHeads : 1;
  at.kvSplit = o.tensorSplit / at.replication;
  return at;
}

/// Step 3: the context an attention op attends to in a decode step at context c.
double attendedContext(const AttentionOp &at, double c) {
  double ctx = at.self ? c : at.skv;
  return at.window > 0 ? std::min(ctx, at.window) : ctx;
}

/// Step 3: the cache bytes one attention op reads and appends in a decode step at context c,
/// in the cache's dtype (kv bytes per element).
double cacheTraffic(const AttentionOp &at, double kv, double c) {
  double ctx = attendedContext(at, c);
  return at.b * ctx * at.cacheWidth * kv + (at.self ? at.b * at.cacheWidth * kv : 0);
}

/// Step 3: the work of one attention op in a decode step at context c: its FLOPs, bytes (q
/// and the output in the activations' dtype, the cache in kv_dtype: `ratio` = its bytes over
/// the activations') and an exp per score (b·h·c scores: the new token's row).
KernelWork attentionDecode(const AttentionOp &at, double act, double ratio, double c) {
  double ctx = attendedContext(at, c);
  KernelWork w;
  // QKᵀ over q's width and P·V over the output's; MLA absorbed: each head's query, mapped
  // into the latent (W_UK absorbed into W_Q: latent + rope dims), scores the cached latent and
  // RoPE key, and its output stays in the latent (latent dims) until W_UV (absorbed into W_O).
  double qWidth = at.latent > 0 ? at.h * (at.latent + at.latentRope) : at.d;
  double oWidth = at.latent > 0 ? at.h * at.latent : at.dOut;
  w.flops = 2 * at.b * ctx * (qWidth + oWidth) + 5 * at.b * at.h * ctx;
  w.bytes = (at.b * (qWidth + oWidth) + at.b * ctx * at.cacheWidth * ratio +
             (at.self ? at.b * at.cacheWidth * ratio : 0)) *
            act;
  w.transcendentals = at.b * at.h * ctx;
  // On the host a call of more than kForkAttentionWork (B·H·S·S_kv·hd: one query row per
  // sequence here) starts the team of threads, as forkingCalls says; ignored by the targets
  // that do not price it.
  w.forks = at.b * qWidth * ctx > kForkAttentionWork ? w.calls : 0;
  return w;
}

/// Serving: one sequence's cache bytes (per device, before the pipeline split) at context C
/// in blocks of B tokens. A growing layer holds ceil(C/B) blocks; a layer with a window of w
/// keys holds the blocks its last min(C, w) tokens touch, floor((C−1)/B) − floor((C−w)/B) + 1
/// once C > w (vLLM frees the blocks that slide out); a cross-attention its s_kv keys' blocks.
double pagedSequenceBytes(const AttentionOp &at, double kv, double C, double B) {
  double perToken = at.cacheWidth * kv / at.kvSplit;
  double blocks = std::ceil((at.self ? C : at.skv) / B);
  if (at.self && at.window > 0 && C > at.window)
    blocks = std::floor((C - 1) / B) - std::floor((C - at.window) / B) + 1;
  return blocks * B * perToken;
}

/// Step 2: the cache per token of the layers whose cache grows with every token, of the
/// windowed layers; the windowed layers' whole cache; the cross-attention's fixed cache. Each
/// op's bytes are its K and V, or its latent and RoPE key (MLA), in the cache's dtype.
struct CacheTotals {
  double growing = 0, windowedPerToken = 0, windowed = 0, fixed = 0;
  void add(Analysis &a, const AttentionOp &at, double kv, double sequence) {
    auto &inf = a.inference;
    double perToken = at.cacheWidth * kv / at.kvSplit;
    if (at.self) {
      ++inf.layers;
      inf.kvHeads = std::max(inf.kvHeads, static_cast<int64_t>(at.kvHeads));
      inf.kvReplication = std::max(inf.kvReplication, at.replication);
    }
    if (at.self && at.latent > 0) {
      ++inf.latentLayers;
      inf.latentWidth = std::max(inf.latentWidth, static_cast<int64_t>(at.cacheWidth));
    }
    if (at.self && at.window > 0) {
      ++inf.windowedLayers;
      windowedPerToken += perToken;
      windowed += std::min(at.window, sequence) * perToken;
    } else if (at.self) {
      growing += perToken;
    } else {
      fixed += at.skv * perToken;
    }
  }
};

/// Serving: the rows of a learned positional table read at positions(n) (`wpe(positions(seq))`):
/// the context the model can take. 0 when no table is read so (rotary or no positions).
void positionalLimit(const Graph &g, Analysis &a) {
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const Op &op = g.ops[i];
    if (op.kind != OpKind::Embedding || op.inputs.size() < 2)
      continue;
    OpId p = g.tensors[op.inputs[0]].producer;
    const Shape &rows = g.tensors[op.inputs[1]].shape;
    if (p == kNone || g.ops[p].kind != OpKind::Positions || rows.empty())
      continue;
    int64_t n = rows[0].size;
    if (a.inference.modelMaxContext == 0 || n < a.inference.modelMaxContext) {
      a.inference.modelMaxContext = n;
      a.inference.positionsOp = p;
    }
  }
}

/// Step 3: the work of a token-wise op in a decode step: its FLOPs and transcendentals are
/// the prefill's over the prompt, its bytes its weights and the rest over the prompt.
KernelWork tokenwiseDecode(const Graph &g, const Op &op, const OpAnalysis &o, double prompt) {
  double weights = 0;
  if (op.kind != OpKind::Embedding)
    for (TensorId x : op.inputs)
      if (g.isParamStorage(x))
        weights += g.bytes(x);
  double total = o.forward.bytesRead + o.forward.bytesWritten;
  KernelWork w;
  w.flops = o.forward.executedFlops / prompt;
  w.bytes = weights + std::max(0.0, total - weights) / prompt;
  w.transcendentals = o.forward.transcendentals / prompt;
  return w;
}

bool skippedInDecode(const Op &op) {
  return opClass(op.kind) == OpClass::View || opClass(op.kind) == OpClass::Loss ||
         op.kind == OpKind::NextTokens;
}

/// Step 6: the paged cache of one sequence at max_context (per device: over the pipeline's p
/// stages too) and the model's own limit on the context.
void pagedCache(Analysis &a, const std::vector<AttentionOp> &attention, double kv,
                double sequence, double p) {
  const Plan &plan = *a.plan;
  auto &inf = a.inference;
  inf.maxContext = plan.maxContext > 0 ? static_cast<double>(plan.maxContext) : sequence;
  inf.kvBlock = static_cast<double>(plan.kvBlock > 0 ? plan.kvBlock : 16);
  inf.kvBlocksPerSequence = std::ceil(inf.maxContext / inf.kvBlock);
  inf.kvBlockBytes = inf.kvBlock * inf.kvBytesPerToken;
  double perSequence = 0;
  for (const AttentionOp &at : attention)
    perSequence += pagedSequenceBytes(at, kv, inf.maxContext, inf.kvBlock);
  inf.kvBytesPerSequence = perSequence / p;
  positionalLimit(*a.graph, a);
}

/// Step 8: the model's attention ops when none of them is causal (an encoder); 0 otherwise,
/// and for a model without attention.
int64_t bidirectionalAttention(const Graph &g) {
  int64_t n = 0;
  for (const Op &op : g.ops) {
    if (op.kind != OpKind::Attention)
      continue;
    if (op.attrs->causal)
      return 0;
    ++n;
  }
  return n;
}

/// Step 8: an encoder's plan is its forward over the prompt: nothing cached, nothing decoded.
void encoderForward(Analysis &a, double prompt, double replica) {
  const Plan &plan = *a.plan;
  auto &inf = a.inference;
  inf.encoder = true;
  inf.bidirectionalLayers = bidirectionalAttention(*a.graph);
  inf.forwardTokensPerSecondPerGpu = inf.forwardTokensPerSecond / replica;
  inf.totalTime = inf.timeToFirstToken = inf.prefillTime;
  inf.maxContext = plan.maxContext > 0 ? static_cast<double>(plan.maxContext) : prompt;
  inf.peakWithoutKv = a.memory.peak;
  a.time.step = a.time.run = inf.prefillTime;
  a.time.steps = 1;
  a.time.runDays = inf.prefillTime / 86400;
  double capacity = inf.prefillTime * a.peakFlops * replica;
  a.time.mfu = a.time.hfu = capacity > 0 ? inf.prefillFlops / capacity : 0;
  positionalLimit(*a.graph, a);
}

} // namespace

void inference(Analysis &a) {
  const Graph &g = *a.graph;
  const Plan &plan = *a.plan;
  if (plan.isTrain)
    return;
  auto &inf = a.inference;
  const Target &target = plan.target;
  const Parallelism &par = plan.parallel;
  double act = bytesOf(g.activationDtype);
  inf.kvDtype = plan.kvDtype != Dtype::Invalid ? plan.kvDtype : g.activationDtype;
  double kv = bytesOf(inf.kvDtype), ratio = kv / act;
  double prompt = static_cast<double>(std::max<int64_t>(1, plan.seq));
  double generate = static_cast<double>(std::max<int64_t>(0, plan.generate));
  double batch = static_cast<double>(plan.batch);
  inf.active = true;

  // Step 1.
  inf.prefillFlops = a.flops.forward;
  inf.prefillTime = a.time.forward + a.time.communication + a.time.hostTransfer;
  inf.forwardTokensPerSecond = inf.prefillTime > 0 ? batch * prompt / inf.prefillTime : 0;
  if (bidirectionalAttention(g) > 0) // step 8
    return encoderForward(a, prompt, degree(par.tensor) * degree(par.pipeline));

  // Steps 2-3: the decode step's ops; attention ops are priced per context in step 4.
  std::vector<AttentionOp> attention;
  double stream = plan.precision.paramsOnHost ? a.memory.hostTotal / hostLinkBandwidth(target) : 0;
  double fixedTime = (a.time.communication + a.time.hostTransfer - stream) / prompt + stream;
  double fixedFlops = 0, fixedBytes = 0;
  CacheTotals cache;
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const Op &op = g.ops[i];
    const OpAnalysis &o = a.ops[i];
    if (skippedInDecode(op))
      continue;
    Analysis::DecodeOp d;
    d.op = i;
    if (op.kind == OpKind::Attention && op.inputs.size() == 3) {
      AttentionOp at = attentionOf(g, i, o, par);
      attention.push_back(at);
      cache.add(a, at, kv, prompt + generate);
      inf.ops.push_back(d); // priced at the mean context below
      continue;
    }
    KernelWork w = tokenwiseDecode(g, op, o, prompt);
    w.measuredArithmetic = unaryArithmetic(target, g, op, false) / prompt;
    w.forks = forkingCalls(target, g, op, o.tensorSplit, w.calls, prompt);
    d.flops = w.flops;
    d.bytes = w.bytes;
    d.time = kernelTime(target, opClass(op.kind), o.computeDtype, splitWork(w, o.tensorSplit));
    fixedTime += d.time;
    fixedFlops += d.flops;
    fixedBytes += d.bytes;
    inf.ops.push_back(d);
  }
  double p = degree(par.pipeline), replica = degree(par.tensor) * p;
  inf.kvBytesPerToken = (cache.windowedPerToken + cache.growing) / p;
  inf.kvCacheBytes =
      batch * ((prompt + generate) * cache.growing + cache.windowed + cache.fixed) / p;

  // Step 4: the decode steps.
  // The time of a step is one device's: a replicated KV head is read on every rank that
  // holds it, so a device reads the cache over kvSplit, not over the op's split.
  auto attentionAt = [&](const AttentionOp &at, double c, double &flops, double &bytes) {
    KernelWork w = attentionDecode(at, act, ratio, c);
    flops = w.flops;
    bytes = w.bytes;
    KernelWork device = w;
    device.bytes += (at.replication - 1) * cacheTraffic(at, kv, c);
    return kernelTime(target, OpClass::Attention, a.ops[at.op].computeDtype,
                      splitWork(device, a.ops[at.op].tensorSplit));
  };
  auto stepTimeAt = [&](double c) {
    double t = fixedTime, f, b;
    for (const AttentionOp &at : attention)
      t += attentionAt(at, c, f, b);
    return t;
  };
  inf.decodeSteps = std::max(0.0, generate - 1);
  inf.meanContext = inf.decodeSteps > 0 ? prompt + generate / 2 : prompt + 1;
  double decodeTotal = 0;
  for (double j = 1; j <= inf.decodeSteps; ++j)
    decodeTotal += stepTimeAt(prompt + j);
  inf.firstDecodeTime = stepTimeAt(prompt + 1);
  inf.lastDecodeTime = stepTimeAt(prompt + std::max(1.0, inf.decodeSteps));
  inf.decodeTime = inf.decodeSteps > 0 ? decodeTotal / inf.decodeSteps : inf.firstDecodeTime;

  // The mean step's ops, FLOPs and bytes (exact means: both are linear in the context; a
  // windowed op's, which stop growing at its window, are averaged step by step).
  inf.decodeFlops = fixedFlops;
  inf.decodeBytes = fixedBytes;
  size_t next = 0;
  for (Analysis::DecodeOp &d : inf.ops) {
    if (g.ops[d.op].kind != OpKind::Attention)
      continue;
    const AttentionOp &at = attention[next++];
    d.time = attentionAt(at, inf.meanContext, d.flops, d.bytes);
    if (at.window > 0 && inf.decodeSteps > 0) { // min(c, w) is not linear in c: the mean of the steps
      double t = 0, f = 0, b = 0, fj, bj;
      for (double j = 1; j <= inf.decodeSteps; ++j) {
        t += attentionAt(at, prompt + j, fj, bj);
        f += fj;
        b += bj;
      }
      d.time = t / inf.decodeSteps;
      d.flops = f / inf.decodeSteps;
      d.bytes = b / inf.decodeSteps;
    }
    inf.decodeFlops += d.flops;
    inf.decodeBytes += d.bytes;
  }
  for (Analysis::DecodeOp &d : inf.ops) {
    d.intensity = d.bytes > 0 ? d.flops / d.bytes : 0;
    double ridge = target.ridge(a.ops[d.op].computeDtype);
    d.computeBound = d.bytes > 0 && ridge > 0 && d.intensity >= ridge;
  }
  inf.decodeIntensity = inf.decodeBytes > 0 ? inf.decodeFlops / inf.decodeBytes : 0;
  inf.decodeMemoryBound = inf.decodeIntensity < a.ridge;
  inf.tokensPerSecond = inf.decodeTime > 0 ? batch / inf.decodeTime : 0;
  inf.totalTime = inf.prefillTime + decodeTotal;
  inf.twoNFlops = 2 * a.params.total * batch;

  // Step 5.
  a.time.step = inf.decodeTime;
  a.time.steps = inf.decodeSteps;
  a.time.run = inf.totalTime;
  a.time.runDays = inf.totalTime / 86400;
  double capacity = inf.decodeTime * a.peakFlops * replica;
  a.time.mfu = a.time.hfu = capacity > 0 ? inf.decodeFlops / capacity : 0;
  inf.peakWithoutKv = a.memory.peak;
  a.memory.peak += inf.kvCacheBytes;

  // Step 6, serving: sequences of max_context tokens in blocks of kv_block tokens; the
  // slowest decode step (every sequence at max_context) and the prefill of the batch's
  // prompts; the memory they may take is servingCapacity's, after the allocator reserve.
  pagedCache(a, attention, kv, prompt + generate, p);
  inf.timeToFirstToken = inf.prefillTime;
  inf.interTokenLatency = stepTimeAt(inf.maxContext);
  inf.tokensPerSecondPerGpu =
      inf.interTokenLatency > 0 ? batch / inf.interTokenLatency / replica : 0;
}

void servingCapacity(Analysis &a) {
  auto &inf = a.inference;
  if (!inf.active || inf.encoder) // an encoder keeps no cache (step 8)
    return;
  // The plan's peak without its own cache, with the allocator's reserve on what it hands out
  // (allocatorReserve's rule): the weights, the prefill's activations and workspace, the
  // context and the communicators' buffers. The cache takes what is left, with its own reserve.
  double r = reserveFraction(*a.plan), unallocated = unallocatedBytes(a);
  double rest = unallocated + (1 + r) * (inf.peakWithoutKv - unallocated);
  double limit = memoryLimit(*a.plan);
  inf.kvMemoryBytes = limit > 0 ? std::max(0.0, (limit - rest) / (1 + r)) : 0;
  inf.kvBlocksTotal = inf.kvBlockBytes > 0 ? std::floor(inf.kvMemoryBytes / inf.kvBlockBytes) : 0;
  inf.maxConcurrent =
      inf.kvBytesPerSequence > 0 ? std::floor(inf.kvMemoryBytes / inf.kvBytesPerSequence) : 0;
}

namespace {

/// Step 8: an encoder generates nothing; a plan that asks it to is an error at `generate`,
/// with a note at its first attention op.
void checkEncoderGenerate(const Analysis &a, DiagnosticEngine &diags) {
  const Plan &plan = *a.plan;
  const Graph &g = *a.graph;
  auto at = plan.settingRanges.find("generate");
  llvm::SMRange r = at != plan.settingRanges.end() ? at->second : plan.range;
  int64_t n = a.inference.bidirectionalLayers;
  auto first = std::find_if(g.ops.begin(), g.ops.end(),
                            [](const Op &op) { return op.kind == OpKind::Attention; });
  diags
      .report(DiagKind::InvalidValue, r.Start,
              "generate = " + std::to_string(plan.generate) + " asks an encoder to generate "
              "tokens: model '" + g.model + "' has no causal attention (its " +
              std::to_string(n) + (n == 1 ? " attention op is" : " attention ops are") +
              " bidirectional, causal = false), so it keeps no KV cache and decodes nothing; "
              "its infer plan is the forward over the prompt (leave generate out)")
      .range(r)
      .note(first->range.Start, "bidirectional attention here", first->range);
}

} // namespace

void checkServing(const Analysis &a, DiagnosticEngine &diags) {
  const auto &inf = a.inference;
  const Plan &plan = *a.plan;
  if (inf.active && inf.encoder && plan.generate > 0)
    return checkEncoderGenerate(a, diags);
  if (!inf.active || inf.modelMaxContext == 0 ||
      inf.maxContext <= static_cast<double>(inf.modelMaxContext))
    return;
  const Graph &g = *a.graph;
  auto at = plan.settingRanges.find("max_context");
  llvm::SMRange r = at != plan.settingRanges.end() ? at->second : plan.range;
  const Op &positions = g.ops[inf.positionsOp];
  diags
      .report(DiagKind::InvalidValue, r.Start,
              "max_context = " + integerText(inf.maxContext) + " is beyond the model's context: its "
              "learned positional table has " + std::to_string(inf.modelMaxContext) +
              " rows, so positions " + std::to_string(inf.modelMaxContext) + " and later have no "
              "embedding")
      .range(r)
      .note(positions.range.Start, "the positions are made here", positions.range);
}

} // namespace tally
