/* dt_store.h: the rendezvous store: a token-guarded TCP key-value server and its blocking client. */
#ifndef DT_STORE_H
#define DT_STORE_H
#include "dt_base.h"

/* Limits of the wire protocol; larger requests are refused with an error reply.
 * Keys are C strings (no NUL inside); values are arbitrary bytes. */
enum {
  DT_STORE_MAX_KEY = 4096,             /* bytes in one key */
  DT_STORE_MAX_VALUE = 67108864,       /* bytes in one value (64 MiB) */
  DT_STORE_MAX_KEYS = 1024,            /* keys in one wait/check */
  DT_STORE_MAX_TOKEN = 1024,           /* bytes in the job token */
  DT_STORE_DEFAULT_TIMEOUT = -1        /* as timeout_ms: the client's timeout given at connect */
};

/* The server runs on its own thread until stopped. host NULL or "" listens on all interfaces;
 * port 0 picks a free port (read it with dt_store_server_port). Clients must present `token`
 * (NULL or "" means no token) or are refused with an error reply. */
typedef struct dt_store_server dt_store_server;
dt_status dt_store_server_start(const char *host, int port, const char *token, dt_store_server **out);
int dt_store_server_port(const dt_store_server *srv);
/* Clients refused so far for a wrong token, and the address of the last one in last_from (n bytes; "" if none). */
int64_t dt_store_server_refused(dt_store_server *srv, char *last_from, size_t n);
/* Stop the thread, close every connection and free the keys. NULL is fine. */
void dt_store_server_stop(dt_store_server *srv);

/* A client connection; calls from several threads are serialised. Connecting retries until
 * timeout_ms while the server is not up yet; timeout_ms is also the default for every call.
 * After a call times out waiting for the server's reply the connection is closed and later
 * calls fail; a get/wait that times out on the server side (key missing) keeps it usable. */
typedef struct dt_store_client dt_store_client;
dt_status dt_store_connect(const char *host, int port, const char *token, int timeout_ms, dt_store_client **out);
/* Close the connection; NULL is fine. */
void dt_store_close(dt_store_client *s);

dt_status dt_store_set(dt_store_client *s, const char *key, const void *value, int64_t len, int timeout_ms);
/* Wait until key exists, then return a copy of its value in *value (malloc'd, NUL-terminated
 * one byte past *len; free with dt_store_free). */
dt_status dt_store_get(dt_store_client *s, const char *key, int timeout_ms, void **value, int64_t *len);
void dt_store_free(void *value);
/* Atomically add delta to the integer stored (as decimal text) at key (missing = 0); *result
 * receives the new value. A value that is not a decimal integer is an error. */
dt_status dt_store_add(dt_store_client *s, const char *key, int64_t delta, int timeout_ms, int64_t *result);
/* Wait until every key exists. */
dt_status dt_store_wait(dt_store_client *s, int nkeys, const char *const *keys, int timeout_ms);
/* Whether every key exists now (no waiting). */
dt_status dt_store_check(dt_store_client *s, int nkeys, const char *const *keys, int timeout_ms, bool *exist);
/* If key's value equals expected (a missing key equals only an empty expected value), set it
 * to desired; *swapped says whether it did. */
dt_status dt_store_compare_set(dt_store_client *s, const char *key, const void *expected, int64_t expected_len,
                               const void *desired, int64_t desired_len, int timeout_ms, bool *swapped);
/* Remove key; *existed (may be NULL) says whether it was there. */
dt_status dt_store_delete(dt_store_client *s, const char *key, int timeout_ms, bool *existed);
dt_status dt_store_num_keys(dt_store_client *s, int timeout_ms, int64_t *count);

#endif
