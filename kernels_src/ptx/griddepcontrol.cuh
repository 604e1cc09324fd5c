// PTX ISA "Parallel synchronization and communication: griddepcontrol" — griddepcontrol.launch_dependents / .wait
// (programmatic dependent launch, sm_90).
#pragma once
#include "../common.cuh"

// The grid launched after this one on the stream with programmatic serialization may start being scheduled once
// every CTA of this grid has executed this (or exited). Says nothing about this grid's memory.
DASH_DEVICE void grid_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// Waits until the grids this one depends on have completed and their memory is visible; returns at once when
// the grid was launched without programmatic serialization.
DASH_DEVICE void grid_dependency_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
