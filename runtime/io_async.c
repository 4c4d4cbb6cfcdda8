/* io_async.c: background file writes (dt_io_write_async): header + tensor bytes, CRC32, fsync, on their own thread. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "dt_internal.h"
#include "dt_io.h"

struct dt_io_job {
  pthread_t thread;
  bool joined;
  atomic_bool done;
  char path[4096];
  char *header;
  size_t header_len;
  dt_tensor **tensors; /* the job's own views; freed by the thread once written */
  int count;
  /* results, written by the thread before `done` */
  dt_status status;
  char message[1024];
  int64_t size;
  uint32_t crc;
};

static void free_views(dt_io_job *j) {
  for (int i = 0; i < j->count; i++) dt_tensor_free(j->tensors[i]);
  free(j->tensors);
  j->tensors = NULL;
  j->count = 0;
}

/* Runs on the job's thread; error messages are thread-local, so the thread copies its own into the job. */
static void *write_job(void *arg) {
  dt_io_job *j = arg;
  dt_file *f = NULL;
  uint32_t crc = 0;
  int64_t size = 0;
  dt_status st = dt_io_open_write(j->path, &f);
  if (st == DT_OK && j->header_len) st = dt_io_write(f, j->header, j->header_len, &crc);
  size += (int64_t)j->header_len;
  for (int i = 0; i < j->count && st == DT_OK; i++) {
    st = dt_io_write_tensor(f, j->tensors[i], &crc);
    size += dt_tensor_numel(j->tensors[i]) * (int64_t)dt_dtype_size(j->tensors[i]->dtype);
  }
  if (f) {
    dt_status cst = dt_io_close(f);
    if (st == DT_OK) st = cst;
  }
  if (st != DT_OK) snprintf(j->message, sizeof j->message, "%s", dt_last_error());
  free_views(j); /* the snapshot's bytes go as soon as they are on disk */
  j->status = st;
  j->size = size;
  j->crc = crc;
  atomic_store(&j->done, true);
  return NULL;
}

static void job_free_unstarted(dt_io_job *j) {
  free_views(j);
  free(j->header);
  free(j);
}

dt_status dt_io_write_async(const char *path, const void *header, size_t n, const dt_tensor *const *tensors,
                            int count, dt_io_job **out) {
  *out = NULL;
  DT_CHECK(count >= 0 && (count == 0 || tensors), DT_ERR_ARG, "write_async %s: bad tensor list (count %d)", path,
           count);
  DT_CHECK(strlen(path) < sizeof((dt_io_job *)0)->path, DT_ERR_ARG, "path too long: %s", path);
  for (int i = 0; i < count; i++) {
    char b[DT_SHAPE_BUF];
    const dt_tensor *t = tensors[i];
    DT_CHECK(t, DT_ERR_ARG, "write_async %s: tensor %d is NULL", path, i);
    DT_CHECK(t->device.type == DT_DEVICE_CPU, DT_ERR_UNSUPPORTED,
             "write_async %s: tensor %d %s is not a CPU tensor", path, i, dt_shape_str(t, b, sizeof b));
    DT_CHECK(t->data || dt_tensor_numel(t) == 0, DT_ERR_STATE,
             "write_async %s: tensor %d's storage was released", path, i);
  }
  dt_io_job *j = calloc(1, sizeof *j);
  DT_CHECK(j, DT_ERR_OOM, "out of memory starting a write of %s", path);
  strcpy(j->path, path);
  j->header = malloc(n ? n : 1);
  j->tensors = calloc(count ? (size_t)count : 1, sizeof *j->tensors);
  if (!j->header || !j->tensors) {
    job_free_unstarted(j);
    return DT_FAIL(DT_ERR_OOM, "out of memory starting a write of %s", path);
  }
  if (n) memcpy(j->header, header, n);
  j->header_len = n;
  for (int i = 0; i < count; i++) {
    const dt_tensor *t = tensors[i];
    int64_t none = 0;
    dt_status st = dt_tensor_numel(t) == 0 ? dt_tensor_empty(1, &none, t->dtype, t->device, &j->tensors[i])
                                           : dt_tensor_view(t, t->ndim, t->shape, t->strides, t->offset,
                                                            &j->tensors[i]);
    if (st != DT_OK) {
      job_free_unstarted(j);
      return st;
    }
    j->count = i + 1;
  }
  int rc = pthread_create(&j->thread, NULL, write_job, j);
  if (rc != 0) {
    job_free_unstarted(j);
    return DT_FAIL(DT_ERR_STATE, "cannot start a writer thread for %s: %s", path, strerror(rc));
  }
  *out = j;
  return DT_OK;
}

dt_status dt_io_job_test(dt_io_job *j, bool *done) {
  DT_CHECK(j, DT_ERR_ARG, "io job is NULL");
  *done = atomic_load(&j->done);
  return DT_OK;
}

dt_status dt_io_job_wait(dt_io_job *j, int64_t *size, uint32_t *crc32) {
  DT_CHECK(j, DT_ERR_ARG, "io job is NULL");
  if (!j->joined) {
    pthread_join(j->thread, NULL); /* the only synchronisation: the results are written before the thread ends */
    j->joined = true;
  }
  if (j->status != DT_OK) return DT_FAIL(j->status, "async write of %s failed: %s", j->path, j->message);
  if (size) *size = j->size;
  if (crc32) *crc32 = j->crc;
  return DT_OK;
}

void dt_io_job_free(dt_io_job *j) {
  if (!j) return;
  if (!j->joined) pthread_join(j->thread, NULL);
  free(j->header);
  free(j);
}
