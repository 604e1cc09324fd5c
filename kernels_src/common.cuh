// Shared definitions for every cupy_dash kernel: the sm_90a guard, fixed-width types without host headers
// (NVRTC has no default include path), and the element type selected by the build defines.
#pragma once

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "cupy_dash kernels must be compiled for sm_90a"
#endif

typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned long long uint64_t;
typedef long long int64_t;
typedef unsigned short uint16_t;

#define DASH_DEVICE __device__ __forceinline__

// NOTES: DASH_FP16 = 1 selects fp16 inputs/outputs, otherwise bf16. Elements are handled as raw 16-bit words;
// conversions go through ptx/cvt.cuh, so no cuda_bf16.h / cuda_fp16.h is needed.
#ifndef DASH_FP16
#define DASH_FP16 0
#endif
typedef uint16_t elem_t;

constexpr float kLog2e = 1.4426950408889634f;

// Shared-window (32-bit) address of a generic pointer into shared memory.
DASH_DEVICE uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
