/* dt_io.h: file helpers for checkpoints and datasets: CRC32, atomic writes, mmap, gzip lines. */
#ifndef DT_IO_H
#define DT_IO_H
#include "dt_tensor.h"

/* CRC32 (zlib polynomial) of a buffer, continuing from crc (start with 0). */
uint32_t dt_io_crc32(uint32_t crc, const void *data, size_t n);
/* CRC32 of a whole file. */
dt_status dt_io_file_crc32(const char *path, uint32_t *out);

/* Write n bytes to path and fsync it. */
dt_status dt_io_write_file(const char *path, const void *data, size_t n);
/* Append pieces to an open file: a handle-free API keeps Lua simple. */
typedef struct dt_file dt_file;
dt_status dt_io_open_write(const char *path, dt_file **out);
dt_status dt_io_write(dt_file *f, const void *data, size_t n, uint32_t *crc);
/* Write the bytes of a tensor's view (made contiguous on the fly). */
dt_status dt_io_write_tensor(dt_file *f, const dt_tensor *t, uint32_t *crc);
/* fsync and close; NULL is fine. */
dt_status dt_io_close(dt_file *f);
/* fsync a directory so renames inside it are durable. */
dt_status dt_io_fsync_dir(const char *path);
/* rename(2), then fsync the parent directory. */
dt_status dt_io_rename(const char *from, const char *to);

/* Read-only memory map of a whole file. */
typedef struct dt_mmap {
  void *data;
  int64_t size;
} dt_mmap;
dt_status dt_io_mmap(const char *path, dt_mmap **out);
void dt_io_munmap(dt_mmap *m);

/* Read a whole file (gzip'd or plain, detected by magic) into memory; free with dt_io_buffer_free. */
dt_status dt_io_read_file(const char *path, char **data, int64_t *size);
void dt_io_buffer_free(char *data);

#endif
