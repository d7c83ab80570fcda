// Attention through cuDNN 9's fused scaled-dot-product attention (issue 38): the graph API's
// backend descriptors (no cudnn_frontend: it is not installed), built once per shape, cached in
// the context, and executed on the context's stream. The generated CUDA step calls
// rt::attention_fwd_cudnn / rt::attention_bwd_cudnn, with attention_fwd/_bwd's arguments, for the
// attention ops passes/CudnnAttention.h gives to cuDNN (bf16/fp16, no dropout, window, soft cap
// or materialised scores, head size a multiple of 8 up to 128, rows on 16 bytes, causal only
// over S = Skv); the others run the runtime's own kernels (attention.cuh).
//
// The graphs are the flash-attention patterns cuDNN's fused engines recognise:
//   forward   S = Q·Kᵀ (fp32) · scale → [causal: row ≥ col, else −inf] → softmax with its
//             statistics (max, exp, sum; Stats = max + log sum, tally's lse) → O = P·V
//   backward  D = rowsum(dO∘O); P = exp(scale·Q·Kᵀ [masked] − Stats); dV = Pᵀ·dO;
//             dS = P∘(dO·Vᵀ − D)·scale; dK = dSᵀ·Q; dQ = dS·K (fp32 accumulator, then rounded)
// Grouped-query attention: K, V, dK and dV have Hkv heads; the backward sums the H/Hkv query
// heads' dK and dV with a reduction. D and the dQ accumulator live in the context's cuDNN
// workspace beside the plan's own (passes/CudnnAttention.h prices the two; the driver reports
// the bytes allocated). NOT RUN: no machine here has a GPU; tests/step/cuda_check compares it
// with the CPU runtime on one (cases "... [cudnn]").
#pragma once

#include <cudnn.h>

#include <array>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "ctx.cuh"

namespace rt {
namespace cu {

/// Throws Error when a cuDNN call fails, naming the call, the kernel and the op path.
inline void checkDnn(cudnnStatus_t s, const char* what, const char* kernel, const char* where) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  throw Error(std::string("tally cuda runtime: ") + what + " failed in " + kernel + " at '" + (where ? where : "") +
              "': " + cudnnGetErrorString(s));
}

/// One backend descriptor, destroyed with its owner.
struct DnnDesc {
  cudnnBackendDescriptor_t d = nullptr;
  DnnDesc() = default;
  explicit DnnDesc(cudnnBackendDescriptorType_t t) {
    checkDnn(cudnnBackendCreateDescriptor(t, &d), "cudnnBackendCreateDescriptor", "attention (cuDNN)", "");
  }
  DnnDesc(const DnnDesc&) = delete;
  DnnDesc& operator=(const DnnDesc&) = delete;
  DnnDesc(DnnDesc&& o) noexcept : d(o.d) { o.d = nullptr; }
  ~DnnDesc() {
    if (d) cudnnBackendDestroyDescriptor(d);
  }
};

/// A built cuDNN graph: its execution plan, the descriptors it refers to, the device pointers'
/// unique ids in the order run() passes them, and the workspace it needs (the plan's own after
/// `extra` bytes of tensors the graph keeps in the workspace: D and the dQ accumulator).
struct DnnPlan {
  std::vector<std::shared_ptr<DnnDesc>> keep;
  std::shared_ptr<DnnDesc> plan;
  int64_t planWorkspace = 0;
  int64_t extra = 0;
};

/// Builds one graph's descriptors. Every tensor is 4-D [batch, heads, rows, columns].
struct DnnBuilder {
  cudnnHandle_t handle;
  const char* where;
  std::vector<std::shared_ptr<DnnDesc>> keep;
  std::vector<cudnnBackendDescriptor_t> ops;
  int64_t nextVirtual = 1000;

  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n,
           const void* v) {
    checkDnn(cudnnBackendSetAttribute(d, a, t, n, v), "cudnnBackendSetAttribute", "attention (cuDNN)", where);
  }
  void link(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendDescriptor_t v) {
    set(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
  }
  void finalize(cudnnBackendDescriptor_t d) {
    checkDnn(cudnnBackendFinalize(d), "cudnnBackendFinalize", "attention (cuDNN)", where);
  }
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
    keep.push_back(std::make_shared<DnnDesc>(t));
    return keep.back()->d;
  }

  /// A tensor: uid 0 makes a virtual one (an intermediate of the graph).
  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, std::array<int64_t, 4> dims,
                                  std::array<int64_t, 4> strides, bool byValue = false) {
    cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const bool isVirtual = uid == 0;
    const int64_t id = isVirtual ? nextVirtual++ : uid, align = 16;
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id);
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &isVirtual);
    if (byValue) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byValue);
    finalize(t);
    return t;
  }
  /// A dense virtual fp32 (or `type`) tensor of `dims`.
  cudnnBackendDescriptor_t temp(std::array<int64_t, 4> dims, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return tensor(0, type, dims, {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1});
  }

  /// y = mode(x[, b[, t]]) elementwise (GEN_INDEX: along `axis`).
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
                 int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(pw);
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    link(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    link(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) link(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) link(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    link(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    finalize(op);
    ops.push_back(op);
  }
  /// c = a · b (batched over the two leading dimensions), fp32 accumulation.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    finalize(mm);
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    link(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    link(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    link(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    link(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    finalize(op);
    ops.push_back(op);
  }
  /// y = reduce(x) over the dimensions where y has extent 1 (or fewer heads: grouped queries).
  void reduce(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    finalize(r);
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    link(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    link(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    link(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    finalize(op);
    ops.push_back(op);
  }
  /// y = x with other dimensions and strides over the same elements (a transpose).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    link(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    link(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    finalize(op);
    ops.push_back(op);
  }
  /// scores where row ≥ column (the causal mask, diagonal top-left: S = Skv), else −inf.
  cudnnBackendDescriptor_t causal(cudnnBackendDescriptor_t s, std::array<int64_t, 4> dims) {
    cudnnBackendDescriptor_t row = temp(dims, CUDNN_DATA_INT32), col = temp(dims, CUDNN_DATA_INT32);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, row, CUDNN_DATA_INT32, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, col, CUDNN_DATA_INT32, 3);
    cudnnBackendDescriptor_t keepIt = temp(dims, CUDNN_DATA_BOOLEAN), out = temp(dims);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keepIt, CUDNN_DATA_BOOLEAN);
    cudnnBackendDescriptor_t negInf = tensor(kUidNegInf, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, true);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, negInf, keepIt, out);
    return out;
  }

  /// The operation graph, the first engine configuration of heuristic A that finalizes, its plan.
  DnnPlan build(int64_t extra) {
    cudnnBackendDescriptor_t graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()),
        ops.data());
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    finalize(graph);
    cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    link(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    finalize(heur);
    int64_t n = 0;
    checkDnn(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n,
                                      nullptr), "heuristics", "attention (cuDNN)", where);
    std::vector<cudnnBackendDescriptor_t> cfgs;
    for (int64_t i = 0; i < n; ++i) cfgs.push_back(make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    checkDnn(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &n,
                                      cfgs.data()), "heuristics", "attention (cuDNN)", where);
    DnnPlan p;
    for (int64_t i = 0; i < n && !p.plan; ++i) {
      auto plan = std::make_shared<DnnDesc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      set(plan->d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      link(plan->d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[static_cast<size_t>(i)]);
      if (cudnnBackendFinalize(plan->d) == CUDNN_STATUS_SUCCESS) p.plan = plan;
    }
    if (!p.plan)
      fail("attention (cuDNN)", where, "cuDNN has no engine for this attention graph (" + std::to_string(n) +
                                           " configurations tried); rebuild with the runtime's kernels");
    checkDnn(cudnnBackendGetAttribute(p.plan->d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                      nullptr, &p.planWorkspace), "workspace size", "attention (cuDNN)", where);
    p.extra = extra;
    p.keep = std::move(keep);
    return p;
  }

  // Unique ids of the tensors a call binds (virtual ones count up from 1000).
  static constexpr int64_t kUidQ = 1, kUidK = 2, kUidV = 3, kUidO = 4, kUidStats = 5, kUidScale = 6, kUidNegInf = 7,
                           kUidDO = 8, kUidDQ = 9, kUidDK = 10, kUidDV = 11, kUidSum = 12, kUidDQAcc = 13;
};

/// The shape of one cuDNN attention call, dtype included: the plan cache's key.
inline std::string dnnKey(bool backward, cudnnDataType_t t, int64_t B, int64_t S, int64_t Skv, int64_t H,
                          int64_t Hkv, int64_t hd, bool causal, const AttnRows& r) {
  return std::string(backward ? "bwd" : "fwd") + "/" + std::to_string(static_cast<int>(t)) + "/" +
         std::to_string(B) + "/" + std::to_string(S) + "/" + std::to_string(Skv) + "/" + std::to_string(H) + "/" +
         std::to_string(Hkv) + "/" + std::to_string(hd) + "/" + (causal ? "c" : "n") + "/" + std::to_string(r.q) +
         "/" + std::to_string(r.k) + "/" + std::to_string(r.v);
}

inline int64_t round256(int64_t n) { return (n + 255) / 256 * 256; }

/// The forward graph (see the banner). Rows: q, k, v, o row strides in elements.
inline DnnPlan dnnForward(cudnnHandle_t h, const char* where, cudnnDataType_t t, int64_t B, int64_t S, int64_t Skv,
                          int64_t H, int64_t Hkv, int64_t hd, bool causal, int64_t rq, int64_t rk, int64_t rv) {
  DnnBuilder g{h, where};
  using D = DnnBuilder;
  cudnnBackendDescriptor_t q = g.tensor(D::kUidQ, t, {B, H, S, hd}, {S * rq, hd, rq, 1});
  cudnnBackendDescriptor_t kT = g.tensor(D::kUidK, t, {B, Hkv, hd, Skv}, {Skv * rk, hd, 1, rk});
  cudnnBackendDescriptor_t v = g.tensor(D::kUidV, t, {B, Hkv, Skv, hd}, {Skv * rv, hd, rv, 1});
  cudnnBackendDescriptor_t o = g.tensor(D::kUidO, t, {B, H, S, hd}, {S * H * hd, hd, H * hd, 1});
  cudnnBackendDescriptor_t stats = g.tensor(D::kUidStats, CUDNN_DATA_FLOAT, {B, H, S, 1}, {H * S, S, 1, 1});
  cudnnBackendDescriptor_t scale = g.tensor(D::kUidScale, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, true);
  const std::array<int64_t, 4> sd{B, H, S, Skv}, rd{B, H, S, 1};
  cudnnBackendDescriptor_t s = g.temp(sd), ss = g.temp(sd);
  g.matmul(q, kT, s);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, nullptr, ss);
  if (causal) ss = g.causal(ss, sd);
  cudnnBackendDescriptor_t mx = g.temp(rd), sub = g.temp(sd), ex = g.temp(sd), sum = g.temp(rd), lg = g.temp(rd);
  g.reduce(CUDNN_REDUCE_TENSOR_MAX, ss, mx);
  g.pointwise(CUDNN_POINTWISE_SUB, ss, mx, nullptr, sub);
  g.pointwise(CUDNN_POINTWISE_EXP, sub, nullptr, nullptr, ex);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, ex, sum);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, lg);
  g.pointwise(CUDNN_POINTWISE_ADD, mx, lg, nullptr, stats);
  cudnnBackendDescriptor_t p = g.temp(sd, t);  // P in the storage type: the second product's A
  g.pointwise(CUDNN_POINTWISE_DIV, ex, sum, nullptr, p);
  g.matmul(p, v, o);
  return g.build(0);
}

/// The backward graph (see the banner). D (softmax sums) and the fp32 dQ accumulator go first in
/// the workspace, the plan's own after them.
inline DnnPlan dnnBackward(cudnnHandle_t h, const char* where, cudnnDataType_t t, int64_t B, int64_t S, int64_t Skv,
                           int64_t H, int64_t Hkv, int64_t hd, bool causal, int64_t rq, int64_t rk, int64_t rv) {
  DnnBuilder g{h, where};
  using D = DnnBuilder;
  const int64_t ro = H * hd;
  cudnnBackendDescriptor_t q = g.tensor(D::kUidQ, t, {B, H, S, hd}, {S * rq, hd, rq, 1});
  cudnnBackendDescriptor_t kT = g.tensor(D::kUidK, t, {B, Hkv, hd, Skv}, {Skv * rk, hd, 1, rk});
  cudnnBackendDescriptor_t vT = g.tensor(D::kUidV, t, {B, Hkv, hd, Skv}, {Skv * rv, hd, 1, rv});
  cudnnBackendDescriptor_t o = g.tensor(D::kUidO, t, {B, H, S, hd}, {S * ro, hd, ro, 1});
  cudnnBackendDescriptor_t dO = g.tensor(D::kUidDO, t, {B, H, S, hd}, {S * ro, hd, ro, 1});
  cudnnBackendDescriptor_t stats = g.tensor(D::kUidStats, CUDNN_DATA_FLOAT, {B, H, S, 1}, {H * S, S, 1, 1});
  cudnnBackendDescriptor_t scale = g.tensor(D::kUidScale, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, true);
  cudnnBackendDescriptor_t dq = g.tensor(D::kUidDQ, t, {B, H, S, hd}, {S * rq, hd, rq, 1});
  cudnnBackendDescriptor_t dk = g.tensor(D::kUidDK, t, {B, Hkv, Skv, hd}, {Skv * rk, hd, rk, 1});
  cudnnBackendDescriptor_t dv = g.tensor(D::kUidDV, t, {B, Hkv, Skv, hd}, {Skv * rv, hd, rv, 1});
  cudnnBackendDescriptor_t sums = g.tensor(D::kUidSum, CUDNN_DATA_FLOAT, {B, H, S, 1}, {H * S, S, 1, 1});
  cudnnBackendDescriptor_t dqAcc =
      g.tensor(D::kUidDQAcc, CUDNN_DATA_FLOAT, {B, H, S, hd}, {H * S * hd, S * hd, hd, 1});
  const std::array<int64_t, 4> sd{B, H, S, Skv}, tr{B, H, Skv, S};
  const std::array<int64_t, 4> trStride{H * S * Skv, S * Skv, 1, Skv};
  // D = rowsum(dO ∘ O)
  cudnnBackendDescriptor_t doo = g.temp({B, H, S, hd});
  g.pointwise(CUDNN_POINTWISE_MUL, dO, o, nullptr, doo);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, doo, sums);
  // P = exp(scale · Q·Kᵀ [masked] − Stats)
  cudnnBackendDescriptor_t s = g.temp(sd), ss = g.temp(sd), sm = g.temp(sd), p = g.temp(sd);
  g.matmul(q, kT, s);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, nullptr, ss);
  if (causal) ss = g.causal(ss, sd);
  g.pointwise(CUDNN_POINTWISE_SUB, ss, stats, nullptr, sm);
  g.pointwise(CUDNN_POINTWISE_EXP, sm, nullptr, nullptr, p);
  // dV = Pᵀ·dO (summed over each kv head's query heads)
  cudnnBackendDescriptor_t pT = g.tensor(0, t, tr, trStride);
  g.reshape(p, pT);
  const bool grouped = H != Hkv;
  cudnnBackendDescriptor_t dvFull = grouped ? g.temp({B, H, Skv, hd}, t) : dv;
  g.matmul(pT, dO, dvFull);
  if (grouped) g.reduce(CUDNN_REDUCE_TENSOR_ADD, dvFull, dv);
  // dS = P ∘ (dO·Vᵀ − D) · scale
  cudnnBackendDescriptor_t dp = g.temp(sd), dpd = g.temp(sd), ds = g.temp(sd), dss = g.temp(sd);
  g.matmul(dO, vT, dp);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, sums, nullptr, dpd);
  g.pointwise(CUDNN_POINTWISE_MUL, dpd, p, nullptr, ds);
  g.pointwise(CUDNN_POINTWISE_MUL, ds, scale, nullptr, dss);
  // dK = dSᵀ·Q
  cudnnBackendDescriptor_t dsT = g.tensor(0, t, tr, trStride);
  g.reshape(dss, dsT);
  cudnnBackendDescriptor_t dkFull = grouped ? g.temp({B, H, Skv, hd}, t) : dk;
  g.matmul(dsT, q, dkFull);
  if (grouped) g.reduce(CUDNN_REDUCE_TENSOR_ADD, dkFull, dk);
  // dQ = dS·K through the fp32 accumulator
  cudnnBackendDescriptor_t k = g.tensor(0, t, {B, Hkv, Skv, hd}, {Skv * rk, hd, rk, 1});
  g.reshape(kT, k);
  g.matmul(dss, k, dqAcc);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dqAcc, nullptr, nullptr, dq);
  return g.build(round256(B * H * S * 4) + round256(B * H * S * hd * 4));
}

/// The cuDNN type of storage type T (bf16, fp16).
template <class T> constexpr cudnnDataType_t dnnType() {
  return std::is_same<T, f16>::value ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
}

/// The cached plan of `key`, built by `make` on first use; grows the context's cuDNN workspace to
/// what it needs (outside any CUDA graph capture: the first step builds every plan).
template <class Make>
inline const DnnPlan& dnnPlan(Ctx& ctx, const std::string& key, Make&& make) {
  auto it = ctx.dnnPlans.find(key);
  if (it == ctx.dnnPlans.end()) {
    if (!ctx.dnn) {
      checkDnn(cudnnCreate(&ctx.dnn), "cudnnCreate", "attention (cuDNN)", ctx.where);
      checkDnn(cudnnSetStream(ctx.dnn, ctx.stream), "cudnnSetStream", "attention (cuDNN)", ctx.where);
    }
    it = ctx.dnnPlans.emplace(key, std::make_shared<DnnPlan>(make(ctx.dnn))).first;
    const size_t need = static_cast<size_t>(it->second->extra + it->second->planWorkspace);
    if (need > ctx.dnnWorkspaceBytes) {
      if (ctx.dnnWorkspace) check(cudaFree(ctx.dnnWorkspace), "cudaFree(cuDNN workspace)", "attention (cuDNN)", ctx.where);
      ctx.dnnWorkspace = nullptr;
      check(cudaMalloc(&ctx.dnnWorkspace, need), "cudaMalloc(cuDNN workspace)", "attention (cuDNN)", ctx.where);
      ctx.dnnWorkspaceBytes = need;
    }
  }
  return *it->second;
}

/// Runs `p` with the device pointers of `uids`, the scale and −inf by value, on the context's stream.
inline void dnnRun(Ctx& ctx, const char* kernel, const DnnPlan& p, std::vector<int64_t> uids,
                   std::vector<void*> ptrs) {
  static float negInf = -m_inf<float>();
  uids.push_back(DnnBuilder::kUidNegInf);
  ptrs.push_back(&negInf);
  void* ws = static_cast<char*>(ctx.dnnWorkspace) + p.extra;
  DnnDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  checkDnn(cudnnBackendSetAttribute(pack.d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                    static_cast<int64_t>(uids.size()), uids.data()), "variant pack", kernel, ctx.where);
  checkDnn(cudnnBackendSetAttribute(pack.d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                    static_cast<int64_t>(ptrs.size()), ptrs.data()), "variant pack", kernel, ctx.where);
  checkDnn(cudnnBackendSetAttribute(pack.d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws),
           "variant pack", kernel, ctx.where);
  checkDnn(cudnnBackendFinalize(pack.d), "variant pack", kernel, ctx.where);
  const int t = timeBegin(ctx, kernel);
  checkDnn(cudnnBackendExecute(ctx.dnn, p.plan->d, pack.d), "cudnnBackendExecute", kernel, ctx.where);
  checkLaunch(ctx, kernel);
  timeEnd(ctx, t, kernel);
}

/// What cuDNN's graphs do not take (the emitter sends such calls to attention_fwd/_bwd).
inline void dnnArgs(const char* kernel, const char* where, const void* scores, float p, AttnScores sm, bool acc) {
  if (scores || p > 0.f || sm.window > 0 || sm.softcap > 0.f || acc)
    fail(kernel, where, "cuDNN's fused attention takes no materialised scores, dropout, window, soft cap or "
                        "accumulation: the runtime's kernels run those (passes/CudnnAttention.h)");
}

}  // namespace cu

/// attention_fwd through cuDNN (bf16, fp16). Same arguments; see the banner for what it takes.
template <class T>
void attention_fwd_cudnn(Ctx& ctx, const T* q, const T* k, const T* v, T* o, float* lse, T* scores, int64_t B,
                         int64_t S, int64_t Skv, int64_t H, int64_t Hkv, int64_t hd, float scale, bool causal,
                         float p, uint64_t seed, uint64_t stream, AttnRows rows = {}, AttnScores sm = {}) {
  static_assert(!std::is_same<T, float>::value, "cuDNN's fused attention takes bf16 and fp16");
  const char* kn = "attention_fwd_cudnn";
  const cu::AttnShape a = cu::attnShape(kn, ctx.where, B, S, Skv, H, Hkv, hd, scale, causal, p, seed, stream, rows, sm);
  cu::dnnArgs(kn, ctx.where, scores, p, sm, false);
  if (!lse) cu::fail(kn, ctx.where, "cuDNN's fused attention writes the lse");
  if (causal && S != Skv) cu::fail(kn, ctx.where, "cuDNN's causal mask is top-left: S must equal Skv");
  const cudnnDataType_t t = cu::dnnType<T>();
  const cu::DnnPlan& pl = cu::dnnPlan(ctx, cu::dnnKey(false, t, B, S, Skv, H, Hkv, hd, causal, {a.qRow, a.kRow, a.vRow}),
                                      [&](cudnnHandle_t h) {
                                        return cu::dnnForward(h, ctx.where, t, B, S, Skv, H, Hkv, hd, causal, a.qRow,
                                                              a.kRow, a.vRow);
                                      });
  float sc = a.scale;
  using D = cu::DnnBuilder;
  cu::dnnRun(ctx, kn, pl, {D::kUidQ, D::kUidK, D::kUidV, D::kUidO, D::kUidStats, D::kUidScale},
             {const_cast<T*>(q), const_cast<T*>(k), const_cast<T*>(v), o, lse, &sc});
}

/// attention_bwd through cuDNN (bf16, fp16): writes (never adds to) dq, dk and dv, all three.
template <class T>
void attention_bwd_cudnn(Ctx& ctx, const T* q, const T* k, const T* v, const T* o, const float* lse, const T* scores,
                         const T* dO, T* dq, T* dk, T* dv, int64_t B, int64_t S, int64_t Skv, int64_t H, int64_t Hkv,
                         int64_t hd, float scale, bool causal, float p, uint64_t seed, uint64_t stream,
                         bool accumulate, AttnRows rows = {}, AttnScores sm = {}) {
  static_assert(!std::is_same<T, float>::value, "cuDNN's fused attention takes bf16 and fp16");
  const char* kn = "attention_bwd_cudnn";
  const cu::AttnShape a = cu::attnShape(kn, ctx.where, B, S, Skv, H, Hkv, hd, scale, causal, p, seed, stream, rows, sm);
  cu::dnnArgs(kn, ctx.where, scores, p, sm, accumulate);
  if (!lse || !o || !dq || !dk || !dv) cu::fail(kn, ctx.where, "cuDNN's fused backward needs o, lse, dq, dk and dv");
  if (causal && S != Skv) cu::fail(kn, ctx.where, "cuDNN's causal mask is top-left: S must equal Skv");
  const cudnnDataType_t t = cu::dnnType<T>();
  const cu::DnnPlan& pl = cu::dnnPlan(ctx, cu::dnnKey(true, t, B, S, Skv, H, Hkv, hd, causal, {a.qRow, a.kRow, a.vRow}),
                                      [&](cudnnHandle_t h) {
                                        return cu::dnnBackward(h, ctx.where, t, B, S, Skv, H, Hkv, hd, causal, a.qRow,
                                                               a.kRow, a.vRow);
                                      });
  char* ws = static_cast<char*>(ctx.dnnWorkspace);
  void* sums = ws;
  void* dqAcc = ws + cu::round256(B * H * S * 4);
  if (cudnnGetVersion() < 90600)  // older cuDNN leaves zeroing the dQ accumulator to its caller
    cu::check(cudaMemsetAsync(dqAcc, 0, static_cast<size_t>(B * H * S * hd * 4), ctx.stream), "cudaMemsetAsync", kn,
              ctx.where);
  float sc = a.scale;
  using D = cu::DnnBuilder;
  cu::dnnRun(ctx, kn, pl,
             {D::kUidQ, D::kUidK, D::kUidV, D::kUidO, D::kUidDO, D::kUidStats, D::kUidScale, D::kUidDQ, D::kUidDK,
              D::kUidDV, D::kUidSum, D::kUidDQAcc},
             {const_cast<T*>(q), const_cast<T*>(k), const_cast<T*>(v), const_cast<T*>(o), const_cast<T*>(dO),
              const_cast<float*>(lse), &sc, dq, dk, dv, sums, dqAcc});
}

}  // namespace rt
