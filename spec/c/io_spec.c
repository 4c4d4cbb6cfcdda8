/* io_spec.c: CRC32, durable writes, strided tensor writes, renames, directories, mmap and gzip reads (plain and ASan). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "dt_io.h"
#include "spec.h"

static char root[256];

static const char *in_root(const char *name) {
  static char buf[4][512];
  static int next;
  char *b = buf[next++ % 4];
  snprintf(b, sizeof buf[0], "%s/%s", root, name);
  return b;
}

/* The whole content of path through dt_io_read_file, compared with want. */
static bool reads_back(const char *path, const void *want, size_t n) {
  char *data = NULL;
  int64_t size = -1;
  dt_status s = dt_io_read_file(path, &data, &size);
  bool ok = s == DT_OK && size == (int64_t)n && memcmp(data, want, n) == 0 && data[n] == 0;
  if (s != DT_OK) printf("  read %s: %s\n", path, dt_last_error());
  dt_io_buffer_free(data);
  return ok;
}

static void spec_crc32(void) {
  const char *s = "123456789";
  expect(dt_io_crc32(0, s, 9) == 0xCBF43926u, "crc32 check value of 123456789");
  expect(dt_io_crc32(dt_io_crc32(0, s, 4), s + 4, 5) == 0xCBF43926u, "crc32 continues across pieces");
  expect(dt_io_crc32(0, s, 0) == 0, "crc32 of nothing is 0");
  const char *p = in_root("digits");
  expect(dt_io_write_file(p, s, 9) == DT_OK, "write_file");
  uint32_t crc = 0;
  expect(dt_io_file_crc32(p, &crc) == DT_OK && crc == 0xCBF43926u, "file crc32 matches the buffer crc32");
  int64_t size = 0;
  bool is_dir = true;
  expect(dt_io_stat(p, &size, &is_dir) == DT_OK && size == 9 && !is_dir, "stat gives size and kind");
  expect(dt_io_stat(root, &size, &is_dir) == DT_OK && is_dir, "stat sees a directory");
  expect_status(dt_io_stat(in_root("nope"), &size, &is_dir), DT_ERR_IO, NEEDLES("cannot stat"), "stat of a missing file");
  expect_status(dt_io_file_crc32(in_root("nope"), &crc), DT_ERR_IO, NEEDLES("cannot open"), "crc of a missing file");
}

/* RFC 3720 (iSCSI) appendix B.4's vectors, plus the common check value of "123456789". */
static void spec_crc32c(void) {
  unsigned char buf[48];
  expect(dt_io_crc32c(0, "123456789", 9) == 0xE3069283u, "crc32c check value of 123456789");
  memset(buf, 0, 32);
  expect(dt_io_crc32c(0, buf, 32) == 0x8A9136AAu, "crc32c of 32 zero bytes (RFC 3720)");
  memset(buf, 0xFF, 32);
  expect(dt_io_crc32c(0, buf, 32) == 0x62A8AB43u, "crc32c of 32 0xFF bytes (RFC 3720)");
  for (int i = 0; i < 32; i++) buf[i] = (unsigned char)i;
  expect(dt_io_crc32c(0, buf, 32) == 0x46DD794Eu, "crc32c of 0..31 (RFC 3720)");
  expect(dt_io_crc32c(dt_io_crc32c(0, buf, 7), buf + 7, 25) == 0x46DD794Eu, "crc32c continues across pieces");
  for (int i = 0; i < 32; i++) buf[i] = (unsigned char)(31 - i);
  expect(dt_io_crc32c(0, buf, 32) == 0x113FDB5Cu, "crc32c of 31..0 (RFC 3720)");
  static const unsigned char pdu[48] = {0x01, 0xC0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        0x14, 0, 0, 0, 0, 0, 0x04, 0, 0, 0, 0, 0x14, 0, 0, 0, 0x18,
                                        0x28, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0};
  expect(dt_io_crc32c(0, pdu, 48) == 0xD9963A56u, "crc32c of the iSCSI read PDU (RFC 3720)");
  expect(dt_io_crc32c(0, buf, 0) == 0, "crc32c of nothing is 0");
}

static void spec_tensor_writes(void) {
  dt_device cpu = {DT_DEVICE_CPU, 0};
  int64_t shape[2] = {3, 5};
  dt_tensor *t = NULL, *tt = NULL, *col = NULL;
  dt_tensor_empty(2, shape, DT_DTYPE_F32, cpu, &t);
  for (int i = 0; i < 15; i++) dt_tensor_set(t, i, i);
  int64_t tshape[2] = {5, 3}, tstrides[2] = {1, 5}, cshape[2] = {3, 2}, cstrides[2] = {5, 1};
  dt_tensor_view(t, 2, tshape, tstrides, 0, &tt);     /* transpose: last stride 5 */
  dt_tensor_view(t, 2, cshape, cstrides, 2, &col);    /* columns 2..3: rows of stride 1, gaps between */
  const char *p = in_root("tensors.bin");
  dt_file *f = NULL;
  uint32_t crc = 0;
  const char head[] = "HEAD";
  expect(dt_io_open_write(p, &f) == DT_OK, "open_write");
  expect(dt_io_write(f, head, 4, &crc) == DT_OK, "write bytes");
  expect(dt_io_write_tensor(f, t, &crc) == DT_OK, "write a contiguous tensor");
  expect(dt_io_write_tensor(f, tt, &crc) == DT_OK, "write a transposed view");
  expect(dt_io_write_tensor(f, col, NULL) == DT_OK, "write a narrowed view without a crc");
  expect(dt_io_close(f) == DT_OK, "close fsyncs and closes");
  expect(dt_io_close(NULL) == DT_OK, "close(NULL) is fine");

  float want[15 + 15 + 6];
  for (int i = 0; i < 15; i++) want[i] = (float)i;
  for (int r = 0; r < 5; r++)
    for (int c = 0; c < 3; c++) want[15 + r * 3 + c] = (float)(c * 5 + r);
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 2; c++) want[30 + r * 2 + c] = (float)(r * 5 + 2 + c);
  char whole[4 + sizeof want];
  memcpy(whole, head, 4);
  memcpy(whole + 4, want, sizeof want);
  expect(reads_back(p, whole, sizeof whole), "file holds the views' elements in row-major order");
  uint32_t file_crc = 0;
  dt_io_file_crc32(p, &file_crc);
  expect(crc == dt_io_crc32(0, whole, 4 + 30 * sizeof(float)), "running crc covers what was written with it");
  expect(file_crc == dt_io_crc32(0, whole, sizeof whole), "file crc covers everything");

  dt_io_open_write(p, &f);
  col->device.type = DT_DEVICE_CUDA; /* pretend: only CPU tensors can be written */
  expect_status(dt_io_write_tensor(f, col, NULL), DT_ERR_UNSUPPORTED, NEEDLES("only CPU tensors"), "device tensor");
  col->device.type = DT_DEVICE_CPU;
  dt_io_close(f);
  expect_status(dt_io_open_write(in_root("missing/dir/x"), &f), DT_ERR_IO, NEEDLES("cannot create"), "open in a missing dir");
  expect(f == NULL, "failed open leaves NULL");
  dt_tensor_free(col);
  dt_tensor_free(tt);
  dt_tensor_free(t);
}

static void spec_dirs_and_renames(void) {
  const char *deep = in_root("a/b/c");
  expect(dt_io_mkdir(deep, false) == DT_OK, "mkdir -p creates parents");
  expect(dt_io_mkdir(deep, true) == DT_OK, "mkdir with exist_ok accepts an existing dir");
  expect_status(dt_io_mkdir(deep, false), DT_ERR_STATE, NEEDLES("already exists"), "mkdir without exist_ok");
  expect_status(dt_io_mkdir(in_root("digits/x"), true), DT_ERR_IO, NEEDLES("cannot create directory"), "mkdir below a regular file");
  dt_io_write_file(in_root("a/zeta"), "z", 1);
  dt_io_write_file(in_root("a/alpha.tmp"), "a", 1);
  expect(dt_io_rename(in_root("a/alpha.tmp"), in_root("a/alpha")) == DT_OK, "rename");
  expect(reads_back(in_root("a/alpha"), "a", 1), "renamed file has the content");
  expect_status(dt_io_rename(in_root("a/alpha.tmp"), in_root("a/x")), DT_ERR_IO, NEEDLES("cannot rename"), "rename of a missing file");
  expect(dt_io_fsync_dir(in_root("a")) == DT_OK, "fsync_dir");
  expect_status(dt_io_fsync_dir(in_root("nodir")), DT_ERR_IO, NEEDLES("cannot open directory"), "fsync of a missing dir");

  char *text = NULL;
  int64_t size = 0;
  expect(dt_io_list_dir(in_root("a"), &text, &size) == DT_OK, "list_dir");
  const char *want = "f alpha\nd b\nf zeta\n";
  expect(text && size == (int64_t)strlen(want) && strcmp(text, want) == 0, "listing is sorted with kinds");
  if (text && strcmp(text, want) != 0) printf("  listing: [%s]\n", text);
  dt_io_buffer_free(text);
  expect_status(dt_io_list_dir(in_root("nodir"), &text, &size), DT_ERR_IO, NEEDLES("cannot list directory"), "listing a missing dir");

  expect(dt_io_remove_tree(in_root("a")) == DT_OK, "remove_tree");
  bool is_dir;
  expect(dt_io_stat(in_root("a"), &size, &is_dir) != DT_OK, "removed tree is gone");
  expect(dt_io_remove_tree(in_root("a")) == DT_OK, "removing a missing path is fine");
  expect(dt_io_pid() > 0, "pid");
}

static void spec_mmap(void) {
  const char *p = in_root("map.bin");
  uint32_t words[1000];
  for (int i = 0; i < 1000; i++) words[i] = (uint32_t)i * 2654435761u;
  dt_io_write_file(p, words, sizeof words);
  dt_mmap *m = NULL;
  expect(dt_io_mmap(p, &m) == DT_OK, "mmap");
  expect(m && m->size == (int64_t)sizeof words && memcmp(m->data, words, sizeof words) == 0, "mapped bytes");
  dt_io_munmap(m);
  dt_io_write_file(in_root("empty"), "", 0);
  expect(dt_io_mmap(in_root("empty"), &m) == DT_OK && m->size == 0 && m->data == NULL, "empty file maps to NULL");
  dt_io_munmap(m);
  dt_io_munmap(NULL);
  expect_status(dt_io_mmap(in_root("nope"), &m), DT_ERR_IO, NEEDLES("cannot open"), "mmap of a missing file");
  expect(m == NULL, "failed mmap leaves NULL");
}

/* A gzip file of `members` copies of text; returns its compressed bytes in buf. */
static size_t write_gzip(const char *path, const char *text, int members, char *buf, size_t cap) {
  FILE *out = fopen(path, "wb");
  for (int i = 0; i < members; i++) {
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s.part", path);
    gzFile gz = gzopen(tmp, "wb");
    gzwrite(gz, text, (unsigned)strlen(text));
    gzclose(gz);
    FILE *in = fopen(tmp, "rb");
    size_t n = fread(buf, 1, cap, in);
    fclose(in);
    fwrite(buf, 1, n, out);
    remove(tmp);
  }
  fclose(out);
  FILE *in = fopen(path, "rb");
  size_t n = fread(buf, 1, cap, in);
  fclose(in);
  return n;
}

static void spec_read_file(void) {
  char text[4000];
  for (int i = 0; i < (int)sizeof text - 1; i++) text[i] = (char)('a' + (i * 7) % 26);
  text[sizeof text - 1] = 0;
  size_t n = strlen(text);
  dt_io_write_file(in_root("plain.txt"), text, n);
  expect(reads_back(in_root("plain.txt"), text, n), "plain file reads back");
  dt_io_write_file(in_root("one"), "\x1f", 1);
  expect(reads_back(in_root("one"), "\x1f", 1), "one byte that starts like gzip");
  expect(reads_back(in_root("empty"), "", 0), "empty file");

  char gzbytes[8192];
  size_t gzn = write_gzip(in_root("t.gz"), text, 1, gzbytes, sizeof gzbytes);
  expect(gzn > 10 && gzn < n, "gzip file is compressed");
  expect(reads_back(in_root("t.gz"), text, n), "gzip file is decompressed transparently");
  char twice[8000];
  memcpy(twice, text, n);
  memcpy(twice + n, text, n);
  write_gzip(in_root("two.gz"), text, 2, gzbytes, sizeof gzbytes);
  expect(reads_back(in_root("two.gz"), twice, 2 * n), "concatenated gzip members are all read");

  char *data = NULL;
  int64_t size = 0;
  gzn = write_gzip(in_root("t.gz"), text, 1, gzbytes, sizeof gzbytes);
  dt_io_write_file(in_root("cut.gz"), gzbytes, gzn / 2);
  expect_status(dt_io_read_file(in_root("cut.gz"), &data, &size), DT_ERR_CORRUPT, NEEDLES("truncated gzip file"), "truncated gzip");
  expect(data == NULL, "failed read leaves NULL");
  gzbytes[gzn - 6] ^= 0x40; /* inside the CRC32 trailer */
  dt_io_write_file(in_root("flip.gz"), gzbytes, gzn);
  expect_status(dt_io_read_file(in_root("flip.gz"), &data, &size), DT_ERR_CORRUPT, NEEDLES("corrupt gzip data"), "flipped byte in a gzip file");
  expect_status(dt_io_read_file(root, &data, &size), DT_ERR_IO, NEEDLES("is a directory"), "reading a directory");
  expect_status(dt_io_read_file(in_root("nope"), &data, &size), DT_ERR_IO, NEEDLES("cannot open"), "reading a missing file");
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/dt_io_spec_XXXXXX");
  if (!mkdtemp(root)) {
    printf("cannot create a temp dir\n");
    return 1;
  }
  spec_crc32();
  spec_crc32c();
  spec_tensor_writes();
  spec_dirs_and_renames();
  spec_mmap();
  spec_read_file();
  dt_io_remove_tree(root);
  return spec_finish();
}
