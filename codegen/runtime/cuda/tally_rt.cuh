// The CUDA kernel runtime that generated training steps call (codegen/runtime/API.md): the same
// functions and arguments as the CPU runtime (codegen/runtime/cpu/tally_rt.h) with a CUDA
// context (rt::Ctx = rt::cu::Ctx: stream, cuBLASLt handle, workspace, per-kernel timing).
// Header-only: a generated step includes this file, compiles with nvcc (C++17, -arch=sm_90) and
// links cuBLASLt and cuDNN (-lcublasLt -lcudnn). Storage types: float, rt::bf16, rt::f16. docs/cuda.md describes
// the kernels, their error messages and what has (and has not) been measured.
#pragma once

#include "ctx.cuh"
#include "elementwise.cuh"
#include "rows.cuh"
#include "attention.cuh"
#include "cudnn_attention.cuh"
