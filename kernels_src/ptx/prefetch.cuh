// PTX ISA "Data Movement and Conversion Instructions: prefetch" — bring a global line into L1 ahead of its load.
#pragma once
#include "../common.cuh"

DASH_DEVICE void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p)); }
