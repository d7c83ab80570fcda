// The rule that picks cuDNN's fused attention or the runtime's kernels for the generated CUDA
// step (passes/CudnnAttention.h).
#include "passes/CudnnAttention.h"

#include <algorithm>

namespace tally {

namespace {

/// The row stride of a [batch, seq, width] operand (its second dimension's), or 0.
int64_t rowStride(const Graph &g, TensorId t) {
  const Tensor &x = g.tensors[t];
  llvm::SmallVector<int64_t, 4> st = stridesOf(x.shape, x.layout);
  return st.size() == 3 ? st[1] : 0;
}

double round256(double bytes) { return 256.0 * static_cast<int64_t>((bytes + 255) / 256); }

} // namespace

std::string cudnnAttentionRefusal(const Graph &g, const Op &op) {
  if (op.kind != OpKind::Attention || op.inputs.size() < 3)
    return "not an attention";
  const OpAttrs &at = op.attrs;
  TensorId q = op.inputs[0], k = op.inputs[1], v = op.inputs[2];
  Dtype dt = g.tensors[q].dtype;
  if (dt != Dtype::BF16 && dt != Dtype::F16)
    return nameOf(dt).str() + " (cuDNN's fused attention takes bf16 and fp16)";
  if (!at.fused)
    return "materialised scores (fused = false)";
  if (at.p > 0)
    return "dropout: cuDNN draws its own mask, not the plan's Philox stream that the CPU step replays";
  if (at.attnWindow > 0 || at.softcap > 0 || at.alibi || at.hasMask)
    return "a sliding window, soft cap, ALiBi or padding mask (not in tally's cuDNN graph)";
  const Shape &qs = g.tensors[q].shape, &ks = g.tensors[k].shape;
  if (qs.size() != 3 || ks.size() != 3 || at.heads <= 0)
    return "not [batch, seq, heads·head] operands";
  int64_t H = at.heads, Hkv = at.kvHeads ? at.kvHeads : H, hd = qs[2].size / H;
  int64_t S = qs[1].size, Skv = ks[1].size;
  if (hd % 8 != 0 || hd > 128)
    return "head size " + std::to_string(hd) + " (cuDNN's fused attention: a multiple of 8 up to 128)";
  if (Hkv <= 0 || H % Hkv != 0)
    return "query heads not a multiple of the key/value heads";
  if (at.causal && S != Skv)
    return "a causal mask over " + std::to_string(S) + " queries and " + std::to_string(Skv) +
           " keys (cuDNN aligns the diagonal top-left, tally bottom-right)";
  for (TensorId t : {q, k, v})
    if (rowStride(g, t) % 8 != 0 || g.tensors[t].layout.offset() % 8 != 0)
      return "q, k or v rows not on 16 bytes";
  return "";
}

double cudnnAttentionScratchBytes(int64_t B, int64_t H, int64_t S, int64_t hd) {
  double rows = static_cast<double>(B) * static_cast<double>(H) * static_cast<double>(S);
  return round256(rows * static_cast<double>(hd) * 4) + round256(rows * 4);
}

double cudnnAttentionWorkspace(const Graph &g) {
  double most = 0;
  for (const Op &op : g.ops) {
    if (op.kind != OpKind::Attention || !cudnnAttentionRefusal(g, op).empty())
      continue;
    const Shape &qs = g.tensors[op.inputs[0]].shape;
    int64_t H = op.attrs->heads;
    most = std::max(most, cudnnAttentionScratchBytes(qs[0].size, H, qs[1].size, qs[2].size / H));
  }
  return most;
}

} // namespace tally
