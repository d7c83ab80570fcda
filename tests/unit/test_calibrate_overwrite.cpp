// test_calibrate_overwrite.cpp — tools/calibrate/Target.cpp: `tally calibrate` keeps a calibration
// made at a lower load rather than replace it with one made under load (issue 42); the lit test
// calibrate-busy.tally runs the command.
#include "tools/calibrate/Calibrate.h"

#include <catch.hpp>

using namespace tally;

TEST_CASE("calibrate overwrite: the recorded load average", "[calibrate-overwrite]") {
  calibrate::Result r;
  r.cores = 2;
  r.loadAverage = 0.375;
  CHECK(calibrate::recordedLoadAverage(calibrate::renderTarget(r, "2026-12-06 05:00 UTC")) == 0.375);
  CHECK(calibrate::recordedLoadAverage("// Load average before measuring: 11.2 (busy: ...).\n") == 11.2);
  CHECK(calibrate::recordedLoadAverage("target host { }\n") == -1);
  CHECK(calibrate::recordedLoadAverage("// Load average before measuring: -1.\n") == -1);
}

TEST_CASE("calibrate overwrite: refused only under load over a lower recorded load", "[calibrate-overwrite]") {
  calibrate::Result r;
  r.cores = 2;
  r.loadAverage = 11.2;
  std::string why = calibrate::overwriteRefusal(r, 0.4);
  CHECK(why.find("load average of 11.2 on 2 cores") != std::string::npos);
  CHECK(why.find("the existing one at 0.4") != std::string::npos);
  CHECK(why.find("--force") != std::string::npos);
  CHECK(calibrate::overwriteRefusal(r, 12).empty()); // the existing one was worse
  CHECK(calibrate::overwriteRefusal(r, -1).empty()); // no recorded load
  r.loadAverage = 2;                                  // at the core count: not under load
  CHECK(calibrate::overwriteRefusal(r, 0.1).empty());
}

// Issue 46, item 5: the robust statistics of tools/calibrate/Robust.cpp on synthetic call times
// (seconds, per round), so no noisy machine is needed. The slice is Linux's default for 2 CPUs.
namespace {
std::vector<std::vector<double>> roundsOf(int rounds, int calls, double t) {
  return std::vector<std::vector<double>>(size_t(rounds), std::vector<double>(size_t(calls), t));
}
} // namespace

TEST_CASE("calibrate robust: the scheduler slice and the rejection threshold", "[calibrate-overwrite]") {
  CHECK(calibrate::defaultSchedulerSlice(1) == Approx(0.75e-3));
  CHECK(calibrate::defaultSchedulerSlice(2) == Approx(1.5e-3));
  CHECK(calibrate::defaultSchedulerSlice(3) == Approx(1.5e-3));
  CHECK(calibrate::defaultSchedulerSlice(8) == Approx(3e-3));
  CHECK(calibrate::defaultSchedulerSlice(64) == Approx(3e-3)); // the kernel caps the scaling at 8 CPUs
  // Short calls: half a slice above the fastest; long calls: twice the fastest.
  CHECK(calibrate::sliceThreshold(3e-6, 1.5e-3) == Approx(3e-6 + 0.75e-3));
  CHECK(calibrate::sliceThreshold(0.2, 1.5e-3) == Approx(0.4));
  std::string source;
  CHECK(calibrate::schedulerSlice(2, source) > 0);
  CHECK(!source.empty());
}

TEST_CASE("calibrate robust: a clean set passes with the plain median", "[calibrate-overwrite]") {
  // 4 rounds of 3 µs calls within ±10%: nothing rejected, the median of all calls, spread < 2.
  std::vector<std::vector<double>> r = {{3.0e-6, 3.1e-6, 2.9e-6}, {3.2e-6, 3.0e-6, 3.3e-6},
                                        {2.8e-6, 3.0e-6, 3.1e-6}, {3.0e-6, 2.9e-6, 3.2e-6}};
  calibrate::Timing t = calibrate::summarize("matmul fp32 64x64x64", r, 1.5e-3);
  CHECK(t.name == "matmul fp32 64x64x64");
  CHECK(t.rounds == 4);
  CHECK(t.calls == 12);
  CHECK(t.rejected == 0);
  CHECK(t.median == Approx(3.0e-6)); // sorted: ..., 3.0, 3.0, 3.0, 3.0, ...: the plain median
  CHECK(t.spread == Approx(3.2e-6 / 3.0e-6)); // round medians 3.0, 3.2, 3.0, 3.0 µs
  CHECK(calibrate::noisyReason(t).empty());
  // A long kernel's ordinary spread (200–380 ms, more than a slice apart) is not a slice.
  calibrate::Timing big = calibrate::summarize("matmul fp32 2048x2048x2048", {{0.2, 0.38}, {0.25, 0.3}}, 1.5e-3);
  CHECK(big.rejected == 0);
  CHECK(big.median == Approx(0.275));
}

TEST_CASE("calibrate robust: scheduler slices among 3 us calls are rejected", "[calibrate-overwrite]") {
  // The calibration under load: some calls of a 3 µs matmul took 8 ms.
  std::vector<std::vector<double>> r = roundsOf(4, 10, 3e-6);
  r[0][2] = r[1][5] = r[2][0] = r[2][9] = r[3][3] = 8e-3;
  calibrate::Timing t = calibrate::summarize("matmul fp32 64x64x64", r, 1.5e-3);
  CHECK(t.calls == 40);
  CHECK(t.rejected == 5);
  CHECK(t.median == 3e-6);
  CHECK(t.spread == 1);
  CHECK(calibrate::noisyReason(t).empty());
  // Without the rejection the median would hold; with most calls slices it is noisy.
  std::vector<std::vector<double>> most = roundsOf(2, 4, 8e-3);
  most[0][0] = most[1][0] = most[1][1] = 3e-6;
  calibrate::Timing m = calibrate::summarize("x", most, 1.5e-3);
  CHECK(m.rejected == 5);
  CHECK(m.median == 3e-6);
  CHECK(calibrate::noisyReason(m) == "5 of its 8 calls were descheduled (rejected as scheduler slices)");
  // A round whose calls were all slices: its median disagrees with the others'.
  std::vector<std::vector<double>> lost = {{3e-6, 3e-6}, {8e-3, 9e-3}, {3e-6, 3e-6}};
  calibrate::Timing l = calibrate::summarize("x", lost, 1.5e-3);
  CHECK(l.rejected == 2);
  CHECK(l.spread == Approx(8.5e-3 / 3e-6));
  CHECK(calibrate::noisyReason(l).find("its 3 rounds' medians disagree 2.83e+03x (at most 2x)") == 0);
}

TEST_CASE("calibrate robust: rounds that disagree are noisy, at the bound's edge not", "[calibrate-overwrite]") {
  // Rounds 3x apart (calls 3 µs, then 9 µs: below half a slice above the fastest, so kept).
  std::vector<std::vector<double>> r = {{3e-6, 3e-6, 3e-6}, {9e-6, 9e-6, 9e-6}, {3e-6, 3e-6, 3e-6}, {9e-6, 9e-6, 9e-6}};
  calibrate::Timing t = calibrate::summarize("matmul fp32 64x64x64", r, 1.5e-3);
  CHECK(t.rejected == 0);
  CHECK(t.spread == Approx(3));
  CHECK(calibrate::noisyReason(t) == "its 4 rounds' medians disagree 3x (at most 2x)");
  // Exactly 2x agrees; just above does not (a round above twice the fastest is rejected as
  // slices and still counts in the spread).
  calibrate::Timing edge = calibrate::summarize("x", {{1e-3}, {2e-3}}, 1.5e-3);
  CHECK(edge.spread == 2);
  CHECK(calibrate::noisyReason(edge).empty());
  calibrate::Timing over = calibrate::summarize("x", {{1e-3}, {2.001e-3}}, 1.5e-3);
  CHECK(!calibrate::noisyReason(over).empty());
  // The threads' wait for a CPU: a quarter is allowed, more is noisy.
  edge.waitShare = 0.25;
  CHECK(calibrate::noisyReason(edge).empty());
  edge.waitShare = 0.6;
  CHECK(calibrate::noisyReason(edge) == "its threads waited for a CPU 60% of its time (at most 25%)");
}

TEST_CASE("calibrate robust: the noisy summary and the file's comments", "[calibrate-overwrite]") {
  calibrate::Result r;
  r.cores = 2;
  r.sliceSeconds = 1.5e-3;
  r.sliceSource = "the kernel's default for 2 CPUs";
  r.timings.push_back(calibrate::summarize("triad", roundsOf(4, 2, 0.02), r.sliceSeconds));
  r.timings.back().waitShare = 0.01;
  CHECK(calibrate::noisySummary(r).empty());
  calibrate::Timing noisy = calibrate::summarize("matmul fp32 64x64x64", {{3e-6}, {9e-6}}, r.sliceSeconds);
  noisy.remeasured = true;
  r.timings.push_back(noisy);
  CHECK(calibrate::noisySummary(r) == "matmul fp32 64x64x64: its 2 rounds' medians disagree 3x (at most 2x)");
  std::string text = calibrate::renderTarget(r, "then");
  CHECK(text.find("(slice 1.5 ms: the kernel's default for 2 CPUs)") != std::string::npos);
  CHECK(text.find("//   triad: 0 of 8 calls rejected, rounds within 1x, waited for a CPU 1%\n") != std::string::npos);
  CHECK(text.find("//   matmul fp32 64x64x64: 0 of 2 calls rejected, rounds within 3x (re-measured, 2 rounds); "
                  "NOISY: its 2 rounds' medians disagree 3x (at most 2x)\n") != std::string::npos);
}
