// tally-measure [--quick]: `tally calibrate`'s measurements (tools/calibrate/Measure.cpp), in an
// executable of their own so that the tally binary does not load OpenBLAS and OpenMP at every
// start. Built beside tally; tally calibrate runs it (tools/tally/CalibrateMeasure.cpp) and
// reads its stdout: one JSON object (tools/calibrate/Protocol.cpp, version kProtocolVersion).
// Exit codes: 0 measured, 1 a measurement was not a finite number or had no memory, 2 a bad
// argument.
#include "tools/calibrate/Calibrate.h"

#include "tally_rt.h"

#include <cstdio>
#include <cstring>
#include <exception>

int main(int argc, char **argv) {
  rt::restart_with_single_threaded_blas(argv);
  tally::calibrate::Options o;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      o.quick = true;
    } else {
      std::fprintf(stderr, "tally-measure: error: unknown argument '%s' (usage: tally-measure [--quick]; "
                           "run by `tally calibrate`)\n", argv[i]);
      return 2;
    }
  }
  std::string json;
  try {
    json = tally::calibrate::resultToJSON(tally::calibrate::measure(o));
  } catch (const std::exception &e) {
    std::fprintf(stderr, "tally-measure: error: %s\n", e.what());
    return 1;
  }
  if (json.empty()) {
    std::fprintf(stderr, "tally-measure: error: a measurement is not a finite number (a timer read 0?)\n");
    return 1;
  }
  std::fwrite(json.data(), 1, json.size(), stdout);
  std::fputc('\n', stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}
