/* The executor of launch plans (launch_plan.h): checks a plan's blob once, then per call copies its template,
 * writes the buffers' addresses (plain pointers, and tensor maps through cuTensorMapReplaceAddress), zeroes, and
 * launches its kernels with cuLaunchKernel. Compiled into cupy_dash.cuda.executor and into the JAX handler's
 * extension; each opens the process's libcuda on first use.
 */
#include "launch_plan.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef int (*cu_launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                            void **, void **);
typedef int (*cu_replace_fn)(void *, void *);
typedef int (*cu_memset_fn)(uint64_t, unsigned char, size_t, void *);
static cu_launch_fn cu_launch;
static cu_replace_fn cu_replace;
static cu_memset_fn cu_memset;

int dash_plan_view(const void *blob, size_t size, dash_plan *plan, char *error, size_t error_size) {
  dash_plan_header h;
  if (size < sizeof h) {
    snprintf(error, error_size, "plan: %zu bytes, shorter than its header", size);
    return -1;
  }
  memcpy(&h, blob, sizeof h);
  size_t need = sizeof h + h.num_kernels * sizeof(dash_plan_kernel) +
                ((size_t)h.num_pointers + h.num_maps + h.num_zeros) * sizeof(dash_plan_patch) + h.params_size;
  if (h.magic != DASH_PLAN_MAGIC || h.num_kernels > DASH_PLAN_MAX_KERNELS || h.params_size == 0 ||
      h.params_size > DASH_PLAN_MAX_PARAMS || need != size) {
    snprintf(error, error_size, "plan: bad header (magic %#x, %u kernels, %u-byte block, %zu bytes for %zu)",
             h.magic, h.num_kernels, h.params_size, size, need);
    return -1;
  }
  const char *at = (const char *)blob + sizeof h;
  plan->header = h;
  plan->kernels = (const dash_plan_kernel *)at;
  plan->pointers = (const dash_plan_patch *)(at + h.num_kernels * sizeof(dash_plan_kernel));
  plan->maps = plan->pointers + h.num_pointers;
  plan->zeros = plan->maps + h.num_maps;
  plan->params = (const unsigned char *)(plan->zeros + h.num_zeros);
  for (uint32_t i = 0; i < h.num_pointers + h.num_maps; ++i) {
    const dash_plan_patch *p = &plan->pointers[i];
    uint32_t width = i < h.num_pointers ? 8 : 128;
    if (p->offset % (i < h.num_pointers ? 8 : 64) || (size_t)p->offset + width > h.params_size) {
      snprintf(error, error_size, "plan: patch %u at offset %u is misaligned or outside the %u-byte block", i,
               p->offset, h.params_size);
      return -1;
    }
  }
  return 0;
}

/* NOTES: runs may start on several threads at once (Python's nogil sections, XLA's threads): the driver's entry
 * points are looked up once, under pthread_once, which orders their stores before every caller's reads. A process
 * whose libcuda lacks them cannot launch, so a failed lookup is not retried. */
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

static void open_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);   /* the one CuPy, torch or XLA loaded */
  if (!lib) return;
  cu_replace_fn replace = (cu_replace_fn)dlsym(lib, "cuTensorMapReplaceAddress");
  cu_launch_fn launch = (cu_launch_fn)dlsym(lib, "cuLaunchKernel");
  cu_memset_fn memset_async = (cu_memset_fn)dlsym(lib, "cuMemsetD8Async");
  if (!replace || !launch || !memset_async) {
    dlclose(lib);
    return;
  }
  cu_replace = replace;
  cu_launch = launch;
  cu_memset = memset_async;
}

static int load_driver(void) {
  pthread_once(&driver_once, open_driver);
  return cu_launch != NULL;
}

static int buffer_index(uint32_t buffer, size_t num_buffers, uint32_t patch, char *error, size_t error_size) {
  if (buffer < num_buffers) return 0;
  snprintf(error, error_size, "plan: patch %u names buffer %u of %zu", patch, buffer, num_buffers);
  return -1;
}

int dash_plan_run(const dash_plan *plan, const uint64_t *buffers, size_t num_buffers, void *stream,
                  unsigned char *inspect, char *error, size_t error_size) {
  const dash_plan_header *h = &plan->header;
  int inspecting = inspect != NULL;
  if (!inspecting && !load_driver()) {
    snprintf(error, error_size, "libcuda.so.1 cannot be opened, or lacks cuLaunchKernel, "
                                "cuTensorMapReplaceAddress or cuMemsetD8Async");
    return -1;
  }
  _Alignas(64) unsigned char params[DASH_PLAN_MAX_PARAMS];
  memcpy(params, plan->params, h->params_size);
  for (uint32_t i = 0; i < h->num_pointers + h->num_maps; ++i) {
    const dash_plan_patch *p = &plan->pointers[i];
    if (buffer_index(p->buffer, num_buffers, i, error, error_size)) return -1;
    uint64_t address = buffers[p->buffer] + p->add;
    if (i < h->num_pointers || inspecting) {
      memcpy(params + p->offset, &address, 8);
    } else {
      int r = cu_replace(params + p->offset, (void *)(uintptr_t)address);
      if (r) {
        snprintf(error, error_size, "cuTensorMapReplaceAddress failed (CUresult %d) for buffer %u at %#llx", r,
                 p->buffer, (unsigned long long)address);
        return r;
      }
    }
  }
  for (uint32_t i = 0; i < h->num_zeros; ++i) {
    if (buffer_index(plan->zeros[i].buffer, num_buffers, h->num_pointers + h->num_maps + i, error, error_size))
      return -1;
  }
  if (inspecting) {
    memcpy(inspect, params, h->params_size);
    return 0;
  }
  for (uint32_t i = 0; i < h->num_zeros; ++i) {
    const dash_plan_patch *z = &plan->zeros[i];
    int r = cu_memset(buffers[z->buffer], 0, z->add, stream);
    if (r) {
      snprintf(error, error_size, "cuMemsetD8Async failed (CUresult %d) for buffer %u", r, z->buffer);
      return r;
    }
  }
  for (uint32_t i = 0; i < h->num_kernels; ++i) {
    int r = dash_launch_kernel(&plan->kernels[i], params, stream, error, error_size);
    if (r) {
      size_t n = strlen(error);
      snprintf(error + n, error_size - n, " for kernel %u of %u", i, h->num_kernels);
      return r;
    }
  }
  return 0;
}

int dash_launch_kernel(const dash_plan_kernel *k, void *params, void *stream, char *error, size_t error_size) {
  if (!load_driver()) {
    snprintf(error, error_size, "libcuda.so.1 cannot be opened, or lacks cuLaunchKernel");
    return -1;
  }
  void *args[1] = {params};
  int r = cu_launch((void *)(uintptr_t)k->function, k->grid[0], k->grid[1], k->grid[2], k->block[0], k->block[1],
                    k->block[2], k->smem, stream, args, NULL);
  if (r) snprintf(error, error_size, "cuLaunchKernel failed (CUresult %d)", r);
  return r;
}
