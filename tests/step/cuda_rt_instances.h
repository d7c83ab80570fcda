// Every function of the CUDA runtime (codegen/runtime/cuda/tally_rt.cuh) that is a template over
// the storage type alone, listed once for explicit instantiation. Include after tally_rt.cuh:
//   TALLY_RT_INSTANCES(template, T)          instantiates them for T (cuda_instantiate.cu and
//                                            the prebuilt runtime, cuda_rt_lib.cu)
//   TALLY_RT_INSTANCES(extern template, T)   declares them instantiated elsewhere, so a
//                                            translation unit that calls them compiles none of
//                                            their kernels (cuda_rt_extern.cuh)
//   TALLY_RT_COPIES(PREFIX, TS)              copy<TS, TD> for every destination type TD.
// Not listed, and so compiled where they are called: the templates over a fused functor
// (rt::fused, layer_norm_fwd_fused, rms_norm_fwd_fused: the functor is the generated step's),
// and the non-template functions (inline). A function missing here is still correct, only
// compiled again by every step; a signature changed in the runtime and not here fails to
// compile in cuda-check-compiles and cuda-step-compiles (an instantiation of no function).
#pragma once

#define TALLY_RT_INSTANCES(PREFIX, T)                                                                    \
  PREFIX void rt::matmul<T>(rt::Ctx&, bool, bool, int64_t, int64_t, int64_t, float, const T*, int64_t,    \
                            int64_t, const T*, int64_t, int64_t, float, T*, int64_t, int64_t, int64_t);   \
  PREFIX void rt::matmul_bias<T>(rt::Ctx&, bool, bool, int64_t, int64_t, int64_t, const T*, int64_t,      \
                                 const T*, int64_t, const T*, T*, int64_t);                              \
  PREFIX void rt::binary<T>(rt::Ctx&, rt::BinOp, const T*, const int64_t*, const T*, const int64_t*, T*,  \
                            const int64_t*, int, bool, const int64_t*);                                  \
  PREFIX void rt::div_bwd<T>(rt::Ctx&, const T*, const int64_t*, const T*, const int64_t*, const T*,        \
                             const int64_t*, T*, const int64_t*, const int64_t*, int, bool);              \
  PREFIX void rt::div_scalar_bwd<T>(rt::Ctx&, const T*, const T*, float, T*, int64_t, bool);               \
  PREFIX void rt::binary_scalar<T>(rt::Ctx&, rt::BinOp, const T*, float, bool, T*, int64_t, bool);       \
  PREFIX void rt::reduce_to<T>(rt::Ctx&, const T*, const int64_t*, int, T*, const int64_t*, float, bool);  \
  PREFIX void rt::unary_fwd<T>(rt::Ctx&, rt::UnOp, const T*, T*, int64_t);                               \
  PREFIX void rt::unary_bwd<T>(rt::Ctx&, rt::UnOp, const T*, const T*, const T*, T*, int64_t, bool);     \
  PREFIX void rt::dropout_fwd<T>(rt::Ctx&, const T*, T*, uint8_t*, int64_t, float, uint64_t, uint64_t);  \
  PREFIX void rt::dropout_bwd<T>(rt::Ctx&, const T*, const uint8_t*, T*, int64_t, float, uint64_t,        \
                                 uint64_t, bool);                                                         \
  PREFIX void rt::rope_fwd<T>(rt::Ctx&, const T*, T*, const int32_t*, int64_t, int64_t, int64_t, int64_t,  \
                              float);                                                                     \
  PREFIX void rt::rope_bwd<T>(rt::Ctx&, const T*, T*, const int32_t*, int64_t, int64_t, int64_t, int64_t,  \
                              float, bool);                                                               \
  PREFIX void rt::softmax_fwd<T>(rt::Ctx&, const T*, T*, int64_t, int64_t);                              \
  PREFIX void rt::softmax_bwd<T>(rt::Ctx&, const T*, const T*, T*, int64_t, int64_t, bool);              \
  PREFIX void rt::layer_norm_fwd<T>(rt::Ctx&, const T*, const T*, const T*, T*, float*, float*, int64_t,  \
                                    int64_t, float);                                                      \
  PREFIX void rt::layer_norm_bwd<T>(rt::Ctx&, const T*, const T*, const float*, const float*, const T*,   \
                                    T*, T*, T*, int64_t, int64_t, bool);                                  \
  PREFIX void rt::rms_norm_fwd<T>(rt::Ctx&, const T*, const T*, T*, float*, int64_t, int64_t, float);     \
  PREFIX void rt::rms_norm_bwd<T>(rt::Ctx&, const T*, const T*, const float*, const T*, T*, T*, int64_t,  \
                                  int64_t, bool);                                                         \
  PREFIX void rt::attention_fwd<T>(rt::Ctx&, const T*, const T*, const T*, T*, float*, T*, int64_t,       \
                                   int64_t, int64_t, int64_t, int64_t, int64_t, float, bool, float,       \
                                   uint64_t, uint64_t, rt::AttnRows, rt::AttnScores);                     \
  PREFIX void rt::attention_bwd<T>(rt::Ctx&, const T*, const T*, const T*, const T*, const float*,        \
                                   const T*, const T*, T*, T*, T*, int64_t, int64_t, int64_t, int64_t,    \
                                   int64_t, int64_t, float, bool, float, uint64_t, uint64_t, bool,        \
                                   rt::AttnRows, rt::AttnScores);                                         \
  PREFIX void rt::embedding_fwd<T>(rt::Ctx&, const int32_t*, const T*, T*, int64_t, int64_t, int64_t);   \
  PREFIX void rt::embedding_bwd<T>(rt::Ctx&, const int32_t*, const T*, T*, int64_t, int64_t, int64_t);   \
  PREFIX void rt::cross_entropy_fwd<T>(rt::Ctx&, const T*, const int32_t*, float*, float*, int64_t,      \
                                       int64_t, int64_t);                                                 \
  PREFIX void rt::cross_entropy_bwd<T>(rt::Ctx&, const T*, const int32_t*, const float*, const float*,   \
                                       T*, int64_t, int64_t, bool, int64_t);                              \
  PREFIX void rt::sum_fwd<T>(rt::Ctx&, const T*, T*, int64_t, int64_t, int64_t, bool);                   \
  PREFIX void rt::sum_bwd<T>(rt::Ctx&, const T*, T*, int64_t, int64_t, int64_t, bool, bool);             \
  PREFIX void rt::fill<T>(rt::Ctx&, T*, float, int64_t);                                                 \
  PREFIX void rt::sum_squares<T>(rt::Ctx&, const T*, int64_t, float*);                                   \
  PREFIX void rt::scale<T>(rt::Ctx&, T*, float, int64_t);                                                \
  PREFIX void rt::sgd_update<T>(rt::Ctx&, float*, T*, const T*, float*, int64_t, float, float, float,    \
                                float);                                                                   \
  PREFIX void rt::adagrad_update<T>(rt::Ctx&, float*, T*, const T*, float*, int64_t, float, float, float, \
                                    float);                                                               \
  PREFIX void rt::rmsprop_update<T>(rt::Ctx&, float*, T*, const T*, float*, float*, int64_t, float,       \
                                    float, float, float, float, float);                                   \
  PREFIX void rt::adam_update<T>(rt::Ctx&, float*, T*, const T*, float*, float*, int64_t, float, float,   \
                                 float, float, float, bool, int64_t, float);                              \
  PREFIX void rt::lion_update<T>(rt::Ctx&, float*, T*, const T*, float*, int64_t, float, float, float,    \
                                 float, float);

// The functions over the 16-bit storage types alone (bf16, fp16): cuDNN's fused attention.
#define TALLY_RT_HALF_INSTANCES(PREFIX, T)                                                               \
  PREFIX void rt::attention_fwd_cudnn<T>(rt::Ctx&, const T*, const T*, const T*, T*, float*, T*, int64_t, \
                                         int64_t, int64_t, int64_t, int64_t, int64_t, float, bool, float, \
                                         uint64_t, uint64_t, rt::AttnRows, rt::AttnScores);               \
  PREFIX void rt::attention_bwd_cudnn<T>(rt::Ctx&, const T*, const T*, const T*, const T*, const float*,  \
                                         const T*, const T*, T*, T*, T*, int64_t, int64_t, int64_t,       \
                                         int64_t, int64_t, int64_t, float, bool, float, uint64_t,         \
                                         uint64_t, bool, rt::AttnRows, rt::AttnScores);

#define TALLY_RT_COPY(PREFIX, TS, TD)                                                                    \
  PREFIX void rt::copy<TS, TD>(rt::Ctx&, const TS*, const int64_t*, TD*, const int64_t*, const int64_t*,  \
                               int, bool);
#define TALLY_RT_COPIES(PREFIX, TS)                                                                      \
  TALLY_RT_COPY(PREFIX, TS, float) TALLY_RT_COPY(PREFIX, TS, rt::bf16) TALLY_RT_COPY(PREFIX, TS, rt::f16)
