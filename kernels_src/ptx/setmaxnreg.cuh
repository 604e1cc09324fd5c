// PTX ISA "Miscellaneous Instructions: setmaxnreg" — hand registers between warpgroups of one CTA.
#pragma once
#include "../common.cuh"

// NOTES: every warp of a warpgroup executes the same call; the kernel needs __launch_bounds__(threads, 1) so that
// ptxas knows the register count at entry (otherwise it ignores setmaxnreg, warning C7508).
template <int kRegs>
DASH_DEVICE void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

template <int kRegs>
DASH_DEVICE void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
