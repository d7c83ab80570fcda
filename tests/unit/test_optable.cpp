// test_optable.cpp — unit tests for passes/OpTable.h: per-op records shared between ops with
// equal values. Every op reads back exactly what was last set for it (bit for bit: NaN,
// -0), ops with equal values hold one record, a record changed for one op is not changed for
// the others, records no op holds are reused, and a deep model's repeat copies share theirs.
#include <catch.hpp>

#include "tests/unit/Support.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using namespace tally;
using namespace tally::test;

namespace {

OpAnalysis record(double flops, double time = 0) {
  OpAnalysis r;
  r.forward.flops = flops;
  r.forwardTime = time;
  return r;
}

bool sameBits(const OpAnalysis &x, const OpAnalysis &y) { return std::memcmp(&x, &y, sizeof x) == 0; }

} // namespace

TEST_CASE("optable: ops with equal records share one; a change is the changed op's alone", "[optable]") {
  OpTable t;
  t.assign(3000);
  REQUIRE(t.size() == 3000);
  CHECK(t.distinct() == 1);
  for (size_t i = 0; i < t.size(); ++i)
    CHECK(sameBits(t[i], OpAnalysis()));
  // 1,000 copies of a three-op block: three records.
  for (size_t i = 0; i < t.size(); ++i)
    t.set(i, record(static_cast<double>(i % 3 + 1)));
  CHECK(t.distinct() == 3);
  // One copy's first op changes: a fourth record, the 999 others keep theirs.
  t.set(300, record(1, 0.5));
  CHECK(t.distinct() == 4);
  CHECK(t[300].forwardTime == 0.5);
  CHECK(t[0].forwardTime == 0);
  CHECK(t[303].forwardTime == 0);
  CHECK(t[303].forward.flops == 1);
  // Setting the same value again changes nothing.
  t.set(301, record(2));
  CHECK(t.distinct() == 4);
  // Every op moving to one value leaves one record, and the freed ones are reused.
  for (size_t i = 0; i < t.size(); ++i)
    t.set(i, record(7));
  CHECK(t.distinct() == 1);
  t.set(5, record(8));
  t.set(6, record(9));
  CHECK(t.distinct() == 3);
  CHECK(t[5].forward.flops == 8);
  CHECK(t[6].forward.flops == 9);
  CHECK(t[7].forward.flops == 7);
}

TEST_CASE("optable: equal means bit for bit (NaN shares with NaN, -0 is not 0)", "[optable]") {
  OpTable t;
  t.assign(4);
  t.set(0, record(std::nan("")));
  t.set(1, record(std::nan("")));
  CHECK(t.distinct() == 2); // the NaN record and the default one still held by ops 2, 3
  CHECK(std::isnan(t[0].forward.flops));
  CHECK(std::isnan(t[1].forward.flops));
  t.set(2, record(0.0));
  t.set(3, record(-0.0));
  CHECK(!std::signbit(t[2].forward.flops));
  CHECK(std::signbit(t[3].forward.flops));
  CHECK(t.distinct() == 3); // NaN, 0 (the default), -0
  // Each field takes part: records differing in one field only are two records.
  OpAnalysis a = record(1), b = record(1);
  b.computeBound = true;
  t.set(0, a);
  t.set(1, b);
  CHECK(!t[0].computeBound);
  CHECK(t[1].computeBound);
}

TEST_CASE("optable: random writes read back exactly what was set", "[optable]") {
  // Values from a small set, so that ops share, move and free records many times over; a
  // plain vector of the values set is the reference.
  std::mt19937 rng(12345);
  const size_t n = 5000;
  OpTable t;
  t.assign(n);
  std::vector<OpAnalysis> reference(n);
  for (int round = 0; round < 20000; ++round) {
    size_t op = rng() % n;
    OpAnalysis r = record(static_cast<double>(rng() % 17), static_cast<double>(rng() % 3) * 0.25);
    r.backwardCalls = static_cast<double>(rng() % 2);
    r.computeDtype = rng() % 2 ? Dtype::BF16 : Dtype::F32;
    t.set(op, r);
    reference[op] = r;
  }
  size_t mismatches = 0;
  for (size_t i = 0; i < n; ++i)
    mismatches += !sameBits(t[i], reference[i]);
  CHECK(mismatches == 0);
  CHECK(t.distinct() <= 17 * 3 * 2 * 2 + 1);
  // Reads in order through the iterator give the same records.
  size_t i = 0;
  for (const OpAnalysis &r : t)
    mismatches += !sameBits(r, reference[i++]);
  CHECK(i == n);
  CHECK(mismatches == 0);
}

TEST_CASE("optable: a deep model's repeat copies share their records", "[optable]") {
  // 64 layers of a small GPT (Support.h): the records are those of one layer and the ops
  // outside the layers, not one per op.
  std::string text = std::string(kTinyGPTModel) +
                     "train t { model = TinyGPT(vocab = 256, d = 64, layers = 64)  batch = 4  seq = 32"
                     "  optimizer = AdamW(lr = 1e-3)  target = H100_SXM }\n";
  Compiled c(text);
  const Analysis &a = *c.a;
  REQUIRE(a.ops.size() > 64 * 10);
  size_t perLayer = 0;
  for (OpId o = 0; o < a.ops.size(); ++o)
    perLayer += c.g().instancePath(c.g().ops[o].instance).rfind("h[0]", 0) == 0;
  CHECK(a.ops.distinct() <= perLayer + (a.ops.size() - 64 * perLayer));
  // Same numbers in every copy: layer 5's qkv matmul reads what layer 0's does.
  CHECK(sameBits(c.at("h[5].attn.qkv.matmul"), c.at("h[0].attn.qkv.matmul")));
}
