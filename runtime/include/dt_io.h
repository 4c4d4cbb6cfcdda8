/* dt_io.h: file helpers for checkpoints and datasets: CRC32 and CRC-32C, durable and atomic writes, mmap, whole-file reads. */
#ifndef DT_IO_H
#define DT_IO_H
#include "dt_tensor.h"

/* CRC32 (zlib polynomial) of a buffer, continuing from crc (start with 0). */
uint32_t dt_io_crc32(uint32_t crc, const void *data, size_t n);
/* CRC-32C (Castagnoli polynomial: iSCSI, TFRecord) of a buffer, continuing from crc (start with 0). */
uint32_t dt_io_crc32c(uint32_t crc, const void *data, size_t n);
/* CRC32 of a whole file. */
dt_status dt_io_file_crc32(const char *path, uint32_t *out);

/* Write an 8-bit RGB image (height rows of width * 3 bytes, top row first) as a PNG file, through a temporary file
 * renamed into place (runtime/png.c). */
dt_status dt_io_write_png(const char *path, const uint8_t *rgb, int width, int height);

/* Size of a file or directory (symlinks followed); DT_ERR_IO naming the path when it is missing. */
dt_status dt_io_stat(const char *path, int64_t *size, bool *is_dir);

/* Create (truncate) path, write n bytes, fsync and close it. */
dt_status dt_io_write_file(const char *path, const void *data, size_t n);
/* A file open for sequential writing; each write may update a running CRC32 (crc may be NULL). */
typedef struct dt_file dt_file;
dt_status dt_io_open_write(const char *path, dt_file **out);
dt_status dt_io_write(dt_file *f, const void *data, size_t n, uint32_t *crc);
/* Write the bytes of a CPU tensor's view in row-major order (gathered on the fly when strided). */
dt_status dt_io_write_tensor(dt_file *f, const dt_tensor *t, uint32_t *crc);
/* fsync and close; NULL is fine. The handle is freed even when fsync fails. */
dt_status dt_io_close(dt_file *f);

/* A file written on a background thread (async checkpoints): `n` header bytes (copied) followed by
 * the row-major bytes of `count` CPU tensors, then fsync and close. The job holds its own views of
 * the tensors, so the caller may drop its handles at once, but must not modify the bytes until the
 * job completes (pass snapshots). The thread never calls back; poll with test or block in wait. */
typedef struct dt_io_job dt_io_job;
dt_status dt_io_write_async(const char *path, const void *header, size_t n, const dt_tensor *const *tensors,
                            int count, dt_io_job **out);
/* *done := whether the write has ended (then wait returns at once). */
dt_status dt_io_job_test(dt_io_job *j, bool *done);
/* Block until the write ends; returns its status (the message names the file) and, on success, the
 * file's size and CRC32 (either pointer may be NULL). May be called again; the result is kept. */
dt_status dt_io_job_wait(dt_io_job *j, int64_t *size, uint32_t *crc32);
/* Wait, then free. NULL is fine. */
void dt_io_job_free(dt_io_job *j);
/* fsync a directory so creations and renames inside it are durable. */
dt_status dt_io_fsync_dir(const char *path);
/* rename(2), then fsync the directory holding `to`. */
dt_status dt_io_rename(const char *from, const char *to);

/* mkdir -p with mode 0755. When exist_ok is false and the last component already exists,
 * fails with DT_ERR_STATE (so callers can pick another name) and creates nothing. */
dt_status dt_io_mkdir(const char *path, bool exist_ok);
/* rm -r (symlinks are removed, not followed); a missing path is not an error. */
dt_status dt_io_remove_tree(const char *path);
/* Entries of a directory (not . or ..), sorted bytewise, one per line as "<kind> <name>\n" with
 * kind 'f' (regular file), 'd' (directory) or 'o' (other), symlinks followed. Free with dt_io_buffer_free. */
dt_status dt_io_list_dir(const char *path, char **text, int64_t *size);
/* Process id, for temp names unique to this process. */
int64_t dt_io_pid(void);
/* Make what this process and the processes it starts create from now on private to its owner
 * (umask |= 077: directories 0700, files 0600). */
void dt_io_make_private(void);

/* Read-only memory map of a whole file (data is NULL for an empty file). */
typedef struct dt_mmap {
  void *data;
  int64_t size;
} dt_mmap;
dt_status dt_io_mmap(const char *path, dt_mmap **out);
void dt_io_munmap(dt_mmap *m);

/* Read a whole file (gzip'd or plain, detected by magic) into memory, NUL-terminated (size
 * excludes the NUL); a truncated or corrupt gzip stream is DT_ERR_CORRUPT. Free with dt_io_buffer_free. */
dt_status dt_io_read_file(const char *path, char **data, int64_t *size);
void dt_io_buffer_free(char *data);

#endif
