/* cupy_dash's XLA FFI handler: launches a prepared plan (xla_ffi.h) on XLA's stream, with no Python.
 *
 * Per call: find the plan of this device (attribute "slots": int64 array, slot id per device ordinal, -1 none),
 * copy its parameter template, write the buffers' addresses into it (plain pointers, and the tensor maps through
 * cuTensorMapReplaceAddress), launch its kernels with cuLaunchKernel on the stream XLA gives. No allocation, no
 * synchronization, no module load: the launches depend only on the addresses and the plan, so the handler
 * declares itself command-buffer compatible (XLA may record the launches into a CUDA graph and replay them).
 * The driver entry points come from the libcuda that XLA already loaded (dlopen RTLD_NOLOAD), so the extension
 * links against glibc only.
 */
#include "xla_ffi.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DASH_MAX_SLOTS 65536

typedef struct {
  dash_plan_header header;
  const dash_plan_kernel *kernels;
  const dash_plan_patch *pointers, *maps, *zeros;
  const unsigned char *params;
} dash_plan;

static dash_plan *slots[DASH_MAX_SLOTS];
static int64_t num_slots;

typedef int (*cu_launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                            void **, void **);
typedef int (*cu_replace_fn)(void *, void *);
typedef int (*cu_memset_fn)(uint64_t, unsigned char, size_t, void *);
static cu_launch_fn cu_launch;
static cu_replace_fn cu_replace;
static cu_memset_fn cu_memset;

/* ---- plans (registered from Python, at trace time) ---------------------------------------------------------- */
int dash_plan_register(const void *blob, size_t size, char *error, size_t error_size) {
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
  const dash_plan_patch *p = (const dash_plan_patch *)((const char *)blob + sizeof h + h.num_kernels *
                                                                                           sizeof(dash_plan_kernel));
  for (uint32_t i = 0; i < h.num_pointers + h.num_maps; ++i) {
    uint32_t width = i < h.num_pointers ? 8 : 128;
    if (p[i].offset % (i < h.num_pointers ? 8 : 64) || (size_t)p[i].offset + width > h.params_size) {
      snprintf(error, error_size, "plan: patch %u at offset %u is misaligned or outside the %u-byte block", i,
               p[i].offset, h.params_size);
      return -1;
    }
  }
  if (num_slots >= DASH_MAX_SLOTS) {
    snprintf(error, error_size, "plan: all %d slots are taken", DASH_MAX_SLOTS);
    return -1;
  }
  /* one block, never freed (compiled programs may use the slot for the life of the process) */
  dash_plan *plan = malloc(sizeof *plan + size);
  if (!plan) {
    snprintf(error, error_size, "plan: out of host memory");
    return -1;
  }
  char *copy = (char *)(plan + 1);
  memcpy(copy, blob, size);
  plan->header = h;
  plan->kernels = (const dash_plan_kernel *)(copy + sizeof h);
  plan->pointers = (const dash_plan_patch *)(plan->kernels + h.num_kernels);
  plan->maps = plan->pointers + h.num_pointers;
  plan->zeros = plan->maps + h.num_maps;
  plan->params = (const unsigned char *)(plan->zeros + h.num_zeros);
  int64_t slot = num_slots;                            /* callers serialize registration (a Python lock) */
  __atomic_store_n(&slots[slot], plan, __ATOMIC_RELEASE);
  __atomic_store_n(&num_slots, slot + 1, __ATOMIC_RELEASE);
  return (int)slot;
}

/* ---- the handler -------------------------------------------------------------------------------------------- */
static dash_ffi_error *fail(const dash_ffi_api *api, int code, const char *message) {
  dash_ffi_error_create_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = offsetof(dash_ffi_error_create_args, errc) + sizeof a.errc;
  a.message = message;
  a.errc = code;
  return api->error_create(&a);
}

static const dash_ffi_array *int64_array_attr(const dash_ffi_attrs *attrs, const char *name) {
  size_t n = strlen(name);
  for (int64_t i = 0; i < attrs->size; ++i) {
    const dash_ffi_bytes *s = attrs->names[i];
    if (s->len == n && memcmp(s->ptr, name, n) == 0) {
      const dash_ffi_array *a = attrs->attrs[i];
      return attrs->types[i] == DASH_FFI_ATTR_ARRAY && a->dtype == DASH_FFI_S64 ? a : NULL;
    }
  }
  return NULL;
}

static int load_driver(void) {
  if (cu_launch && cu_replace && cu_memset) return 1;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) return 0;
  cu_replace_fn replace = (cu_replace_fn)dlsym(lib, "cuTensorMapReplaceAddress");
  cu_launch_fn launch = (cu_launch_fn)dlsym(lib, "cuLaunchKernel");
  cu_memset_fn memset_async = (cu_memset_fn)dlsym(lib, "cuMemsetD8Async");
  if (!replace || !launch || !memset_async) return 0;
  cu_replace = replace;
  cu_launch = launch;
  cu_memset = memset_async;
  return 1;
}

static const dash_ffi_buffer *buffer_at(const dash_ffi_call_frame *cf, uint32_t i) {
  return i < cf->args.size ? cf->args.items[i] : cf->rets.items[i - cf->args.size];
}

static dash_ffi_error *dash_ffi_handler(dash_ffi_call_frame *cf) {
  if (cf->extension_start && cf->extension_start->type == DASH_FFI_EXTENSION_METADATA) {
    dash_ffi_metadata *m = ((dash_ffi_metadata_extension *)cf->extension_start)->metadata;
    m->api_version.major_version = DASH_FFI_API_MAJOR;
    m->api_version.minor_version = DASH_FFI_API_MINOR;
    m->traits = DASH_FFI_TRAIT_COMMAND_BUFFER_COMPATIBLE;
    return NULL;
  }
  const dash_ffi_api *api = cf->api;
  if (cf->stage != DASH_FFI_STAGE_EXECUTE) return NULL;
  char msg[256];
  if (api->struct_size < offsetof(dash_ffi_api, device_ordinal_get) + sizeof(void *) || !api->device_ordinal_get)
    return fail(api, DASH_FFI_FAILED_PRECONDITION, "cupy_dash: this XLA has no XLA_FFI_DeviceOrdinal_Get");
  dash_ffi_ordinal_get_args og;
  memset(&og, 0, sizeof og);
  og.struct_size = offsetof(dash_ffi_ordinal_get_args, device_ordinal) + sizeof og.device_ordinal;
  og.ctx = cf->ctx;
  dash_ffi_error *e = api->device_ordinal_get(&og);
  if (e) return e;
  const dash_ffi_array *slot_ids = int64_array_attr(&cf->attrs, "slots");
  if (!slot_ids) return fail(api, DASH_FFI_INVALID_ARGUMENT, "cupy_dash: attribute 'slots' (int64 array) missing");
  int64_t slot = -1;
  if (og.device_ordinal >= 0 && (size_t)og.device_ordinal < slot_ids->size)
    slot = ((const int64_t *)slot_ids->data)[og.device_ordinal];
  if (slot < 0 || slot >= __atomic_load_n(&num_slots, __ATOMIC_ACQUIRE)) {
    snprintf(msg, sizeof msg, "cupy_dash: this call was not prepared for device %d when it was traced (no plan)",
             (int)og.device_ordinal);
    return fail(api, DASH_FFI_FAILED_PRECONDITION, msg);
  }
  const dash_plan *plan = __atomic_load_n(&slots[slot], __ATOMIC_ACQUIRE);
  const dash_plan_header *h = &plan->header;
  int64_t nbuf = cf->args.size + cf->rets.size;
  _Alignas(64) unsigned char params[DASH_PLAN_MAX_PARAMS];
  memcpy(params, plan->params, h->params_size);
  for (uint32_t i = 0; i < h->num_pointers + h->num_maps; ++i) {
    const dash_plan_patch *p = i < h->num_pointers ? &plan->pointers[i] : &plan->maps[i - h->num_pointers];
    if (p->buffer >= nbuf) {
      snprintf(msg, sizeof msg, "cupy_dash: plan patch %u names buffer %u of %lld", i, p->buffer, (long long)nbuf);
      return fail(api, DASH_FFI_INTERNAL, msg);
    }
    uint64_t address = (uint64_t)(uintptr_t)buffer_at(cf, p->buffer)->data + p->add;
    if (i < h->num_pointers) {
      memcpy(params + p->offset, &address, 8);
    } else if (!(h->flags & DASH_PLAN_INSPECT)) {
      if (!load_driver()) return fail(api, DASH_FFI_FAILED_PRECONDITION, "cupy_dash: libcuda is not loaded");
      int r = cu_replace(params + p->offset, (void *)(uintptr_t)address);
      if (r) {
        snprintf(msg, sizeof msg, "cupy_dash: cuTensorMapReplaceAddress failed (CUresult %d) for buffer %u at %#llx",
                 r, p->buffer, (unsigned long long)address);
        return fail(api, DASH_FFI_INVALID_ARGUMENT, msg);
      }
    }
  }
  if (h->flags & DASH_PLAN_INSPECT) {
    if (cf->rets.size < 1) return fail(api, DASH_FFI_INVALID_ARGUMENT, "cupy_dash: an inspect plan needs a result");
    const dash_ffi_buffer *out = cf->rets.items[cf->rets.size - 1];
    memcpy(out->data, params, h->params_size);
    return NULL;
  }
  dash_ffi_stream_get_args sg;
  memset(&sg, 0, sizeof sg);
  sg.struct_size = offsetof(dash_ffi_stream_get_args, stream) + sizeof sg.stream;
  sg.ctx = cf->ctx;
  e = api->stream_get(&sg);
  if (e) return e;
  if (!load_driver()) return fail(api, DASH_FFI_FAILED_PRECONDITION, "cupy_dash: libcuda is not loaded");
  for (uint32_t i = 0; i < h->num_zeros; ++i) {
    const dash_plan_patch *z = &plan->zeros[i];
    if (z->buffer >= nbuf) return fail(api, DASH_FFI_INTERNAL, "cupy_dash: plan zeroes a buffer it does not have");
    int r = cu_memset((uint64_t)(uintptr_t)buffer_at(cf, z->buffer)->data, 0, z->add, sg.stream);
    if (r) {
      snprintf(msg, sizeof msg, "cupy_dash: cuMemsetD8Async failed (CUresult %d) for buffer %u", r, z->buffer);
      return fail(api, DASH_FFI_INTERNAL, msg);
    }
  }
  void *args[1] = {params};
  for (uint32_t i = 0; i < h->num_kernels; ++i) {
    const dash_plan_kernel *k = &plan->kernels[i];
    int r = cu_launch((void *)(uintptr_t)k->function, k->grid[0], k->grid[1], k->grid[2], k->block[0], k->block[1],
                      k->block[2], k->smem, sg.stream, args, NULL);
    if (r) {
      snprintf(msg, sizeof msg, "cupy_dash: cuLaunchKernel failed (CUresult %d) for kernel %u of the plan", r, i);
      return fail(api, DASH_FFI_INTERNAL, msg);
    }
  }
  return NULL;
}

void *dash_ffi_handler_address(void) { return (void *)dash_ffi_handler; }
