// step_main.cpp — the Catch2 main of step_tests (the runtime's kernel tests).
#define CATCH_CONFIG_MAIN
#include <catch.hpp>
