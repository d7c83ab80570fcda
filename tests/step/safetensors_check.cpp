// safetensors_check.cpp — tests of codegen/runtime/common/tally_safetensors.h and tally_driver.h
// (ctest step-safetensors), linked with Debian's prebuilt Catch2 main (libCatch2WithMain.a).
// The C++ half of the round trips with the python implementation is safetensors_tool.cpp.
// Host-only: no runtime, no BLAS, only the header under test.
#include <catch.hpp>

#include "tally_safetensors.h"
#include "tally_types.h"   // rt::bf16, rt::f16 for the fixed tensors

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace {

/// A scratch file name unique to this process.
std::string temp_path(const std::string& tag) {
  return "/tmp/tally_st_" + std::to_string(static_cast<long>(getpid())) + "_" + tag + ".safetensors";
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// A file from a header text and a data buffer (the length field written here, little-endian).
std::string file_bytes(const std::string& header, const std::string& data) {
  std::string s;
  uint64_t n = header.size();
  for (int k = 0; k < 8; ++k) s += static_cast<char>((n >> (8 * k)) & 0xFF);
  return s + header + data;
}

/// The little-endian bytes of a float.
std::string f32_bytes(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  std::string s;
  for (int k = 0; k < 4; ++k) s += static_cast<char>((u >> (8 * k)) & 0xFF);
  return s;
}

}  // namespace

TEST_CASE("safetensors: the writer's bytes, read back", "[safetensors]") {
  const std::string path = temp_path("writer");
  rt::st::Writer w;
  const float b[2] = {1.5f, -2.0f};
  const int32_t a = 7;
  w.add("b", "F32", {2}, b, 8);
  w.add("a", "I32", {1, 1}, &a, 4);
  w.write(path);
  // Names sorted, data back to back in that order: a at [0, 4), b at [4, 12). The JSON is 110
  // bytes, padded with 2 spaces to 112.
  const std::string header =
      "{\"a\":{\"dtype\":\"I32\",\"shape\":[1,1],\"data_offsets\":[0,4]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}";
  REQUIRE(header.size() == 110);
  const std::string want = file_bytes(header + std::string(2, ' '), std::string("\x07\0\0\0", 4) + f32_bytes(1.5f) +
                                                                       f32_bytes(-2.0f));
  CHECK(read_bytes(path) == want);
  rt::st::File f = rt::st::File::read(path);
  CHECK(f.names() == std::vector<std::string>{"a", "b"});
  const rt::st::Entry* eb = f.find("b");
  REQUIRE(eb != nullptr);
  CHECK(eb->dtype == "F32");
  CHECK(eb->shape == std::vector<int64_t>{2});
  CHECK(eb->begin == 4);
  CHECK(eb->end == 12);
  float got[2];
  std::memcpy(got, f.bytes(*eb).data(), 8);
  CHECK(got[0] == 1.5f);
  CHECK(got[1] == -2.0f);
  CHECK(f.find("c") == nullptr);
  // No tensors at all: "{}" padded to 8.
  rt::st::Writer().write(path);
  CHECK(read_bytes(path) == file_bytes("{}      ", ""));
  CHECK(rt::st::File::read(path).names().empty());
  std::remove(path.c_str());
}

TEST_CASE("safetensors: a hand-made header with metadata, whitespace, escapes, header order", "[safetensors]") {
  const std::string path = temp_path("hand");
  // z before a (not sorted: names() keeps the header's order); metadata nested and ignored;
  // "\u00e9" is é (C3 A9), the surrogate pair \ud83d\ude00 is U+1F600 (F0 9F 98 80).
  const std::string header =
      " {\n\t\"z\" : {\"shape\": [], \"dtype\": \"F32\", \"data_offsets\": [4, 8]},\r\n"
      "  \"__metadata__\": {\"format\": \"pt\", \"nested\": [1, -2, {\"k\": []}, \"s\"]},\n"
      "  \"caf\\u00e9 \\ud83d\\ude00\\/\\\"\\\\\\n\": {\"dtype\": \"U8\", \"shape\": [2, 2], \"data_offsets\": [0, 4]}\n"
      "}   ";
  write_bytes(path, file_bytes(header, std::string("\x01\x02\x03\x04", 4) + f32_bytes(0.5f)));
  rt::st::File f = rt::st::File::read(path);
  const std::string fancy = "caf\xc3\xa9 \xf0\x9f\x98\x80/\"\\\n";
  CHECK(f.names() == std::vector<std::string>{"z", fancy});
  const rt::st::Entry* z = f.find("z");
  REQUIRE(z != nullptr);
  CHECK(z->shape.empty());
  float zv;
  std::memcpy(&zv, f.bytes(*z).data(), 4);
  CHECK(zv == 0.5f);
  const rt::st::Entry* u = f.find(fancy);
  REQUIRE(u != nullptr);
  CHECK(u->dtype == "U8");
  CHECK(u->shape == std::vector<int64_t>{2, 2});
  CHECK(f.bytes(*u)[3] == 4);
  CHECK(f.find("__metadata__") == nullptr);
  std::remove(path.c_str());
}

TEST_CASE("safetensors: malformed files are rt::Error naming the file and the problem", "[safetensors]") {
  const std::string path = temp_path("bad");
  const std::string ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  const std::string data8(8, '\0');
  struct Case {
    const char* what;
    std::string bytes;
    const char* message;
  };
  auto withHeader = [&](const std::string& h, const std::string& d) { return file_bytes(h, d); };
  std::string tooLong = file_bytes(ok, data8);
  tooLong[0] = static_cast<char>(200);   // header length 200 > the 62 bytes after the length
  const std::vector<Case> cases = {
      {"empty file", "", "file is 0 bytes, too short for the 8-byte header length"},
      {"truncated length", std::string("\x10\0\0", 3), "file is 3 bytes, too short"},
      {"header past the end", tooLong, "header length 200 runs past the end of the file (70 bytes)"},
      {"truncated data", withHeader(ok, std::string(5, '\0')),
       "tensor 'a': data_offsets [0, 8] are outside the 5-byte data buffer"},
      {"not an object", withHeader("[1]", ""), "header JSON at byte 0: expected a JSON object (the header)"},
      {"unclosed object", withHeader(ok.substr(0, ok.size() - 1), data8), "expected ',' or '}' after a header entry"},
      {"float", withHeader("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", data8),
       "numbers in the header must be integers"},
      {"exponent", withHeader("{\"a\":{\"dtype\":\"F32\",\"shape\":[2e0],\"data_offsets\":[0,8]}}", data8),
       "numbers in the header must be integers"},
      {"leading zero", withHeader("{\"a\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}}", data8),
       "leading zeros"},
      {"huge integer", withHeader("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", data8),
       "does not fit in 64 bits"},
      {"null in metadata", withHeader("{\"__metadata__\":{\"k\":null}}", ""), "unsupported JSON value"},
      {"true as entry", withHeader("{\"a\":true}", ""), "tensor 'a': entry must be an object"},
      {"trailing text", withHeader(ok + " x", data8), "unexpected text after the header object"},
      {"unknown escape", withHeader("{\"\\q\":{}}", ""), "unknown escape"},
      {"lone surrogate", withHeader("{\"\\ud800x\":{}}", ""), "high surrogate not followed by a low one"},
      {"raw newline in string", withHeader("{\"a\nb\":{}}", ""), "control character in a string"},
      {"unterminated string", withHeader("{\"abc", ""), "unterminated string"},
      {"deep metadata", withHeader("{\"__metadata__\":" + std::string(80, '[') + std::string(80, ']') + "}", ""),
       "nested deeper than 64 levels"},
      {"unknown field", withHeader("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", data8),
       "tensor 'a': unknown field 'x'"},
      {"missing field", withHeader("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", data8),
       "tensor 'a': missing shape"},
      {"repeated field", withHeader("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", data8),
       "field 'dtype' appears twice"},
      {"repeated tensor", withHeader("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", data8),
       "tensor 'a' appears twice"},
      {"unknown dtype", withHeader("{\"a\":{\"dtype\":\"F8\",\"shape\":[2],\"data_offsets\":[0,8]}}", data8),
       "tensor 'a': unsupported dtype 'F8'"},
      {"negative dimension", withHeader("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", data8),
       "shape [-2] has a negative dimension"},
      {"three offsets", withHeader("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", data8),
       "data_offsets must be [begin, end]"},
      {"offsets past the buffer", withHeader("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", data8),
       "data_offsets [4, 12] are outside the 8-byte data buffer"},
      {"begin after end", withHeader("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", data8),
       "data_offsets [8, 4] are outside"},
      {"shape and bytes disagree", withHeader("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", data8),
       "tensor 'a': F32 [2] needs 8 bytes but data_offsets span 4"},
      {"shape product overflows",
       withHeader("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", data8),
       "is too large"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    write_bytes(path, c.bytes);
    CHECK_THROWS_WITH(rt::st::File::read(path),
                      Catch::StartsWith("safetensors: " + path + ": ") && Catch::Contains(c.message));
  }
  // A well-formed control: the same header and data read fine.
  write_bytes(path, file_bytes(ok, data8));
  CHECK(rt::st::File::read(path).names() == std::vector<std::string>{"a"});
  std::remove(path.c_str());
  CHECK_THROWS_WITH(rt::st::File::read(path), Catch::StartsWith("safetensors: " + path + ": cannot open"));
}

TEST_CASE("safetensors: the writer rejects bad tensors and unwritable paths", "[safetensors]") {
  rt::st::Writer w;
  const float x[4] = {0, 1, 2, 3};
  CHECK_THROWS_WITH(w.add("a", "F8", {4}, x, 16), "safetensors: tensor 'a': unsupported dtype 'F8' (supported: BF16, F16, F32, F64, I32, I64, U8)");
  CHECK_THROWS_WITH(w.add("a", "F32", {3}, x, 16), "safetensors: tensor 'a': F32 [3] needs 12 bytes, got 16");
  CHECK_THROWS_WITH(w.add("a", "F32", {-4}, x, 16), Catch::Contains("negative dimension"));
  CHECK_THROWS_WITH(w.add("__metadata__", "F32", {4}, x, 16), Catch::Contains("reserved"));
  CHECK_THROWS_WITH(w.add("a", "F32", {4}, nullptr, 16), Catch::Contains("data is null"));
  w.add("a", "F32", {2, 2}, x, 16);
  CHECK_THROWS_WITH(w.add("a", "F32", {4}, x, 16), "safetensors: tensor 'a': added twice");
  CHECK_THROWS_WITH(w.write("/nonexistent-dir/x.safetensors"),
                    Catch::StartsWith("safetensors: /nonexistent-dir/x.safetensors: cannot open for writing"));
}

/// The peak resident set of this process in bytes (getrusage).
long peak_rss_bytes() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss * 1024L;
}

TEST_CASE("safetensors: the reader reads the header only, and a tensor's bytes when asked", "[safetensors]") {
  // Issue 43: a valid header followed by 1 GiB of padding was loaded whole (20 GB ended in
  // std::bad_alloc). The padding here is a hole (ftruncate): reading it would cost 1 GiB.
  const std::string path = temp_path("sparse");
  write_bytes(path, file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", f32_bytes(2.5f)));
  REQUIRE(truncate(path.c_str(), 1L << 30) == 0);
  const long before = peak_rss_bytes();
  {
    rt::st::File f = rt::st::File::read(path);
    const rt::st::Entry* a = f.find("a");
    REQUIRE(a != nullptr);
    float v = 0;
    std::memcpy(&v, f.bytes(*a).data(), 4);
    CHECK(v == 2.5f);
  }
  CHECK(peak_rss_bytes() - before < (64L << 20));
  // A file that shrinks after its header was checked: the read says so instead of reading past.
  rt::st::File g = rt::st::File::read(path);
  const rt::st::Entry* a = g.find("a");
  REQUIRE(a != nullptr);
  REQUIRE(truncate(path.c_str(), 10) == 0);
  CHECK_THROWS_WITH(g.bytes(*a), Catch::Contains("tensor 'a': the file ends before the tensor's data"));
  std::remove(path.c_str());
  // A folder is not a file.
  CHECK_THROWS_WITH(rt::st::File::read("/tmp"), Catch::Contains("safetensors: /tmp: not a regular file"));
}

TEST_CASE("safetensors: the writer replaces a file only when the new one is whole", "[safetensors]") {
  const std::string path = temp_path("atomic");
  const std::string dir = path.substr(0, path.rfind('/'));
  const std::string base = path.substr(path.rfind('/') + 1);
  write_bytes(path, "old contents");
  chmod(path.c_str(), 0640);
  rt::st::Writer w;
  const float x[2] = {1, 2};
  w.add("a", "F32", {2}, x, 8);
  w.write(path);
  CHECK(rt::st::File::read(path).names() == std::vector<std::string>{"a"});
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0640);   // the replaced file's permissions are kept
  // No temporary file is left beside it.
  std::string list;
  FILE* lsp = popen(("ls -a " + dir + " | grep -F '." + base + ".tmp-' || true").c_str(), "r");
  char buf[256];
  while (lsp && fgets(buf, sizeof buf, lsp)) list += buf;
  if (lsp) pclose(lsp);
  CHECK(list.empty());
  // A symbolic link is written through: the link stays, the file it names is replaced.
  const std::string link = temp_path("atomic_link");
  std::remove(link.c_str());
  REQUIRE(symlink(path.c_str(), link.c_str()) == 0);
  rt::st::Writer w2;
  w2.add("b", "F32", {2}, x, 8);
  w2.write(link);
  struct stat ls {};
  REQUIRE(lstat(link.c_str(), &ls) == 0);
  CHECK(S_ISLNK(ls.st_mode));
  CHECK(rt::st::File::read(path).names() == std::vector<std::string>{"b"});
  // A device is written in place (never renamed over); a folder is refused.
  w2.write("/dev/null");
  CHECK_THROWS_WITH(w2.write(dir), Catch::Contains("cannot open for writing"));
  std::remove(link.c_str());
  std::remove(path.c_str());
}

TEST_CASE("driver helpers: json_escape and now_seconds", "[driver]") {
  CHECK(rt::json_escape("plain") == "plain");
  CHECK(rt::json_escape("a\"b\\c") == "a\\\"b\\\\c");
  CHECK(rt::json_escape("l1\nl2\r\t\b\f") == "l1\\nl2\\r\\t\\b\\f");
  CHECK(rt::json_escape(std::string("\x01\x1f\x7f", 3)) == "\\u0001\\u001f\\u007f");
  CHECK(rt::json_escape(std::string("nul\0x", 5)) == "nul\\u0000x");
  CHECK(rt::json_escape("caf\xc3\xa9") == "caf\xc3\xa9");   // UTF-8 copied
  const double t0 = rt::now_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double t1 = rt::now_seconds();
  CHECK(t1 - t0 >= 0.019);
  CHECK(t1 - t0 < 10.0);
}
