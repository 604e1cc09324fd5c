/* A stand-in for libcuda.so.1 with the three entry points the launch-plan executor calls (cupy_dash/cuda/launch_plan.c),
 * for tests/unit/test_launch_plan_driver.py: each call is appended as one line of text to the file named by
 * FAKE_CUDA_LOG. cuTensorMapReplaceAddress writes the address over the map's first 8 bytes; cuLaunchKernel logs
 * the first FAKE_CUDA_PARAMS bytes of its parameter block in hex, and returns 700 for the launch numbered
 * FAKE_CUDA_FAIL_LAUNCH (counted from 0), 0 otherwise. Not a test module: built by the test. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *log_file(void) {
  static FILE *f;
  if (!f) f = fopen(getenv("FAKE_CUDA_LOG"), "a");
  return f;
}

int cuTensorMapReplaceAddress(void *map, void *address) {
  uint64_t a = (uint64_t)(uintptr_t)address;
  memcpy(map, &a, 8);
  fprintf(log_file(), "replace %llu\n", (unsigned long long)a);
  fflush(log_file());
  return 0;
}

int cuMemsetD8Async(uint64_t dst, unsigned char value, size_t n, void *stream) {
  fprintf(log_file(), "memset %llu %u %zu %llu\n", (unsigned long long)dst, value, n,
          (unsigned long long)(uintptr_t)stream);
  fflush(log_file());
  return 0;
}

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem,
                   void *stream, void **params, void **extra) {
  static int launches;
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
