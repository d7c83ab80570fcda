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
