// Compiles every function of the CUDA runtime (codegen/runtime/cuda/tally_rt.cuh) for the
// storage types cuda_check.cu does not run (fp16, and copies between every pair of types) by
// explicit instantiation, so that the test suite catches a kernel that does not build with nvcc
// on a machine without a GPU. Linked into tests/step/cuda_check; defines no entry point.
#include "codegen/runtime/cuda/tally_rt.cuh"

#define TALLY_INSTANTIATE(T)                                                                          \
  template void rt::matmul<T>(rt::Ctx&, bool, bool, int64_t, int64_t, int64_t, float, const T*, int64_t,   \
                              int64_t, const T*, int64_t, int64_t, float, T*, int64_t, int64_t, int64_t);  \
  template void rt::binary<T>(rt::Ctx&, rt::BinOp, const T*, const int64_t*, const T*, const int64_t*, T*, \
                              const int64_t*, int, bool, const int64_t*);                                 \
  template void rt::div_bwd<T>(rt::Ctx&, const T*, const int64_t*, const T*, const int64_t*, const T*,       \
                               const int64_t*, T*, const int64_t*, const int64_t*, int, bool);             \
  template void rt::div_scalar_bwd<T>(rt::Ctx&, const T*, const T*, float, T*, int64_t, bool);              \
  template void rt::binary_scalar<T>(rt::Ctx&, rt::BinOp, const T*, float, bool, T*, int64_t, bool);      \
  template void rt::reduce_to<T>(rt::Ctx&, const T*, const int64_t*, int, T*, const int64_t*, float, bool); \
  template void rt::unary_fwd<T>(rt::Ctx&, rt::UnOp, const T*, T*, int64_t);                              \
  template void rt::unary_bwd<T>(rt::Ctx&, rt::UnOp, const T*, const T*, const T*, T*, int64_t, bool);    \
  template void rt::dropout_fwd<T>(rt::Ctx&, const T*, T*, uint8_t*, int64_t, float, uint64_t, uint64_t); \
  template void rt::dropout_bwd<T>(rt::Ctx&, const T*, const uint8_t*, T*, int64_t, float, uint64_t,       \
                                   uint64_t, bool);                                                        \
  template void rt::rope_fwd<T>(rt::Ctx&, const T*, T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, \
                                float);                                                                    \
  template void rt::rope_bwd<T>(rt::Ctx&, const T*, T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, \
                                float, bool);                                                              \
  template void rt::softmax_fwd<T>(rt::Ctx&, const T*, T*, int64_t, int64_t);                             \
  template void rt::softmax_bwd<T>(rt::Ctx&, const T*, const T*, T*, int64_t, int64_t, bool);             \
  template void rt::layer_norm_fwd<T>(rt::Ctx&, const T*, const T*, const T*, T*, float*, float*, int64_t, \
                                      int64_t, float);                                                     \
  template void rt::layer_norm_bwd<T>(rt::Ctx&, const T*, const T*, const float*, const float*, const T*,  \
                                      T*, T*, T*, int64_t, int64_t, bool);                                 \
  template void rt::rms_norm_fwd<T>(rt::Ctx&, const T*, const T*, T*, float*, int64_t, int64_t, float);    \
  template void rt::rms_norm_bwd<T>(rt::Ctx&, const T*, const T*, const float*, const T*, T*, T*, int64_t, \
                                    int64_t, bool);                                                        \
  template void rt::attention_fwd<T>(rt::Ctx&, const T*, const T*, const T*, T*, float*, T*, int64_t,      \
                                     int64_t, int64_t, int64_t, int64_t, int64_t, float, bool, float,      \
                                     uint64_t, uint64_t, rt::AttnRows);                                    \
  template void rt::attention_bwd<T>(rt::Ctx&, const T*, const T*, const T*, const T*, const float*,       \
                                     const T*, const T*, T*, T*, T*, int64_t, int64_t, int64_t, int64_t,   \
                                     int64_t, int64_t, float, bool, float, uint64_t, uint64_t, bool,       \
                                     rt::AttnRows);                                                        \
  template void rt::embedding_fwd<T>(rt::Ctx&, const int32_t*, const T*, T*, int64_t, int64_t, int64_t);  \
  template void rt::embedding_bwd<T>(rt::Ctx&, const int32_t*, const T*, T*, int64_t, int64_t, int64_t);  \
  template void rt::cross_entropy_fwd<T>(rt::Ctx&, const T*, const int32_t*, float*, float*, int64_t,     \
                                         int64_t);                                                         \
  template void rt::cross_entropy_bwd<T>(rt::Ctx&, const T*, const int32_t*, const float*, const float*,  \
                                         T*, int64_t, int64_t, bool);                                      \
  template void rt::sum_fwd<T>(rt::Ctx&, const T*, T*, int64_t, int64_t, int64_t, bool);                  \
  template void rt::sum_bwd<T>(rt::Ctx&, const T*, T*, int64_t, int64_t, int64_t, bool, bool);            \
  template void rt::fill<T>(rt::Ctx&, T*, float, int64_t);                                                \
  template void rt::sum_squares<T>(rt::Ctx&, const T*, int64_t, float*);                                  \
  template void rt::scale<T>(rt::Ctx&, T*, float, int64_t);                                               \
  template void rt::sgd_update<T>(rt::Ctx&, float*, T*, const T*, float*, int64_t, float, float, float,   \
                                  float);                                                                  \
  template void rt::adagrad_update<T>(rt::Ctx&, float*, T*, const T*, float*, int64_t, float, float, float, \
                                      float);                                                              \
  template void rt::rmsprop_update<T>(rt::Ctx&, float*, T*, const T*, float*, float*, int64_t, float,      \
                                      float, float, float, float, float);                                  \
  template void rt::adam_update<T>(rt::Ctx&, float*, T*, const T*, float*, float*, int64_t, float, float,  \
                                   float, float, float, bool, int64_t, float);                             \
  template void rt::lion_update<T>(rt::Ctx&, float*, T*, const T*, float*, int64_t, float, float, float,   \
                                   float, float);

// copy<TS, TD> for every pair of storage types.
#define TALLY_COPY(TS, TD)                                                                             \
  template void rt::copy<TS, TD>(rt::Ctx&, const TS*, const int64_t*, TD*, const int64_t*, const int64_t*, \
                                 int, bool);
#define TALLY_COPY_FROM(TS) TALLY_COPY(TS, float) TALLY_COPY(TS, rt::bf16) TALLY_COPY(TS, rt::f16)
TALLY_COPY_FROM(float)
TALLY_COPY_FROM(rt::bf16)
TALLY_COPY_FROM(rt::f16)

TALLY_INSTANTIATE(rt::f16)
