/* dt_tensor.h: refcounted storage, strided tensor views and pool-accounted allocation. */
#ifndef DT_TENSOR_H
#define DT_TENSOR_H
#include "dt_base.h"

enum { DT_MAX_DIMS = 8 };

/* Memory pools; every byte a tensor holds is counted in exactly one. DT_POOL_DEVICE and DT_POOL_PINNED are the CUDA
 * backend's own accounting (dt_cuda_memory_stats; all devices together), zero in CPU-only builds. */
typedef enum { DT_POOL_HOST = 0, DT_POOL_PINNED = 1, DT_POOL_DEVICE = 2, DT_POOL_COUNT = 3 } dt_pool;

typedef struct dt_pool_stats {
  int64_t live_bytes;
  int64_t peak_bytes;
  int64_t alloc_count;
} dt_pool_stats;

dt_status dt_pool_stats_get(int pool, dt_pool_stats *out);
/* Start a new peak window: peak := live. */
void dt_pool_reset_peak(int pool);

typedef struct dt_storage dt_storage; /* opaque, refcounted */

/* A strided view of a storage. Strides and offset count elements, not bytes.
 * Lua reads these fields directly (see spec/abi_spec.lua). */
typedef struct dt_tensor {
  void *data; /* storage base (element 0 of the storage, not of the view) */
  dt_storage *storage;
  int64_t shape[8];
  int64_t strides[8];
  int64_t offset;
  int32_t ndim;
  int32_t dtype;
  dt_device device;
} dt_tensor;

/* New contiguous tensor, uninitialised (dt_tensor_zeros: filled with zeros), on `device`: host memory for cpu,
 * stream-ordered device memory (dt_cuda_malloc on the device's compute stream) for cuda:N. A device that this build or
 * machine lacks is an error naming it. */
dt_status dt_tensor_empty(int ndim, const int64_t *shape, int dtype, dt_device device, dt_tensor **out);
/* dt_tensor_empty on the device of `device_of`: what an op makes its outputs with (through the FFI a dt_device read
 * from a tensor is a new cdata object, garbage on every call; a tensor's handle is not). */
dt_status dt_tensor_empty_on(int ndim, const int64_t *shape, int dtype, const dt_tensor *device_of, dt_tensor **out);
dt_status dt_tensor_zeros(int ndim, const int64_t *shape, int dtype, dt_device device, dt_tensor **out);
/* A tensor over memory the caller owns (e.g. an mmap'd file); never freed by dt. */
dt_status dt_tensor_wrap(void *data, int ndim, const int64_t *shape, int dtype, dt_tensor **out);
/* Release the view; the storage is freed when its last view goes. NULL is fine. */
void dt_tensor_free(dt_tensor *t);
/* Drop the storage's bytes now even if other views exist (they become empty). */
void dt_tensor_release_storage(dt_tensor *t);

/* A new view sharing storage: arbitrary shape/strides/offset, bounds-checked. */
dt_status dt_tensor_view(const dt_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                         int64_t offset, dt_tensor **out);
/* A new row-major view of contiguous t with another shape of as many elements, at t's offset. */
dt_status dt_tensor_reshape(const dt_tensor *t, int ndim, const int64_t *shape, dt_tensor **out);
/* dst[i] becomes the view of src's storage with the ndim, shape and strides of layouts[i] at element src->offset +
 * layouts[i].offset, in place: its handle is kept and its previous storage released (the layouts are descriptors:
 * only those fields are read). Every view is checked before any changes. FSDP binds and unbinds its parameters so
 * every step, one call a unit instead of a new handle a parameter. */
dt_status dt_tensor_set_views(int n, dt_tensor *const *dst, const dt_tensor *src, const dt_tensor *layouts);

int64_t dt_tensor_numel(const dt_tensor *t);
/* t's shape into shape[0 .. ndim - 1] and, unless strides is NULL, its strides, as doubles (exact below 2^53): Lua
 * reads them without a new object each (the FFI boxes every int64_t it reads outside compiled code, and the array
 * fields of a struct too). */
void dt_tensor_dims_f64(const dt_tensor *t, double *shape, double *strides);
bool dt_tensor_is_contiguous(const dt_tensor *t);
/* True when t is its storage's only view and covers all of it (offset 0, contiguous, every byte): writing into it
 * changes no other tensor. */
bool dt_tensor_owns_storage(const dt_tensor *t);
/* Pointer to element 0 of the view. */
void *dt_tensor_ptr(const dt_tensor *t);
int64_t dt_storage_nbytes(const dt_storage *s);
int dt_storage_refcount(const dt_storage *s);

/* dst := src, with broadcasting of src and dtype conversion; any strides; any devices (host <-> cuda:N and between
 * cuda devices: one dt_cuda_memcpy when both are contiguous with one dtype and shape, else staged through contiguous
 * temporaries). A copy into host memory (pinned included) has landed when the call returns; one from host memory has
 * read its source. */
dt_status dt_tensor_copy(dt_tensor *dst, const dt_tensor *src);
/* Every element := value (converted to dst's dtype). On a cuda device it is queued on the compute stream. */
dt_status dt_tensor_fill(dt_tensor *dst, double value);
/* Read/write one element at a flat index of the view (row-major), as double. For tests and printing: on a cuda device
 * each is a small synchronous copy (get waits for the compute stream and reports device-side errors). */
dt_status dt_tensor_get(const dt_tensor *t, int64_t flat_index, double *out);
dt_status dt_tensor_set(dt_tensor *t, int64_t flat_index, double value);

/* bf16/f16 conversion helpers (round to nearest even). */
float dt_bf16_to_f32(uint16_t h);
uint16_t dt_f32_to_bf16(float f);
float dt_f16_to_f32(uint16_t h);
uint16_t dt_f32_to_f16(float f);

#endif
