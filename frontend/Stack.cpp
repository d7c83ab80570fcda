// Runs a command on a thread with the frontend's stack (frontend/Stack.h).
#include "frontend/Stack.h"

#include <exception> // std::terminate: llvm/Support/thread.h uses it without including it

#include "llvm/Support/thread.h"

namespace tally {

int runOnFrontendStack(llvm::function_ref<int()> fn) {
  int result = 0;
  llvm::thread worker(llvm::Optional<unsigned>(kFrontendStackBytes), [&] { result = fn(); });
  worker.join();
  return result;
}

} // namespace tally
