// PTX ISA "Data Movement and Conversion Instructions: st" — a 16-byte store of four 32-bit words to global memory.
#pragma once
#include "../common.cuh"

// dst: 16-byte aligned global address. One st.global.v4 (ptxas otherwise may split a uint4 store whose words do
// not sit in four consecutive registers into four 4-byte stores).
DASH_DEVICE void st_global_v4(void* dst, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(w0), "r"(w1), "r"(w2), "r"(w3)
               : "memory");
}

// *dst = value where `on`, as one predicated st.global.b64: no branch, so a warp whose other lanes skip the store
// does not diverge (the timeline builds' stamps, bwd/timeline.cuh). dst: 8-byte aligned global address.
// NOTES: no "memory" clobber: the kernel never reads what it stamps, and a clobber would keep the compiler from
// moving the visit's own loads across a stamp, so that a timeline build would schedule them unlike the normal build.
DASH_DEVICE void st_global_b64_if(bool on, int64_t* dst, int64_t value) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %0, 0;\n @p st.global.b64 [%1], %2;\n}\n" ::"r"((int)on), "l"(dst),
               "l"(value));
}
