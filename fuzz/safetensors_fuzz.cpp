// libFuzzer target: the one safetensors reader (codegen/runtime/common/tally_safetensors.h) that
// the generated step's `--init` and `--data` go through. Each input is a whole file, handed to
// File::from_fd through an in-memory file (memfd): the reader must either refuse it with an
// rt::Error or accept it with every promise its comment makes — every tensor's byte range inside
// the data buffer and exactly numel × dtype size long, names unique — and then read every tensor's
// bytes without touching anything else. A crash, a sanitizer report, another exception or a
// broken promise (abort) is a finding. scripts/fuzz.sh builds and runs it (issue 43, item 2).
#include "tally_safetensors.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <set>

namespace {

/// Aborts with `what` when `ok` is false: a promise of the reader broken by an accepted file.
void promise(bool ok, const char *what) {
  if (ok)
    return;
  std::fprintf(stderr, "safetensors_fuzz: the reader accepted a file that breaks: %s\n", what);
  std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const int fd = ::memfd_create("safetensors_fuzz", MFD_CLOEXEC);
  if (fd < 0)
    return 0;
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) {
      ::close(fd);
      return 0;
    }
    done += static_cast<size_t>(n);
  }
  try {
    rt::st::File f = rt::st::File::from_fd(fd, "<fuzz input>"); // owns fd from here
    uint64_t headerBytes = 0;
    for (int k = 7; k >= 0; --k)
      headerBytes = (headerBytes << 8) | data[k];
    const uint64_t dataBytes = size - 8 - headerBytes;
    std::set<std::string> seen;
    for (const std::string &name : f.names()) {
      promise(seen.insert(name).second, "a name twice");
      const rt::st::Entry *e = f.find(name);
      promise(e != nullptr, "a listed name that find() does not know");
      promise(e->begin <= e->end && e->end <= dataBytes, "a byte range outside the data buffer");
      uint64_t want = 0;
      promise(rt::st::detail::shape_bytes(e->shape, rt::st::dtype_size(e->dtype), want),
              "a shape whose size overflows");
      promise(e->end - e->begin == want, "a byte range other than numel x dtype size");
      promise(f.bytes(*e).size() == want, "a tensor read back short");
    }
  } catch (const rt::Error &) {
    // refused with a message: what the reader is for
  }
  return 0;
}
