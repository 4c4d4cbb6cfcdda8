/* io.c: CRC32, fsync'd writes, atomic renames, directories, mmap and gzip-aware whole-file reads (zlib). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "dt_internal.h"
#include "dt_io.h"

#define IO_CHUNK ((size_t)1 << 20)

struct dt_file {
  int fd;
  char path[4096];
};

uint32_t dt_io_crc32(uint32_t crc, const void *data, size_t n) {
  const Bytef *p = data;
  while (n > 0) { /* zlib takes uInt lengths */
    uInt k = n > (size_t)1 << 30 ? (uInt)1 << 30 : (uInt)n;
    crc = (uint32_t)crc32(crc, p, k);
    p += k;
    n -= k;
  }
  return crc;
}

static dt_status open_read(const char *path, int *fd) {
  *fd = open(path, O_RDONLY | O_CLOEXEC);
  DT_CHECK(*fd >= 0, DT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  return DT_OK;
}

/* read(2) until n bytes or end of file; *got receives the count. */
static dt_status read_full(int fd, const char *path, void *buf, size_t n, size_t *got) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = read(fd, (char *)buf + done, n - done);
    if (r < 0 && errno == EINTR) continue;
    DT_CHECK(r >= 0, DT_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    if (r == 0) break;
    done += (size_t)r;
  }
  *got = done;
  return DT_OK;
}

dt_status dt_io_file_crc32(const char *path, uint32_t *out) {
  int fd;
  DT_TRY(open_read(path, &fd));
  char *buf = malloc(IO_CHUNK);
  if (!buf) {
    close(fd);
    return DT_FAIL(DT_ERR_OOM, "out of memory reading %s", path);
  }
  uint32_t crc = 0;
  dt_status st = DT_OK;
  for (;;) {
    size_t got = 0;
    st = read_full(fd, path, buf, IO_CHUNK, &got);
    if (st != DT_OK || got == 0) break;
    crc = dt_io_crc32(crc, buf, got);
  }
  free(buf);
  close(fd);
  *out = crc;
  return st;
}

dt_status dt_io_stat(const char *path, int64_t *size, bool *is_dir) {
  struct stat sb;
  DT_CHECK(stat(path, &sb) == 0, DT_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
  *size = (int64_t)sb.st_size;
  *is_dir = S_ISDIR(sb.st_mode);
  return DT_OK;
}

static dt_status write_all(int fd, const char *path, const void *data, size_t n) {
  const char *p = data;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    DT_CHECK(w > 0, DT_ERR_IO, "cannot write %s: %s", path, w < 0 ? strerror(errno) : "no progress");
    p += w;
    n -= (size_t)w;
  }
  return DT_OK;
}

dt_status dt_io_open_write(const char *path, dt_file **out) {
  *out = NULL;
  DT_CHECK(strlen(path) < sizeof((dt_file *)0)->path, DT_ERR_ARG, "path too long: %s", path);
  dt_file *f = calloc(1, sizeof *f);
  DT_CHECK(f, DT_ERR_OOM, "out of memory opening %s", path);
  f->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f->fd < 0) {
    free(f);
    return DT_FAIL(DT_ERR_IO, "cannot create %s: %s", path, strerror(errno));
  }
  strcpy(f->path, path);
  *out = f;
  return DT_OK;
}

dt_status dt_io_write(dt_file *f, const void *data, size_t n, uint32_t *crc) {
  DT_TRY(write_all(f->fd, f->path, data, n));
  if (crc) *crc = dt_io_crc32(*crc, data, n);
  return DT_OK;
}

dt_status dt_io_write_tensor(dt_file *f, const dt_tensor *t, uint32_t *crc) {
  char b[DT_SHAPE_BUF];
  DT_CHECK(t->device.type == DT_DEVICE_CPU, DT_ERR_UNSUPPORTED, "writing %s to %s: only CPU tensors can be written",
           dt_shape_str(t, b, sizeof b), f->path);
  int64_t n = dt_tensor_numel(t);
  if (n == 0) return DT_OK;
  DT_CHECK(t->data, DT_ERR_STATE, "writing a tensor whose storage was released to %s", f->path);
  size_t es = dt_dtype_size(t->dtype);
  const char *base = dt_tensor_ptr(t);
  if (dt_tensor_is_contiguous(t)) return dt_io_write(f, base, (size_t)n * es, crc);
  /* Strided: gather rows of the last dim into a bounded buffer. */
  int last = t->ndim - 1;
  int64_t row = t->shape[last], rstride = t->strides[last];
  size_t row_bytes = (size_t)row * es, cap = row_bytes > IO_CHUNK ? row_bytes : IO_CHUNK;
  char *buf = malloc(cap);
  DT_CHECK(buf, DT_ERR_OOM, "out of memory writing %s", f->path);
  size_t used = 0;
  dt_status st = DT_OK;
  for (int64_t r = 0; r < n / row && st == DT_OK; r++) {
    if (used + row_bytes > cap) {
      st = dt_io_write(f, buf, used, crc);
      used = 0;
    }
    const char *src = base + dt_strided_offset(t->ndim, t->shape, t->strides, r * row) * (int64_t)es;
    if (rstride == 1) memcpy(buf + used, src, row_bytes);
    else
      for (int64_t i = 0; i < row; i++) memcpy(buf + used + (size_t)i * es, src + i * rstride * (int64_t)es, es);
    used += row_bytes;
  }
  if (st == DT_OK && used) st = dt_io_write(f, buf, used, crc);
  free(buf);
  return st;
}

dt_status dt_io_close(dt_file *f) {
  if (!f) return DT_OK;
  dt_status st = DT_OK;
  if (fsync(f->fd) != 0) st = DT_FAIL(DT_ERR_IO, "cannot fsync %s: %s", f->path, strerror(errno));
  if (close(f->fd) != 0 && st == DT_OK) st = DT_FAIL(DT_ERR_IO, "cannot close %s: %s", f->path, strerror(errno));
  free(f);
  return st;
}

dt_status dt_io_write_file(const char *path, const void *data, size_t n) {
  dt_file *f;
  DT_TRY(dt_io_open_write(path, &f));
  dt_status st = dt_io_write(f, data, n, NULL);
  dt_status cst = dt_io_close(f);
  return st != DT_OK ? st : cst;
}

dt_status dt_io_fsync_dir(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DT_CHECK(fd >= 0, DT_ERR_IO, "cannot open directory %s: %s", path, strerror(errno));
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  DT_CHECK(rc == 0, DT_ERR_IO, "cannot fsync directory %s: %s", path, strerror(err));
  return DT_OK;
}

/* The directory part of path ("." when there is none) into buf. */
static dt_status parent_dir(const char *path, char *buf, size_t n) {
  DT_CHECK(strlen(path) < n, DT_ERR_ARG, "path too long: %s", path);
  strcpy(buf, path);
  size_t len = strlen(buf);
  while (len > 1 && buf[len - 1] == '/') buf[--len] = 0;
  char *slash = strrchr(buf, '/');
  if (!slash) strcpy(buf, ".");
  else if (slash == buf) buf[1] = 0;
  else *slash = 0;
  return DT_OK;
}

dt_status dt_io_rename(const char *from, const char *to) {
  DT_CHECK(rename(from, to) == 0, DT_ERR_IO, "cannot rename %s to %s: %s", from, to, strerror(errno));
  char dir[4096];
  DT_TRY(parent_dir(to, dir, sizeof dir));
  return dt_io_fsync_dir(dir);
}

dt_status dt_io_mkdir(const char *path, bool exist_ok) {
  char buf[4096];
  size_t len = strlen(path);
  DT_CHECK(len > 0 && len < sizeof buf, DT_ERR_ARG, "bad directory path '%s'", path);
  strcpy(buf, path);
  while (len > 1 && buf[len - 1] == '/') buf[--len] = 0;
  for (char *p = buf + 1; *p; p++) { /* parents */
    if (*p != '/') continue;
    *p = 0;
    int rc = mkdir(buf, 0755);
    int err = errno;
    *p = '/';
    DT_CHECK(rc == 0 || err == EEXIST, DT_ERR_IO, "cannot create directory %.*s: %s", (int)(p - buf), buf,
             strerror(err));
  }
  if (mkdir(buf, 0755) == 0) return DT_OK;
  int err = errno;
  struct stat sb;
  if (err == EEXIST && stat(buf, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    DT_CHECK(exist_ok, DT_ERR_STATE, "directory %s already exists", buf);
    return DT_OK;
  }
  return DT_FAIL(DT_ERR_IO, "cannot create directory %s: %s", buf, strerror(err));
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

dt_status dt_io_remove_tree(const char *path) {
  struct stat sb;
  if (lstat(path, &sb) != 0 && errno == ENOENT) return DT_OK;
  DT_CHECK(nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0, DT_ERR_IO, "cannot remove %s: %s", path,
           strerror(errno));
  return DT_OK;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted "<kind> <name>\n" lines for the n names of dir into a fresh buffer. */
static dt_status format_listing(const char *dir, char **names, size_t n, char **text, int64_t *size) {
  if (n > 1) qsort(names, n, sizeof *names, cmp_names);
  size_t total = 1, used = 0;
  for (size_t i = 0; i < n; i++) total += strlen(names[i]) + 3;
  char *out = malloc(total);
  DT_CHECK(out, DT_ERR_OOM, "out of memory listing %s", dir);
  for (size_t i = 0; i < n; i++) {
    char full[8192];
    struct stat sb;
    snprintf(full, sizeof full, "%s/%s", dir, names[i]);
    char kind = stat(full, &sb) != 0 ? 'o' : S_ISREG(sb.st_mode) ? 'f' : S_ISDIR(sb.st_mode) ? 'd' : 'o';
    used += (size_t)sprintf(out + used, "%c %s\n", kind, names[i]);
  }
  out[used] = 0;
  *text = out;
  *size = (int64_t)used;
  return DT_OK;
}

dt_status dt_io_list_dir(const char *path, char **text, int64_t *size) {
  *text = NULL;
  *size = 0;
  DIR *d = opendir(path);
  DT_CHECK(d, DT_ERR_IO, "cannot list directory %s: %s", path, strerror(errno));
  char **names = NULL;
  size_t n = 0, cap = 0;
  dt_status st = DT_OK;
  for (struct dirent *e; st == DT_OK && (e = readdir(d)) != NULL;) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (strchr(e->d_name, '\n')) {
      st = DT_FAIL(DT_ERR_UNSUPPORTED, "directory %s holds a name with a newline", path);
      break;
    }
    if (n == cap) {
      cap = cap ? 2 * cap : 32;
      char **grown = realloc(names, cap * sizeof *names);
      if (!grown) {
        st = DT_FAIL(DT_ERR_OOM, "out of memory listing %s", path);
        break;
      }
      names = grown;
    }
    names[n] = strdup(e->d_name);
    if (!names[n]) st = DT_FAIL(DT_ERR_OOM, "out of memory listing %s", path);
    else n++;
  }
  closedir(d);
  if (st == DT_OK) st = format_listing(path, names, n, text, size);
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  return st;
}

int64_t dt_io_pid(void) { return (int64_t)getpid(); }

void dt_io_make_private(void) {
  mode_t old = umask(077);
  umask(old | 077);
}

dt_status dt_io_mmap(const char *path, dt_mmap **out) {
  *out = NULL;
  int fd;
  DT_TRY(open_read(path, &fd));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int err = errno;
    close(fd);
    return DT_FAIL(DT_ERR_IO, "cannot stat %s: %s", path, strerror(err));
  }
  dt_mmap *m = calloc(1, sizeof *m);
  if (!m) {
    close(fd);
    return DT_FAIL(DT_ERR_OOM, "out of memory mapping %s", path);
  }
  m->size = (int64_t)sb.st_size;
  if (m->size > 0) {
    void *p = mmap(NULL, (size_t)m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      close(fd);
      free(m);
      return DT_FAIL(DT_ERR_IO, "cannot mmap %s (%lld bytes): %s", path, (long long)sb.st_size, strerror(err));
    }
    m->data = p;
  }
  close(fd); /* the mapping keeps the file alive */
  *out = m;
  return DT_OK;
}

void dt_io_munmap(dt_mmap *m) {
  if (!m) return;
  if (m->data) munmap(m->data, (size_t)m->size);
  free(m);
}

/* Decompress a gzip file (all members) into a growing buffer. */
static dt_status read_gzip(int fd, const char *path, int64_t hint, char **data, int64_t *size) {
  gzFile gz = gzdopen(fd, "rb");
  if (!gz) {
    close(fd);
    return DT_FAIL(DT_ERR_OOM, "out of memory opening gzip stream %s", path);
  }
  size_t cap = hint > 0 ? (size_t)hint * 4 + 1 : 4096, used = 0;
  char *buf = malloc(cap);
  dt_status st = buf ? DT_OK : DT_FAIL(DT_ERR_OOM, "out of memory reading %s", path);
  while (st == DT_OK) {
    if (cap - used < 2) {
      char *grown = realloc(buf, cap * 2);
      if (!grown) {
        st = DT_FAIL(DT_ERR_OOM, "out of memory reading %s (%zu bytes so far)", path, used);
        break;
      }
      buf = grown;
      cap *= 2;
    }
    size_t want = cap - used - 1;
    int r = gzread(gz, buf + used, want > (size_t)1 << 30 ? 1u << 30 : (unsigned)want);
    if (r < 0) {
      int code;
      const char *msg = gzerror(gz, &code);
      st = DT_FAIL(DT_ERR_CORRUPT, "corrupt gzip data in %s after %zu bytes: %s", path, used, msg);
    } else if (r == 0) {
      break;
    }
    used += r > 0 ? (size_t)r : 0;
  }
  int rc = gzclose_r(gz);
  if (st == DT_OK && rc == Z_BUF_ERROR)
    st = DT_FAIL(DT_ERR_CORRUPT, "truncated gzip file %s (stream ends after %zu bytes of output)", path, used);
  else if (st == DT_OK && rc != Z_OK)
    st = DT_FAIL(DT_ERR_CORRUPT, "cannot read gzip file %s (zlib error %d)", path, rc);
  if (st != DT_OK) {
    free(buf);
    return st;
  }
  buf[used] = 0;
  *data = buf;
  *size = (int64_t)used;
  return DT_OK;
}

dt_status dt_io_read_file(const char *path, char **data, int64_t *size) {
  *data = NULL;
  *size = 0;
  int fd;
  DT_TRY(open_read(path, &fd));
  struct stat sb;
  unsigned char magic[2];
  size_t got = 0;
  dt_status st = fstat(fd, &sb) == 0 ? DT_OK : DT_FAIL(DT_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
  if (st == DT_OK && S_ISDIR(sb.st_mode)) st = DT_FAIL(DT_ERR_IO, "cannot read %s: it is a directory", path);
  if (st == DT_OK) st = read_full(fd, path, magic, 2, &got);
  if (st != DT_OK) {
    close(fd);
    return st;
  }
  if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    if (lseek(fd, 0, SEEK_SET) != 0) {
      close(fd);
      return DT_FAIL(DT_ERR_IO, "cannot seek in %s: %s", path, strerror(errno));
    }
    return read_gzip(fd, path, (int64_t)sb.st_size, data, size); /* gzclose closes fd */
  }
  size_t n = (size_t)sb.st_size;
  char *buf = malloc(n + 1);
  if (!buf) {
    close(fd);
    return DT_FAIL(DT_ERR_OOM, "out of memory reading %s (%zu bytes)", path, n);
  }
  memcpy(buf, magic, got);
  size_t rest = 0;
  st = got < n ? read_full(fd, path, buf + got, n - got, &rest) : DT_OK;
  close(fd);
  if (st == DT_OK && got + rest != n)
    st = DT_FAIL(DT_ERR_IO, "%s shrank while reading: %zu of %zu bytes", path, got + rest, n);
  if (st != DT_OK) {
    free(buf);
    return st;
  }
  buf[n] = 0;
  *data = buf;
  *size = (int64_t)n;
  return DT_OK;
}

void dt_io_buffer_free(char *data) { free(data); }
