// The Catch2 entry point for tally's unit tests; each tests/unit/test_*.cpp adds its cases.
#define CATCH_CONFIG_MAIN
#include <catch.hpp>
