/* io_async_spec.c: background writes (dt_io_write_async): bytes, CRC32, job-owned views, errors (plain and ASan). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_io.h"
#include "spec.h"

static char root[256];

static dt_tensor *tensor_1d(int64_t n, int dtype) {
  dt_tensor *t = NULL;
  dt_device cpu = {DT_DEVICE_CPU, 0};
  if (dt_tensor_empty(1, &n, dtype, cpu, &t) != DT_OK) return NULL;
  return t;
}

/* header, a contiguous f32 tensor, a strided view of it and an empty tensor, compared byte by byte. */
static void spec_writes_and_crc(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/a.bin", root);
  dt_tensor *a = tensor_1d(1 << 20, DT_DTYPE_F32);
  float *ap = dt_tensor_ptr(a);
  for (int i = 0; i < 1 << 20; i++) ap[i] = (float)i * 0.5f;
  dt_tensor *every_other = NULL, *empty = tensor_1d(0, DT_DTYPE_BF16);
  int64_t shape = 4, stride = 2;
  dt_tensor_view(a, 1, &shape, &stride, 1, &every_other); /* elements 1, 3, 5, 7 */
  const dt_tensor *list[3] = {a, every_other, empty};
  const char header[] = "HEAD";
  dt_io_job *job = NULL;
  expect(dt_io_write_async(path, header, 4, list, 3, &job) == DT_OK && job, "write_async starts");
  /* the job holds its own views: dropping ours must not free the bytes under it */
  dt_tensor_free(every_other);
  dt_tensor_free(empty);
  int64_t size = 0;
  uint32_t crc = 0;
  expect(dt_io_job_wait(job, &size, &crc) == DT_OK, "wait succeeds");
  size_t want_n = 4 + (size_t)(1 << 20) * 4 + 16;
  expect(size == (int64_t)want_n, "size counts header and tensor bytes");
  char *data = NULL;
  int64_t got = 0;
  expect(dt_io_read_file(path, &data, &got) == DT_OK && got == (int64_t)want_n, "file has the expected size");
  bool same = data && memcmp(data, "HEAD", 4) == 0 && memcmp(data + 4, ap, (size_t)(1 << 20) * 4) == 0;
  float tail[4];
  if (data) memcpy(tail, data + 4 + (1 << 22), 16);
  same = same && tail[0] == 0.5f && tail[1] == 1.5f && tail[2] == 2.5f && tail[3] == 3.5f;
  expect(same, "bytes are the header, the tensor and the strided view gathered");
  expect(data && crc == dt_io_crc32(0, data, want_n), "crc is the CRC32 of the whole file");
  uint32_t file_crc = 0;
  expect(dt_io_file_crc32(path, &file_crc) == DT_OK && file_crc == crc, "file crc agrees");
  bool done = false;
  expect(dt_io_job_test(job, &done) == DT_OK && done, "test reports completion");
  int64_t size2 = 0;
  expect(dt_io_job_wait(job, &size2, NULL) == DT_OK && size2 == size, "wait may be called again");
  dt_io_buffer_free(data);
  dt_io_job_free(job);
  dt_tensor_free(a);
}

/* Several jobs at once, each with its own file; freeing without waiting is fine. */
static void spec_concurrent_jobs(void) {
  dt_io_job *jobs[4];
  dt_tensor *t = tensor_1d(4096, DT_DTYPE_I32);
  int32_t *tp = dt_tensor_ptr(t);
  for (int i = 0; i < 4096; i++) tp[i] = i;
  const dt_tensor *list[1] = {t};
  bool ok = true;
  for (int k = 0; k < 4; k++) {
    char path[512];
    snprintf(path, sizeof path, "%s/c%d.bin", root, k);
    ok = ok && dt_io_write_async(path, NULL, 0, list, 1, &jobs[k]) == DT_OK;
  }
  expect(ok, "four jobs start");
  dt_tensor_free(t);
  uint32_t crc0 = 0, crc1 = 0;
  expect(dt_io_job_wait(jobs[0], NULL, &crc0) == DT_OK && dt_io_job_wait(jobs[1], NULL, &crc1) == DT_OK &&
             crc0 == crc1 && crc0 != 0,
         "identical contents give identical CRCs");
  for (int k = 0; k < 4; k++) dt_io_job_free(jobs[k]);
  dt_io_job_free(NULL);
}

static void spec_errors(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/missing-dir/x.bin", root);
  dt_tensor *t = tensor_1d(16, DT_DTYPE_F32);
  const dt_tensor *list[1] = {t};
  dt_io_job *job = NULL;
  expect(dt_io_write_async(path, "h", 1, list, 1, &job) == DT_OK, "a doomed write still starts");
  expect_status(dt_io_job_wait(job, NULL, NULL), DT_ERR_IO, NEEDLES("missing-dir/x.bin"), "the failure surfaces in wait and names the file");
  expect_status(dt_io_job_wait(job, NULL, NULL), DT_ERR_IO, NEEDLES("cannot create"), "and again on a second wait");
  dt_io_job_free(job);
  dt_tensor_release_storage(t);
  t->shape[0] = 16;
  snprintf(path, sizeof path, "%s/r.bin", root);
  expect_status(dt_io_write_async(path, NULL, 0, list, 1, &job), DT_ERR_STATE, NEEDLES("storage was released"), "a released tensor is refused at once");
  expect_status(dt_io_write_async(path, NULL, 0, NULL, 2, &job), DT_ERR_ARG, NEEDLES("bad tensor list"), "a NULL list with a count is refused");
  dt_tensor_free(t);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/dt_io_async_spec_%d", (int)dt_io_pid());
  dt_io_remove_tree(root);
  dt_io_mkdir(root, true);
  spec_writes_and_crc();
  spec_concurrent_jobs();
  spec_errors();
  dt_io_remove_tree(root);
  return spec_finish();
}
