// PTX ISA "Parallel synchronization: membar / fence" — fence.acq_rel.gpu.
#pragma once
#include "../common.cuh"

DASH_DEVICE void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
