// tally runtime, common: the Philox4x32-10 counter-based generator (Salmon et al., SC'11) and
// the element -> (counter, key) mapping that makes dropout masks identical on CPU and CUDA.
#pragma once

#include "tally_hd.h"

namespace rt {

/// Four 32-bit words: a Philox counter or output block.
struct u32x4 { uint32_t w[4]; };

/// Philox4x32 with 10 rounds: the block `counter` encrypted under `key`.
/// Round: (hi0, lo0) = M0·c0, (hi1, lo1) = M1·c2;  c = {hi1^c1^k0, lo1, hi0^c3^k1, lo0};
/// the key is bumped by the Weyl constants between rounds.
TALLY_HD inline u32x4 philox4x32_10(u32x4 c, uint32_t k0, uint32_t k1) {
  const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
  const uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) { k0 += W0; k1 += W1; }
    uint64_t p0 = static_cast<uint64_t>(M0) * c.w[0];
    uint64_t p1 = static_cast<uint64_t>(M1) * c.w[2];
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    u32x4 n;
    n.w[0] = hi1 ^ c.w[1] ^ k0;
    n.w[1] = lo1;
    n.w[2] = hi0 ^ c.w[3] ^ k1;
    n.w[3] = lo0;
    c = n;
  }
  return c;
}

/// The Philox block holding elements 4q .. 4q+3 of stream `stream` under `seed`:
/// counter = {lo32(q), hi32(q), lo32(stream), hi32(stream)}, key = {lo32(seed), hi32(seed)}.
TALLY_HD inline u32x4 philox_block(uint64_t seed, uint64_t stream, uint64_t q) {
  u32x4 c;
  c.w[0] = static_cast<uint32_t>(q);
  c.w[1] = static_cast<uint32_t>(q >> 32);
  c.w[2] = static_cast<uint32_t>(stream);
  c.w[3] = static_cast<uint32_t>(stream >> 32);
  return philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

/// A 32-bit output word as a uniform in [0, 1): (word >> 8) · 2^-24 (exact in float).
TALLY_HD inline float philox_word_uniform(uint32_t word) {
  return static_cast<float>(word >> 8) * 5.9604644775390625e-8f;
}

/// The uniform of element `e` of stream `stream` under `seed`: word (e mod 4) of block e / 4.
TALLY_HD inline float philox_uniform(uint64_t seed, uint64_t stream, uint64_t e) {
  u32x4 b = philox_block(seed, stream, e >> 2);
  return philox_word_uniform(b.w[e & 3u]);
}

/// Dropout's decision for element e: keep iff its uniform is >= p.
TALLY_HD inline bool dropout_keep(uint64_t seed, uint64_t stream, uint64_t e, float p) {
  return philox_uniform(seed, stream, e) >= p;
}

} // namespace rt
