// tally runtime, common: reading and writing .safetensors files, for the generated drivers
// (weights in, gradients and trained weights out). Host code only (not TALLY_HD); C++17, no
// dependencies. The python side is tests/step/e2e/safetensors.py.
//
// The format: an 8-byte little-endian header length N, N bytes of a JSON object
//   {"name":{"dtype":"F32","shape":[2,3],"data_offsets":[b,e]}, ..., "__metadata__":{...}}
// then the data buffer; [b, e) are byte offsets into the buffer (after the header), data is
// little-endian and row-major. The reader parses exactly that JSON (objects, arrays, strings
// with escapes, integers; "__metadata__" is accepted with any such value and ignored) and
// rejects everything else, with the file name and what is wrong in an rt::Error. It checks that
// every tensor's offsets lie in the buffer and span numel × dtype size bytes; it does not require
// the tensors to tile the buffer. It reads the 8-byte length and the header only (bounded by the
// file's size and 100 MB); a tensor's bytes are read when asked for (File::bytes), so a file is
// never loaded whole. The writer sorts names, writes the data in that order, and pads the header
// with spaces to a multiple of 8 bytes, into a temporary file that is fsynced and renamed over
// the target. Multi-byte values are stored little-endian: this header assumes a little-endian
// host (x86-64, aarch64), as the drivers do; it uses POSIX (open, pread, mkstemp, rename).
#pragma once

#include "tally_driver.h"   // json_escape
#include "tally_error.h"    // rt::Error

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace rt {
namespace st {

/// One tensor of a file: its dtype name, shape and byte range [begin, end) in the data buffer.
struct Entry {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

/// Bytes per element of a safetensors dtype name ("F32", "F16", "BF16", "I32", "I64", "F64",
/// "U8"); 0 for any other name.
inline uint64_t dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "U8") return 1;
  return 0;
}

/// The largest header read (the reference implementation's limit).
constexpr uint64_t kMaxHeaderBytes = 100000000;

namespace detail {

/// What is wrong with a file, before the caller adds "safetensors: <path>: ".
struct Bad {
  std::string what;
};

/// numel × elementSize of a shape, or false when a dimension is negative or the product
/// overflows uint64.
inline bool shape_bytes(const std::vector<int64_t>& shape, uint64_t elementSize, uint64_t& bytes) {
  uint64_t n = elementSize;
  for (int64_t d : shape) {
    if (d < 0) return false;
    const uint64_t u = static_cast<uint64_t>(d);
    if (u != 0 && n > UINT64_MAX / u) return false;
    n *= u;
  }
  bytes = n;
  return true;
}

/// "[2,3]" for a shape (messages and the writer's header).
inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

/// A strict reader of the safetensors header JSON. Throws Bad naming the byte offset in the
/// header of anything it does not accept.
class HeaderParser {
 public:
  explicit HeaderParser(const std::string& text) : s_(text) {}

  /// Parses the whole header: tensors in header order (metadata skipped).
  std::vector<std::pair<std::string, Entry>> parse() {
    std::vector<std::pair<std::string, Entry>> out;
    std::map<std::string, size_t> seen;   // names so far (duplicates are an error)
    skip_ws();
    expect('{', "a JSON object (the header)");
    skip_ws();
    if (peek() == '}') {
      ++i_;
    } else {
      while (true) {
        skip_ws();
        const size_t at = i_;
        std::string name = string_value();
        skip_ws();
        expect(':', "':' after a name");
        skip_ws();
        if (name == "__metadata__") {
          skip_value(1);
        } else {
          if (!seen.emplace(name, out.size()).second) fail_at(at, "tensor '" + name + "' appears twice");
          out.emplace_back(name, entry(name));
        }
        skip_ws();
        if (peek() == ',') { ++i_; continue; }
        expect('}', "',' or '}' after a header entry");
        break;
      }
    }
    skip_ws();
    if (i_ != s_.size()) fail_at(i_, "unexpected text after the header object");
    return out;
  }

 private:
  const std::string& s_;
  size_t i_ = 0;

  [[noreturn]] void fail_at(size_t at, const std::string& what) const {
    throw Bad{"header JSON at byte " + std::to_string(at) + ": " + what};
  }
  int peek() const { return i_ < s_.size() ? static_cast<unsigned char>(s_[i_]) : -1; }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c, const char* what) {
    if (peek() != static_cast<unsigned char>(c)) {
      fail_at(i_, std::string("expected ") + what + (i_ < s_.size() ? "" : " (the header ends here)"));
    }
    ++i_;
  }

  /// Four hex digits of a \u escape.
  unsigned hex4() {
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const int c = peek();
      unsigned d;
      if (c >= '0' && c <= '9') d = static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') d = static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') d = static_cast<unsigned>(c - 'A' + 10);
      else fail_at(i_, "\\u needs four hex digits");
      v = v * 16 + d;
      ++i_;
    }
    return v;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  /// A JSON string (escapes decoded, \u to UTF-8 with surrogate pairs).
  std::string string_value() {
    expect('"', "a string");
    std::string out;
    while (true) {
      const int c = peek();
      if (c < 0) fail_at(i_, "unterminated string");
      ++i_;
      if (c == '"') return out;
      if (c < 0x20) fail_at(i_ - 1, "control character in a string (write it as an escape)");
      if (c != '\\') { out += static_cast<char>(c); continue; }
      const int e = peek();
      ++i_;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          const size_t at = i_ - 2;
          unsigned cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at(at, "lone low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (peek() != '\\' || i_ + 1 >= s_.size() || s_[i_ + 1] != 'u')
              fail_at(at, "high surrogate not followed by a low one");
            i_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail_at(at, "high surrogate not followed by a low one");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          put_utf8(out, cp);
          break;
        }
        default: fail_at(i_ - 2, "unknown escape in a string");
      }
    }
  }

  /// A JSON integer (no fraction or exponent, no leading zeros) that fits int64.
  int64_t integer_value() {
    const size_t at = i_;
    bool neg = false;
    if (peek() == '-') { neg = true; ++i_; }
    if (!(peek() >= '0' && peek() <= '9')) fail_at(at, "expected an integer");
    if (peek() == '0' && i_ + 1 < s_.size() && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '9')
      fail_at(at, "leading zeros are not JSON");
    uint64_t v = 0;
    const uint64_t limit = neg ? uint64_t(INT64_MAX) + 1 : uint64_t(INT64_MAX);
    while (peek() >= '0' && peek() <= '9') {
      const uint64_t d = static_cast<uint64_t>(peek() - '0');
      if (v > (limit - d) / 10) fail_at(at, "integer does not fit in 64 bits");
      v = v * 10 + d;
      ++i_;
    }
    if (peek() == '.' || peek() == 'e' || peek() == 'E') fail_at(at, "numbers in the header must be integers");
    if (!neg) return static_cast<int64_t>(v);
    return v == uint64_t(INT64_MAX) + 1 ? INT64_MIN : -static_cast<int64_t>(v);
  }

  /// A JSON array of integers.
  std::vector<int64_t> integer_array(const char* what) {
    std::vector<int64_t> out;
    if (peek() != '[') fail_at(i_, std::string(what) + " must be an array of integers");
    ++i_;
    skip_ws();
    if (peek() == ']') { ++i_; return out; }
    while (true) {
      skip_ws();
      out.push_back(integer_value());
      skip_ws();
      if (peek() == ',') { ++i_; continue; }
      expect(']', "',' or ']' in an array");
      return out;
    }
  }

  /// Any value of the accepted subset (objects, arrays, strings, integers), not kept.
  void skip_value(int depth) {
    if (depth > 64) fail_at(i_, "nested deeper than 64 levels");
    const int c = peek();
    if (c == '"') { string_value(); return; }
    if (c == '-' || (c >= '0' && c <= '9')) { integer_value(); return; }
    if (c == '[' || c == '{') {
      const char close = c == '[' ? ']' : '}';
      ++i_;
      skip_ws();
      if (peek() == close) { ++i_; return; }
      while (true) {
        skip_ws();
        if (close == '}') {
          string_value();
          skip_ws();
          expect(':', "':' after a name");
          skip_ws();
        }
        skip_value(depth + 1);
        skip_ws();
        if (peek() == ',') { ++i_; continue; }
        if (close == ']') expect(']', "',' or ']' in an array");
        else expect('}', "',' or '}' in an object");
        return;
      }
    }
    if (c < 0) fail_at(i_, "expected a value (the header ends here)");
    fail_at(i_, "unsupported JSON value (only objects, arrays, strings and integers)");
  }

  /// One tensor's object: exactly "dtype", "shape" and "data_offsets".
  Entry entry(const std::string& name) {
    const std::string where = "tensor '" + name + "': ";
    Entry e;
    bool hasDtype = false, hasShape = false, hasOffsets = false;
    const size_t at = i_;
    if (peek() != '{') fail_at(i_, where + "entry must be an object");
    ++i_;
    skip_ws();
    if (peek() == '}') {
      ++i_;
    } else {
      while (true) {
        skip_ws();
        const size_t keyAt = i_;
        const std::string key = string_value();
        skip_ws();
        expect(':', "':' after a name");
        skip_ws();
        bool* seen = nullptr;
        if (key == "dtype") {
          seen = &hasDtype;
          e.dtype = string_value();
        } else if (key == "shape") {
          seen = &hasShape;
          e.shape = integer_array("shape");
        } else if (key == "data_offsets") {
          seen = &hasOffsets;
          std::vector<int64_t> o = integer_array("data_offsets");
          if (o.size() != 2) fail_at(keyAt, where + "data_offsets must be [begin, end]");
          if (o[0] < 0 || o[1] < 0) fail_at(keyAt, where + "negative data_offsets");
          e.begin = static_cast<uint64_t>(o[0]);
          e.end = static_cast<uint64_t>(o[1]);
        } else {
          fail_at(keyAt, where + "unknown field '" + key + "'");
        }
        if (*seen) fail_at(keyAt, where + "field '" + key + "' appears twice");
        *seen = true;
        skip_ws();
        if (peek() == ',') { ++i_; continue; }
        expect('}', "',' or '}' in a tensor entry");
        break;
      }
    }
    if (!hasDtype || !hasShape || !hasOffsets)
      fail_at(at, where + "missing " + (!hasDtype ? "dtype" : !hasShape ? "shape" : "data_offsets"));
    return e;
  }
};

/// "safetensors: <path>: <what>: <strerror>" as an rt::Error.
[[noreturn]] inline void fail_io(const std::string& path, const std::string& what) {
  throw Error("safetensors: " + path + ": " + what + ": " + std::strerror(errno));
}

/// Writes the parts, in order, to path: into a new temporary file in path's folder, flushed to
/// disk (fsync) and renamed over path only when every byte was written, so a failed or
/// interrupted write leaves the old file whole. A path that is a symbolic link is written
/// through (the file it names is replaced; the link stays); a character device or FIFO
/// (/dev/null) is written in place, since a rename cannot replace it; a directory is refused.
inline void write_atomic(const std::string& path, const std::vector<std::pair<const void*, uint64_t>>& parts) {
  std::string target = path;
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) {
    errno = EISDIR;
    fail_io(path, "cannot open for writing");
  }
  int fd = -1;
  std::string temp;
  if (exists && !S_ISREG(st.st_mode)) {
    fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail_io(path, "cannot open for writing");
  } else {
    if (exists) {
      if (::access(path.c_str(), W_OK) != 0) fail_io(path, "cannot open for writing");
      if (char* real = ::realpath(path.c_str(), nullptr)) {
        target = real;
        std::free(real);
      }
    }
    const size_t slash = target.rfind('/');
    const std::string dir = slash == std::string::npos ? "" : target.substr(0, slash + 1);
    const std::string base = slash == std::string::npos ? target : target.substr(slash + 1);
    temp = dir + "." + base + ".tmp-XXXXXX";
    std::vector<char> name(temp.begin(), temp.end());
    name.push_back('\0');
    fd = ::mkstemp(name.data());
    if (fd < 0) fail_io(path, "cannot open for writing");
    temp = name.data();
    if (exists) ::fchmod(fd, st.st_mode & 07777);
  }
  auto fail = [&](const char* what) {
    const int saved = errno;
    ::close(fd);
    if (!temp.empty()) ::unlink(temp.c_str());
    errno = saved;
    fail_io(path, what);
  };
  for (const auto& part : parts) {
    const uint8_t* p = static_cast<const uint8_t*>(part.first);
    uint64_t left = part.second;
    while (left > 0) {
      const ssize_t put = ::write(fd, p, static_cast<size_t>(std::min<uint64_t>(left, uint64_t(1) << 30)));
      if (put < 0 && errno == EINTR) continue;
      if (put <= 0) fail("write failed");
      p += put;
      left -= static_cast<uint64_t>(put);
    }
  }
  if (!temp.empty() && ::fsync(fd) != 0) fail("write failed (fsync)");
  if (::close(fd) != 0) {
    fd = -1;
    if (!temp.empty()) ::unlink(temp.c_str());
    fail_io(path, "write failed (close)");
  }
  if (!temp.empty() && ::rename(temp.c_str(), target.c_str()) != 0) {
    const int saved = errno;
    ::unlink(temp.c_str());
    errno = saved;
    fail_io(path, "cannot rename the written file into place");
  }
}

}  // namespace detail

/// An open .safetensors file whose header was read and checked; tensor data is read on demand,
/// one tensor at a time, by bounded reads (pread) of exactly its byte range, so a file is never
/// loaded whole and a header that promises more than the file holds is refused before any data
/// is read.
class File {
 public:
  File() = default;
  File(File&& o) noexcept { *this = std::move(o); }
  File& operator=(File&& o) noexcept {
    if (this != &o) {
      close_fd();
      entries_ = std::move(o.entries_);
      index_ = std::move(o.index_);
      path_ = std::move(o.path_);
      fd_ = o.fd_;
      dataStart_ = o.dataStart_;
      o.fd_ = -1;
    }
    return *this;
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() { close_fd(); }

  /// Opens and checks the file at path (reading its 8-byte length and its header only). Throws
  /// rt::Error("safetensors: <path>: <what>") when it cannot be read or is malformed: shorter
  /// than 8 bytes, a header length past the end of the file (or over 100 MB), header JSON
  /// outside the accepted subset, an unknown dtype, a negative dimension, offsets outside the
  /// data buffer, or offsets spanning other than numel × dtype size bytes.
  static File read(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error("safetensors: " + path + ": cannot open: " + std::strerror(errno));
    return from_fd(fd, path);
  }

  /// The same checks on an open descriptor, which the File then owns (closed on error too);
  /// `path` names it in messages.
  static File from_fd(int fd, const std::string& path) {
    File f;
    f.fd_ = fd;
    f.path_ = path;
    try {
      f.check_header();
    } catch (const detail::Bad& b) {
      throw Error("safetensors: " + path + ": " + b.what);
    }
    return f;
  }

  /// The tensor called name, or nullptr.
  const Entry* find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &entries_[it->second].second;
  }

  /// A tensor's bytes (e must come from this file), read from the file now. Throws
  /// rt::Error("safetensors: <path>: tensor '<name>': …") when the read fails or comes back
  /// short (the file shrank since it was opened).
  std::vector<uint8_t> bytes(const Entry& e) const {
    std::vector<uint8_t> out(static_cast<size_t>(e.end - e.begin));
    read_into(e, out.data());
    return out;
  }

  /// The same read into out (e.end − e.begin bytes the caller owns: a region of the step, so
  /// a tensor whose dtype is the model's goes from the file to its place with no copy).
  void read_into(const Entry& e, void* out) const {
    uint8_t* dst = static_cast<uint8_t*>(out);
    const uint64_t size = e.end - e.begin;
    uint64_t done = 0;
    while (done < size) {
      const uint64_t chunk = std::min<uint64_t>(size - done, uint64_t(1) << 30);
      const ssize_t got = ::pread(fd_, dst + done, static_cast<size_t>(chunk),
                                  static_cast<off_t>(dataStart_ + e.begin + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        throw Error("safetensors: " + path_ + ": tensor '" + name_of(e) + "': " +
                    (got < 0 ? std::string("read failed: ") + std::strerror(errno)
                             : std::string("the file ends before the tensor's data (it shrank since it was opened)")));
      done += static_cast<uint64_t>(got);
    }
  }

  /// The tensor names in the order of the file's header.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& e : entries_) out.push_back(e.first);
    return out;
  }

 private:
  std::vector<std::pair<std::string, Entry>> entries_;
  std::map<std::string, size_t> index_;
  std::string path_;
  int fd_ = -1;
  uint64_t dataStart_ = 0;   // 8 + header length

  void close_fd() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  std::string name_of(const Entry& e) const {
    for (const auto& kv : entries_)
      if (&kv.second == &e) return kv.first;
    return "?";
  }

  /// Reads exactly n bytes at offset into p, or throws Bad with what.
  void read_exactly(void* p, uint64_t n, uint64_t offset, const char* what) const {
    uint64_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, static_cast<uint8_t*>(p) + done, static_cast<size_t>(n - done),
                                  static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) throw detail::Bad{std::string("cannot read ") + what};
      done += static_cast<uint64_t>(got);
    }
  }

  void check_header() {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw detail::Bad{std::string("cannot read the file size: ") + std::strerror(errno)};
    if (!S_ISREG(st.st_mode)) throw detail::Bad{"not a regular file"};
    const uint64_t fileBytes = static_cast<uint64_t>(st.st_size);
    if (fileBytes < 8)
      throw detail::Bad{"file is " + std::to_string(fileBytes) + " bytes, too short for the 8-byte header length"};
    unsigned char len[8];
    read_exactly(len, 8, 0, "the header length");
    uint64_t n = 0;
    for (int k = 7; k >= 0; --k) n = (n << 8) | len[k];
    if (n > fileBytes - 8)
      throw detail::Bad{"header length " + std::to_string(n) + " runs past the end of the file (" +
                        std::to_string(fileBytes) + " bytes)"};
    if (n > kMaxHeaderBytes)
      throw detail::Bad{"header length " + std::to_string(n) + " is over the limit of " +
                        std::to_string(kMaxHeaderBytes) + " bytes"};
    std::string header(static_cast<size_t>(n), '\0');
    if (n > 0) read_exactly(&header[0], n, 8, "the header");
    entries_ = detail::HeaderParser(header).parse();
    dataStart_ = 8 + n;
    const uint64_t dataBytes = fileBytes - 8 - n;
    for (size_t k = 0; k < entries_.size(); ++k) {
      const std::string& name = entries_[k].first;
      const Entry& e = entries_[k].second;
      const std::string where = "tensor '" + name + "': ";
      const uint64_t es = dtype_size(e.dtype);
      if (es == 0)
        throw detail::Bad{where + "unsupported dtype '" + e.dtype + "' (supported: BF16, F16, F32, F64, I32, I64, U8)"};
      uint64_t want = 0;
      if (!detail::shape_bytes(e.shape, es, want))
        throw detail::Bad{where + "shape " + detail::shape_text(e.shape) + " has a negative dimension or is too large"};
      if (e.begin > e.end || e.end > dataBytes)
        throw detail::Bad{where + "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                          "] are outside the " + std::to_string(dataBytes) + "-byte data buffer"};
      if (e.end - e.begin != want)
        throw detail::Bad{where + e.dtype + " " + detail::shape_text(e.shape) + " needs " + std::to_string(want) +
                          " bytes but data_offsets span " + std::to_string(e.end - e.begin)};
      index_[name] = k;
    }
  }
};

/// Collects tensors and writes them as one .safetensors file.
class Writer {
 public:
  /// Adds a tensor (the bytes are copied now). Throws rt::Error("safetensors: tensor '<name>':
  /// …") for an unsupported dtype, a negative dimension, bytes other than numel × dtype size, a
  /// name added twice, the reserved name "__metadata__", or null data with bytes > 0.
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, const void* data,
           uint64_t bytes) {
    const std::string where = "safetensors: tensor '" + name + "': ";
    if (name == "__metadata__") throw Error(where + "the name is reserved");
    if (items_.count(name)) throw Error(where + "added twice");
    const uint64_t es = dtype_size(dtype);
    if (es == 0) throw Error(where + "unsupported dtype '" + dtype + "' (supported: BF16, F16, F32, F64, I32, I64, U8)");
    uint64_t want = 0;
    if (!detail::shape_bytes(shape, es, want))
      throw Error(where + "shape " + detail::shape_text(shape) + " has a negative dimension or is too large");
    if (bytes != want)
      throw Error(where + dtype + " " + detail::shape_text(shape) + " needs " + std::to_string(want) + " bytes, got " +
                  std::to_string(bytes));
    if (bytes > 0 && data == nullptr) throw Error(where + "data is null");
    Item& it = items_[name];
    it.dtype = dtype;
    it.shape = std::move(shape);
    const uint8_t* p = static_cast<const uint8_t*>(data);
    it.bytes.assign(p, p + bytes);
  }

  /// Writes the header (names sorted, data_offsets back to back in that order, padded with
  /// spaces to a multiple of 8 bytes) and the data to path. Throws rt::Error("safetensors:
  /// <path>: …") when the file cannot be written.
  void write(const std::string& path) const {
    std::string header = "{";
    uint64_t pos = 0;
    bool first = true;
    for (const auto& kv : items_) {
      const Item& it = kv.second;
      header += first ? "" : ",";
      first = false;
      header += "\"" + json_escape(kv.first) + "\":{\"dtype\":\"" + it.dtype + "\",\"shape\":" +
                detail::shape_text(it.shape) + ",\"data_offsets\":[" + std::to_string(pos) + "," +
                std::to_string(pos + it.bytes.size()) + "]}";
      pos += it.bytes.size();
    }
    header += "}";
    while (header.size() % 8 != 0) header += ' ';
    unsigned char len[8];
    uint64_t n = header.size();
    for (int k = 0; k < 8; ++k) len[k] = static_cast<unsigned char>((n >> (8 * k)) & 0xFF);
    std::vector<std::pair<const void*, uint64_t>> parts{{len, 8}, {header.data(), header.size()}};
    for (const auto& kv : items_) parts.emplace_back(kv.second.bytes.data(), kv.second.bytes.size());
    detail::write_atomic(path, parts);
  }

 private:
  struct Item {
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Item> items_;   // sorted by name: the file's order
};

}  // namespace st
}  // namespace rt
