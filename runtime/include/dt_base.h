/* dt_base.h: status codes, thread-local error messages, dtypes, devices and threading. */
#ifndef DT_BASE_H
#define DT_BASE_H
#ifndef DT_FFI
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#endif

/* Every fallible function returns a dt_status; on failure dt_last_error() says why. LuaJIT returns a C enum as a new
 * cdata object, garbage on every call of an op: the FFI (DT_FFI, dt/cdef.lua) declares the status as the int it is,
 * which comes back as a plain number. */
#ifdef DT_FFI
typedef int dt_status;
#else
typedef enum {
  DT_OK = 0,
  DT_ERR_ARG = -1,    /* bad argument: shape, dtype, range */
  DT_ERR_OOM = -2,    /* allocation failed */
  DT_ERR_IO = -3,     /* file or socket error */
  DT_ERR_STATE = -4,  /* call not valid in this state */
  DT_ERR_UNSUPPORTED = -5,
  DT_ERR_CORRUPT = -6 /* checksum or format mismatch */
} dt_status;
#endif

const char *dt_last_error(void);
void dt_clear_error(void);

typedef enum {
  DT_DTYPE_F32 = 0,
  DT_DTYPE_F64 = 1,
  DT_DTYPE_BF16 = 2,
  DT_DTYPE_F16 = 3,
  DT_DTYPE_I32 = 4,
  DT_DTYPE_I64 = 5,
  DT_DTYPE_U8 = 6,
  DT_DTYPE_BOOL = 7,
  DT_DTYPE_COUNT = 8
} dt_dtype;

size_t dt_dtype_size(int dtype);
const char *dt_dtype_name(int dtype);
bool dt_dtype_is_float(int dtype);

typedef enum { DT_DEVICE_CPU = 0, DT_DEVICE_CUDA = 1 } dt_device_type;

typedef struct dt_device {
  int32_t type;  /* dt_device_type */
  int32_t index; /* cuda:N; 0 for cpu */
} dt_device;

/* Number of devices of a type this build and machine can use (cpu: 1; cuda: 0 in CPU-only builds and without a GPU;
 * the emulation build has DT_EMU_DEVICES, default 1). */
int dt_device_count(int device_type);

/* How libdt was built for CUDA: none (DT_CUDA=OFF), the real backend (nvcc kernels on the CUDA runtime; devices only
 * where a GPU and driver are present), or its CPU emulation (DT_CUDA=EMULATE: the same kernels on fibers). */
typedef enum { DT_CUDA_BUILD_NONE = 0, DT_CUDA_BUILD_REAL = 1, DT_CUDA_BUILD_EMULATED = 2 } dt_cuda_build_kind;
int dt_cuda_build(void);

/* Threads used by CPU kernels (OpenMP and OpenBLAS). Default: DT_NUM_THREADS,
 * else OMP_NUM_THREADS, else online cores / DT_LOCAL_WORLD_SIZE. */
int dt_threads_get(void);
dt_status dt_threads_set(int n);

/* Size in bytes of a struct that Lua reads directly, so a spec can compare with ffi.sizeof. */
size_t dt_abi_sizeof(const char *type_name);

/* Catch `signum` (e.g. SIGTERM) into a flag instead of dying, so a training loop can finish its
 * step and checkpoint; dt_signal_take() returns a caught signal number once (0 if none).
 * dt_signal_restore puts the default action back. */
dt_status dt_signal_watch(int signum);
int dt_signal_take(void);
void dt_signal_restore(int signum);

/* Absolute path of the running executable (dtrun), for re-executing it as a worker. */
const char *dt_exe_path(void);

/* Monotonic clock in seconds. */
double dt_time_now(void);

#endif
