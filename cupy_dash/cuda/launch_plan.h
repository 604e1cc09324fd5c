/* Launch plans: the one executor of every cupy_dash launch (the host fast path, the eager calls, the JAX custom
 * call's C handler). A plan is everything one call needs on one device except buffer addresses: the kernels
 * (function handle, grid, block, dynamic smem), a parameter-block template (every kernel takes the one block by
 * value), where each buffer's address goes into it, and the buffers to zero first. Running a plan copies the
 * template, writes the addresses, zeroes, launches; it never allocates device memory or synchronizes.
 * Builds without CUDA headers: the driver entry points come from the process's libcuda through dlopen.
 */
#ifndef CUPY_DASH_LAUNCH_PLAN_H_
#define CUPY_DASH_LAUNCH_PLAN_H_

#include <stddef.h>
#include <stdint.h>

#define DASH_PLAN_MAGIC 0x48534144u                   /* "DASH" */
#define DASH_PLAN_MAX_KERNELS 4
#define DASH_PLAN_MAX_PARAMS 4096
#define DASH_PLAN_MAX_BUFFERS 64                      /* buffer addresses a run takes */
#define DASH_PLAN_INSPECT 1u                          /* flag for the JAX handler: run the plan in inspect mode
                                                         (dash_plan_run), the block to the last result (tests) */

/* The blob, as Python packs it (cupy_dash/cuda/plans.py pack_plan): a header, then dash_plan_kernel[num_kernels],
 * dash_plan_patch[num_pointers] (8 bytes at `offset` = address of buffer `buffer` + `add`),
 * dash_plan_patch[num_maps] (the 128-byte CUtensorMap at `offset` gets buffer `buffer`'s address through
 * cuTensorMapReplaceAddress; add 0), dash_plan_patch[num_zeros] (offset 0; `add` bytes of buffer `buffer` zeroed
 * before the kernels), then the parameter template (params_size bytes). Buffers are numbered by the caller. */
typedef struct {
  uint64_t function;                                   /* CUfunction */
  uint32_t grid[3], block[3], smem, pad;
} dash_plan_kernel;                                    /* 40 bytes */

typedef struct { uint32_t offset, buffer; uint64_t add; } dash_plan_patch;   /* 16 bytes */

typedef struct {
  uint32_t magic, flags, num_kernels, params_size, num_pointers, num_maps, num_zeros, reserved;
} dash_plan_header;                                    /* 32 bytes */

typedef struct {                                       /* a checked blob's parts (pointers into the blob) */
  dash_plan_header header;
  const dash_plan_kernel *kernels;
  const dash_plan_patch *pointers, *maps, *zeros;
  const unsigned char *params;
} dash_plan;

/* Check `blob` (its sizes, magic, patch offsets) and point `plan` into it. 0, or -1 with a message in `error`. */
int dash_plan_view(const void *blob, size_t size, dash_plan *plan, char *error, size_t error_size);

/* Run `plan` with the buffer addresses `buffers[0 .. num_buffers)` on the CUstream `stream`. Inspect mode (`inspect`
 * not NULL) makes no driver call: the patched block is written to `inspect` (params_size bytes), a tensor map's
 * patch writing its address over the map's first 8 bytes (tests, without a GPU). 0, or nonzero with a message in
 * `error` (the CUresult of a failed driver call, or -1). */
int dash_plan_run(const dash_plan *plan, const uint64_t *buffers, size_t num_buffers, void *stream,
                  unsigned char *inspect, char *error, size_t error_size);

/* Launch one kernel with the parameter block `params` (copied by the driver during the call). 0, or nonzero with a
 * message in `error`. */
int dash_launch_kernel(const dash_plan_kernel *kernel, void *params, void *stream, char *error, size_t error_size);

#endif
