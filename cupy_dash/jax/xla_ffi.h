/* The part of the XLA FFI C ABI (xla/ffi/api/c_api.h, API 0.x) that cupy_dash's handler uses, declared here so
 * that building the package needs neither jaxlib nor a CUDA toolkit. Every XLA struct starts with its size, and
 * minor API versions only append fields, so a struct declared up to the last field we read is valid for every
 * later minor version. tests/adapters/test_jax_ffi.py compiles static_asserts of these layouts against jaxlib's header
 * when jaxlib is installed.
 */
#ifndef CUPY_DASH_XLA_FFI_H_
#define CUPY_DASH_XLA_FFI_H_

#include <stddef.h>
#include <stdint.h>

#include "launch_plan.h"

/* the API version this handler declares in its metadata (XLA accepts older minor versions for 12 months) */
#define DASH_FFI_API_MAJOR 0
#define DASH_FFI_API_MINOR 3

enum { DASH_FFI_EXTENSION_METADATA = 1 };
enum { DASH_FFI_STAGE_EXECUTE = 3 };
enum { DASH_FFI_ATTR_ARRAY = 1 };
enum { DASH_FFI_S64 = 5 };
enum { DASH_FFI_TRAIT_COMMAND_BUFFER_COMPATIBLE = 1 };
enum { DASH_FFI_INVALID_ARGUMENT = 3, DASH_FFI_FAILED_PRECONDITION = 9, DASH_FFI_INTERNAL = 13 };

typedef struct dash_ffi_error dash_ffi_error;          /* XLA_FFI_Error (opaque) */
typedef struct dash_ffi_context dash_ffi_context;      /* XLA_FFI_ExecutionContext (opaque) */

typedef struct dash_ffi_extension {                    /* XLA_FFI_Extension_Base */
  size_t struct_size;
  int type;
  struct dash_ffi_extension *next;
} dash_ffi_extension;

typedef struct {                                       /* XLA_FFI_Api_Version */
  size_t struct_size;
  dash_ffi_extension *extension_start;
  int major_version, minor_version;
} dash_ffi_version;

typedef struct {                                       /* XLA_FFI_Metadata (up to traits) */
  size_t struct_size;
  dash_ffi_version api_version;
  uint32_t traits;
} dash_ffi_metadata;

typedef struct {                                       /* XLA_FFI_Metadata_Extension */
  dash_ffi_extension extension_base;
  dash_ffi_metadata *metadata;
} dash_ffi_metadata_extension;

typedef struct {                                       /* XLA_FFI_Error_Create_Args */
  size_t struct_size;
  dash_ffi_extension *extension_start;
  const char *message;
  int errc;
} dash_ffi_error_create_args;

typedef struct {                                       /* XLA_FFI_Stream_Get_Args */
  size_t struct_size;
  dash_ffi_extension *extension_start;
  dash_ffi_context *ctx;
  void *stream;                                        /* out: CUstream */
} dash_ffi_stream_get_args;

typedef struct {                                       /* XLA_FFI_DeviceOrdinal_Get_Args */
  size_t struct_size;
  dash_ffi_extension *extension_start;
  dash_ffi_context *ctx;
  int32_t device_ordinal;                              /* out */
} dash_ffi_ordinal_get_args;

typedef dash_ffi_error *dash_ffi_fn(void *args);      /* every API function: one args struct, maybe an error */

typedef struct {                                       /* XLA_FFI_Api, up to XLA_FFI_DeviceOrdinal_Get */
  size_t struct_size;
  dash_ffi_extension *extension_start;
  dash_ffi_version api_version;
  const void *internal_api;
  dash_ffi_fn *error_create;                           /* XLA_FFI_Error_Create */
  void *error_get_message, *error_destroy, *handler_register;
  dash_ffi_fn *stream_get;                             /* XLA_FFI_Stream_Get */
  void *type_register, *execution_context_get, *state_set, *state_get, *device_memory_allocate,
      *device_memory_free, *thread_pool_schedule, *thread_pool_num_threads, *future_create,
      *future_set_available, *future_set_error, *run_id_get;
  dash_ffi_fn *device_ordinal_get;                     /* XLA_FFI_DeviceOrdinal_Get */
} dash_ffi_api;

typedef struct {                                       /* XLA_FFI_Buffer */
  size_t struct_size;
  dash_ffi_extension *extension_start;
  int dtype;
  void *data;
  int64_t rank;
  int64_t *dims;
} dash_ffi_buffer;

typedef struct { const char *ptr; size_t len; } dash_ffi_bytes;             /* XLA_FFI_ByteSpan */
typedef struct { int dtype; size_t size; void *data; } dash_ffi_array;      /* XLA_FFI_Array */

typedef struct {                                       /* XLA_FFI_Args and XLA_FFI_Rets */
  size_t struct_size;
  dash_ffi_extension *extension_start;
  int64_t size;
  int *types;
  void **items;                                        /* dash_ffi_buffer* each */
} dash_ffi_list;

typedef struct {                                       /* XLA_FFI_Attrs */
  size_t struct_size;
  dash_ffi_extension *extension_start;
  int64_t size;
  int *types;
  dash_ffi_bytes **names;
  void **attrs;
} dash_ffi_attrs;

typedef struct {                                       /* XLA_FFI_CallFrame (up to attrs) */
  size_t struct_size;
  dash_ffi_extension *extension_start;
  const dash_ffi_api *api;
  dash_ffi_context *ctx;
  int stage;
  dash_ffi_list args;
  dash_ffi_list rets;
  dash_ffi_attrs attrs;
} dash_ffi_call_frame;

/* Launch plans (cupy_dash/cuda/launch_plan.h) are registered from Python at trace time into a table of slots
 * that lives for the life of the process; the custom call's attribute "slots" names each device's. */
int dash_plan_register(const void *blob, size_t size, char *error, size_t error_size);
int64_t dash_ffi_process_token(void);
void *dash_ffi_handler_address(void);

#endif
