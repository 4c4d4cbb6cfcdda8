/* store_wire.h: the store's length-prefixed binary message format, shared by server and client. */
#ifndef DT_STORE_WIRE_H
#define DT_STORE_WIRE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dt_store.h"

/* A message is an 8-byte header (u32 magic, u32 body length) and a body:
 *   u8 code, u8 zero, u16 nargs, i64 num, then nargs x (u32 length, bytes).
 * All integers little-endian. Requests carry an op code; replies a WIRE_* status code,
 * with the error text as their one argument on failure. */
enum {
  WIRE_MAGIC = 0x31535444, /* "DTS1" */
  WIRE_VERSION = 1,
  WIRE_HEADER = 8,
  WIRE_BODY_FIXED = 12,
  WIRE_MAX_ARGS = DT_STORE_MAX_KEYS + 1,
  /* largest legal body: compare_set with a key and two maximal values */
  WIRE_MAX_BODY = WIRE_BODY_FIXED + 3 * 4 + DT_STORE_MAX_KEY + 2 * DT_STORE_MAX_VALUE,
  /* before the token is accepted only a hello fits */
  WIRE_MAX_HELLO_BODY = WIRE_BODY_FIXED + 4 + DT_STORE_MAX_TOKEN
};

typedef enum {
  WIRE_HELLO = 1, /* args: token; num: protocol version */
  WIRE_SET,       /* key, value */
  WIRE_GET,       /* key; num: timeout ms. Reply: value */
  WIRE_ADD,       /* key; num: delta. Reply num: new value */
  WIRE_CHECK,     /* keys. Reply num: 1 when all exist */
  WIRE_WAIT,      /* keys; num: timeout ms */
  WIRE_CAS,       /* key, expected, desired. Reply num: 1 when swapped */
  WIRE_DELETE,    /* key. Reply num: 1 when it existed */
  WIRE_NUM_KEYS,  /* Reply num: key count */
  WIRE_OK = 0x80,
  WIRE_ERR = 0x81,    /* args: message */
  WIRE_TIMEOUT = 0x82, /* args: message */
  WIRE_RETRY = 0x83    /* args: message; before the hello only: the server dropped the connection, try again */
} wire_code;

typedef struct wire_arg {
  const uint8_t *p;
  uint32_t len;
} wire_arg;

typedef struct wire_buf {
  uint8_t *p;
  size_t len, cap;
} wire_buf;

/* Body length from a header; false when the magic is wrong. */
bool wire_header(const uint8_t *h, uint32_t *body_len);
/* Split a complete body into code, num and arguments (pointing into body). False with a
 * reason in err when lengths are inconsistent or there are more than max_args arguments. */
bool wire_parse(const uint8_t *body, uint32_t body_len, uint8_t *code, int64_t *num, wire_arg *args,
                int max_args, int *nargs, char *err, size_t errn);
/* Append one encoded message to b; false when out of memory. */
bool wire_encode(wire_buf *b, uint8_t code, int64_t num, int nargs, const wire_arg *args);
void wire_buf_free(wire_buf *b);
/* Argument from a C string (length via strlen). */
wire_arg wire_str(const char *s);
/* Whether the token a client presented equals the server's, in time independent of their contents. */
bool wire_token_equal(wire_arg given, const char *token);
/* A non-blocking TCP socket listening on host:port (NULL or "": every interface; port 0: any free port, *bound gets
 * the port), or -1 with *err an errno or (negative) a getaddrinfo error. Shared with the REPL's control socket. */
int wire_listen(const char *host, int port, int backlog, int *bound, int *err);
/* A non-blocking TCP socket connected to host:port (one try, waiting until `deadline`, dt_time_now() seconds), or -1
 * with *err an errno. */
int wire_connect(const char *host, int port, double deadline, int *err);
/* Printable, truncated copy of an argument (a key) for error messages. */
const char *wire_show(const uint8_t *p, size_t len, char *buf, size_t n);

#endif
