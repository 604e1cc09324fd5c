/* A stand-in for libcuda.so.1 with the three entry points the launch-plan executor calls (cupy_dash/cuda/launch_plan.c),
 * for tests/unit/test_launch_plan_driver.py: each call is appended as one line of text to the file named by
 * FAKE_CUDA_LOG. cuTensorMapReplaceAddress writes the address over the map's first 8 bytes; cuLaunchKernel logs
 * the first FAKE_CUDA_PARAMS bytes of its parameter block in hex, and returns 700 for the launch numbered
 * FAKE_CUDA_FAIL_LAUNCH (counted from 0), 0 otherwise. With FAKE_CUDA_NO_CONTEXT set, the memset and the launch
 * return CUDA_ERROR_INVALID_CONTEXT (201, logged "nocontext <call>") until fake_cuda_bind() (the test's stand-in
 * for binding a context) has been called. Not a test module: built by the test. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *log_file(void) {
  static FILE *f;
  if (!f) f = fopen(getenv("FAKE_CUDA_LOG"), "a");
  return f;
}

static int bound;

void fake_cuda_bind(void) {
  bound = 1;
  fprintf(log_file(), "bind\n");
  fflush(log_file());
}

static int no_context(const char *call) {
  if (!getenv("FAKE_CUDA_NO_CONTEXT") || bound) return 0;
  fprintf(log_file(), "nocontext %s\n", call);
  fflush(log_file());
  return 1;
}

int cuTensorMapReplaceAddress(void *map, void *address) {
  uint64_t a = (uint64_t)(uintptr_t)address;
  memcpy(map, &a, 8);
  fprintf(log_file(), "replace %llu\n", (unsigned long long)a);
  fflush(log_file());
  return 0;
}

int cuMemsetD8Async(uint64_t dst, unsigned char value, size_t n, void *stream) {
  if (no_context("memset")) return 201;
  fprintf(log_file(), "memset %llu %u %zu %llu\n", (unsigned long long)dst, value, n,
          (unsigned long long)(uintptr_t)stream);
  fflush(log_file());
  return 0;
}

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem,
                   void *stream, void **params, void **extra) {
  static int launches;
  if (no_context("launch")) return 201;
  const char *fail = getenv("FAKE_CUDA_FAIL_LAUNCH");
  size_t n = (size_t)atol(getenv("FAKE_CUDA_PARAMS"));
  const unsigned char *p = params[0];
  fprintf(log_file(), "launch %llu %u %u %u %u %u %u %u %llu %d ", (unsigned long long)(uintptr_t)f, gx, gy, gz, bx,
          by, bz, smem, (unsigned long long)(uintptr_t)stream, extra == NULL);
  for (size_t i = 0; i < n; ++i) fprintf(log_file(), "%02x", p[i]);
  fprintf(log_file(), "\n");
  fflush(log_file());
  return fail && atoi(fail) == launches++ ? 700 : 0;
}
