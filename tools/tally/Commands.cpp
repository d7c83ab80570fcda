// Dispatch to the subcommands defined outside main.cpp.
#include "tools/tally/Commands.h"

namespace tally {

int runExtraCommand() { return -1; }

} // namespace tally
