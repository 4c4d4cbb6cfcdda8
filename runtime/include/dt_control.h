/* dt_control.h: a worker's control socket (a Unix socket the live REPL attaches to) and its client side. */
#ifndef DT_CONTROL_H
#define DT_CONTROL_H
#include "dt_base.h"

/* Wire: each message is a 4-byte length (host order: both ends are on one host) then that many bytes. */
enum {
  DT_CONTROL_MAX_MESSAGE = 16777216, /* bytes in one request or reply (16 MiB); larger requests hang up */
  DT_CONTROL_MAX_CLIENTS = 32        /* clients attached at once; one more is told so and hung up */
};

/* The server: a poll()-driven thread accepts clients on `path` (created 0600; its directory is created if missing and
 * made 0700), refuses a peer whose uid (SO_PEERCRED) is not this process's, and queues complete requests in arrival
 * order. It never calls into Lua: the owner takes requests at its safe points and replies; a reply to a client that
 * has gone is dropped. Replies start with a status byte ('o' done, 'e' failed); the server's own refusals are
 * 'e' + why. A stale socket file at `path` (a previous run's) is replaced. */
typedef struct dt_control dt_control;
dt_status dt_control_open(const char *path, dt_control **out);
/* Also listen on TCP at host:port (NULL or "": every interface; port 0: any free port; *bound gets the port), for
 * clients on other nodes: off unless called (the live REPL's repl_tcp). A TCP client's first message must be `token`
 * (the job token; compared in constant time): it is then answered `hello` (an 'o' reply) and served like a Unix
 * client; a wrong token is refused ('e' + why), hung up on and counted; one that sends none within 3 s is hung up. */
dt_status dt_control_listen_tcp(dt_control *c, const char *host, int port, const char *token, const char *hello,
                                int *bound);
/* TCP clients refused so far for a wrong token. */
int64_t dt_control_refused(const dt_control *c);
/* Requests waiting to be taken: an atomic read, no system call (the idle cost of a safe point). */
int dt_control_pending(const dt_control *c);
/* Where the owner is, said at each safe point: the thread answers a "w" request (where) from it at once, even while
 * the owner is inside a step ("step 12 of 100 done, in the next step for 3.2 s", or "step 12 of 100, paused");
 * total 0: no " of N". */
void dt_control_mark(dt_control *c, int64_t step, int64_t total, bool paused);
/* Sleep until a request is waiting or timeout_ms passed (a paused rank's wait); returns dt_control_pending. */
int dt_control_wait(dt_control *c, int timeout_ms);
/* The oldest waiting request: its client's id and a copy of its bytes (free it with dt_io_buffer_free). */
dt_status dt_control_take(dt_control *c, uint64_t *client, char **data, size_t *len);
/* Queue a reply to `client`; the server thread sends it without blocking this thread. */
dt_status dt_control_reply(dt_control *c, uint64_t client, const char *data, size_t len);
/* Stop the thread, hang up every client (they see the end of the stream) and remove the socket file. NULL is fine. */
void dt_control_close(dt_control *c);

/* OK when the peer of the connected Unix socket `fd` runs as `owner_uid`; else DT_ERR_STATE naming both uids. */
dt_status dt_control_check_peer(int fd, unsigned owner_uid);

/* The client: connect, send one message, receive one. dt_control_recv waits up to timeout_ms (-1: forever): *data
 * (free it with dt_io_buffer_free) and *len get the message; on a timeout *data is NULL; when the server hung up,
 * *data is NULL and *closed true (a refusal it sent first came with an earlier call). */
dt_status dt_control_connect(const char *path, int *fd);
/* A TCP client (dt_control_listen_tcp's): send the token as the first message, then use it as a Unix one. */
dt_status dt_control_connect_tcp(const char *host, int port, int *fd);
dt_status dt_control_send(int fd, const char *data, size_t len);
dt_status dt_control_recv(int fd, int timeout_ms, char **data, size_t *len, bool *closed);
void dt_control_disconnect(int fd);
/* Clients of one job's sockets take turns: an exclusive lock on `path` (created if missing; *fd holds it until
 * dt_control_unlock), held for one request to every rank, so that every rank gets concurrent clients' requests in
 * the same order. */
dt_status dt_control_lock(const char *path, int *fd);
void dt_control_unlock(int fd);

#endif
