/* store_wire.c: encoding and validation of the store's length-prefixed messages; opening a TCP listener. */
#define _GNU_SOURCE
#include "store_wire.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }
static void put_u64(uint8_t *p, uint64_t v) {
  put_u32(p, (uint32_t)v);
  put_u32(p + 4, (uint32_t)(v >> 32));
}

bool wire_header(const uint8_t *h, uint32_t *body_len) {
  *body_len = get_u32(h + 4);
  return get_u32(h) == WIRE_MAGIC;
}

bool wire_parse(const uint8_t *body, uint32_t body_len, uint8_t *code, int64_t *num, wire_arg *args,
                int max_args, int *nargs, char *err, size_t errn) {
  if (body_len < WIRE_BODY_FIXED) {
    snprintf(err, errn, "message body of %u bytes is shorter than the %d-byte fixed part", body_len,
             WIRE_BODY_FIXED);
    return false;
  }
  *code = body[0];
  int n = body[2] | body[3] << 8;
  *num = (int64_t)get_u64(body + 4);
  if (body[1] != 0) {
    snprintf(err, errn, "reserved byte is %d, expected 0", body[1]);
    return false;
  }
  if (n > max_args) {
    snprintf(err, errn, "%d arguments exceed the limit of %d", n, max_args);
    return false;
  }
  size_t pos = WIRE_BODY_FIXED;
  for (int i = 0; i < n; i++) {
    if (body_len - pos < 4) {
      snprintf(err, errn, "argument %d length runs past the %u-byte body", i, body_len);
      return false;
    }
    uint32_t len = get_u32(body + pos);
    pos += 4;
    if (len > body_len - pos) {
      snprintf(err, errn, "argument %d of %u bytes runs past the %u-byte body", i, len, body_len);
      return false;
    }
    args[i].p = body + pos;
    args[i].len = len;
    pos += len;
  }
  if (pos != body_len) {
    snprintf(err, errn, "%zu trailing bytes after %d arguments", (size_t)body_len - pos, n);
    return false;
  }
  *nargs = n;
  return true;
}

static bool buf_reserve(wire_buf *b, size_t extra) {
  if (b->cap - b->len >= extra) return true;
  size_t cap = b->cap ? b->cap : 256;
  while (cap - b->len < extra) cap *= 2;
  uint8_t *p = realloc(b->p, cap);
  if (!p) return false;
  b->p = p;
  b->cap = cap;
  return true;
}

bool wire_encode(wire_buf *b, uint8_t code, int64_t num, int nargs, const wire_arg *args) {
  size_t body = WIRE_BODY_FIXED;
  for (int i = 0; i < nargs; i++) body += 4 + (size_t)args[i].len;
  if (!buf_reserve(b, WIRE_HEADER + body)) return false;
  uint8_t *p = b->p + b->len;
  put_u32(p, WIRE_MAGIC);
  put_u32(p + 4, (uint32_t)body);
  p += WIRE_HEADER;
  p[0] = code;
  p[1] = 0;
  p[2] = (uint8_t)nargs;
  p[3] = (uint8_t)(nargs >> 8);
  put_u64(p + 4, (uint64_t)num);
  p += WIRE_BODY_FIXED;
  for (int i = 0; i < nargs; i++) {
    put_u32(p, args[i].len);
    if (args[i].len) memcpy(p + 4, args[i].p, args[i].len);
    p += 4 + args[i].len;
  }
  b->len += WIRE_HEADER + body;
  return true;
}

void wire_buf_free(wire_buf *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}

wire_arg wire_str(const char *s) {
  wire_arg a = {(const uint8_t *)s, (uint32_t)strlen(s)};
  return a;
}

const char *wire_show(const uint8_t *p, size_t len, char *buf, size_t n) {
  size_t o = 0, shown = len < 64 ? len : 64;
  for (size_t i = 0; i < shown && o + 5 < n; i++) {
    uint8_t ch = p[i];
    if (ch >= 32 && ch < 127 && ch != '\\') buf[o++] = (char)ch;
    else o += (size_t)snprintf(buf + o, n - o, "\\x%02x", ch);
  }
  if (shown < len && o + 4 < n) o += (size_t)snprintf(buf + o, n - o, "...");
  buf[o < n ? o : n - 1] = 0;
  return buf;
}

bool wire_token_equal(wire_arg given, const char *token) {
  /* every byte up to the longest legal token is compared: the time taken tells nothing about the token */
  size_t n = strlen(token);
  unsigned diff = given.len != n || given.len > DT_STORE_MAX_TOKEN;
  for (size_t i = 0; i < DT_STORE_MAX_TOKEN; i++) {
    uint8_t g = i < given.len ? given.p[i] : 0, t = i < n ? (uint8_t)token[i] : 0;
    diff |= (unsigned)(g ^ t);
  }
  return diff == 0;
}

int wire_listen(const char *host, int port, int backlog, int *bound, int *err) {
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
  int rc = getaddrinfo(host && *host ? host : NULL, portstr, &hints, &res);
  if (rc != 0) {
    *err = rc < 0 ? rc : -1;
    return -1;
  }
  int listen_fd = -1;
  for (struct addrinfo *ai = res; ai && listen_fd < 0; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog) == 0) {
      listen_fd = fd;
      struct sockaddr_storage sa;
      socklen_t len = sizeof sa;
      getsockname(fd, (struct sockaddr *)&sa, &len);
      *bound = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                              : ((struct sockaddr_in *)&sa)->sin_port);
    } else {
      *err = errno;
      close(fd);
    }
  }
  freeaddrinfo(res);
  return listen_fd;
}
