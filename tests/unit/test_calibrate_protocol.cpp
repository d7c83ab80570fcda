// Unit tests for tally-measure's output as tally calibrate reads it (tools/calibrate/Protocol.cpp):
// a Result written and read back is the same bit for bit (so the target tally writes is the
// one the child measured), and what is not the protocol's object — another version, a missing
// or mistyped field, an impossible value — is refused with its reason.
#include "tools/calibrate/Calibrate.h"

#include <catch.hpp>

#include <cstring>

// In a namespace of its own: the unit tests build as one unity translation unit per batch,
// and calibrate's Result would clash with tally's in the files after this one.
namespace calibrate_protocol_tests {

using namespace tally::calibrate;
using tally::calibrate::Point;   // declared here, they hide tally's (a using-directive does not)
using tally::calibrate::Result;
using Catch::Matchers::Contains;

namespace {

/// A Result with numbers that decimal text rounds unless it keeps 17 significant digits.
Result sample() {
  Result r;
  r.cpuModel = "Test \"CPU\" @ 2.0GHz";  // quotes must be escaped
  r.cores = 2, r.threads = 2;
  r.memoryBytes = 25275478016.0;
  r.loadAverage = -1;
  r.seconds = 0.1 + 0.2;  // 0.30000000000000004
  r.triadBandwidth = 12892512345.678901;
  r.cacheBytes = 2097152;
  r.cacheBandwidth = 1.0 / 3.0 * 1e10;
  r.elementwiseBandwidth = 3.5762e9;
  r.kernelOverhead = 8.02e-7;
  r.forkOverhead = 2.0 / 3.0 * 1e-5;
  r.transcendentalTime = 2.665e-9;
  r.optimizerBandwidth = 4.1822e10 / 3;
  r.quick = true;
  r.blasCore = "Haswell", r.blasCoreEnv = "Haswell", r.avx512 = true;
  r.matmuls.push_back({"fp32", 64, 64, 64, 1.0 / 7.0 * 1e-4});
  r.matmuls.push_back({"bf16", 1024, 64, 64, 2.0 / 3.0 * 1e-3});
  r.attention.B = 1, r.attention.H = 4, r.attention.S = 128, r.attention.hd = 64;
  r.attention.forwardSeconds = 1e-3 / 3, r.attention.backwardSeconds = 2e-3 / 3;
  r.attentionShapes.push_back({2, 4, 16, 16, 1e-4 / 3, 2e-4 / 3});
  r.unary.push_back({"gelu", 1.0 / 3.0 * 1e-9, 0});
  r.unary.push_back({"silu", 5.078e-10, 2.0 / 7.0 * 1e-9});
  r.unary.push_back({"layer_norm", 1.0 / 11.0 * 1e-9, 0, 13.0 / 3.0 * 1e-9, 6.0 / 7.0 * 1e-9});
  r.sliceSeconds = 1.5e-3, r.sliceSource = "the kernel's default";
  Timing t;
  t.name = "matmul fp32 64x64x64", t.rounds = 4, t.calls = 12, t.rejected = 2, t.median = 1.0 / 7.0 * 1e-4;
  t.spread = 1.0 / 3.0 + 1, t.remeasured = true, t.waitShare = 0.1 / 3;
  r.timings.push_back(t);
  return r;
}

bool sameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

} // namespace

TEST_CASE("calibrate protocol: a result reads back bit for bit", "[calibrate]") {
  Result r = sample(), back;
  std::string text = resultToJSON(r), error;
  REQUIRE(!text.empty());
  REQUIRE(resultFromJSON(text, back, error));
  CHECK(error.empty());
  CHECK(back.cpuModel == r.cpuModel);
  CHECK(back.blasCore == "Haswell");
  CHECK(back.blasCoreEnv == "Haswell");
  CHECK(back.avx512);
  // The host file says which kernels OpenBLAS ran and that the environment chose its AVX2 ones
  // on a CPU with AVX-512; nothing when OpenBLAS chose them itself.
  CHECK_THAT(renderTarget(r, "then"), Contains("OpenBLAS single-threaded per tile (codegen/runtime/cpu), its Haswell kernels."));
  CHECK_THAT(blasCoreNote(r), Contains("OPENBLAS_CORETYPE=Haswell in the environment: its AVX2 kernels on a CPU with AVX-512"));
  Result own = r;
  own.blasCoreEnv = "";
  CHECK(blasCoreNote(own).empty());
  own.blasCoreEnv = "SkylakeX", own.blasCore = "SkylakeX";
  CHECK(blasCoreNote(own).find("AVX2") == std::string::npos);
  CHECK(blasHeldToAvx2(r));
  CHECK_FALSE(blasHeldToAvx2(own));
  CHECK(back.cores == 2);
  CHECK(back.threads == 2);
  CHECK(back.quick);
  for (auto [a, b] : {std::pair{back.memoryBytes, r.memoryBytes}, {back.loadAverage, r.loadAverage},
                      {back.seconds, r.seconds}, {back.triadBandwidth, r.triadBandwidth},
                      {back.cacheBytes, r.cacheBytes}, {back.cacheBandwidth, r.cacheBandwidth},
                      {back.elementwiseBandwidth, r.elementwiseBandwidth},
                      {back.kernelOverhead, r.kernelOverhead},
                      {back.forkOverhead, r.forkOverhead},
                      {back.transcendentalTime, r.transcendentalTime},
                      {back.optimizerBandwidth, r.optimizerBandwidth},
                      {back.attention.forwardSeconds, r.attention.forwardSeconds},
                      {back.attention.backwardSeconds, r.attention.backwardSeconds}})
    CHECK(sameBits(a, b));
  REQUIRE(back.matmuls.size() == 2);
  CHECK(back.matmuls[1].dtype == "bf16");
  CHECK(back.matmuls[1].M == 1024);
  CHECK(back.matmuls[1].N == 64);
  CHECK(sameBits(back.matmuls[0].seconds, r.matmuls[0].seconds));
  CHECK(back.attention.S == 128);
  REQUIRE(back.attentionShapes.size() == 1);
  CHECK(back.attentionShapes[0].S == 16);
  CHECK(back.attentionShapes[0].hd == 16);
  CHECK(sameBits(back.attentionShapes[0].forwardSeconds, r.attentionShapes[0].forwardSeconds));
  CHECK(sameBits(back.attentionShapes[0].backwardSeconds, r.attentionShapes[0].backwardSeconds));
  REQUIRE(back.unary.size() == 3);
  CHECK(back.unary[1].op == "silu");
  for (size_t i = 0; i < 3; ++i) {
    CHECK(sameBits(back.unary[i].forward, r.unary[i].forward));
    CHECK(sameBits(back.unary[i].gradient, r.unary[i].gradient));
    CHECK(sameBits(back.unary[i].forwardRow, r.unary[i].forwardRow));
    CHECK(sameBits(back.unary[i].gradientRow, r.unary[i].gradientRow));
  }
  REQUIRE(back.timings.size() == 1);
  CHECK(back.timings[0].name == "matmul fp32 64x64x64");
  CHECK(back.timings[0].rounds == 4);
  CHECK(back.timings[0].calls == 12);
  CHECK(back.timings[0].rejected == 2);
  CHECK(back.timings[0].remeasured);
  CHECK(back.sliceSource == r.sliceSource);
  for (auto [a, b] : {std::pair{back.timings[0].median, r.timings[0].median},
                      {back.timings[0].spread, r.timings[0].spread},
                      {back.timings[0].waitShare, r.timings[0].waitShare}, {back.sliceSeconds, r.sliceSeconds}})
    CHECK(sameBits(a, b));
  // The target text is made from the numbers alone, so it is the same from either Result.
  CHECK(renderTarget(back, "then") == renderTarget(r, "then"));
  // Each unary kind's measured rates, those above zero (gelu's gradient measured none).
  CHECK_THAT(renderTarget(r, "then"),
             Contains("  elementwise_time { gelu = 0.3333 ns, silu = 0.5078 ns, silu_grad = 0.2857 ns, "
                      "layer_norm = 0.09091 ns }\n"));
  // The row kernels' cost per row, forward and gradient.
  CHECK_THAT(renderTarget(r, "then"), Contains("  row_time { layer_norm = 4.333 ns, layer_norm_grad = 0.8571 ns }\n"));
}

TEST_CASE("calibrate protocol: a number that is not finite is not written", "[calibrate]") {
  Result r = sample();
  r.triadBandwidth = 1.0 / 0.0;
  CHECK(resultToJSON(r).empty());
}

TEST_CASE("calibrate protocol: other output is refused with its reason", "[calibrate]") {
  std::string good = resultToJSON(sample());
  auto refused = [](const std::string &text) {
    Result r;
    r.cores = 99;  // untouched on failure
    std::string error;
    CHECK_FALSE(resultFromJSON(text, r, error));
    CHECK(r.cores == 99);
    return error;
  };
  CHECK_THAT(refused("hello"), Contains("not JSON"));
  CHECK_THAT(refused(""), Contains("not JSON"));
  CHECK_THAT(refused("[1, 2]"), Contains("not a JSON object"));
  CHECK_THAT(refused("{\"version\": 1}"), Contains("not tally-measure's output"));
  CHECK_THAT(refused("{\"protocol\": \"tally-measure\", \"version\": 1}"),
             Contains("protocol version 1, and this tally reads version 8"));
  CHECK_THAT(refused("{\"protocol\": \"tally-measure\", \"version\": 8}"), Contains("quick"));
  auto edit = [&](const std::string &from, const std::string &to) {
    std::string t = good;
    size_t at = t.find(from);
    REQUIRE(at != std::string::npos);
    return t.replace(at, from.size(), to);
  };
  CHECK_THAT(refused(edit("\"cores\":2", "\"cores\":\"two\"")), Contains("cores"));
  CHECK_THAT(refused(edit("\"cores\":2", "\"cores\":0")), Contains("cores and threads must be at least 1"));
  CHECK_THAT(refused(edit("\"dtype\":\"bf16\"", "\"dtype\":\"fp8\"")), Contains("'fp8'"));
  CHECK_THAT(refused(edit("\"dtype\":\"bf16\"", "\"dtype\":\"fp32\"")), Contains("no fp32 or no bf16"));
  CHECK_THAT(refused(edit("\"M\":64", "\"M\":-64")), Contains("shape or time"));
  CHECK_THAT(refused(edit("\"hd\":64", "\"hd\":0")), Contains("attention's shape"));
  CHECK_THAT(refused(edit("\"hd\":16", "\"hd\":-1")), Contains("attention's shape"));
  CHECK_THAT(refused(edit("\"attention_shapes\":[", "\"attention_shape\":[")), Contains("attention_shapes"));
  CHECK_THAT(refused(edit("\"rejected\":2", "\"rejected\":13")), Contains("timing of 'matmul fp32 64x64x64' is not possible"));
  CHECK_THAT(refused(edit("\"timings\":[", "\"timing\":[")), Contains("timings"));
  CHECK_THAT(refused(edit("\"gradient\":0", "\"gradient\":-1")), Contains("unary kernel 'gelu' is negative"));
  CHECK_THAT(refused(edit("\"unary\":[", "\"unaries\":[")), Contains("unary"));
}

TEST_CASE("calibrate: the attention curve, a point per call of every shape", "[calibrate]") {
  Result r = sample();
  r.kernelOverhead = 1e-6;
  r.forkOverhead = 3e-6;
  r.transcendentalTime = 1e-9;
  r.attention.forwardSeconds = 2e-3 / 3, r.attention.backwardSeconds = 4e-3 / 3;
  // fp32 peak = 2·64³ FLOPs / (1e-4 / 7) s.
  double peak = 2.0 * 64 * 64 * 64 / (1.0 / 7.0 * 1e-4);
  std::vector<Point> c = attentionCurveOf(r);
  REQUIRE(c.size() == 4);
  // The small shape's forward: B 2, H 4, S 16, hd 16: the kernel's one tile of 16 queries and
  // keys per batch row and head computes 2·4·16·16 = 2048 scores (attention_tile = 64), of which
  // 2·4·16·17/2 = 1088 are the causal ones (one exp each); (4·16 + 5)·2048 = 141312 FLOPs; its
  // time less 1088 exps and one call on the calling thread (B·H·S·S·hd = 32768, not above
  // kForkAttentionWork: kernel_overhead).
  CHECK(c[0].flops == 141312);
  CHECK(c[0].efficiency == Approx(141312 / peak / (1e-4 / 3 - 1088e-9 - 1e-6)));
  // Its backward: (10·16 + 9)·2048 FLOPs.
  CHECK(c[1].flops == 169 * 2048);
  CHECK(c[1].efficiency == Approx(169.0 * 2048 / peak / (2e-4 / 3 - 1088e-9 - 1e-6)));
  // The large shape's: B 1, H 4, S 128, hd 64: tiles of 64 compute 64·64·(1 + 2) = 12288 scores
  // per head, 4·12288 = 49152, of the 4·128·129/2 = 33024 causal ones (their exps).
  // B·H·S·S·hd = 4·128·128·64 = 4194304: a threaded call, less fork_overhead.
  CHECK(c[2].flops == 261 * 49152.0);
  CHECK(c[2].efficiency == Approx(261 * 49152.0 / peak / (2e-3 / 3 - 33024e-9 - 3e-6)));
  CHECK(c[3].flops == 649 * 49152.0);
  CHECK(c[3].efficiency == Approx(649 * 49152.0 / peak / (4e-3 / 3 - 33024e-9 - 3e-6)));
  for (const Point &p : c)
    CHECK((p.efficiency > 0 && p.efficiency <= 1));
  // The target text carries it.
  CHECK_THAT(renderTarget(r, "then"), Contains("  attention_curve = [(141312, "));
  CHECK_THAT(renderTarget(r, "then"), Contains("  attention_tile = 64\n"));
  CHECK_THAT(renderTarget(r, "then"), Contains("  kernel_overhead = 1000 ns\n  fork_overhead = 3000 ns\n"));
}

} // namespace calibrate_protocol_tests
