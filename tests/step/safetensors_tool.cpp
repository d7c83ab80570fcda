// safetensors_tool.cpp — the C++ half of the round trips between
// codegen/runtime/common/tally_safetensors.h and the python implementation
// tests/step/e2e/safetensors.py (ctest step-safetensors-python, safetensors_cross.py):
//   safetensors_tool --copy IN OUT      reads IN, writes every tensor to OUT, prints the names,
//                                       dtypes and shapes of IN in header order as JSON; on
//                                       rt::Error prints its message to stderr and exits 2
//   safetensors_tool --write-fixed OUT  writes the tensors of write_fixed() (values from
//                                       formulas safetensors_cross.py repeats)
// Host-only: no runtime, no BLAS, no Catch2 (the cases are safetensors_check.cpp).
#include "tally_safetensors.h"
#include "tally_types.h"   // rt::bf16, rt::f16 for the fixed tensors

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace {

/// The tensors --write-fixed writes; safetensors_cross.py checks each value from the same formula.
void write_fixed(const std::string& path) {
  rt::st::Writer w;
  std::vector<float> f32(6);
  for (int i = 0; i < 6; ++i) f32[i] = 0.25f * static_cast<float>(i) - 1.0f;          // [2, 3]
  w.add("f32", "F32", {2, 3}, f32.data(), f32.size() * 4);
  std::vector<double> f64(5);
  for (int i = 0; i < 5; ++i) f64[i] = 1.0 / (i + 1);                                  // [5]
  w.add("f64", "F64", {5}, f64.data(), f64.size() * 8);
  std::vector<rt::bf16> bf(4);
  for (int i = 0; i < 4; ++i) bf[i] = rt::bf16(1.5f * static_cast<float>(i) - 2.0f);    // exact in bf16
  w.add("bf16", "BF16", {4}, bf.data(), bf.size() * 2);
  std::vector<rt::f16> h(3);
  for (int i = 0; i < 3; ++i) h[i] = rt::f16(0.125f * static_cast<float>(i) + 0.5f);   // exact in f16
  w.add("f16", "F16", {3, 1}, h.data(), h.size() * 2);
  std::vector<int32_t> i32(4);
  for (int i = 0; i < 4; ++i) i32[i] = 1000 * i - 7;
  w.add("i32", "I32", {2, 2}, i32.data(), i32.size() * 4);
  const int64_t i64[2] = {int64_t(1) << 40, -3};
  w.add("i64", "I64", {2}, i64, sizeof i64);
  const uint8_t u8[3] = {0, 128, 255};
  w.add("u8", "U8", {3}, u8, 3);
  const float scalar = 3.25f;
  w.add("scalar", "F32", {}, &scalar, 4);
  w.add("empty", "F32", {0, 3}, nullptr, 0);
  const float one = 1.0f, two = 2.0f;
  w.add("quote\"back\\slash\nnewline", "F32", {1}, &one, 4);
  w.add("caf\xc3\xa9.w", "F32", {1}, &two, 4);   // "café.w" in UTF-8
  w.write(path);
}

/// --copy: every tensor of in into out; the names, dtypes and shapes of in on stdout as JSON.
int copy_file(const std::string& in, const std::string& out) {
  try {
    rt::st::File f = rt::st::File::read(in);
    rt::st::Writer w;
    std::string json = "{\"names\":[";
    std::string dtypes = "\"dtypes\":[", shapes = "\"shapes\":[";
    bool first = true;
    for (const std::string& name : f.names()) {
      const rt::st::Entry* e = f.find(name);
      if (!e) throw rt::Error("find('" + name + "') is null for a listed name");
      const std::vector<uint8_t> b = f.bytes(*e);
      w.add(name, e->dtype, e->shape, b.data(), b.size());
      const char* sep = first ? "" : ",";
      first = false;
      json += sep + ("\"" + rt::json_escape(name) + "\"");
      dtypes += sep + ("\"" + rt::json_escape(e->dtype) + "\"");
      shapes += sep + rt::st::detail::shape_text(e->shape);
    }
    w.write(out);
    std::cout << json << "]," << dtypes << "]," << shapes << "]}\n";
    return 0;
  } catch (const rt::Error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--copy") return copy_file(argv[2], argv[3]);
  if (argc == 3 && std::string(argv[1]) == "--write-fixed") {
    try {
      write_fixed(argv[2]);
      return 0;
    } catch (const rt::Error& e) {
      std::cerr << e.what() << "\n";
      return 2;
    }
  }
  std::cerr << "usage: safetensors_tool --copy IN OUT | --write-fixed OUT\n";
  return 2;
}
