/* A TCP proxy that makes a loopback server look distant: one-way delay per chunk, a shared bandwidth cap. */
/*
 * delay_proxy --upstream HOST:PORT [--listen [ADDR:]PORT] [--rtt 20ms] [--rate 100MB/s]
 *             [--burst 256KiB] [--no-handshake] [--max-queue 16MiB]
 *
 * This kernel has no netem, so the proxy does in user space what a distant
 * link does. Each direction is one link shared by every connection (a
 * virtual-time token bucket: a chunk of n bytes occupies the link for n/rate
 * seconds, after up to --burst bytes of credit), and every chunk then
 * arrives rtt/2 later. Because the delay is constant and the link is FIFO,
 * due times are non-decreasing per direction, so one FIFO per direction is
 * the whole timer queue. A new connection reaches the upstream only 1.5 RTT
 * after it was accepted (SYN, SYN-ACK, then the first data: the handshake a
 * distant server costs), unless --no-handshake. A connection stops being
 * read once --max-queue bytes wait in one direction (backpressure, bounded
 * memory; like a TCP window it bounds one connection to max-queue / (rtt/2):
 * 16 MiB / 10 ms = 1.6 GB/s by default). Prints "listening on ADDR:PORT" on stdout when ready; SIGTERM or
 * SIGINT ends it; at exit it prints bytes moved per direction on stderr.
 * Data never passes through user space (see pipebuf below).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK_MAX (64 * 1024)
#define PIPE_SIZE (1 << 20) /* the default pipe-max-size an unprivileged process may ask for */
#define POOL_MAX 64

typedef struct conn conn;

/*
 * Bytes in flight stay in the kernel: splice(2) moves them from the source
 * socket into a pipe and, when due, from the pipe to the destination socket
 * (page references, no copy through user space: half the proxy's CPU). A
 * pipe belongs to one connection and direction while it holds bytes; its
 * chunks leave it in the order they entered.
 */
typedef struct pipebuf {
  int r, w;
  size_t cap, used;      /* bytes; a pipe may also run out of slots before cap */
  bool full;             /* no more chunks go in until it is empty */
  int refs;              /* chunks in it, + 1 while it is the one being filled */
  struct pipebuf *next;  /* free list */
} pipebuf;

/* A chunk read from one side, waiting for its due time (global FIFO) and then for the other side (outq). */
typedef struct chunk {
  struct chunk *next;
  conn *c;
  int side;      /* the side it was read from; it goes to the other one */
  int64_t due;   /* CLOCK_MONOTONIC ns */
  size_t len, off;
  bool eof;      /* the source closed its write half: shut the destination's */
  pipebuf *pipe; /* where its bytes wait */
} chunk;

/* epoll's data for one socket of a connection. */
typedef struct endpoint {
  conn *c;
  int side;      /* 0: the client, 1: the upstream server */
} endpoint;

struct conn {
  int fd[2];
  endpoint ep[2];
  uint32_t events[2];      /* registered epoll interest */
  chunk *out_head[2], *out_tail[2]; /* due chunks read from side s, to write to side 1-s */
  size_t queued[2];        /* bytes read from side s not yet written (FIFO + outq) */
  bool rd_eof[2], wr_shut[2];
  pipebuf *fill[2];         /* the pipe side s's bytes go into next */
  bool connecting, connected, closed;
  int64_t connect_at;      /* when to connect upstream */
  int refs;                /* chunks of this conn in the global FIFOs, + 1 while open */
  conn *next_pending;      /* FIFO of connections waiting for connect_at */
};

static struct {
  int epfd, listen_fd;
  struct sockaddr_storage upstream;
  socklen_t upstream_len;
  int64_t one_way_ns, handshake_ns;
  double rate;             /* bytes/s, 0 = no cap */
  int64_t burst_ns;        /* credit the bucket may hold, in ns of link time */
  size_t max_queue;
  chunk *fifo_head[2], *fifo_tail[2];
  int64_t link_free[2], last_due[2];
  conn *pending_head, *pending_tail;
  uint64_t moved[2], conns, open_conns;
  pipebuf *pool;
  int pooled;
} P;

static volatile sig_atomic_t stop;

static void on_signal(int sig) { stop = 1; }

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "delay_proxy: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(2);
}

/* "20ms", "0.5s", "150us", "0": a duration in ns, or -1. */
static int64_t parse_duration(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || v < 0) return -1;
  double mul = !*end || !strcmp(end, "s") ? 1e9 : !strcmp(end, "ms") ? 1e6 : !strcmp(end, "us") ? 1e3
             : !strcmp(end, "ns") ? 1 : -1;
  return mul < 0 ? -1 : (int64_t)(v * mul);
}

/* "100MB/s", "1GiB/s", "800Mbit/s", "64KiB" (sizes too), "0" = unlimited: bytes (per s), or -1. */
static double parse_amount(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || v < 0) return -1;
  double mul = 1;
  switch (*end) {
  case 'k': case 'K': mul = 1e3; end++; break;
  case 'M': mul = 1e6; end++; break;
  case 'G': mul = 1e9; end++; break;
  default: break;
  }
  if (*end == 'i' && mul > 1) {
    mul = mul == 1e3 ? 1024.0 : mul == 1e6 ? 1048576.0 : 1073741824.0;
    end++;
  }
  if (!strncmp(end, "bit", 3)) {
    mul /= 8;
    end += 3;
  } else if (*end == 'B') {
    end++;
  }
  if (!strcmp(end, "/s")) end += 2;
  return *end ? -1 : v * mul;
}

/* A pipe from the pool, or a new one of PIPE_SIZE bytes (or what the system allows); NULL when out of fds. */
static pipebuf *pipe_get(void) {
  pipebuf *p = P.pool;
  if (p) {
    P.pool = p->next;
    P.pooled--;
  } else {
    int fds[2];
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC)) return NULL;
    p = calloc(1, sizeof *p);
    if (!p) {
      close(fds[0]);
      close(fds[1]);
      return NULL;
    }
    p->r = fds[0];
    p->w = fds[1];
    fcntl(p->w, F_SETPIPE_SZ, PIPE_SIZE);
    int cap = fcntl(p->w, F_GETPIPE_SZ);
    p->cap = cap > 0 ? (size_t)cap : 65536;
  }
  p->used = 0;
  p->full = false;
  p->refs = 1;
  p->next = NULL;
  return p;
}

/* Drops a reference: an empty pipe goes back to the pool, one with stale bytes (a closed connection) is closed. */
static void pipe_put(pipebuf *p) {
  if (!p || --p->refs > 0) return;
  if (p->used == 0 && P.pooled < POOL_MAX) {
    p->next = P.pool;
    P.pool = p;
    P.pooled++;
    return;
  }
  close(p->r);
  close(p->w);
  free(p);
}

static void chunk_free(chunk *k) {
  pipe_put(k->pipe);
  free(k);
}

/* Registers the epoll interest side's socket needs now (reading unless backed up; writing when due data waits). */
static void update(conn *c, int side) {
  if (c->closed || c->fd[side] < 0) return;
  uint32_t ev = 0;
  bool usable = side == 0 || c->connected;
  if (usable && !c->rd_eof[side] && c->queued[side] < P.max_queue) ev |= EPOLLIN;
  if ((usable && c->out_head[1 - side]) || (side == 1 && c->connecting)) ev |= EPOLLOUT;
  if (ev == c->events[side]) return;
  struct epoll_event e = {.events = ev, .data.ptr = &c->ep[side]};
  epoll_ctl(P.epfd, EPOLL_CTL_MOD, c->fd[side], &e);
  c->events[side] = ev;
}

static void unref(conn *c) {
  if (--c->refs == 0) free(c);
}

/* Closes both sockets and drops the due data; chunks still in the global FIFOs keep c alive until due. */
static void close_conn(conn *c) {
  if (c->closed) return;
  c->closed = true;
  for (int s = 0; s < 2; s++) {
    if (c->fd[s] >= 0) close(c->fd[s]);
    c->fd[s] = -1;
    while (c->out_head[s]) {
      chunk *k = c->out_head[s];
      c->out_head[s] = k->next;
      chunk_free(k);
    }
    pipe_put(c->fill[s]);
    c->fill[s] = NULL;
  }
  P.open_conns--;
  unref(c);
}

/* Writes side s's due chunks to side 1-s until the socket would block. */
static void flush(conn *c, int s) {
  int dst = 1 - s;
  if (c->closed || (dst == 1 && !c->connected)) return;
  while (c->out_head[s]) {
    chunk *k = c->out_head[s];
    if (k->eof) {
      shutdown(c->fd[dst], SHUT_WR);
      c->wr_shut[dst] = true;
    } else {
      while (k->off < k->len) {
        ssize_t n = splice(k->pipe->r, NULL, c->fd[dst], NULL, k->len - k->off,
                           SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          update(c, dst);
          return;
        }
        if (n <= 0) {
          close_conn(c);
          return;
        }
        k->off += (size_t)n;
        k->pipe->used -= (size_t)n;
        c->queued[s] -= (size_t)n;
        P.moved[s] += (uint64_t)n;
      }
    }
    c->out_head[s] = k->next;
    if (!c->out_head[s]) c->out_tail[s] = NULL;
    chunk_free(k);
  }
  if (c->wr_shut[0] && c->wr_shut[1]) {
    close_conn(c);
    return;
  }
  update(c, dst);
  update(c, s);
}

/* Puts a chunk read from side s on the link: its due time from the token bucket and the one-way delay. */
static void enqueue(conn *c, int s, chunk *k, int64_t now) {
  int64_t ready = now;
  if (P.rate > 0 && k->len) {
    int64_t start = now - P.burst_ns;
    if (P.link_free[s] > start) start = P.link_free[s];
    P.link_free[s] = start + (int64_t)((double)k->len * 1e9 / P.rate);
    if (P.link_free[s] > ready) ready = P.link_free[s];
  }
  k->due = ready + P.one_way_ns;
  if (k->due < P.last_due[s]) k->due = P.last_due[s];
  P.last_due[s] = k->due;
  k->c = c;
  k->side = s;
  k->next = NULL;
  if (P.fifo_tail[s]) P.fifo_tail[s]->next = k;
  else P.fifo_head[s] = k;
  P.fifo_tail[s] = k;
  c->refs++;
}

static void read_side(conn *c, int s) {
  bool fresh_pipe_tried = false;
  while (!c->closed && !c->rd_eof[s] && c->queued[s] < P.max_queue) {
    pipebuf *p = c->fill[s];
    if (!p || p->full || p->used >= p->cap) {
      if (p) {
        p->full = true;
        pipe_put(p);
      }
      p = c->fill[s] = pipe_get();
      if (!p) break; /* out of fds: read again when a pipe drains */
    }
    size_t room = p->cap - p->used;
    ssize_t n = splice(c->fd[s], NULL, p->w, NULL, room, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      /* Either the socket is empty or the pipe ran out of slots (partly filled pages): then a fresh pipe. */
      int avail = 0;
      if (p->used == 0 || fresh_pipe_tried || ioctl(c->fd[s], FIONREAD, &avail) || avail <= 0) break;
      p->full = true;
      fresh_pipe_tried = true;
      continue;
    }
    if (n < 0) { /* a reset: the other side sees one too, at once */
      close_conn(c);
      return;
    }
    chunk *k = calloc(1, sizeof *k);
    if (!k) break;
    k->len = (size_t)n;
    k->eof = n == 0;
    if (n == 0) {
      c->rd_eof[s] = true;
    } else {
      k->pipe = p;
      p->refs++;
      p->used += (size_t)n;
    }
    c->queued[s] += (size_t)n;
    enqueue(c, s, k, now_ns());
  }
  update(c, s);
}

static void start_connect(conn *c) {
  int fd = socket(P.upstream.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    close_conn(c);
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  c->fd[1] = fd;
  struct epoll_event e = {.events = EPOLLOUT, .data.ptr = &c->ep[1]};
  epoll_ctl(P.epfd, EPOLL_CTL_ADD, fd, &e);
  c->events[1] = EPOLLOUT;
  if (connect(fd, (struct sockaddr *)&P.upstream, P.upstream_len) && errno != EINPROGRESS) {
    perror("delay_proxy: connect to upstream");
    close_conn(c);
    return;
  }
  c->connecting = true;
}

static void on_connected(conn *c) {
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(c->fd[1], SOL_SOCKET, SO_ERROR, &err, &len);
  if (err) {
    fprintf(stderr, "delay_proxy: connect to upstream: %s\n", strerror(err));
    close_conn(c);
    return;
  }
  c->connecting = false;
  c->connected = true;
  flush(c, 0);
  if (!c->closed) update(c, 1);
}

static void accept_all(void) {
  for (;;) {
    int fd = accept4(P.listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    conn *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd[0] = fd;
    c->fd[1] = -1;
    c->refs = 1;
    for (int s = 0; s < 2; s++) c->ep[s] = (endpoint){c, s};
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &c->ep[0]};
    epoll_ctl(P.epfd, EPOLL_CTL_ADD, fd, &e);
    c->events[0] = EPOLLIN;
    c->connect_at = now_ns() + P.handshake_ns;
    c->refs++; /* held by the pending list */
    if (P.pending_tail) P.pending_tail->next_pending = c;
    else P.pending_head = c;
    P.pending_tail = c;
    P.conns++;
    P.open_conns++;
  }
}

/* Moves everything due into the connections' output queues and starts due connects. */
static void run_timers(int64_t now) {
  while (P.pending_head && P.pending_head->connect_at <= now) {
    conn *c = P.pending_head;
    P.pending_head = c->next_pending;
    if (!P.pending_head) P.pending_tail = NULL;
    if (!c->closed) start_connect(c);
    unref(c);
  }
  for (int s = 0; s < 2; s++) {
    while (P.fifo_head[s] && P.fifo_head[s]->due <= now) {
      chunk *k = P.fifo_head[s];
      P.fifo_head[s] = k->next;
      if (!P.fifo_head[s]) P.fifo_tail[s] = NULL;
      conn *c = k->c;
      if (c->closed) {
        chunk_free(k);
      } else {
        k->next = NULL;
        if (c->out_tail[s]) c->out_tail[s]->next = k;
        else c->out_head[s] = k;
        c->out_tail[s] = k;
        flush(c, s);
      }
      unref(c);
    }
  }
}

static int64_t next_deadline(void) {
  int64_t t = INT64_MAX;
  if (P.pending_head) t = P.pending_head->connect_at;
  for (int s = 0; s < 2; s++)
    if (P.fifo_head[s] && P.fifo_head[s]->due < t) t = P.fifo_head[s]->due;
  return t;
}

static void usage(void) {
  fprintf(stderr, "usage: delay_proxy --upstream HOST:PORT [--listen [ADDR:]PORT] [--rtt 20ms] [--rate 100MB/s]\n"
                  "                   [--burst 256KiB] [--max-queue 16MiB] [--no-handshake]\n");
  exit(2);
}

/* Splits "HOST:PORT" (or "PORT" with default_host) and resolves it. */
static void resolve(const char *spec, const char *default_host, struct sockaddr_storage *out, socklen_t *len,
                    bool passive) {
  char host[256];
  const char *colon = strrchr(spec, ':');
  const char *port = colon ? colon + 1 : spec;
  if (colon) {
    size_t n = (size_t)(colon - spec);
    if (n >= sizeof host) die("address too long: %s", spec);
    memcpy(host, spec, n);
    host[n] = 0;
  } else {
    snprintf(host, sizeof host, "%s", default_host);
  }
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0}, *res;
  if (getaddrinfo(host, port, &hints, &res) || !res) die("cannot resolve %s (want HOST:PORT)", spec);
  memcpy(out, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
}

int main(int argc, char **argv) {
  const char *listen_spec = "127.0.0.1:0", *upstream = NULL;
  int64_t rtt = 20000000;
  P.rate = 0;
  double burst = 256 * 1024;
  P.max_queue = 16u << 20;
  bool handshake = true;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--no-handshake")) {
      handshake = false;
      continue;
    }
    if (!v) usage();
    i++;
    if (!strcmp(a, "--listen")) listen_spec = v;
    else if (!strcmp(a, "--upstream")) upstream = v;
    else if (!strcmp(a, "--rtt")) {
      if ((rtt = parse_duration(v)) < 0) die("--rtt %s: want a duration such as 20ms", v);
    } else if (!strcmp(a, "--rate")) {
      if ((P.rate = parse_amount(v)) < 0) die("--rate %s: want a rate such as 100MB/s, 1GiB/s or 800Mbit/s", v);
    } else if (!strcmp(a, "--burst")) {
      if ((burst = parse_amount(v)) < 0) die("--burst %s: want a size such as 256KiB", v);
    } else if (!strcmp(a, "--max-queue")) {
      double q = parse_amount(v);
      if (q < CHUNK_MAX) die("--max-queue %s: want a size of at least 64KiB", v);
      P.max_queue = (size_t)q;
    } else usage();
  }
  if (!upstream) usage();
  P.one_way_ns = rtt / 2;
  P.handshake_ns = handshake ? rtt + rtt / 2 : 0;
  P.burst_ns = P.rate > 0 ? (int64_t)(burst * 1e9 / P.rate) : 0;
  resolve(upstream, "127.0.0.1", &P.upstream, &P.upstream_len, false);

  struct sockaddr_storage la;
  socklen_t la_len;
  resolve(listen_spec, "127.0.0.1", &la, &la_len, true);
  P.listen_fd = socket(la.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(P.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (P.listen_fd < 0 || bind(P.listen_fd, (struct sockaddr *)&la, la_len) || listen(P.listen_fd, 512))
    die("cannot listen on %s (port taken? use --listen with another port or 0)", listen_spec);
  getsockname(P.listen_fd, (struct sockaddr *)&la, &la_len);
  char host[64] = "?";
  int port = 0;
  if (la.ss_family == AF_INET) {
    inet_ntop(AF_INET, &((struct sockaddr_in *)&la)->sin_addr, host, sizeof host);
    port = ntohs(((struct sockaddr_in *)&la)->sin_port);
  } else if (la.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&la)->sin6_addr, host, sizeof host);
    port = ntohs(((struct sockaddr_in6 *)&la)->sin6_port);
  }

  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  struct rlimit nofile; /* two pipes' fds per MiB in flight per connection and direction */
  if (!getrlimit(RLIMIT_NOFILE, &nofile) && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  P.epfd = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event le = {.events = EPOLLIN, .data.ptr = NULL};
  epoll_ctl(P.epfd, EPOLL_CTL_ADD, P.listen_fd, &le);
  printf("listening on %s:%d\n", host, port);
  fflush(stdout);

  struct epoll_event events[128];
  while (!stop) {
    int64_t deadline = next_deadline(), now = now_ns();
    struct timespec ts, *tsp = NULL;
    if (deadline != INT64_MAX) {
      int64_t wait = deadline > now ? deadline - now : 0;
      ts = (struct timespec){.tv_sec = wait / 1000000000, .tv_nsec = wait % 1000000000};
      tsp = &ts;
    }
    int n = epoll_pwait2(P.epfd, events, 128, tsp, NULL);
    if (n < 0 && errno != EINTR) {
      perror("delay_proxy: epoll_pwait2");
      return 1;
    }
    for (int i = 0; i < n; i++) {
      endpoint *ep = events[i].data.ptr;
      if (!ep) {
        accept_all();
        continue;
      }
      conn *c = ep->c;
      if (c->closed) continue;
      c->refs++; /* keep c while handling this event, even if it closes */
      int s = ep->side;
      uint32_t ev = events[i].events;
      if (s == 1 && c->connecting && (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) on_connected(c);
      /* An error, or a hang-up after the end of input: nothing more can move on this socket. */
      if (!c->closed && ((ev & EPOLLERR) || ((ev & EPOLLHUP) && c->rd_eof[s]))) close_conn(c);
      if (!c->closed && (ev & EPOLLOUT)) flush(c, 1 - s);
      if (!c->closed && (ev & (EPOLLIN | EPOLLHUP))) read_side(c, s);
      unref(c);
    }
    run_timers(now_ns());
  }
  fprintf(stderr, "delay_proxy: %" PRIu64 " connections, %" PRIu64 " bytes to the upstream, %" PRIu64
                  " bytes back\n", P.conns, P.moved[0], P.moved[1]);
  return 0;
}
