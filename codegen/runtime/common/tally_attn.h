// tally runtime, common: the row strides attention's q, k and v may have (AttnRows) and what is
// done to the scores besides the scale and the causal mask (AttnScores), shared by the CPU and
// CUDA runtimes so generated steps pass the same values to either.
#pragma once

#include <cstdint>

namespace rt {

/// Row strides, in elements, of attention's q, k and v (and of dq, dk, dv in the backward, which
/// are the same views of the gradient buffer). 0 = dense: H·hd for q, Hkv·hd for k and v. A
/// larger stride reads a column slice of a wider buffer, e.g. q, k, v as the three parts of one
/// fused projection [B, S, (H + 2·Hkv)·hd]; the backward writes (or adds to) only the slice's
/// columns. A stride smaller than the width is an error.
struct AttnRows {
  int64_t q = 0, k = 0, v = 0;
};

/// window > 0: a sliding window with the causal mask (Mistral, Gemma 2): query i, at position
/// i + Skv − S among the keys, sees keys i + Skv − S − window < j <= i + Skv − S, `window` keys
/// with itself. softcap > 0: each scaled score s becomes softcap·tanh(s / softcap) before the
/// mask and the softmax (Gemma 2's attention logit soft-capping). 0: neither.
struct AttnScores {
  int64_t window = 0;
  float softcap = 0.0f;
};

}  // namespace rt
