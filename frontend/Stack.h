// The stack the frontend's recursive parts run on. The parser's tree builder, Sema and the
// lowering recurse once per operator of an expression; the documented limits (256 levels of
// brackets, 4000 operators per expression, 64 levels of blocks: docs/language.md) bound that
// depth, and a 4000-operator chain in a forward body was measured to need between 4 and 8 MiB in
// a RelWithDebInfo build (ASan frames are about 3× larger). The CLI therefore runs every command
// on a thread with a stack far above that, whatever `ulimit -s` says; its pages are only
// touched, and so only committed, as deep as an input actually goes.
#pragma once

#include "llvm/ADT/STLFunctionalExtras.h"

namespace tally {

/// Stack size of the thread the commands run on: 32× the measured need of the deepest input
/// within the documented limits.
constexpr unsigned kFrontendStackBytes = 256u << 20;

/// Runs `fn` on a thread with a kFrontendStackBytes stack and returns its result.
int runOnFrontendStack(llvm::function_ref<int()> fn);

} // namespace tally
