/* png.c: an 8-bit RGB image to a PNG file (zlib deflate, CRC32 per chunk), written through a temporary file. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <zlib.h>

#include "dt_internal.h"
#include "dt_io.h"

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* length, type, data, CRC32 of type and data */
static bool put_chunk(FILE *f, const char *type, const uint8_t *data, uint32_t n) {
  uint8_t head[8], tail[4];
  put_be32(head, n);
  memcpy(head + 4, type, 4);
  put_be32(tail, dt_io_crc32(dt_io_crc32(0, type, 4), data, n));
  return fwrite(head, 1, 8, f) == 8 && (n == 0 || fwrite(data, 1, n, f) == n) && fwrite(tail, 1, 4, f) == 4;
}

dt_status dt_io_write_png(const char *path, const uint8_t *rgb, int width, int height) {
  DT_CHECK(path && rgb, DT_ERR_ARG, "dt_io_write_png: NULL argument");
  DT_CHECK(width >= 1 && height >= 1 && width <= 1 << 15 && height <= 1 << 15, DT_ERR_ARG,
           "png: image size must be 1..32768 pixels a side, got %d x %d", width, height);
  size_t row = (size_t)width * 3 + 1, raw_n = row * (size_t)height; /* each row: filter byte 0 (none), pixels */
  uLongf packed_n = compressBound((uLong)raw_n);
  uint8_t *raw = malloc(raw_n), *packed = malloc(packed_n);
  if (!raw || !packed) {
    free(raw), free(packed);
    return DT_FAIL(DT_ERR_OOM, "png: out of memory for a %d x %d image", width, height);
  }
  for (int y = 0; y < height; y++) {
    raw[(size_t)y * row] = 0;
    memcpy(raw + (size_t)y * row + 1, rgb + (size_t)y * (row - 1), row - 1);
  }
  int zs = compress2(packed, &packed_n, raw, (uLong)raw_n, 6);
  free(raw);
  if (zs != Z_OK || packed_n > UINT32_MAX) {
    free(packed);
    return DT_FAIL(DT_ERR_STATE, "png: deflate failed (zlib %d)", zs);
  }
  char tmp[4096];
  DT_CHECK(snprintf(tmp, sizeof tmp, "%s.tmp", path) < (int)sizeof tmp, DT_ERR_ARG, "png: path too long: %s", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    free(packed);
    return DT_FAIL(DT_ERR_IO, "png: cannot write %s: %s", tmp, strerror(errno));
  }
  static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  uint8_t ihdr[13] = {0};
  put_be32(ihdr, (uint32_t)width);
  put_be32(ihdr + 4, (uint32_t)height);
  ihdr[8] = 8, ihdr[9] = 2; /* 8 bits per channel, truecolour; deflate, filters of method 0, no interlace */
  bool ok = fwrite(sig, 1, 8, f) == 8 && put_chunk(f, "IHDR", ihdr, 13) &&
            put_chunk(f, "IDAT", packed, (uint32_t)packed_n) && put_chunk(f, "IEND", NULL, 0);
  free(packed);
  ok = fclose(f) == 0 && ok;
  if (!ok) {
    remove(tmp);
    return DT_FAIL(DT_ERR_IO, "png: cannot write %s: %s", tmp, strerror(errno));
  }
  return dt_io_rename(tmp, path);
}
