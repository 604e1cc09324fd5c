/* cupy_dash's XLA FFI handler: runs a prepared launch plan (cupy_dash/cuda/launch_plan.h) on XLA's stream, with
 * no Python.
 *
 * Per call: find the plan of this device (attribute "slots": int64 array, slot id per device ordinal, -1 none, then
 * this process's token: a program compiled in another process, serialized and loaded here, names slots that hold
 * other plans, and is refused) and run it with the call's buffers (arguments, then results) through dash_plan_run,
 * the executor every cupy_dash launch shares. No allocation, no synchronization, no module load: the launches depend
 * only on the addresses and the plan, so the handler declares itself command-buffer compatible (XLA may record the
 * launches into a CUDA graph and replay them). The extension links against glibc only (libcuda is opened at run
 * time).
 */
#include "xla_ffi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DASH_MAX_SLOTS 65536

static dash_plan *slots[DASH_MAX_SLOTS];
static int64_t num_slots;
static int64_t process_token;    /* drawn at the first registration (callers serialize), never 0 */

int64_t dash_ffi_process_token(void) { return process_token; }

static void draw_process_token(void) {
  FILE *f = fopen("/dev/urandom", "rb");
  uint64_t t = 0;
  if (!f || fread(&t, sizeof t, 1, f) != 1) t = (uint64_t)(uintptr_t)&t ^ ((uint64_t)getpid() << 32);
  if (f) fclose(f);
  __atomic_store_n(&process_token, (int64_t)(t | 1), __ATOMIC_RELEASE);
}

/* ---- plans (registered from Python, at trace time) ---------------------------------------------------------- */
int dash_plan_register(const void *blob, size_t size, char *error, size_t error_size) {
  dash_plan view;
  if (dash_plan_view(blob, size, &view, error, error_size)) return -1;
  if (!process_token) draw_process_token();
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
  memcpy(plan + 1, blob, size);
  dash_plan_view(plan + 1, size, plan, error, error_size);
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
  if (!slot_ids || slot_ids->size < 1)
    return fail(api, DASH_FFI_INVALID_ARGUMENT, "cupy_dash: attribute 'slots' (int64 array) missing");
  size_t devices = slot_ids->size - 1;
  if (((const int64_t *)slot_ids->data)[devices] != __atomic_load_n(&process_token, __ATOMIC_ACQUIRE))
    return fail(api, DASH_FFI_FAILED_PRECONDITION, "cupy_dash: this program was compiled in another process (its "
                                                   "launch plans live there): trace and compile it in this one");
  int64_t slot = -1;
  if (og.device_ordinal >= 0 && (size_t)og.device_ordinal < devices)
    slot = ((const int64_t *)slot_ids->data)[og.device_ordinal];
  if (slot < 0 || slot >= __atomic_load_n(&num_slots, __ATOMIC_ACQUIRE)) {
    snprintf(msg, sizeof msg, "cupy_dash: this call was not prepared for device %d when it was traced (no plan)",
             (int)og.device_ordinal);
    return fail(api, DASH_FFI_FAILED_PRECONDITION, msg);
  }
  const dash_plan *plan = __atomic_load_n(&slots[slot], __ATOMIC_ACQUIRE);
  int64_t nbuf = cf->args.size + cf->rets.size;
  uint64_t buffers[DASH_PLAN_MAX_BUFFERS];
  if (nbuf > DASH_PLAN_MAX_BUFFERS) return fail(api, DASH_FFI_INTERNAL, "cupy_dash: too many buffers for a plan");
  for (int64_t i = 0; i < nbuf; ++i) {
    const dash_ffi_buffer *b = i < cf->args.size ? cf->args.items[i] : cf->rets.items[i - cf->args.size];
    buffers[i] = (uint64_t)(uintptr_t)b->data;
  }
  void *stream = NULL;
  unsigned char *inspect = NULL;
  if (plan->header.flags & DASH_PLAN_INSPECT) {   /* the patched block goes to the last result */
    if (cf->rets.size < 1) return fail(api, DASH_FFI_INVALID_ARGUMENT, "cupy_dash: an inspect plan needs a result");
    inspect = ((const dash_ffi_buffer *)cf->rets.items[cf->rets.size - 1])->data;
  } else {
    dash_ffi_stream_get_args sg;
    memset(&sg, 0, sizeof sg);
    sg.struct_size = offsetof(dash_ffi_stream_get_args, stream) + sizeof sg.stream;
    sg.ctx = cf->ctx;
    e = api->stream_get(&sg);
    if (e) return e;
    stream = sg.stream;
  }
  char error[200];
  int r = dash_plan_run(plan, buffers, (size_t)nbuf, stream, inspect, error, sizeof error);
  if (r) {
    snprintf(msg, sizeof msg, "cupy_dash: %s", error);
    return fail(api, r < 0 ? DASH_FFI_INTERNAL : DASH_FFI_INVALID_ARGUMENT, msg);
  }
  return NULL;
}

void *dash_ffi_handler_address(void) { return (void *)dash_ffi_handler; }
