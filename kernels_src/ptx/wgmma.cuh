// PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate: wgmma" — wgmma.fence / commit_group /
// wait_group, the shared-memory matrix descriptor (128B swizzle), and wgmma.mma_async m64nNk16 with fp32
// accumulators, A from shared memory (SS) or from registers (RS), for N = 64 and 128 (SS also 80: the backward's
// 80-query tile and the head-dim-256 forward's 80-key tile, 112: the head-dim-192 forward's 112-key tile, 176: the
// forward's 176-key tile, 32 and 96: the head-dim-96 probe, tests/gpu/kernels/wgmma_n96.cu, and 48: the head-dim-192
// backward plan's dQ^T pieces, tests/gpu/kernels/bwd192_visit.cu; RS also 96: O, dV and dK at head dim 96).
#pragma once
#include "../common.cuh"

#if DASH_FP16
#define DASH_WGMMA_TYPES ".f32.f16.f16"
#else
#define DASH_WGMMA_TYPES ".f32.bf16.bf16"
#endif

// Orders the warpgroup's register accesses before the next wgmma (accumulators, A fragments).
DASH_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
DASH_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending committed groups are still running; their registers may be read after that.
template <int kPending>
DASH_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accesses of these registers across a wgmma fence, commit or wait.
template <int kRegs>
DASH_DEVICE void wgmma_fence_operand(float (&d)[kRegs]) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kSteps>
DASH_DEVICE void wgmma_fence_operand(uint32_t (&a)[kSteps][4]) {
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
  }
}

// Matrix descriptor (ISA "Matrix Descriptor Format") of an operand in 128B-swizzled shared memory whose swizzle
// pattern starts on a 1024-byte boundary (base offset 0). Addresses are shared-window byte addresses; LBO / SBO
// are byte offsets (ISA "Shared Memory Matrix Layout"): K-major: LBO unused (16), SBO = 1024 between 8-row
// groups; MN-major: LBO = bytes between 64-element MN panels, SBO = 1024 between 8-row K groups.
DASH_DEVICE uint64_t wgmma_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo_bytes & 0x3FFFF) >> 4) << 16) |
         ((uint64_t)((sbo_bytes & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

// Operand lists of the accumulator registers: "+f" of d[i .. i + 7], of the 32 registers of an m64n64 tile and
// of the 64 of an m64n128 tile, and their placeholders %0 .. %31 / %0 .. %63 in the instruction text.
#define DASH_ACC8(d, i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define DASH_ACC32(d) DASH_ACC8(d, 0), DASH_ACC8(d, 8), DASH_ACC8(d, 16), DASH_ACC8(d, 24)
#define DASH_ACC64(d) DASH_ACC32(d), DASH_ACC8(d, 32), DASH_ACC8(d, 40), DASH_ACC8(d, 48), DASH_ACC8(d, 56)
#define DASH_ACC16(d) DASH_ACC8(d, 0), DASH_ACC8(d, 8)
#define DASH_ACC24(d) DASH_ACC16(d), DASH_ACC8(d, 16)
#define DASH_ACC40(d) DASH_ACC32(d), DASH_ACC8(d, 32)
#define DASH_ACC48(d) DASH_ACC40(d), DASH_ACC8(d, 40)
#define DASH_ACC56(d) DASH_ACC48(d), DASH_ACC8(d, 48)
#define DASH_ACC88(d) DASH_ACC64(d), DASH_ACC8(d, 64), DASH_ACC8(d, 72), DASH_ACC8(d, 80)
#define DASH_REGS16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define DASH_REGS24 DASH_REGS16 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define DASH_REGS40 DASH_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define DASH_REGS48 DASH_REGS40 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define DASH_REGS56 DASH_REGS48 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define DASH_REGS32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define DASH_REGS64 \
  DASH_REGS32 ", " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
  "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define DASH_REGS88 \
  DASH_REGS64 ", " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, " \
  "%81, %82, %83, %84, %85, %86, %87"

// One SS wgmma of shape SHAPE ("m64n64k16"...) whose kRegs accumulators are operands %0 .. %(kRegs - 1) (REGS, ACC):
// the descriptors, the accumulate flag and the two transposes follow as %kRegs .. %(kRegs + 4) (OPS: "%32, %33",
// PRED: "%34", TRANS: "%35, %36" for kRegs = 32).
#define DASH_WGMMA_SS(SHAPE, REGS, ACC, OPS, PRED, TRANS) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n" \
               "wgmma.mma_async.sync.aligned." SHAPE DASH_WGMMA_TYPES " {" REGS "}, " OPS ", p, 1, 1, " \
               TRANS ";\n}\n" \
               : ACC \
               : "l"(a_desc), "l"(b_desc), "r"(accumulate), "n"(kTransA), "n"(kTransB))

// d (64 x kN fp32, kN / 2 registers per thread) = (accumulate ? d : 0) + A (64 x 16) * B (16 x kN), A and B
// from shared memory. kTransA / kTransB: 0 = K-major, 1 = M/N-major.
template <int kN, int kTransA, int kTransB>
DASH_DEVICE void wgmma_ss(float (&d)[kN / 2], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  static_assert(kN == 32 || kN == 48 || kN == 64 || kN == 80 || kN == 96 || kN == 112 || kN == 128 || kN == 176,
                "wgmma_ss: N = 32, 48, 64, 80, 96, 112, 128 or 176");
  if constexpr (kN == 32) {
    DASH_WGMMA_SS("m64n32k16", DASH_REGS16, DASH_ACC16(d), "%16, %17", "%18", "%19, %20");
  } else if constexpr (kN == 48) {
    DASH_WGMMA_SS("m64n48k16", DASH_REGS24, DASH_ACC24(d), "%24, %25", "%26", "%27, %28");
  } else if constexpr (kN == 64) {
    DASH_WGMMA_SS("m64n64k16", DASH_REGS32, DASH_ACC32(d), "%32, %33", "%34", "%35, %36");
  } else if constexpr (kN == 80) {
    DASH_WGMMA_SS("m64n80k16", DASH_REGS40, DASH_ACC40(d), "%40, %41", "%42", "%43, %44");
  } else if constexpr (kN == 96) {
    DASH_WGMMA_SS("m64n96k16", DASH_REGS48, DASH_ACC48(d), "%48, %49", "%50", "%51, %52");
  } else if constexpr (kN == 112) {
    DASH_WGMMA_SS("m64n112k16", DASH_REGS56, DASH_ACC56(d), "%56, %57", "%58", "%59, %60");
  } else if constexpr (kN == 128) {
    DASH_WGMMA_SS("m64n128k16", DASH_REGS64, DASH_ACC64(d), "%64, %65", "%66", "%67, %68");
  } else {
    DASH_WGMMA_SS("m64n176k16", DASH_REGS88, DASH_ACC88(d), "%88, %89", "%90", "%91, %92");
  }
}

// d (64 x kN fp32) = (accumulate ? d : 0) + A (64 x 16, four packed 16-bit pairs per thread in the accumulator
// fragment order, ISA "Register Fragments: matrix A") * B (16 x kN) from shared memory. kTransB: 0 = K-major,
// 1 = N-major.
template <int kN, int kTransB>
DASH_DEVICE void wgmma_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t b_desc, int accumulate) {
  static_assert(kN == 64 || kN == 96 || kN == 128, "wgmma_rs: N = 64, 96 or 128");
  if constexpr (kN == 96) {   // head dim 96: an N-major B across one and a half 64-column panels
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n96k16" DASH_WGMMA_TYPES " {" DASH_REGS48 "}, {%48, %49, %50, "
                 "%51}, %52, p, 1, 1, %54;\n}\n"
                 : DASH_ACC48(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate), "n"(kTransB));
  } else if constexpr (kN == 64) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16" DASH_WGMMA_TYPES " {" DASH_REGS32 "}, {%32, %33, %34, %35}, "
                 "%36, p, 1, 1, %38;\n}\n"
                 : DASH_ACC32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate), "n"(kTransB));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16" DASH_WGMMA_TYPES " {" DASH_REGS64 "}, {%64, %65, %66, "
                 "%67}, %68, p, 1, 1, %70;\n}\n"
                 : DASH_ACC64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate), "n"(kTransB));
  }
}
