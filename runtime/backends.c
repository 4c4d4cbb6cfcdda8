/* backends.c: the list of backends in this build (the only file above them that names them), and their lookup. */
#include "dispatch.h"
#include "cpu/cpu_backend.h"
#if DT_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

const dt_backend *dt_backend_get(int device_type) {
  if (device_type == DT_DEVICE_CPU) return &dt_cpu_backend;
#if DT_HAVE_CUDA
  if (device_type == DT_DEVICE_CUDA) return &dt_cuda_backend;
#endif
  return NULL;
}

dt_status dt_backend_of(dt_device device, const char *what, const dt_backend **out) {
  *out = dt_backend_get(device.type);
  if (*out) return DT_OK;
  char b[32];
  dt_device_str(device, b, sizeof b);
  DT_CHECK(device.type == DT_DEVICE_CUDA, DT_ERR_ARG, "%s: unknown %s", what, b);
  return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: %s is not available in this build (CPU only)", what, b);
}

#if !DT_HAVE_CUDA
int dt_cuda_build(void) { return DT_CUDA_BUILD_NONE; } /* the CUDA builds define it in runtime/cuda/device.c */
#endif
