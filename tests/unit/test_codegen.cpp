// The step emitter (codegen/EmitStep.cpp, both backends): every example's training step is
// generated on one device without the step and the memory plan disagreeing (each operand has a
// live buffer at its schedule step), and the calls carry the numbers the shapes give. The CPU
// steps are compiled and run against PyTorch by tests/step/e2e (ctest e2e); the CUDA steps are
// the same calls (checked here) and compile with nvcc in ctest cuda-step-compiles.
#include "Support.h"

#include "codegen/Emit.h"
#include "passes/Collectives.h"

#include <cstring>
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

using namespace tally;
using namespace tally::test;

namespace {

/// The overrides `tally build` analyzes a plan with (tools/tally/Build.cpp): priced as tally's own
/// step runs it (its fused loss, ZeRO's transients as its memory plan holds them). A plan
/// analyzed as a framework runs it prices PyTorch's eager loss, which the step does not run.
PlanOverrides asBuilt(PlanOverrides o = {}) {
  o.generatedStep = true;
  return o;
}

std::string emit(const Analysis &a, std::string &text, bool cuda = false) {
  codegen::EmitOptions o;
  o.source = "t.tally";
  StepFiles step = emitStep(a, cuda, o);
  text = step.byPath[cuda ? "step.cu" : "step.cpp"];
  return step.error;
}

std::vector<std::string> lines(const std::string &text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos)
      end = text.size();
    out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

/// The runtime calls of a generated step, in order: the lines that start with `rt::` (not the
/// CUDA step's own error checks, `rt::cu::check`).
std::vector<std::string> runtimeCalls(const std::string &text) {
  std::vector<std::string> out;
  for (const std::string &l : lines(text)) {
    size_t first = l.find_first_not_of(' ');
    if (first != std::string::npos && l.compare(first, 4, "rt::") == 0 && l.compare(first, 8, "rt::cu::") != 0)
      out.push_back(l.substr(first));
  }
  return out;
}

/// runtimeCalls with the CUDA step's cuDNN attention spelled as the runtime's kernels' call: the
/// same arguments, another engine (passes/CudnnAttention.h).
std::vector<std::string> runtimeCallsAnyEngine(const std::string &text) {
  std::vector<std::string> out = runtimeCalls(text);
  for (std::string &c : out)
    for (const char *name : {"rt::attention_fwd_cudnn<", "rt::attention_bwd_cudnn<"})
      if (c.compare(0, std::strlen(name), name) == 0)
        c.erase(std::strlen(name) - 7, 6);
  return out;
}


} // namespace

TEST_CASE("codegen: every example's plan generates on one device", "[codegen]") {
  PlanOverrides one = asBuilt();
  one.target = "H100_SXM";
  for (const char *file : {"gpt2.tally", "lecture.tally", "llama2_7b.tally", "tour.tally"}) {
    INFO(file);
    Compiled t(fromFile, example(file), "", one);
    std::string text;
    CHECK(emit(*t.a, text) == "");
    // One call per non-view op of the schedule's micro-batch entries, each under a comment
    // (an add's gradient that shares dy's buffer is a comment alone: no call).
    size_t calls = 0;
    for (const StepEntry &e : t.a->stepSchedule) {
      const Op &op = t.a->step->ops[e.op];
      if (e.kind != StepEntry::Optimizer && opClass(op.kind) != OpClass::View && !op.attrs->shares)
        ++calls;
    }
    CHECK(countOf(text, "  op_class = ") == calls + 2); // + the optimizer update and zero-grad
  }
}

TEST_CASE("codegen: the e2e GPT's tied head, fused qkv and recompute", "[codegen]") {
  Compiled t(fromFile, sourceDir() + "/tests/step/e2e/gpt.tally", "", asBuilt());
  std::string text;
  REQUIRE(emit(*t.a, text) == "");
  // q, k, v are column slices of the [2, 16, 192] qkv output: row stride 3·64.
  CHECK(countOf(text, "rt::AttnRows{192, 192, 192}") == 4); // 2 layers × (forward, backward)
  // The tied head's weight gradient is the transposed view of wte's gradient: written as
  // dWᵀ[100 × 64] = dlogitsᵀ[100 × 32] · x[32 × 64] (32 = 2 × 16 tokens of a micro-batch),
  // added into the grads region at wte's offset 0.
  CHECK(countOf(text, "rt::matmul<float>(ctx, true, false, 100, 64, 32, 1.0f,") == 1);
  CHECK(countOf(text, ", 1.0f, G<float>(0), 64, 0, 1);") == 1);
  // The loss gradient: 1 / 2 micro-steps.
  CHECK(countOf(text, "rt::fill<float>(ctx, A<float>(") >= 1);
  CHECK(countOf(text, "5.000000000e-01f, 1);") == 1);
  // Kernels are timed under their forward op's class, as tally run's estimate files them: a bias
  // add's gradient reduction and its copies are the add's (elementwise) time, a matmul's
  // gradient matmuls matmul time. So no kernel of this step is filed as a reduction.
  CHECK(countOf(text, "op_class = \"reduction\"") == 0);
  std::vector<std::string> ls = lines(text);
  auto classAfter = [&](const std::string &comment) {
    for (size_t i = 0; i + 1 < ls.size(); ++i)
      if (ls[i].find(comment) != std::string::npos)
        return ls[i + 1];
    return std::string("(no " + comment + ")");
  };
  CHECK(classAfter("// h[1].mlp.fc.add.reduce_to (backward)") == "  op_class = \"elementwise\";");
  // The add's matmul output's gradient is dy's buffer: a comment, no call (issue 46).
  CHECK(classAfter("// h[1].mlp.fc.add.contiguous (backward): the gradient is the output's").find("op_class") ==
        std::string::npos);
  CHECK(countOf(text, "rt::copy<") == 0);
  CHECK(classAfter("// h[1].mlp.fc.matmul.matmul (backward)") == "  op_class = \"matmul\";");
  CHECK(classAfter("// h[1].mlp.fc.matmul (forward)") == "  op_class = \"matmul\";");
  // The op's path and step-graph index follow its class (what `tally run --trace` names calls by).
  auto pathAfter = [&](const std::string &comment) {
    for (size_t i = 0; i + 2 < ls.size(); ++i)
      if (ls[i].find(comment) != std::string::npos)
        return ls[i + 2];
    return std::string("(no " + comment + ")");
  };
  OpId fc = kNone;
  for (OpId i = 0; i < t.a->step->ops.size(); ++i)
    if (t.a->step->opPath(i) == "h[1].mlp.fc.matmul")
      fc = i;
  CHECK(pathAfter("// h[1].mlp.fc.matmul (forward)") ==
        "  op_path = \"h[1].mlp.fc.matmul\"; op_id = " + std::to_string(fc) + ";");
  CHECK(countOf(text, "  op_path = ") == countOf(text, "  op_class = "));
  CHECK(countOf(text, "  op_path = \"zero_grad\"; op_id = -1;") == 1);
}

TEST_CASE("codegen: a plan priced with a framework's eager norm is not emitted as tally's fused one",
          "[codegen]") {
  // The same RMSNorm model analyzed as the ddp stack runs it (the module's eager PyTorch
  // decomposition) and as `tally build` analyzes it (its fused kernel, Plan::generatedStep).
  const char *text = R"(
model M(d = 16) {
  norm = RMSNorm(d)
  param w: [d, d]
  forward(x: f32[batch, d]) { return mean(norm(x) @ w) }
}
train t { model = M() batch = 4 optimizer = SGD(lr = 0.1) target = 1 x H100_SXM }
)";
  Compiled framework(text);
  std::string out;
  CHECK(emit(*framework.a, out).find("eager rms_norm") != std::string::npos);
  Compiled built(text, "", asBuilt());
  CHECK(emit(*built.a, out) == "");
}

TEST_CASE("codegen: checkpointed blocks are recomputed into their own buffers", "[codegen]") {
  Compiled t(R"(
block Layer(d) {
  ln = LayerNorm(d)
  fc = Linear(d, 2 * d)
  forward(x) { return x + dropout(gelu(fc(ln(x))), 0.1) @ transpose(fc.weight) }
}
model M(d = 16, layers = 3) {
  h = repeat(layers) Layer(d)
  w = RMSNorm(d)
  forward(x: f32[batch, seq, d]) {
    y = softmax(w(h(x)), dim = -1)
    return mean(y * y - 2 * y)
  }
}
train t { model = M() batch = 4 seq = 8 micro_batch = 2 optimizer = AdamW(lr = 1e-3)
          precision = mixed_fp16 checkpoint = full target = H100_SXM }
)", "", asBuilt()); // as `tally build` analyzes it: its fused norm (OpAttrs::norm)
  std::string text;
  REQUIRE(emit(*t.a, text) == "");
  // Three layers of six forward ops (ln, matmul, add, gelu, dropout, matmul; the transpose
  // is a view and the residual add the seventh) run again before their backward.
  CHECK(countOf(text, "(recompute)") == 3 * 7);
  // The same dropout stream and seed in the forward, the recompute and the backward.
  CHECK(countOf(text, "rt::dropout_fwd<rt::f16>") == 6);
  CHECK(countOf(text, "rt::dropout_bwd<rt::f16>") == 3);
  // fp16 loss scaling: the overflow check skips the update; the update unscales.
  CHECK(countOf(text, "rt::sum_squares<rt::f16>") == 1);
  CHECK(countOf(text, "1.0f / kLossScale") == 1);
}

TEST_CASE("codegen: plans the CPU backend cannot run are refused with the reason; 1/x runs", "[codegen]") {
  Compiled t(fromFile, example("gpt2.tally"), "", asBuilt());
  std::string text;
  // Data parallel (8 x { data = 8, zero = 1 }) runs under MPI on the CPU and over NCCL on CUDA:
  // ZeRO-1's reduce-scatters, this rank's updates and the parameters' all-gathers, on the device.
  CHECK(emit(*t.a, text) == "");
  REQUIRE(emit(*t.a, text, true) == "");
  CHECK(countOf(text, "tally_comm::reduce_scatter<rt::bf16>(ctx, G<rt::bf16>(0), ") == 10);
  CHECK(countOf(text, "tally_comm::all_gather<rt::bf16>(ctx, G<rt::bf16>(0), ") == 20); // gradients, parameters
  CHECK(countOf(text, "    tally_comm::copy(ctx, P<uint8_t>(e.p), G<uint8_t>(e.g), e.bytes);") == 1);
  CHECK(countOf(text, "if (e.n > 0 && e.rank == me)") == 2); // its pieces: the update, the gather
  // ZeRO 3 (8 x { data = 8, zero = 3 }) runs on the CPU: each of the 32 blocks' 9 parameters and
  // the root's 3 gathered before the forward and again before the backward, each of the 291
  // gradients reduce-scattered once per micro-batch; CUDA refuses it.
  Compiled z3(fromFile, example("llama2_7b.tally"), "", asBuilt());
  REQUIRE(emit(*z3.a, text) == "");
  CHECK(countOf(text, "tally_comm::all_gather_piece<rt::bf16>(ctx, A<rt::bf16>(") == 2 * (32 * 9 + 3));
  CHECK(countOf(text, "tally_comm::reduce_scatter_piece<rt::bf16>(ctx, A<rt::bf16>(") == 32 * 9 + 3);
  CHECK(countOf(text, "gather_parameters(") == 0); // the parameters stay in pieces
  CHECK(emit(*z3.a, text, true).find("ZeRO stage 3: the CUDA backend shards the optimizer state") != std::string::npos);
  Compiled d(R"(
model M(d = 8) {
  param w: [d, d]
  forward(x: f32[batch, d]) { return mean(1 / (x @ w)) }
}
train t { model = M() batch = 2 optimizer = SGD(lr = 0.1) precision = fp32 target = H100_SXM }
)");
  CHECK(emit(*d.a, text) == "");
  CHECK(countOf(text, "rt::div_scalar_bwd<float>(ctx, ") == 1); // d(1/u)/du from the output
  CHECK(countOf(text, "rt::matmul<float>(ctx, false, false, 2, 8, 8, 1.0f,") == 1);
}

TEST_CASE("codegen: a division by a tensor and a gradient written into a split part", "[codegen]") {
  Compiled t(R"(
model M(d = 8) {
  param w: [d, 2 * d]
  forward(x: f32[batch, d]) {
    a, b = split(x @ w, 2, dim = -1)
    return mean(a * sigmoid(b) / (b * b + 1))
  }
}
train t { model = M() batch = 2 optimizer = SGD(lr = 0.1) precision = fp32 target = H100_SXM }
)");
  std::string text;
  REQUIRE(emit(*t.a, text) == "");
  CHECK(countOf(text, "rt::div_bwd<float>(ctx, ") == 1);
  // The gradients of a and b go into the halves of the [2, 16] product's gradient, which starts
  // from a zero fill (b is read three times): one write into a's half (from a · sigmoid(b)),
  // three into b's (sigmoid(b), and b · b's two operands), each with row stride 16.
  CHECK(countOf(text, "rt::fill<float>(ctx, A<float>(0), 0.0f, 32);") == 1);
  CHECK(countOf(text, "dims{{16, 1}}, dims{{2, 8}}, 2, true);") == 4);
}

TEST_CASE("codegen: every example's CUDA step makes the CPU step's calls, each after ctx.where", "[codegen][cuda]") {
  PlanOverrides one = asBuilt();
  one.target = "H100_SXM";
  std::vector<std::string> files; // every examples/*.tally, so a new example is covered too
  for (const auto &e : std::filesystem::directory_iterator(sourceDir() + "/examples"))
    // Mixtral's MoE ops have no runtime kernels yet: tests/lit/moe-build-refused.tally pins
    // the refusal; every other example must generate.
    if (e.path().extension() == ".tally" && e.path().filename() != "mixtral_8x7b.tally")
      files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 5);
  for (const std::string &file : files) {
    INFO(file);
    Compiled t(fromFile, example(file), "", one);
    std::string cpu, cuda;
    REQUIRE(emit(*t.a, cpu) == "");
    REQUIRE(emit(*t.a, cuda, true) == "");
    // One call per non-view op of the micro-batch entries, each under its comment and after
    // `ctx.where = "<the op's path>";`.
    std::vector<std::string> ls = lines(cuda);
    size_t calls = 0, placed = 0;
    const char *kinds[] = {"forward", "backward", "recompute", "optimizer"};
    size_t from = 0;
    for (const StepEntry &e : t.a->stepSchedule) {
      const Op &op = t.a->step->ops[e.op];
      if (e.kind == StepEntry::Optimizer || opClass(op.kind) == OpClass::View || op.attrs->shares)
        continue;
      ++calls;
      std::string comment = "  // " + t.a->step->opPath(op) + " (" + kinds[e.kind] + ")";
      for (size_t i = from; i + 2 < ls.size(); ++i)
        if (ls[i].compare(0, comment.size(), comment) == 0) {
          CHECK(ls[i + 1] == "  ctx.where = \"" + t.a->step->opPath(op) + "\";");
          CHECK(ls[i + 2].compare(0, 6, "  rt::") == 0);
          placed += 1;
          from = i + 1;
          break;
        }
    }
    CHECK(placed == calls);
    CHECK(countOf(cuda, "  ctx.where = ") == calls + 2); // + the optimizer update and zero-grad
    CHECK(countOf(cuda, "  op_class = ") == 0);
    // The same runtime calls over the same regions, in the same order as the CPU step.
    CHECK(runtimeCallsAnyEngine(cuda) == runtimeCalls(cpu));
    CHECK(countOf(cuda, "#include \"cuda/tally_rt.cuh\"") == 1);
    // The loss goes to a device slot inside the graph region, read back once after it.
    CHECK(countOf(cuda, "store_loss(ctx, ") == 1);
    CHECK(countOf(cuda, "loss = device_load(ctx, ") == 0);
  }
}

TEST_CASE("codegen: the CUDA step's files, layout and refusals", "[codegen][cuda]") {
  Compiled t(fromFile, sourceDir() + "/tests/step/e2e/gpt.tally", "", asBuilt());
  codegen::EmitOptions o;
  o.source = "t.tally";
  StepFiles step = emitStep(*t.a, true, o);
  REQUIRE(step.error == "");
  std::map<std::string, std::string> &byPath = step.byPath;
  CHECK(byPath.count("step.cu") == 1);
  CHECK(byPath.count("runtime/driver/driver_cuda.cu") == 1);
  CHECK(byPath.count("runtime/cuda/tally_rt.cuh") == 1);
  CHECK(byPath.count("runtime/driver/driver_cpu.cpp") == 0);
  CHECK(byPath.count("runtime/cpu/tally_rt.h") == 0);
  CHECK(byPath.count("step.cpp") == 0);
  const std::string &cm = byPath["CMakeLists.txt"];
  CHECK(countOf(cm, "project(tally_step LANGUAGES CXX CUDA)") == 1);
  CHECK(countOf(cm, "set(TALLY_CUDA_ARCH 90 CACHE STRING") == 1);
  CHECK(countOf(cm, "add_executable(tally_step step.cu runtime/driver/driver_cuda.cu)") == 1);
  // The memory plan of the CPU step: the same kLayout but for its backend name.
  std::string cpu;
  REQUIRE(emit(*t.a, cpu) == "");
  const std::string &cu = byPath["step.cu"];
  auto layout = [](const std::string &text) {
    std::string l = text.substr(text.find("Layout kLayout = {"));
    return l.substr(0, l.find("};\n"));
  };
  std::string l = layout(cu);
  size_t at = l.find("\"cuda\"");
  REQUIRE(at != std::string::npos);
  CHECK(l.replace(at, 6, "\"cpu\"").substr(0, 200) == layout(cpu).substr(0, 200));
  // Every path ctx.where takes has its op class in kOpSites (the driver files kernel times by it).
  CHECK(countOf(cu, "    {\"h[0].attn.attention\", \"attention\"},") == 1);
  CHECK(countOf(cu, "    {\"zero_grad\", \"optimizer\"},") == 1);

  // Head size 512 is beyond the CUDA attention kernels (1..256); the CPU runs it.
  Compiled big(R"(
model M(d = 512) {
  param w: [d, d]
  forward(x: f32[batch, seq, d]) { return mean(attention(x @ w, x, x, heads = 1, causal = true)) }
}
train t { model = M() batch = 2 seq = 4 optimizer = SGD(lr = 0.1) precision = fp32 target = H100_SXM }
)");
  std::string text;
  CHECK(emit(*big.a, text) == "");
  std::string err = emit(*big.a, text, true);
  CHECK(err.find("the CUDA runtime's attention refuses it: head_dim 512 is outside 1..256") != std::string::npos);
  CHECK(err.rfind("op attention", 0) == 0);
}

TEST_CASE("codegen: fp16 loss scaling on CUDA reads the overflow check back from the device", "[codegen][cuda]") {
  Compiled t(R"(
model M(d = 16) {
  ln = LayerNorm(d)
  param w: [d, d]
  forward(x: f32[batch, d]) { return mean(gelu(ln(x) @ w)) }
}
train t { model = M() batch = 4 micro_batch = 2 optimizer = AdamW(lr = 1e-3) precision = mixed_fp16 target = H100_SXM }
)");
  std::string cpu, cuda;
  REQUIRE(emit(*t.a, cpu) == "");
  REQUIRE(emit(*t.a, cuda, true) == "");
  CHECK(countOf(cuda, "rt::sum_squares<rt::f16>(ctx, G<rt::f16>(0), ") == 1);
  CHECK(countOf(cuda, ", device_scalars);") == 2); // written by sum_squares, read back by device_load
  CHECK(countOf(cuda, "const double sumsq = device_load(ctx, device_scalars);") == 1);
  CHECK(countOf(cpu, ", &sumsq);") == 1);
  // Everything but the overflow check's destination is the CPU step's.
  auto calls = [](const std::string &text) {
    std::vector<std::string> out;
    for (const std::string &c : runtimeCalls(text))
      if (c.rfind("rt::sum_squares", 0) != 0)
        out.push_back(c);
    return out;
  };
  CHECK(calls(cuda) == calls(cpu));
  CHECK(countOf(cuda, "  ctx.where = ") == countOf(cpu, "  op_class = "));
}

namespace {

/// The generated CMakeLists.txt of a plan (the step's emitter writes it).
std::string cmakeLists(const Analysis &a) {
  StepFiles step = emitStep(a, false);
  REQUIRE(step.error == "");
  return step.byPath["CMakeLists.txt"];
}

/// The CUDA step's step.cu for a plan, and the notes `tally build` would print beside it.
std::string cudaStepSource(const Analysis &a, std::vector<std::string> &notes) {
  codegen::EmitOptions eo;
  eo.notes = &notes;
  std::vector<codegen::File> files;
  REQUIRE(codegen::emitCudaStep(a, eo, files) == "");
  for (const codegen::File &f : files)
    if (f.path == "step.cu")
      return f.text;
  return "";
}

const char *kDataParallel = R"(
model M(d = 4096) {
  param w: [d, d]
  forward(x: f32[batch, d]) { return mean(x @ w) }
}
train dp { model = M() batch = 4 micro_batch = 1 optimizer = AdamW(lr = 1e-3) precision = fp32
           target = 2 x H100_SXM { data = 2, overlap = false } }
train dpo { model = M() batch = 4 micro_batch = 1 optimizer = AdamW(lr = 1e-3) precision = fp32
            target = 2 x H100_SXM { data = 2 } }
train zero { model = M() batch = 4 micro_batch = 1 optimizer = AdamW(lr = 1e-3) precision = fp32
             target = 2 x H100_SXM { data = 2, zero = 1 } }
train one { model = M() batch = 4 micro_batch = 1 optimizer = AdamW(lr = 1e-3) precision = fp32
            target = H100_SXM }
train tp { model = M() batch = 4 micro_batch = 1 optimizer = AdamW(lr = 1e-3) precision = fp32
           target = 2 x H100_SXM { tensor = 2 } }
)";

} // namespace

TEST_CASE("codegen: data parallel over MPI, gradients averaged in 25 MiB buckets", "[codegen]") {
  Compiled t(kDataParallel, "dp");
  std::string text;
  REQUIRE(emit(*t.a, text) == "");
  // w is 4096² fp32 = 64 MiB of gradients, E = 16777216 elements; a bucket holds 25 MiB / 4 B =
  // 6553600 of them: [0, 6553600), [6553600, 13107200), [13107200, 16777216).
  CHECK(countOf(text, "rt::scale<float>(ctx, G<float>(0), 5.000000000e-01f, 16777216);") == 1);
  CHECK(countOf(text, "tally_comm::all_reduce<float>(ctx, G<float>(0), 0, 6553600);") == 1);
  CHECK(countOf(text, "tally_comm::all_reduce<float>(ctx, G<float>(0), 6553600, 13107200);") == 1);
  CHECK(countOf(text, "tally_comm::all_reduce<float>(ctx, G<float>(0), 13107200, 16777216);") == 1);
  CHECK(countOf(text, "tally_comm::all_reduce") == 3);
  CHECK(countOf(text, "  reduce_gradients(ctx);\n") == 1);
  // Each rank runs batch / (micro_batch × 2) = 2 micro-batches and seeds the loss with 1/2.
  CHECK(countOf(text, ", 4, 1, 2, ") == 1); // kLayout: batch, micro-batch, micro-steps per rank
  bool seed = false;
  for (const Op &op : t.a->step->ops)
    if (op.kind == OpKind::Fill && op.forwardOp == kNone)
      seed = op.attrs->scalar == 0.5;
  CHECK(seed);
  CHECK(t.a->regions.shard == 0);
  std::string cm = cmakeLists(*t.a);
  CHECK(cm.find("find_package(MPI REQUIRED COMPONENTS CXX)") != std::string::npos);
  CHECK(cm.find("TALLY_MPI=1") != std::string::npos);

  Compiled one(kDataParallel, "one");
  REQUIRE(emit(*one.a, text) == "");
  CHECK(countOf(text, "tally_comm") == 0);
  CHECK(cmakeLists(*one.a).find("MPI") == std::string::npos);

  Compiled tp(kDataParallel, "tp");
  CHECK(emit(*tp.a, text).find("tensor = 2") != std::string::npos);

  // overlap = true (the default): w's gradient, the only one, spans the three buckets, so all
  // three start right after the op that writes it, in the last micro-batch.
  Compiled o(kDataParallel, "dpo");
  REQUIRE(emit(*o.a, text) == "");
  CHECK(countOf(text, "    {0, 6553600},\n    {6553600, 13107200},\n    {13107200, 16777216},\n") == 1);
  size_t first = text.find("  if (last) start_bucket(ctx, 0); // its last gradient is written\n"
                           "  if (last) start_bucket(ctx, 1); // its last gradient is written\n"
                           "  if (last) start_bucket(ctx, 2); // its last gradient is written\n");
  CHECK(first != std::string::npos);
  CHECK(countOf(text, "start_bucket(ctx, ") == 3); // none left for reduce_gradients()
  CHECK(countOf(text, "rt::scale<float>(ctx, G<float>(0) + kBuckets[k][0], 5.000000000e-01f, kBuckets[k][1] - kBuckets[k][0]);") == 1);
  CHECK(countOf(text, "tally_comm::all_reduce_start<float>(ctx, G<float>(0), kBuckets[k][0], kBuckets[k][1], k);") == 1);
  CHECK(countOf(text, "tally_comm::all_reduce_wait(ctx);") == 1);
  CHECK(countOf(text, "tally_comm::all_reduce<") == 0);
}

TEST_CASE("codegen: ZeRO-1 shards master and optimizer state over the ranks", "[codegen]") {
  Compiled t(kDataParallel, "zero");
  std::string text;
  REQUIRE(emit(*t.a, text) == "");
  // The grads region's 16777216 elements in 2 runs of 8388608; AdamW's 2 states each a run of
  // fp32: 2 × 8388608 × 4 = 67108864 bytes per rank, half of the 134217728 unsharded.
  CHECK(t.a->regions.shard == 8388608);
  CHECK(t.a->regions.optimizer.bytes == 67108864);
  CHECK(t.a->regions.optimizer.tensors.empty());
  CHECK(t.a->regions.master.bytes == 0); // fp32: no master copy
  Compiled dp(kDataParallel, "dp");
  CHECK(dp.a->regions.optimizer.bytes == 134217728);
  // The analyzer's ZeRO-1 estimate per device is the same T × 2 × 4 / 2 (no padding here).
  CHECK(t.a->memory.optimizer == 67108864.0);
  CHECK(countOf(text, "constexpr int64_t kShard = 8388608;") == 1);
  // On MPI the step's reduce-scatter and the parameters' gather are the counted rings (as under
  // data x tensor); --dump-grads's gather of the gradients stays MPI's, outside the step.
  CHECK(countOf(text, "tally_comm::dp_reduce_scatter<float>(ctx, G<float>(0), 0, 6553600, kShard);") == 1);
  CHECK(countOf(text, "tally_comm::dp_reduce_scatter") == 3);
  CHECK(countOf(text, "tally_comm::reduce_scatter") == 0);
  CHECK(countOf(text, "tally_comm::dp_all_gather") == 3); // the parameters
  CHECK(countOf(text, "tally_comm::all_gather") == 3);    // the gradients (--dump-grads)
  // w's two pieces: rank 0 elements [0, 8388608) at state offsets 0 and 33554432 (the second
  // state's run), rank 1 the rest at the same shard offsets; p is w in the params region.
  CHECK(countOf(text, "{0, 8388608, 0, -1, 0, 0, 33554432}, // w [0, 8388608)") == 1);
  CHECK(countOf(text, "{1, 8388608, 33554432, -1, 33554432, 0, 33554432}, // w [8388608, 16777216)") == 1);
  CHECK(countOf(text, "gather_parameters(ctx);\n") == 1);
  // kLayout: ranks, zero, shard, tensor, pipeline, stage, tensor and data strides
  CHECK(countOf(text, ", 2, 1, 8388608, 1, 1, 0, 1, 1};") == 1);
}

namespace {
const char *kDataTensor = R"(
model T(d = 8) {
  param w1: [d, 4 * d]
  param w2: [4 * d, d]
  forward(x: f32[batch, d]) { return mean(gelu(x @ w1) @ w2) }
}
train tpdp { model = T() batch = 4 micro_batch = 1 optimizer = SGD(lr = 0.1) target = 4 x H100_SXM { tensor = 2, overlap = false } }
train tpdpo { model = T() batch = 4 micro_batch = 1 optimizer = SGD(lr = 0.1) target = 4 x H100_SXM { tensor = 2 } }
train dtp { model = T() batch = 4 micro_batch = 1 optimizer = SGD(lr = 0.1) target = 4 x H100_SXM { tensor = 2, order = dtp, overlap = false } }
train tpz { model = T() batch = 4 micro_batch = 1 optimizer = SGD(lr = 0.1) target = 4 x H100_SXM { tensor = 2, zero = 1 } }
train tpz2 { model = T() batch = 4 micro_batch = 1 optimizer = SGD(lr = 0.1) target = 4 x H100_SXM { tensor = 2, zero = 2 } }
train tpz3 { model = T() batch = 4 micro_batch = 1 optimizer = SGD(lr = 0.1) target = 4 x H100_SXM { tensor = 2, zero = 3 } }
train tpz2m { model = T() batch = 4 micro_batch = 1 optimizer = SGD(lr = 0.1) precision = mixed_bf16 target = 4 x H100_SXM { tensor = 2, zero = 2 } }
)";

/// The body of the function of `text` whose definition starts with `head`, to its closing brace.
std::string functionText(const std::string &text, const std::string &head) {
  size_t at = text.find(head);
  if (at == std::string::npos)
    return "";
  size_t end = text.find("\n}\n", at);
  return text.substr(at, end == std::string::npos ? std::string::npos : end - at);
}
} // namespace

TEST_CASE("codegen: data x tensor: ranks split by the plan's order, each collective on its group", "[codegen]") {
  PlanOverrides o;
  o.tensorStep = o.generatedStep = true; // as `tally build --backend cpu` analyzes it
  Compiled t(kDataTensor, "tpdp", o), d(kDataTensor, "dtp", o);
  // One rule for where a rank sits (passes/Collectives.h): the default order (tcpd) puts the
  // tensor group innermost, `order = dtp` the data group.
  const Plan &tp = *t.a->plan, &dt = *d.a->plan;
  REQUIRE((tp.parallel.data == 2 && tp.parallel.tensor == 2));
  for (int64_t q = 0; q < 4; ++q) {
    CHECK(rankCoordinate(tp, q, 't') == q % 2);
    CHECK(rankCoordinate(tp, q, 'd') == q / 2);
    CHECK(rankCoordinate(dt, q, 't') == q / 2);
    CHECK(rankCoordinate(dt, q, 'd') == q % 2);
  }
  CHECK(place(tp, 't').n == 2);
  CHECK(place(tp, 'd').n == 2);
  StepFiles files = emitStep(*t.a, false);
  REQUIRE(files.error == "");
  const std::string &text = files.byPath["step.cpp"];
  // kLayout: ranks 2, zero 0, shard 0, tensor 2, pipeline 1, stage 0; the tensor stride 1 and the
  // data stride 2, which the driver splits the MPI groups by (tally_comm::split_groups).
  CHECK(countOf(text, ", 2, 0, 0, 2, 1, 0, 1, 2};") == 1);
  // w2 is row-parallel: its output summed over the tensor group; the gradients (each rank's
  // cut, in one bucket of G's 256 elements) averaged over the data group by the counted ring.
  CHECK(countOf(text, "tally_comm::tp_all_reduce<float>(ctx, A<float>(") == 1);
  CHECK(countOf(text, "rt::scale<float>(ctx, G<float>(0), 5.000000000e-01f, 256);") == 1);
  CHECK(countOf(text, "tally_comm::dp_all_reduce<float>(ctx, G<float>(0), 0, 256);") == 1);
  CHECK(countOf(text, "tally_comm::all_reduce<") == 0);
  std::string e;
  REQUIRE(emit(*d.a, e) == "");
  CHECK(countOf(e, ", 2, 0, 0, 2, 1, 0, 2, 1};") == 1); // order = dtp: the strides swapped
  // overlap = true: each bucket's ring runs where the last micro-batch's backward completes it.
  Compiled ov(kDataTensor, "tpdpo", o);
  REQUIRE(emit(*ov.a, e) == "");
  CHECK(countOf(e, "  if (last) start_bucket(ctx, 0); // its last gradient is written\n") == 1);
  CHECK(countOf(e, "tally_comm::dp_all_reduce<float>(ctx, G<float>(0), kBuckets[k][0], kBuckets[k][1]);") == 1);
  CHECK(countOf(e, "all_reduce_start") == 0);
  // The runtime: the tensor groups are the ranks of one data rank (and stage), the data groups
  // those of one tensor rank (and stage), the pipelines those of one data and tensor rank;
  // tp_all_reduce runs on the first, the gradients' collectives on the second.
  const std::string &comm = files.byPath["runtime/driver/tally_comm.h"];
  std::string split = functionText(comm, "inline void split_groups(int tr, int t, int dr, int d, int pr = 0, int p = 1) {");
  CHECK(countOf(split, "MPI_Comm_split(MPI_COMM_WORLD, colour, key, &c)") == 1);
  CHECK(countOf(split, "split(dr * p + pr, tr, t, kTensor, detail::tensor_group(), \"tensor\");") == 1);
  CHECK(countOf(split, "split(tr * p + pr, dr, d, kData, detail::data_group(), \"data\");") == 1);
  CHECK(countOf(split, "split(dr * t + tr, pr, p, kPipeline, detail::pipeline_group(), \"pipeline\");") == 1);
  for (const char *f : {"template <class T> void pp_send(", "template <class T> void pp_recv(", "inline void pp_sync(",
                        "template <class T> void pp_sum_with("})
    CHECK(countOf(functionText(comm, f), "detail::pipeline_group().comm") >= 1);
  CHECK(countOf(functionText(comm, "template <class T> void tp_all_reduce("), "detail::tensor_group()") == 1);
  CHECK(countOf(functionText(comm, "template <class T> void dp_all_reduce("), "detail::data_group()") == 1);
  CHECK(countOf(functionText(comm, "inline void barrier("), "detail::data_group().comm") == 1);
  CHECK(countOf(functionText(comm, "template <class T> void all_reduce("), "detail::data_group().comm") == 1);
  const std::string &driver = files.byPath["runtime/driver/driver_cpu.cpp"];
  CHECK(countOf(driver, "tally_comm::split_groups(tensorRankOf(rank), static_cast<int>(kLayout.tensor), dataRankOf(rank),") == 1);
  // ZeRO-1: each data group reduce-scatters its ranks' grads region (their tensor cut's, 256
  // elements: a shard of 128 per data rank) and gathers the updated parameters back, both as
  // counted rings on the data group; each rank updates the shard its data rank owns. The
  // estimate prices the region both ways: (N - 1)/N of its bytes each, 2 x 512 B at N = 2.
  Compiled z(kDataTensor, "tpz", o);
  REQUIRE(emit(*z.a, e) == "");
  CHECK(countOf(e, "constexpr int64_t kShard = 128;") == 1);
  CHECK(countOf(e, "tally_comm::dp_reduce_scatter<float>(ctx, G<float>(0), 0, 256, kShard);") == 1);
  CHECK(countOf(e, "tally_comm::dp_all_gather<float>(ctx, G<float>(0), 0, 256, kShard);") == 1);
  CHECK(countOf(e, "tally_comm::all_gather<float>(ctx, G<float>(0), 0, 256, kShard);") == 1); // --dump-grads only
  CHECK(countOf(e, "const int me = tally_comm::data_rank();") == 2);
  CHECK(countOf(e, "tally_comm::rank()") == 0);
  CHECK(countOf(e, ", 2, 1, 128, 2, 1, 0, 1, 2};") == 1); // kLayout: zero 1, shard 128
  CHECK(z.a->regions.grads.bytes == 1024);
  CHECK(dataParallelSentBytes(*z.a) == 1024);
  for (const char *f : {"template <class T> void dp_reduce_scatter(", "template <class T> void dp_all_gather("})
    CHECK(countOf(functionText(comm, f), "detail::data_group(), region, end, shard, begin)") == 1);
  // ZeRO 2 and 3: each rank's pieces are ⌈n/2⌉ of its tensor cut's n = 128 elements of w1 and
  // w2 (the memory plan's rule), moved over the data group. The estimate prices d × those
  // pieces; a ring of 2 sends the other rank's piece of each tensor, 2 × 64 × 4 = 512 B a move:
  // per rank and step 2 micro-batches' reduce-scatters (2 × 512 B) and under ZeRO 2 one gather
  // after the update (512 B), under ZeRO 3 the root unit gathered before its forward and its
  // backward every micro-batch (4 × 512 B): what the step's rings send.
  Compiled z2(kDataTensor, "tpz2", o), z3(kDataTensor, "tpz3", o);
  REQUIRE(emit(*z2.a, e) == "");
  CHECK(countOf(e, "tally_comm::reduce_scatter_piece<float>(ctx, A<float>(") == 2);
  CHECK(countOf(e, ", 128, 64, G<float>(") == 2);
  CHECK(countOf(e, "tally_comm::all_gather_piece<float>(ctx, P<float>(") == 2);
  CHECK(countOf(e, ", 2, 2, 0, 2, 1, 0, 1, 2};") == 1); // kLayout: zero 2, tensor 2
  CHECK(z2.a->regions.grads.bytes == 512); // two pieces of 64 fp32, each padded to 256 B
  CHECK(dataParallelSentBytes(*z2.a) == 1536);
  REQUIRE(emit(*z3.a, e) == "");
  CHECK(countOf(e, "tally_comm::all_gather_piece<float>(ctx, A<float>(") == 4); // w1, w2: forward, backward
  CHECK(z3.a->regions.params.bytes == 512);
  CHECK(dataParallelSentBytes(*z3.a) == 3072);
  // With a separate fp32 master (mixed bf16) the master is cut as the gradients are: two pieces
  // of 64 fp32 (each padded to 256 B), the bf16 gradients' pieces moved (2 x 64 x 2 B a move).
  Compiled z2m(kDataTensor, "tpz2m", o);
  REQUIRE(emit(*z2m.a, e) == "");
  CHECK(countOf(e, "tally_comm::reduce_scatter_piece<rt::bf16>(ctx, A<rt::bf16>(") == 2);
  CHECK(z2m.a->regions.master.bytes == 512);
  CHECK(z2m.a->regions.grads.bytes == 512);
  CHECK(dataParallelSentBytes(*z2m.a) == 768);
}

namespace {
/// A one-layer GPT with dropout under tensor = 2 and sequence_parallel (tests/step/e2e/dp.tally's
/// tp2sp, smaller).
const char *kSequenceParallel = R"(
block SpMLP(d) {
  fc   = Linear(d, 4 * d)
  proj = Linear(4 * d, d)
  forward(x) { return dropout(proj(gelu(fc(x))), 0.1) }
}
block SpAttention(d, heads) {
  qkv  = Linear(d, 3 * d)
  proj = Linear(d, d)
  forward(x) {
    q, k, v = split(qkv(x), 3, dim = -1)
    return proj(attention(q, k, v, heads = heads, causal = true))
  }
}
block SpBlock(d, heads) {
  ln1 = LayerNorm(d)
  attn = SpAttention(d, heads)
  ln2 = LayerNorm(d)
  mlp = SpMLP(d)
  forward(x) {
    x = x + attn(ln1(x))
    return x + mlp(ln2(x))
  }
}
model SpGPT(vocab = 32, ctx = 8, d = 16, heads = 2) {
  wte = Embedding(vocab, d)
  wpe = Embedding(ctx, d)
  h   = repeat(1) SpBlock(d, heads)
  lnf = LayerNorm(d)
  forward(tokens: i32[batch, seq]) {
    x = h(wte(tokens) + wpe(positions(seq)))
    return cross_entropy(lnf(x) @ transpose(wte.weight), next_tokens(tokens))
  }
}
train sp { model = SpGPT() batch = 4 seq = 8 micro_batch = 2 optimizer = SGD(lr = 0.1) precision = fp32
           target = 2 x H100_SXM { tensor = 2, sequence_parallel = true } }
)";

/// The op paths the step's calls are made at (`op_path = "...";`), in order, one micro-batch.
std::vector<std::string> sitesOf(const std::string &text) {
  std::vector<std::string> out;
  const std::string key = "op_path = \"";
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    size_t from = at + key.size();
    out.push_back(text.substr(from, text.find('"', from) - from));
  }
  return out;
}

/// Whether `want` occurs in `have` as consecutive entries.
bool runOf(const std::vector<std::string> &have, const std::vector<std::string> &want) {
  for (size_t i = 0; i + want.size() <= have.size(); ++i)
    if (std::equal(want.begin(), want.end(), have.begin() + static_cast<long>(i)))
      return true;
  return false;
}
} // namespace

TEST_CASE("codegen: sequence parallel: the gathers and reduce-scatters at the ops Megatron puts them", "[codegen]") {
  PlanOverrides o;
  o.tensorStep = o.generatedStep = true; // as `tally build --backend cpu` analyzes it
  Compiled c(kSequenceParallel, "sp", o);
  StepFiles files = emitStep(*c.a, false);
  REQUIRE(files.error == "");
  const std::string &text = files.byPath["step.cpp"];
  std::vector<std::string> sites = sitesOf(functionText(text, "static double micro_step("));
  const std::string gather = "tensor_parallel.sequence_all_gather", scatter = "tensor_parallel.sequence_reduce_scatter",
                    keep = "tensor_parallel.sequence_scatter";
  // Forward: the embeddings' sum run whole and this rank's half kept; ln1's and ln2's outputs
  // gathered before the column-parallel qkv and fc, lnf's before the whole head; the
  // row-parallel projections' partial sums reduce-scattered.
  CHECK(runOf(sites, {"add", keep, "h[0].ln1.layer_norm", gather, "h[0].attn.qkv.matmul"}));
  CHECK(runOf(sites, {"h[0].attn.proj.matmul", scatter, "h[0].attn.proj.add"}));
  CHECK(runOf(sites, {"h[0].ln2.layer_norm", gather, "h[0].mlp.fc.matmul"}));
  CHECK(runOf(sites, {"h[0].mlp.proj.matmul", scatter, "h[0].mlp.proj.add", "h[0].mlp.dropout"}));
  CHECK(runOf(sites, {"lnf.layer_norm", gather, "matmul"}));
  // Backward: the head's input gradient kept (alike on both ranks), its input gathered again for
  // the weight gradient; a projection's output gradient gathered once for both its matmuls; a
  // column input's gradient reduce-scattered, the input gathered again for the weight gradient;
  // the embeddings' gradient gathered once for both lookups' backward.
  CHECK(runOf(sites, {"matmul.matmul", keep, gather, "matmul.matmul"}));
  CHECK(runOf(sites, {gather, "h[0].attn.proj.matmul.matmul", "h[0].attn.proj.matmul.matmul"}));
  CHECK(runOf(sites, {"h[0].attn.qkv.matmul.matmul", scatter, gather, "h[0].attn.qkv.matmul.matmul"}));
  CHECK(runOf(sites, {"h[0].mlp.fc.matmul.matmul", scatter, gather, "h[0].mlp.fc.matmul.matmul"}));
  CHECK(runOf(sites, {gather, "add.reduce_to", "wpe.embedding.embedding_backward", "wte.embedding.embedding_backward"}));
  // 3 gathers forward, 6 backward; 4 reduce-scatters; no all-reduce inside the micro-batch.
  CHECK(std::count(sites.begin(), sites.end(), gather) == 9);
  CHECK(std::count(sites.begin(), sites.end(), scatter) == 4);
  CHECK(std::count(sites.begin(), sites.end(), keep) == 2);
  CHECK(countOf(functionText(text, "static double micro_step("), "tp_all_reduce") == 0);
  // Dropout on this rank's half of each sequence, keyed by each element's place in the whole.
  CHECK(countOf(text, "tally_comm::tensor_rank()) * 64);") == 1); // 4 tokens x 16
  // Once per step, the gradients of ln1, ln2, lnf (weight and bias) and the two projections'
  // biases summed over the tensor group: 8 all-reduces, as the estimate's one message of 8 x 16.
  CHECK(countOf(functionText(text, "double train_step("), "tally_comm::tp_all_reduce<float>(ctx, G<float>(") == 8);
  // Every gathered, reduce-scattered and all-reduced byte is what the estimate prices.
  double sentPerMicro = (9 + 4) * 2 * 8 * 16 * 4 / 2.0, norms = 8 * 16 * 4;
  CHECK(tensorParallelSentBytes(*c.a) == Approx(2 * sentPerMicro + norms));
}

TEST_CASE("codegen: ZeRO 2 and 3's transients in the estimate are what the step's memory plan holds", "[codegen]") {
  // tests/step/e2e/dp.tally's 2-layer GPT on 2 ranks, as tally's step runs it (tally build/run:
  // Plan::generatedStep). Its memory plan (passes/ZeroShards.cpp) gathers the root (wte, wpe,
  // lnf: 14,592 B in fp32) from the embedding to the head and each block (50,816 B) around its
  // ops; a parameter's gradient of one micro-batch lives across its readers' backward (the tied
  // wte's 12,288 B from the head to the embedding, fc's 16,384 B at its matmul). The analytic
  // rows are the most of each the plan holds at one schedule step, to the byte.
  std::string dp = sourceDir() + "/tests/step/e2e/dp.tally";
  auto most = [](const Analysis &a, const char *what) {
    std::vector<double> live(a.schedule.size() + 1, 0);
    for (const Buffer &b : a.buffers)
      if (std::string(b.what).find(what) != std::string::npos)
        for (uint32_t k = b.first; k <= b.last; ++k)
          live[k] += static_cast<double>(b.bytes);
    return *std::max_element(live.begin(), live.end());
  };
  // The plans' `host` target needs `tally calibrate`; the bytes do not depend on the target.
  auto on = [](int zero, bool generated) {
    PlanOverrides o;
    o.generatedStep = generated;
    o.target = "2 x H100_SXM { data = 2, zero = " + std::to_string(zero) + ", overlap = false }";
    return o;
  };
  for (const char *plan : {"dp2z2", "dp2z3"}) {
    INFO(plan);
    Compiled z(fromFile, dp, plan, on(plan[4] - '0', true));
    const Analysis &a = *z.a;
    REQUIRE(a.planListed);
    bool three = std::string(plan) == "dp2z3";
    CHECK(a.memory.zeroGathered == (three ? 65408.0 : 0.0));
    CHECK(a.memory.zeroGathered == most(a, "gathered parameter"));
    CHECK(a.memory.unshardedGrads == 28672.0); // wte's and fc's
    CHECK(a.memory.unshardedGrads == most(a, "parameter gradient of one micro-batch"));
    // The plan's total (arena and regions) and the analytic peak describe the same step: they
    // differ by the regions' padding (256 B per tensor), the first fit's fragmentation and the
    // rows' maxima summed where the plan meets them at different steps: within 2%.
    double total = static_cast<double>(a.arenaBytes + a.regions.params.bytes + a.regions.grads.bytes +
                                       a.regions.master.bytes + a.regions.optimizer.bytes);
    double allocated = a.memory.peak - unallocatedBytes(a) - a.memory.allocatorReserve;
    CHECK(allocated == Approx(total).epsilon(0.02));
  }
  // ZeRO 0 and 1: the step writes every parameter's gradient into the grads region, so the
  // arena has no buffer for one (wte's 12,288 B among them before issue 39's fix).
  Compiled d(fromFile, dp, "dp2z", on(1, true));
  for (const Buffer &b : d.a->buffers)
    if (b.tensor != kNone && d.a->step->tensors[b.tensor].gradOf != kNone) {
      INFO(d.a->step->tensorName(b.tensor));
      CHECK(d.a->step->tensors[d.a->step->tensors[b.tensor].gradOf].role != TensorRole::Param);
    }
  CHECK(d.a->memory.zeroGathered + d.a->memory.unshardedGrads == 0);
  // Priced as a framework runs it (tally report), the plan has no such rows yet.
  Compiled f(fromFile, dp, "dp2z3", on(3, false));
  CHECK(f.a->memory.zeroGathered + f.a->memory.unshardedGrads == 0);
}

TEST_CASE("codegen: the CUDA step's memory estimate has its workspace and no caching allocator", "[codegen][cuda]") {
  // examples/gpt2.tally's gpt2_124M on one H100: the framework estimate (a PyTorch run) adds the
  // caching allocator's reserve; tally's own CUDA step allocates exactly its regions and arena,
  // plus the context's 64 MiB workspace (cuBLASLt and kernel scratch), and nothing else.
  // The framework's loss written fused, as the step runs it (a framework's default is PyTorch's
  // eager loss, which keeps more: docs/memory.md, "The loss as frameworks run it").
  PlanOverrides framework;
  framework.target = "1 x H100_SXM { cross_entropy = fused }";
  PlanOverrides step;
  step.target = "H100_SXM";
  step.cudaStep = true;
  Compiled f(fromFile, example("gpt2.tally"), "gpt2_124M", framework);
  Compiled c(fromFile, example("gpt2.tally"), "gpt2_124M", step);
  CHECK(f.a->memory.libraryWorkspace == 0);
  CHECK(f.a->memory.allocatorReserve > 0);
  CHECK(c.a->memory.libraryWorkspace == 67108864.0);
  CHECK(c.a->memory.allocatorReserve == 0);
  CHECK(c.a->memory.context == f.a->memory.context);
  CHECK(c.a->memory.context > 0);
  // cuDNN's fused attention runs its bf16 attention (passes/CudnnAttention.h): its workspace line
  // holds the backward's fp32 dQ accumulator and softmax sums, 16·12·1024·64·4 + 16·12·1024·4.
  CHECK(f.a->memory.cudnnWorkspace == 0);
  CHECK(c.a->memory.cudnnWorkspace == 50331648.0 + 786432.0);
  CHECK(c.a->memory.peak == f.a->memory.peak - f.a->memory.allocatorReserve + 67108864.0 + c.a->memory.cudnnWorkspace);
  CHECK(c.a->arenaBytes == f.a->arenaBytes);
}

TEST_CASE("codegen: the CUDA step runs bf16 attention through cuDNN and fp32 on the runtime's kernels", "[codegen][cuda]") {
  // tests/step/e2e/gpt.tally (fp32) and the same model in bf16: the emitter and the estimate read
  // one rule (passes/CudnnAttention.h), and tally build names the engine of every attention call.
  for (const char *precision : {"fp32", "mixed_bf16"}) {
    INFO(precision);
    PlanOverrides o;
    o.target = "H100_SXM";
    o.precision = precision;
    o.cudaStep = true;
    Compiled t(fromFile, sourceDir() + "/tests/step/e2e/gpt.tally", "", o);
    std::vector<std::string> notes;
    std::string cu = cudaStepSource(*t.a, notes);
    size_t attention = 0;
    for (const Op &op : t.a->graph->ops)
      attention += op.kind == OpKind::Attention;
    REQUIRE(attention > 0);
    // The graph's lines first (tests/lit/build-cuda-graph.tally), then the attention engine's.
    notes.erase(std::remove_if(notes.begin(), notes.end(),
                               [](const std::string &n) { return n.rfind("cuda graph: ", 0) == 0; }),
                notes.end());
    REQUIRE(notes.size() == 1);
    bool bf16 = std::string(precision) == "mixed_bf16";
    CHECK(countOf(cu, "rt::attention_fwd_cudnn<rt::bf16>(ctx, ") == (bf16 ? attention : 0));
    CHECK(countOf(cu, "rt::attention_bwd_cudnn<rt::bf16>(ctx, ") == (bf16 ? attention : 0));
    CHECK(countOf(cu, "rt::attention_fwd<") == (bf16 ? 0 : attention));
    CHECK(notes[0].rfind(bf16 ? "attention: cuDNN fused attention (" + std::to_string(2 * attention) + " calls"
                              : "attention: the runtime's kernels: f32 (cuDNN's fused attention takes bf16 and fp16)",
                         0) == 0);
    // The estimate prices the kernel that runs: cuDNN's at the target's native attention
    // efficiency, the runtime's at the fp32 rate it measured.
    for (OpId i = 0; i < t.a->graph->ops.size(); ++i)
      if (t.a->graph->ops[i].kind == OpKind::Attention) {
        KernelWork w = forwardWork(*t.a, i, t.a->ops[i]);
        CHECK(w.nativeAttention == bf16);
        CHECK((w.rate == Dtype::F32) == !bf16);
      }
    CHECK((t.a->memory.cudnnWorkspace > 0) == bf16);
  }
}

TEST_CASE("codegen: data parallel on CUDA: NCCL all-reduces in buckets, one process per GPU", "[codegen][cuda]") {
  // tests/step/e2e/dp.tally's dp2 on 2 GPUs (data = 2, no ZeRO; the unit tests cannot calibrate the
  // host its file names); the CPU step of the same plan runs under MPI.
  PlanOverrides two = asBuilt();
  two.target = "2 x H100_SXM";
  Compiled t(fromFile, sourceDir() + "/tests/step/e2e/dp.tally", "dp2", two);
  REQUIRE(t.a->plan->parallel.data == 2);
  REQUIRE(t.a->plan->parallel.zero == 0);
  StepFiles step = emitStep(*t.a, true);
  REQUIRE(step.error == "");
  std::map<std::string, std::string> &byPath = step.byPath;
  const std::string &cu = byPath["step.cu"], &cm = byPath["CMakeLists.txt"];
  CHECK(byPath.count("runtime/driver/tally_comm_nccl.h") == 1);
  CHECK(byPath.count("runtime/driver/tally_comm.h") == 0);
  CHECK(countOf(cu, "#include \"driver/tally_comm_nccl.h\"") == 1);
  // The gradients averaged in one 25 MiB bucket (29,568 fp32 gradients): divided by 2 and its
  // sum started once the last micro-batch's backward has written it (overlap, the default).
  CHECK(countOf(cu, "    {0, 29568},\n") == 1);
  CHECK(countOf(cu, "  if (last) start_bucket(ctx, 0); // its last gradient is written\n") == 1);
  CHECK(countOf(cu, "tally_comm::all_reduce_start<float>(ctx, G<float>(0), kBuckets[k][0], kBuckets[k][1], k);") == 1);
  CHECK(countOf(cu, "  tally_comm::all_reduce_wait(ctx);") == 1);
  CHECK(countOf(cu, "    {\"data_parallel.reduce_gradients\", \"communication\"},") == 1);
  CHECK(countOf(cu, "  op_class = \"") == 0); // the device step names ops by path, not by the global
  CHECK(countOf(cm, "find_library(TALLY_NCCL_LIBRARY nccl REQUIRED") == 1);
  CHECK(countOf(cm, "target_compile_definitions(tally_step PRIVATE TALLY_NCCL=1)") == 1);
  CHECK(countOf(cm, "TALLY_MPI") == 0);
  // The CPU step of the same plan: MPI, the same calls.
  StepFiles cpuStep = emitStep(*t.a, false);
  REQUIRE(cpuStep.error == "");
  for (const auto &[path, text] : cpuStep.byPath)
    byPath["cpu:" + path] = text;
  CHECK(countOf(byPath["cpu:step.cpp"], "#include \"driver/tally_comm.h\"") == 1);
  CHECK(countOf(byPath["cpu:step.cpp"], "  if (last) start_bucket(ctx, 0); // its last gradient is written\n") == 1);
  CHECK(countOf(byPath["cpu:CMakeLists.txt"], "target_compile_definitions(tally_step PRIVATE TALLY_MPI=1)") == 1);
  CHECK(byPath.count("cpu:runtime/driver/tally_comm_nccl.h") == 0);
}

TEST_CASE("codegen: overlapped data parallel starts each bucket after its last gradient write", "[codegen][cuda]") {
  // GPT-2 124M on 8 GPUs, data parallel without ZeRO, overlap (the default): G holds 124,439,808
  // bf16 gradients padded per tensor (Region::bytes), 25 MiB buckets of 13,107,200 elements.
  PlanOverrides eight = asBuilt();
  eight.target = "8 x H100_SXM";
  Compiled t(fromFile, example("gpt2.tally"), "gpt2_124M", eight);
  REQUIRE(t.a->plan->parallel.data == 8);
  REQUIRE(t.a->plan->parallel.zero == 0);
  REQUIRE(t.a->plan->parallel.overlap);
  std::string cu;
  REQUIRE(emit(*t.a, cu, true) == "");
  int64_t elems = t.a->regions.grads.bytes / 2, bucket = 25 * 1024 * 1024 / 2;
  int64_t buckets = (elems + bucket - 1) / bucket;
  CHECK(buckets == 10);
  std::string micro = cu.substr(cu.find("static void micro_step(rt::Ctx &ctx, uint64_t seed, int64_t m)"));
  micro = micro.substr(0, micro.find("\n}\n") + 1);
  std::string reduce = cu.substr(cu.find("static void reduce_gradients"));
  reduce = reduce.substr(0, reduce.find("\n}\n"));
  size_t lastAt = 0;
  for (int64_t k = 0; k < buckets; ++k) {
    std::string call = "if (last) start_bucket(ctx, " + std::to_string(k) + ");";
    INFO(call);
    CHECK(countOf(micro, call) == 1); // every bucket is written by the backward, started once
    CHECK(countOf(reduce, "start_bucket(ctx, " + std::to_string(k) + ")") == 0);
    lastAt = std::max(lastAt, micro.find(call));
  }
  CHECK(countOf(reduce, "tally_comm::all_reduce_wait(ctx);") == 1);
  // wte (50,257 × 768 = 38,597,376 elements, first in G) spans buckets 0-2; its gradient (the
  // tied head's and the embedding's) is written last, by the embedding backward, the last call
  // of the backward: the three start together at the end.
  size_t zero = micro.find("  if (last) start_bucket(ctx, 0); // its last gradient is written\n"
                           "  if (last) start_bucket(ctx, 1); // its last gradient is written\n"
                           "  if (last) start_bucket(ctx, 2); // its last gradient is written\n");
  REQUIRE(zero != std::string::npos);
  CHECK(micro.find("if (last) start_bucket(ctx, 2);") == lastAt);
  CHECK(micro.rfind("wte.embedding", zero) != std::string::npos);
  CHECK(micro.find("rt::", zero) == std::string::npos); // nothing runs after them
  CHECK(countOf(cu, "  [[maybe_unused]] const bool last = m + 1 == kLayout.microSteps;\n") == 1);
  // The wait for the buckets ends the graph region (passes/CudaGraph.h): NCCL's calls are captured.
  std::string region = cu.substr(cu.find("static void forward_backward("));
  region = region.substr(0, region.find("\n}\n"));
  CHECK(countOf(region, "    micro_step(ctx, seed + static_cast<uint64_t>(m), m);\n") == 1);
  CHECK(countOf(region, "  reduce_gradients(ctx);") == 1);
  // Without overlap: one reduce after the backward, as before.
  eight.target = "8 x H100_SXM";
  Compiled off(fromFile, example("gpt2.tally"), "gpt2_124M", eight);
  Plan p = *off.a->plan;
  p.parallel.overlap = false;
  Analysis b = analyze(*off.c.graph, p, off.c.diags);
  std::string plain;
  REQUIRE(emit(b, plain, true) == "");
  CHECK(countOf(plain, "start_bucket") == 0);
  CHECK(countOf(plain, "tally_comm::all_reduce<rt::bf16>(ctx, G<rt::bf16>(0), ") == buckets);
}

TEST_CASE("codegen: the pipeline step runs the estimate's stages in the timeline's order", "[codegen][pipeline]") {
  // tests/step/e2e/dp.tally's 4-layer GPT (tied head) as tally's step runs it on 2 pipeline
  // ranks (Plan::generatedStep; passes/PipelineStep.cpp): the forward ops on the chunks the
  // estimate prices (chunkOfOps), each rank's units in pipelineOrder, each chunk's slots the
  // micro-batches it holds at once, and the bytes each rank sends.
  std::string dp = sourceDir() + "/tests/step/e2e/dp.tally";
  auto on = [](const std::string &layout, bool generated) {
    PlanOverrides o;
    o.generatedStep = generated;
    o.target = "2 x H100_SXM { " + layout + " }";
    return o;
  };
  const double boundary = 2 * 16 * 32 * 4, wte = 96 * 32 * 4; // [2, 16, 32] fp32; wte's gradient
  struct Case {
    const char *plan, *layout;
    int64_t chunks;
    std::vector<int64_t> slots; // per chunk
    double boundaries;          // per rank and micro-batch
  };
  for (const Case &c : {Case{"pp2", "pipeline = 2", 2, {2, 1}, 1}, Case{"pp2v2", "pipeline = 2, interleave = 2", 4, {4, 3, 2, 1}, 3}}) {
    INFO(c.plan);
    Compiled run(fromFile, dp, c.plan, on(c.layout, true));
    const Analysis &a = *run.a;
    const auto &ps = a.pipelineStep;
    REQUIRE(ps.error.empty());
    REQUIRE(ps.chunks.size() == static_cast<size_t>(c.chunks));
    std::vector<uint32_t> priced = chunkOfOps(*a.graph, *a.copies, c.chunks);
    for (OpId i = 0; i < a.graph->ops.size(); ++i)
      CHECK(ps.chunkOfOp[i] == priced[i]);
    CHECK(ps.chunkOfOp[run.op("wte.embedding")] == 0);
    CHECK(ps.chunkOfOp[a.graph->tensors[a.graph->loss].producer] == c.chunks - 1);
    for (int32_t r = 0; r < 2; ++r) {
      std::vector<PipelineUnit> want = pipelineOrder(r, 2, 4, static_cast<int32_t>(c.chunks / 2));
      REQUIRE(ps.order[static_cast<size_t>(r)].size() == want.size());
      for (size_t k = 0; k < want.size(); ++k)
        CHECK((ps.order[static_cast<size_t>(r)][k].microBatch == want[k].microBatch &&
               ps.order[static_cast<size_t>(r)][k].chunk == want[k].chunk &&
               ps.order[static_cast<size_t>(r)][k].backward == want[k].backward));
      CHECK(pipelineSentBytes(a, r) == 4 * c.boundaries * boundary + wte);
      const auto &rank = ps.ranks[static_cast<size_t>(r)];
      REQUIRE(rank.shared.size() == 1);
      CHECK(a.graph->tensorName(rank.shared[0]) == "wte.weight");
      int64_t arena = 0;
      for (int64_t k = r; k < c.chunks; k += 2)
        arena += ps.chunks[static_cast<size_t>(k)].slots * ps.chunks[static_cast<size_t>(k)].slotBytes;
      CHECK(rank.arenaBytes == arena);
    }
    for (int64_t k = 0; k < c.chunks; ++k)
      CHECK(ps.chunks[static_cast<size_t>(k)].slots == c.slots[static_cast<size_t>(k)]);
    // The timeline's idle time per device; the busiest device's is the bubble.
    REQUIRE(a.pipeline.idle.size() == 2);
    CHECK(std::min(a.pipeline.idle[0], a.pipeline.idle[1]) == Approx(a.pipeline.bubble).epsilon(1e-9));
    // The framework's estimate neither plans the step nor prices the tied gradient's exchange.
    Compiled framework(fromFile, dp, c.plan, on(c.layout, false));
    CHECK(framework.a->pipelineStep.chunks.empty());
    CHECK(a.time.pipelineComm > framework.a->time.pipelineComm);
  }
}

TEST_CASE("codegen: the pipeline step's fused kernels stay in one stage, placed as the stage places them",
          "[codegen][pipeline]") {
  // dp.tally's pp2 with --fuse: the residual add that ends a block is fused with the next
  // block's norm (forward), except at the stage boundary, where the add runs on stage 0 and the
  // norm on stage 1; every run's entries are of one stage and one kind.
  PlanOverrides o;
  o.fuseKernels = true;
  o.target = "2 x H100_SXM { pipeline = 2 }";
  Compiled run(fromFile, sourceDir() + "/tests/step/e2e/dp.tally", "pp2", asBuilt(o));
  const Analysis &a = *run.a;
  const auto &ps = a.pipelineStep;
  REQUIRE(ps.error.empty());
  REQUIRE(a.fusion.enabled);
  REQUIRE(!a.fusion.kernels.empty());
  auto entryOf = [&](OpId forward) {
    for (uint32_t e = 0; e < a.stepSchedule.size(); ++e)
      if (a.stepSchedule[e].op == forward && a.stepSchedule[e].kind == StepEntry::Forward)
        return e;
    FAIL("no forward entry");
    return uint32_t(0);
  };
  auto kernelAt = [&](uint32_t e) -> const Analysis::FusedKernel * {
    for (const Analysis::FusedKernel &k : a.fusion.kernels)
      if (k.first <= e && e < k.first + k.count)
        return &k;
    return nullptr;
  };
  for (const Analysis::FusedKernel &k : a.fusion.kernels)
    for (uint32_t e = k.first; e < k.first + k.count; ++e) {
      CHECK(ps.chunkOfOp[a.stepSchedule[e].op] == ps.chunkOfOp[a.stepSchedule[k.first].op]);
      CHECK(a.stepSchedule[e].kind == a.stepSchedule[k.first].kind);
    }
  // Inside stage 0: h[0]'s last add ends in h[1]'s first norm. At the boundary: h[1]'s add is
  // in no run with h[2]'s norm.
  const Analysis::FusedKernel *inside = kernelAt(entryOf(run.op("h[0].add#2")));
  REQUIRE(inside != nullptr);
  CHECK(inside == kernelAt(entryOf(run.op("h[1].ln1.layer_norm"))));
  CHECK(inside->norm);
  const Analysis::FusedKernel *boundary = kernelAt(entryOf(run.op("h[1].add#2")));
  CHECK((boundary == nullptr || boundary != kernelAt(entryOf(run.op("h[2].ln1.layer_norm")))));
  CHECK(ps.chunkOfOp[run.op("h[1].add#2")] == 0);
  CHECK(ps.chunkOfOp[run.op("h[2].ln1.layer_norm")] == 1);
}

TEST_CASE("codegen: data x pipeline prices each stage's data group apart (issue 39 item 4)", "[codegen][pipeline]") {
  // dp.tally's dp2pp2 on 4 ranks (pipeline = 2, data = 2 derived): each pipeline runs 2 of the 4
  // micro-batches; each stage's data group all-reduces that stage's grads region, which a ring
  // of 2 sends whole, so rank r of stage s sends its stage's region to its data group, priced
  // under that stage (CollectiveUse::stage), and the step time waits for the larger region.
  std::string dp = sourceDir() + "/tests/step/e2e/dp.tally";
  PlanOverrides o;
  o.generatedStep = true;
  o.target = "4 x H100_SXM { pipeline = 2 }";
  Compiled run(fromFile, dp, "dp2pp2", o);
  const Analysis &a = *run.a;
  const auto &ps = a.pipelineStep;
  REQUIRE(ps.error.empty());
  REQUIRE(ps.ranks.size() == 2);
  CHECK(ps.microBatches == 2);
  const double boundary = 2 * 16 * 32 * 4, wte = 96 * 32 * 4;
  for (int64_t r = 0; r < 2; ++r) {
    CHECK(dataParallelSentBytes(a, r) == static_cast<double>(ps.ranks[static_cast<size_t>(r)].grads.bytes));
    CHECK(pipelineSentBytes(a, r) == 2 * boundary + wte);
  }
  CHECK(ps.ranks[0].grads.bytes != ps.ranks[1].grads.bytes);
  int staged = 0;
  for (const Analysis::CollectiveUse &u : a.collectives)
    if (u.group == 'd') {
      CHECK((u.stage == 0 || u.stage == 1));
      CHECK_FALSE(u.overlapped);
      ++staged;
    }
  CHECK(staged >= 2);
  // The order puts the data ranks inside: the stage is then rank / 2 (rankCoordinate).
  o.target = "4 x H100_SXM { pipeline = 2, order = dpt }";
  Compiled swapped(fromFile, dp, "dp2pp2", o);
  CHECK(rankCoordinate(*swapped.a->plan, 1, 'p') == 0);
  CHECK(rankCoordinate(*swapped.a->plan, 2, 'p') == 1);
  // ZeRO-1: each stage's optimizer state is its data rank's half of the stage's grads region (one
  // SGD state, padded to 256 bytes); its region is reduce-scattered and gathered back, the same
  // bytes to the data group as the all-reduce.
  o.target = "4 x H100_SXM { pipeline = 2, zero = 1 }";
  Compiled zero(fromFile, dp, "dp2pp2", o);
  const auto &zs = zero.a->pipelineStep;
  REQUIRE(zs.error.empty());
  for (int64_t r = 0; r < 2; ++r) {
    const auto &rank = zs.ranks[static_cast<size_t>(r)];
    CHECK(rank.shard == rank.grads.bytes / 4 / 2);
    CHECK(rank.optimizer.bytes == (rank.shard * 4 + 255) / 256 * 256);
    CHECK(dataParallelSentBytes(*zero.a, r) == static_cast<double>(rank.grads.bytes));
  }
  // ZeRO 2: the stage's regions hold each tensor's half (dp.tally's tensors have even sizes), and
  // the moves are split by chunk: each gradient reduced within the chunk that completes it, the
  // tied wte's by both stages (one more move than the one-device plan's). Each rank's data group
  // gets every micro-batch's reduce-scatter and one gather after the update: (m + 1) halves of
  // its stage's tensors; the tied gradient's sum between the stages moves the half.
  o.target = "4 x H100_SXM { pipeline = 2, zero = 2 }";
  Compiled zero2(fromFile, dp, "dp2pp2", o);
  const Analysis &z = *zero2.a;
  const auto &z2 = z.pipelineStep;
  REQUIRE(z2.error.empty());
  REQUIRE(z2.ranks.size() == 2);
  CHECK(z2.zero.reduces.size() == z.zero.reduces.size() + 1);
  int wteMoves = 0;
  for (const auto &r : z2.zero.reduces) {
    CHECK(z2.chunkOfOp[z.stepSchedule[r.first].op] == z2.chunkOfOp[z.stepSchedule[r.last].op]);
    wteMoves += z.step->tensorName(r.param) == "wte.weight";
  }
  CHECK(wteMoves == 2);
  for (int64_t r = 0; r < 2; ++r) {
    const auto &rank = z2.ranks[static_cast<size_t>(r)];
    double half = 0;
    for (const Region::Entry &e : rank.params.tensors)
      half += static_cast<double>(e.bytes) / 2;
    CHECK(rank.shard == 0);
    CHECK(rank.grads.bytes == rank.optimizer.bytes);
    CHECK(rank.grads.bytes < rank.params.bytes);
    CHECK(dataParallelSentBytes(z, r) == 3 * half);
    CHECK(pipelineSentBytes(z, r) == 2 * boundary + wte / 2);
  }
  // Data x tensor x pipeline with sequence parallelism: each stage's norms' gradients are
  // all-reduced over its tensor group once per step, under ZeRO 2 in the data rank's pieces
  // (sequenceGradientElements): half the elements of ZeRO-1's (dp.tally's norms are even).
  o.tensorStep = true; // as `tally build --backend cpu` analyzes it
  auto norms = [&](const char *target) {
    o.target = target;
    Compiled c(fromFile, dp, "dp2pp2", o);
    INFO(c.a->pipelineStep.error);
    REQUIRE(c.a->pipelineStep.error.empty());
    std::vector<double> bytes(2, 0);
    for (const Analysis::CollectiveUse &u : c.a->collectives)
      if (llvm::StringRef(u.what).startswith("sequence parallel all-reduce of the norms' gradients"))
        bytes[static_cast<size_t>(u.stage)] += u.perStep * u.cost.bytes;
    return bytes;
  };
  std::vector<double> whole = norms("8 x H100_SXM { tensor = 2, pipeline = 2, sequence_parallel = true, zero = 1 }");
  std::vector<double> pieces = norms("8 x H100_SXM { tensor = 2, pipeline = 2, sequence_parallel = true, zero = 2 }");
  for (size_t r = 0; r < 2; ++r) {
    CHECK(whole[r] > 0);
    CHECK(pieces[r] * 2 == whole[r]);
  }
}

TEST_CASE("codegen: data x tensor x pipeline composes the two pricings per rank (issue 39 item 4)",
          "[codegen][pipeline]") {
  // dp.tally's dp2tp2pp2 on 8 ranks (tensor = 2, pipeline = 2, data = 2 derived): each data rank
  // runs tp2pp2's stages on 2 of the 4 micro-batches, so its tensor and pipeline bytes are half
  // of tp2pp2's boundaries and all-reduces plus the whole tied gradient; each (stage, tensor
  // rank)'s data group all-reduces that rank's region (its stage's tensor cut, the same regions
  // as tp2pp2's), which a ring of 2 sends whole, priced under its stage. Under ZeRO-1 the
  // optimizer state is the data rank's half of that region, and the data group gets the same
  // bytes (half reduce-scattered, half gathered back).
  std::string dp = sourceDir() + "/tests/step/e2e/dp.tally";
  PlanOverrides o;
  o.generatedStep = o.tensorStep = true;
  o.target = "4 x H100_SXM { tensor = 2, pipeline = 2 }";
  Compiled tp(fromFile, dp, "tp2pp2", o);
  o.target = "8 x H100_SXM { tensor = 2, pipeline = 2 }";
  Compiled run(fromFile, dp, "dp2tp2pp2", o);
  const Analysis &a = *run.a;
  const auto &ps = a.pipelineStep;
  REQUIRE(a.tensorStepError.empty());
  REQUIRE(ps.error.empty());
  REQUIRE(ps.ranks.size() == 2);
  CHECK(ps.microBatches == 2);
  const double boundary = 2 * 16 * 32 * 4, wte = 96 * 32 * 4;
  for (int64_t r = 0; r < 2; ++r) {
    INFO("stage " << r);
    const auto &rank = ps.ranks[static_cast<size_t>(r)], &alone = tp.a->pipelineStep.ranks[static_cast<size_t>(r)];
    CHECK(rank.params.bytes == alone.params.bytes);
    CHECK(rank.grads.bytes == alone.grads.bytes);
    CHECK(rank.arenaBytes == alone.arenaBytes);
    CHECK(pipelineSentBytes(a, r) == 2 * boundary / 2 + wte);
    CHECK(tensorParallelSentBytes(a, r) == 2 * (2 * 4 * boundary + boundary / 2));
    CHECK(dataParallelSentBytes(a, r) == static_cast<double>(rank.grads.bytes));
  }
  // The rank grid is the plan's order (tensor innermost, then the stages, then the data ranks).
  CHECK(rankCoordinate(*a.plan, 5, 't') == 1);
  CHECK(rankCoordinate(*a.plan, 5, 'p') == 0);
  CHECK(rankCoordinate(*a.plan, 5, 'd') == 1);
  o.target = "8 x H100_SXM { tensor = 2, pipeline = 2, zero = 1 }";
  Compiled zero(fromFile, dp, "dp2tp2pp2z", o);
  const auto &zs = zero.a->pipelineStep;
  REQUIRE(zs.error.empty());
  for (int64_t r = 0; r < 2; ++r) {
    const auto &rank = zs.ranks[static_cast<size_t>(r)];
    CHECK(rank.shard == rank.grads.bytes / 4 / 2);
    CHECK(rank.optimizer.bytes == (rank.shard * 4 + 255) / 256 * 256);
    CHECK(dataParallelSentBytes(*zero.a, r) == static_cast<double>(rank.grads.bytes));
  }
}

TEST_CASE("codegen: tensor x pipeline prices each stage's tensor group and half boundaries (issue 39 item 4)",
          "[codegen][pipeline]") {
  // dp.tally's tp2pp2 on 4 ranks (tensor = 2, pipeline = 2): each stage's regions are its tensor
  // cuts, each rank sends half of each boundary to its pipeline peer (Megatron's scatter/gather)
  // and all-gathers the halves of what it receives over its tensor group; its stage's all-reduces
  // (2 blocks x 2 forward and 2 backward, a ring of 2 sending each [2, 16, 32] message once) and
  // those all-gathers are recorded under its stage.
  std::string dp = sourceDir() + "/tests/step/e2e/dp.tally";
  PlanOverrides o;
  o.generatedStep = o.tensorStep = true;
  o.target = "4 x H100_SXM { tensor = 2, pipeline = 2 }";
  Compiled run(fromFile, dp, "tp2pp2", o);
  const Analysis &a = *run.a;
  const auto &ps = a.pipelineStep;
  REQUIRE(a.tensorStepError.empty());
  REQUIRE(ps.error.empty());
  REQUIRE(ps.ranks.size() == 2);
  CHECK(ps.microBatches == 4);
  const double boundary = 2 * 16 * 32 * 4, wte = 96 * 32 * 4;
  for (int64_t r = 0; r < 2; ++r) {
    INFO("stage " << r);
    CHECK(pipelineSentBytes(a, r) == 4 * boundary / 2 + wte);
    CHECK(tensorParallelSentBytes(a, r) == 4 * (2 * 4 * boundary + boundary / 2));
    CHECK(dataParallelSentBytes(a, r) == 0);
    // The regions hold the stage's cuts: the whole-model step's halves of qkv, fc and the projections.
    Compiled pp(fromFile, dp, "pp2", [] {
      PlanOverrides q;
      q.generatedStep = true;
      q.target = "2 x H100_SXM { pipeline = 2 }";
      return q;
    }());
    CHECK(ps.ranks[static_cast<size_t>(r)].params.bytes < pp.a->pipelineStep.ranks[static_cast<size_t>(r)].params.bytes);
  }
  int staged = 0;
  for (const Analysis::CollectiveUse &u : a.collectives)
    if (u.group == 't') {
      CHECK((u.stage == 0 || u.stage == 1));
      ++staged;
    }
  CHECK(staged >= 6); // per stage: forward and backward all-reduces, the boundary's all-gather
  // Interleaved runs (e2e tp2pp2v2). With sequence parallelism (e2e tp2pp2sp) a stage gathers
  // nothing at its boundary, and records its own reduce-scatters, gathers and norms' all-reduce.
  o.target = "4 x H100_SXM { tensor = 2, pipeline = 2, interleave = 2 }";
  Compiled v2(fromFile, dp, "tp2pp2", o);
  CHECK(v2.a->pipelineStep.error.empty());
  o.target = "4 x H100_SXM { tensor = 2, pipeline = 2, sequence_parallel = true }";
  Compiled sp(fromFile, dp, "tp2pp2", o);
  REQUIRE(sp.a->pipelineStep.error.empty());
  std::set<std::string> kinds;
  for (const Analysis::CollectiveUse &u : sp.a->collectives)
    if (u.group == 't') {
      CHECK((u.stage == 0 || u.stage == 1));
      kinds.insert(u.what);
    }
  CHECK(kinds.count("all-gather of a received pipeline boundary (Megatron's scatter/gather)") == 0);
  CHECK(kinds.count("sequence parallel reduce-scatter of a row output (a pipeline stage's)") == 1);
  CHECK(kinds.count("sequence parallel all-gather of a column input (a pipeline stage's)") == 1);
  CHECK(kinds.count("sequence parallel all-reduce of the norms' gradients (a pipeline stage's)") == 1);
  CHECK(kinds.count("sequence parallel recompute reduce-scatter (a pipeline stage's)") == 0);
  // With recompute (e2e tp2pp2sp runs it under sequence parallelism): each stage's backward
  // re-runs its 2 blocks' forward, and so their 4 row outputs' all-reduces, per micro-batch: 4
  // micro-batches × 4 × [2, 16, 32] fp32 more bytes to its tensor group than without.
  o.target = "4 x H100_SXM { tensor = 2, pipeline = 2 }";
  o.checkpoint = "full";
  Compiled ck(fromFile, dp, "tp2pp2", o);
  REQUIRE(ck.a->pipelineStep.error.empty());
  int again = 0;
  for (const Analysis::CollectiveUse &u : ck.a->collectives)
    if (u.group == 't' && u.what == "recompute all-reduce (a pipeline stage's)") {
      CHECK((u.stage == 0 || u.stage == 1));
      ++again;
    }
  CHECK(again == 2); // one record per stage
  for (int64_t r = 0; r < 2; ++r)
    CHECK(tensorParallelSentBytes(*ck.a, r) == tensorParallelSentBytes(a, r) + 4 * 4 * boundary);
}

TEST_CASE("codegen: the padded LM head: the step pads, the counts and files do not (issue 38 item 4)", "[codegen][cuda]") {
  // tests/step/e2e/gpt.tally's tied head, vocabulary 100: padded to 128 rows under the CUDA step
  // (passes/HeadPadding.h); check_e2e.py runs the CPU step both ways.
  PlanOverrides o;
  o.cudaStep = o.fuseKernels = o.padHead = true;
  PlanOverrides off = o;
  off.padHead = false;
  Compiled t(fromFile, sourceDir() + "/tests/step/e2e/gpt.tally", "", o);
  Compiled u(fromFile, sourceDir() + "/tests/step/e2e/gpt.tally", "", off);
  const HeadPadding &hp = t.a->headPad;
  REQUIRE(hp.applies());
  CHECK(!u.a->headPad.applies());
  CHECK(hp.vocab == 100);
  CHECK(hp.padded == 128);
  CHECK(t.g().tensorName(hp.weight) == "wte.weight");
  // The step holds [128, 64]; the forward graph and the parameter count the real [100, 64].
  CHECK(t.a->step->tensors[hp.weight].shape[0].size == 128);
  CHECK(t.a->step->tensors[hp.logits].shape.back().size == 128);
  CHECK(t.g().tensors[hp.weight].shape[0].size == 100);
  CHECK(t.a->params.total == u.a->params.total);
  // The regions and the estimate's model states hold the 28 padded rows of fp32 in params, grads
  // and AdamW's two states (fp32 keeps no master).
  const double rows = 28 * 64 * 4;
  CHECK(t.a->regions.params.bytes - u.a->regions.params.bytes == rows);
  CHECK(t.a->regions.grads.bytes - u.a->regions.grads.bytes == rows);
  CHECK(t.a->regions.optimizer.bytes - u.a->regions.optimizer.bytes == 2 * rows);
  CHECK(t.a->memory.params - u.a->memory.params == Approx(rows));
  CHECK(t.a->memory.grads - u.a->memory.grads == Approx(rows));
  CHECK(t.a->memory.optimizer - u.a->memory.optimizer == Approx(2 * rows));
  CHECK(t.a->arenaBytes > u.a->arenaBytes); // the logits and their gradient are 128 wide
  // The head's work is priced over 128 columns.
  KernelWork wp = forwardWork(*t.a, hp.matmul, t.a->ops[hp.matmul]);
  KernelWork wu = forwardWork(*u.a, hp.matmul, u.a->ops[hp.matmul]);
  CHECK(wp.flops == Approx(wu.flops * 128 / 100));
  // The backward runs the padded step's products; the model FLOPs (MFU) count the real 100.
  CHECK(t.a->ops[hp.matmul].executedBackwardFlops == Approx(u.a->ops[hp.matmul].executedBackwardFlops * 128 / 100));
  CHECK(t.a->flops.step == Approx(u.a->flops.step).epsilon(1e-12));
  // The emitted step: the loss masks columns 100..127; files and the update see 100 × 64.
  std::vector<std::string> notes;
  std::string cu = cudaStepSource(*t.a, notes);
  CHECK(countOf(cu, "{\"wte.weight\", \"F32\", 2, {100, 64}, 6400}") == 1);
  CHECK(countOf(cu, "    {6400, ") == 1);
  CHECK(countOf(cu, ", 32, 100, 128);") == 1);        // cross_entropy_fwd
  CHECK(countOf(cu, ", 32, 100, false, 128);") == 1); // cross_entropy_bwd
  CHECK(std::count(notes.begin(), notes.end(),
                   "lm head: wte.weight padded 100 -> 128 rows in the step's regions (zero, never updated; the "
                   "loss masks logit columns 100..127; files and parameter counts keep [100, 64])") == 1);
}

TEST_CASE("codegen: the padded LM head's rule refuses what it cannot pad in place", "[codegen]") {
  PlanOverrides o;
  o.cudaStep = o.padHead = true;
  const std::string tied = R"(
model M(d = 64, vocab = 100) {
  wte = Embedding(vocab, d)
  forward(tokens: i32[batch, seq]) { return cross_entropy(wte(tokens) @ transpose(wte.weight), next_tokens(tokens)) }
}
train t { model = M() batch = 2 seq = 16 optimizer = SGD(lr = 0.1) target = ZEROLINE }
)";
  auto with = [&](const std::string &zero) {
    std::string s = tied;
    s.replace(s.find("ZEROLINE"), 8, zero);
    return s;
  };
  Compiled plain(with("H100_SXM"), "", o);
  CHECK(plain.a->headPad.applies());
  Compiled zero1(with("2 x H100_SXM { data = 2, zero = 1 }"), "", o);
  CHECK(zero1.a->headPad.applies());
  Compiled zero(with("2 x H100_SXM { data = 2, zero = 2 }"), "", o);
  CHECK(!zero.a->headPad.applies());
  CHECK(zero.a->headPad.refused == "ZeRO 2 cuts each parameter into pieces by its real element count");
  // A vocabulary that is a multiple of 64 needs nothing: no padding, no refusal.
  std::string aligned = with("H100_SXM");
  aligned.replace(aligned.find("vocab = 100"), 11, "vocab = 128");
  Compiled even(aligned, "", o);
  CHECK(!even.a->headPad.applies());
  CHECK(even.a->headPad.refused.empty());
  // The weight read by another op (a scale of the table) would see the padded rows.
  std::string other = with("H100_SXM");
  other.replace(other.find("wte(tokens) @"), 13, "(wte(tokens) + mean(wte.weight)) @");
  Compiled read(other, "", o);
  CHECK(!read.a->headPad.applies());
  CHECK(read.a->headPad.refused.find("is also read by") != std::string::npos);
}

TEST_CASE("codegen: the CPU step's kernels are instantiated in kernel files, declared to step.cpp", "[codegen]") {
  // Mixed bf16 data parallel: bf16 kernels, the AdamW update of bf16 gradients into the fp32
  // master, the bf16 -> fp32 copies.
  PlanOverrides two = asBuilt(); // the file's target is the calibrated host, which unit tests cannot load
  two.target = "2 x H100_SXM";
  Compiled t(fromFile, sourceDir() + "/tests/step/e2e/dp.tally", "dp2_bf16", two);
  StepFiles step = emitStep(*t.a, false);
  REQUIRE(step.error == "");
  const std::string &src = step.byPath["step.cpp"], &h = step.byPath["kernels.h"];
  CHECK(src.find("#include \"kernels.h\"\n") != std::string::npos);
  // The kernel files: the transformer's kernels (core) and the others (rest), each listed in the
  // CMakeLists.txt.
  std::map<std::string, std::string> kernelFiles;
  std::string all;
  for (const auto &[path, text] : step.byPath)
    if (llvm::StringRef(path).startswith("kernels_")) {
      kernelFiles[path] = text;
      all += text;
    }
  CHECK(kernelFiles.size() == 2);
  // Each includes the runtime, not kernels.h, which declares the other file's kernels too: a
  // compiler cache keys an object by every file it includes.
  for (const auto &f : kernelFiles) {
    CHECK(f.second.find("#include \"cpu/tally_rt.h\"\n") != std::string::npos);
    CHECK(f.second.find("kernels.h\"") == std::string::npos);
  }
  CHECK(kernelFiles.count("kernels_core.cpp"));
  CHECK(kernelFiles.count("kernels_rest.cpp"));
  CHECK(step.byPath.count("kernels.cpp") == 0);
  std::string listed = "add_executable(tally_step step.cpp";
  for (const auto &f : kernelFiles)
    listed += " " + f.first;
  CHECK(step.byPath["CMakeLists.txt"].find(listed + " runtime/driver/driver_cpu.cpp)") != std::string::npos);
  // Every kernel step.cpp calls with storage-type arguments is declared once and instantiated
  // once, in one of the files, and nothing else.
  std::set<std::string> called;
  for (const std::string &c : runtimeCalls(src)) {
    std::string head = c.substr(0, c.find('('));
    if (head.find('<') != std::string::npos)
      called.insert(head);
  }
  REQUIRE(called.count("rt::matmul<rt::bf16>"));
  REQUIRE(called.count("rt::adam_update<rt::bf16>"));
  for (const std::string &c : called) {
    CHECK(countOf(h, "extern template decltype(" + c + ") " + c + ";\n") == 1);
    CHECK(countOf(all, "\ntemplate decltype(" + c + ") " + c + ";\n") == 1);
  }
  CHECK(countOf(h, "extern template") == called.size());
  CHECK(countOf(all, "\ntemplate decltype") == called.size());
  CHECK(countOf(kernelFiles["kernels_core.cpp"], "\ntemplate decltype(rt::matmul<rt::bf16>)") == 1);
  CHECK(countOf(kernelFiles["kernels_rest.cpp"], "\ntemplate decltype(rt::adam_update<rt::bf16>)") == 1);
  // The files depend only on the kernels: another layout of the same model and precision
  // (ZeRO-1) gives the same files, which a compiler cache then finds; and the core file
  // depends only on its own kernels: dp1 (one process) scales no gradient where dp2 averages
  // its ranks' (rt::scale), but the two and a pipeline plan share their core file.
  Compiled z(fromFile, sourceDir() + "/tests/step/e2e/dp.tally", "dp2z_bf16", two);
  StepFiles zs = emitStep(*z.a, false);
  for (const auto &[path, text] : kernelFiles)
    CHECK(zs.byPath[path] == text);
  PlanOverrides one = asBuilt();
  one.target = "H100_SXM";
  Compiled d1(fromFile, sourceDir() + "/tests/step/e2e/dp.tally", "dp1", one);
  Compiled d2(fromFile, sourceDir() + "/tests/step/e2e/dp.tally", "dp2", two);
  Compiled p2(fromFile, sourceDir() + "/tests/step/e2e/dp.tally", "pp2", two);
  StepFiles s1 = emitStep(*d1.a, false), s2 = emitStep(*d2.a, false), sp = emitStep(*p2.a, false);
  REQUIRE(sp.error == "");
  CHECK(s1.byPath["kernels_rest.cpp"].find("rt::scale<float>") == std::string::npos);
  CHECK(s2.byPath["kernels_rest.cpp"].find("rt::scale<float>") != std::string::npos);
  CHECK(s1.byPath["kernels_core.cpp"].find("rt::attention_bwd<float>") != std::string::npos);
  CHECK(s1.byPath["kernels_core.cpp"] == s2.byPath["kernels_core.cpp"]);
  CHECK(s1.byPath["kernels_core.cpp"] == sp.byPath["kernels_core.cpp"]);
  // A fused functor is step.cpp's own type: its templates are not named in the kernel files; the
  // CUDA step has no kernel files.
  PlanOverrides fuse = asBuilt();
  fuse.target = "H100_SXM";
  fuse.fuseKernels = true;
  Compiled g(fromFile, sourceDir() + "/tests/step/e2e/gpt.tally", "", fuse);
  StepFiles fused = emitStep(*g.a, false);
  REQUIRE(fused.error == "");
  CHECK(fused.byPath["step.cpp"].find("_fused<float>(ctx, Fused") != std::string::npos);
  for (const auto &[path, text] : fused.byPath)
    if (llvm::StringRef(path).startswith("kernels"))
      CHECK(text.find("Fused") == std::string::npos);
  StepFiles cuda = emitStep(*g.a, true);
  for (const auto &[path, text] : cuda.byPath)
    CHECK(!llvm::StringRef(path).startswith("kernels"));
}

TEST_CASE("codegen: tensor and pipeline parallel on CUDA over NCCL (issue 39 item 7)", "[codegen][cuda]") {
  // dp.tally's tp2 and pp2 as `tally build --backend cuda --fuse=false` emits them: the CPU step's
  // collectives and sends at the same ops, through tally_comm_nccl.h's functions of the same names.
  const std::string dp = sourceDir() + "/tests/step/e2e/dp.tally";
  auto plan = [&](const char *name, bool cuda) {
    PlanOverrides o;
    o.cudaStep = o.padHead = cuda;
    o.tensorStep = o.generatedStep = true;
    o.target = std::string("2 x H100_SXM { ") + (name[0] == 't' ? "tensor" : "pipeline") + " = 2 }";
    return Compiled(fromFile, dp, name, o);
  };
  auto marks = [](const std::string &text, const std::string &prefix) { // the lines that start with it
    std::vector<std::string> out;
    for (const std::string &l : lines(text))
      if (l.rfind(prefix, 0) == 0)
        out.push_back(l);
    return out;
  };
  Compiled tp = plan("tp2", true), tpCpu = plan("tp2", false);
  StepFiles t = emitStep(*tp.a, true), c = emitStep(*tpCpu.a, false);
  REQUIRE((t.error == "" && c.error == ""));
  const std::string &cu = t.byPath["step.cu"];
  // 2 row-parallel projections forward and 2 column-parallel inputs' gradients backward per layer.
  CHECK(countOf(cu, "tally_comm::tp_all_reduce<float>(ctx, A<float>(") == 8);
  CHECK(countOf(cu, "  // tensor parallel: the row-parallel partial sums of h[1].mlp.proj.matmul summed") == 1);
  CHECK(marks(cu, "  // tensor parallel: ") == marks(c.byPath["step.cpp"], "  // tensor parallel: "));
  CHECK(countOf(t.byPath["CMakeLists.txt"], "TALLY_NCCL=1") == 1);
  // The groups split by the CPU's rule (color data rank, key tensor rank; and the reverse).
  const std::string &nccl = t.byPath["runtime/driver/tally_comm_nccl.h"];
  CHECK(countOf(nccl, "ncclCommSplit(detail::comm(), dr, tr, &tc, nullptr)") == 1);
  CHECK(countOf(nccl, "ncclCommSplit(detail::comm(), tr, dr, &dc, nullptr)") == 1);
  CHECK(countOf(c.byPath["runtime/driver/tally_comm.h"], "split(dr * p + pr, tr, t, kTensor,") == 1);
  Compiled pp = plan("pp2", true);
  StepFiles p = emitStep(*pp.a, true);
  REQUIRE(p.error == "");
  const std::string &pcu = p.byPath["step.cu"];
  // Stage 0 sends the boundary activation ([2, 16, 32]) and receives its gradient; stage 1 the
  // reverse; both sum the tied head's gradient (128 padded rows of 32) and read the losses back.
  CHECK(countOf(pcu, ", 1024, 1, 8 + static_cast<int>(mb), key);") == 1);
  CHECK(countOf(pcu, ", 1024, 0, 8 + static_cast<int>(mb));") == 1);
  CHECK(countOf(pcu, ", 1024, 0, 12 + static_cast<int>(mb), key);") == 1);
  CHECK(countOf(pcu, "tally_comm::pp_sum_with<float>(ctx, G<float>(0), 4096, ") == 2);
  CHECK(countOf(pcu, "  loss = read_losses<float>(ctx); // the last stage's losses (0 elsewhere)") == 2);
  CHECK(countOf(pcu, "const GraphPlan kGraph = {false, \"pipeline = 2: ") == 1); // not captured
}
