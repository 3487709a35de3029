/*
 * engine/group/transport.c over real TCP on 127.0.0.1 (port 0): CURVE with a ZAP
 * allow-list, refusals of NULL/PLAIN/unknown keys/garbage, fail-closed
 * listening, plaintext only when asked, the message-size bound, key files.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <zmq.h>

#include "transport.h"
#include "transport_keys.h"

typedef struct fixture {
  char dir[64];
  char head_key[128], head_pub[128], w1_key[128], w1_pub[128], w2_key[128], allowed[128];
  char w1_z85[SF_CURVE_KEY_Z85_LEN + 1];
  void *ctx;
} fixture;

static void path_in(const fixture *f, char *out, size_t size, const char *name) { snprintf(out, size, "%s/%s", f->dir, name); }

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/sf-test-transport-XXXXXX");
  if (!mkdtemp(f->dir)) return -1;
  sf_error err;
  if (sf_curve_keygen(f->dir, "head", NULL, &err) < 0 || sf_curve_keygen(f->dir, "w1", f->w1_z85, &err) < 0 ||
      sf_curve_keygen(f->dir, "w2", NULL, &err) < 0)
    return -1;
  path_in(f, f->head_key, sizeof f->head_key, "head.key");
  path_in(f, f->head_pub, sizeof f->head_pub, "head.pub");
  path_in(f, f->w1_key, sizeof f->w1_key, "w1.key");
  path_in(f, f->w1_pub, sizeof f->w1_pub, "w1.pub");
  path_in(f, f->w2_key, sizeof f->w2_key, "w2.key");
  path_in(f, f->allowed, sizeof f->allowed, "allowed");
  FILE *a = fopen(f->allowed, "w");
  if (!a) return -1;
  fprintf(a, "# workers admitted by the head\n\n%s   # w1\n", f->w1_z85);
  fclose(a);
  f->ctx = zmq_ctx_new();
  *state = f;
  alarm(60); /* a failed assertion leaves sockets open and zmq_ctx_term waiting: end the process instead */
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  zmq_ctx_term(f->ctx);
  alarm(0);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
  if (system(cmd) != 0) return -1;
  free(f);
  return 0;
}

static sf_transport_options head_options(const fixture *f) {
  sf_transport_options o = {0};
  o.endpoint = "tcp://127.0.0.1:0";
  o.secret_key_file = f->head_key;
  o.allowed_keys = f->allowed;
  o.handshake_timeout = 2;
  return o;
}

static sf_transport *listen_ok(const fixture *f, const sf_transport_options *o) {
  sf_transport *t = NULL;
  sf_error err;
  int rc = sf_transport_listen(f->ctx, o, &t, &err);
  if (rc < 0) fail_msg("listen: %s", err.message);
  const char *ep = sf_transport_endpoint(t);
  assert_non_null(strstr(ep, "tcp://127.0.0.1:"));
  assert_int_not_equal(atoi(strrchr(ep, ':') + 1), 0); /* port 0 resolved */
  return t;
}

static sf_transport *connect_ok(const fixture *f, const char *endpoint, const char *key, const char *server_key) {
  sf_transport_options o = {0};
  o.endpoint = endpoint;
  o.secret_key_file = key;
  o.server_key_file = server_key;
  sf_transport *t = NULL;
  sf_error err;
  if (sf_transport_connect(f->ctx, &o, &t, &err) < 0) fail_msg("connect: %s", err.message);
  return t;
}

/* Receives one message on a ROUTER within ms: 0 and the frames' count, or -1 on timeout. */
static int router_recv(void *router, int ms, char *peer, size_t *peer_len, char *body, size_t body_size, char *user_id) {
  zmq_pollitem_t item = {router, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, ms) <= 0) return -1;
  int n = zmq_recv(router, peer, 255, 0);
  assert_true(n > 0);
  *peer_len = (size_t)n;
  zmq_msg_t m;
  zmq_msg_init(&m);
  assert_true(zmq_msg_recv(&m, router, 0) >= 0);
  size_t len = zmq_msg_size(&m) < body_size - 1 ? zmq_msg_size(&m) : body_size - 1;
  memcpy(body, zmq_msg_data(&m), len);
  body[len] = '\0';
  if (user_id) {
    const char *u = zmq_msg_gets(&m, "User-Id");
    snprintf(user_id, SF_CURVE_KEY_Z85_LEN + 1, "%s", u ? u : "");
  }
  zmq_msg_close(&m);
  return 0;
}

/* The legitimate round trip: dealer -> router (checks body and User-Id), router -> dealer. */
static void round_trip(void *router, void *dealer, const char *text, const char *expect_user) {
  assert_int_equal(zmq_send(dealer, text, strlen(text), 0), (int)strlen(text));
  char peer[256], body[256], user[64];
  size_t peer_len;
  assert_int_equal(router_recv(router, 5000, peer, &peer_len, body, sizeof body, user), 0);
  assert_string_equal(body, text);
  if (expect_user) assert_string_equal(user, expect_user);
  assert_int_equal(zmq_send(router, peer, peer_len, ZMQ_SNDMORE), (int)peer_len);
  assert_int_equal(zmq_send(router, "ack", 3, 0), 3);
  zmq_pollitem_t item = {dealer, 0, ZMQ_POLLIN, 0};
  assert_int_equal(zmq_poll(&item, 1, 5000), 1);
  char reply[8] = "";
  assert_int_equal(zmq_recv(dealer, reply, sizeof reply - 1, 0), 3);
  assert_string_equal(reply, "ack");
}

/* Waits (up to 5 s) until the transport's stats reach at least these counts; returns them. */
static sf_transport_stats wait_stats(sf_transport *t, uint64_t mech, uint64_t key, uint64_t proto) {
  sf_transport_stats s;
  for (int i = 0; i < 500; i++) {
    sf_transport_get_stats(t, &s);
    if (s.refused_mechanism >= mech && s.refused_key >= key && s.refused_protocol >= proto) break;
    usleep(10000);
  }
  return s;
}

/* Waits (up to 5 s) until n connections were refused in all; returns the stats. */
static sf_transport_stats wait_refused(sf_transport *t, uint64_t n) {
  sf_transport_stats s;
  for (int i = 0; i < 500 && sf_transport_refused(t) < n; i++) usleep(10000);
  sf_transport_get_stats(t, &s);
  return s;
}

static void *raw_dealer(void *ctx, const char *endpoint, int mechanism) {
  void *d = zmq_socket(ctx, ZMQ_DEALER);
  int zero = 0, never = -1;
  zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(d, ZMQ_RECONNECT_IVL, &never, sizeof never); /* one connection each: exact counts */
  if (mechanism == ZMQ_PLAIN) {
    zmq_setsockopt(d, ZMQ_PLAIN_USERNAME, "admin", 5);
    zmq_setsockopt(d, ZMQ_PLAIN_PASSWORD, "admin", 5);
  }
  assert_int_equal(zmq_connect(d, endpoint), 0);
  return d;
}

static void test_listed_key_round_trip(void **state) {
  fixture *f = *state;
  sf_transport_options o = head_options(f);
  sf_transport *head = listen_ok(f, &o);
  sf_transport *w1 = connect_ok(f, sf_transport_endpoint(head), f->w1_key, f->head_pub);
  round_trip(sf_transport_socket(head), sf_transport_socket(w1), "hello", f->w1_z85);
  sf_transport_stats s;
  sf_transport_get_stats(head, &s);
  assert_int_equal(s.accepted, 1);
  assert_int_equal(sf_transport_refused(head), 0);
  sf_transport_close(&w1);
  sf_transport_close(&head);
  assert_null(head);
  /* A second listening transport may follow on the same context once the first is closed. */
  head = listen_ok(f, &o);
  sf_transport_close(&head);
}

static void test_allow_dir_and_reload(void **state) {
  fixture *f = *state;
  char dir[128], cmd[512];
  path_in(f, dir, sizeof dir, "allowed.d");
  assert_int_equal(mkdir(dir, 0755), 0);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s/'", f->w1_pub, dir);
  assert_int_equal(system(cmd), 0);
  sf_transport_options o = head_options(f);
  o.allowed_keys = dir;
  sf_transport *head = listen_ok(f, &o);
  sf_transport *w1 = connect_ok(f, sf_transport_endpoint(head), f->w1_key, f->head_pub);
  round_trip(sf_transport_socket(head), sf_transport_socket(w1), "from w1", f->w1_z85);
  /* w2 is not listed yet: refused. */
  sf_transport *w2 = connect_ok(f, sf_transport_endpoint(head), f->w2_key, f->head_pub);
  zmq_send(sf_transport_socket(w2), "early", 5, ZMQ_DONTWAIT);
  sf_transport_stats s = wait_stats(head, 0, 1, 0);
  assert_true(s.refused_key >= 1); /* the refused client may have retried already */
  sf_transport_close(&w2);
  /* Adding w2.pub to the directory admits it without a restart. */
  snprintf(cmd, sizeof cmd, "cp '%s/w2.pub' '%s/'", f->dir, dir);
  assert_int_equal(system(cmd), 0);
  w2 = connect_ok(f, sf_transport_endpoint(head), f->w2_key, f->head_pub);
  char w2_z85[SF_CURVE_KEY_Z85_LEN + 1];
  sf_error err;
  assert_int_equal(sf_curve_key_load(f->w2_key, w2_z85, NULL, &err), 0);
  round_trip(sf_transport_socket(head), sf_transport_socket(w2), "from w2", w2_z85);
  sf_transport_close(&w2);
  sf_transport_close(&w1);
  sf_transport_close(&head);
}

static void test_unknown_key_refused(void **state) {
  fixture *f = *state;
  sf_transport_options o = head_options(f);
  sf_transport *head = listen_ok(f, &o);
  sf_transport *w1 = connect_ok(f, sf_transport_endpoint(head), f->w1_key, f->head_pub);
  sf_transport *w2 = connect_ok(f, sf_transport_endpoint(head), f->w2_key, f->head_pub);
  zmq_send(sf_transport_socket(w2), "let me in", 9, ZMQ_DONTWAIT);
  sf_transport_stats s = wait_stats(head, 0, 1, 0);
  assert_true(s.refused_key >= 1); /* the refused client may have retried already */
  assert_int_equal(s.refused_mechanism, 0);
  /* Only w1's message arrives. */
  round_trip(sf_transport_socket(head), sf_transport_socket(w1), "legit", f->w1_z85);
  char peer[256], body[64];
  size_t peer_len;
  assert_int_equal(router_recv(sf_transport_socket(head), 300, peer, &peer_len, body, sizeof body, NULL), -1);
  sf_transport_close(&w2);
  sf_transport_close(&w1);
  sf_transport_close(&head);
}

static void test_null_plain_garbage_refused(void **state) {
  fixture *f = *state;
  sf_transport_options o = head_options(f);
  sf_transport *head = listen_ok(f, &o);
  const char *ep = sf_transport_endpoint(head);
  void *null_client = raw_dealer(f->ctx, ep, ZMQ_NULL);
  zmq_send(null_client, "null", 4, ZMQ_DONTWAIT);
  /* Usually counted as "not CURVE"; if the client hangs up on the head's greeting first, as a
     handshake that failed.  Either way refused, once. */
  sf_transport_stats s = wait_refused(head, 1);
  assert_int_equal(s.refused_mechanism + s.refused_protocol, 1);
  void *plain_client = raw_dealer(f->ctx, ep, ZMQ_PLAIN);
  zmq_send(plain_client, "plain", 5, ZMQ_DONTWAIT);
  s = wait_refused(head, 2);
  assert_int_equal(s.refused_mechanism + s.refused_protocol, 2);
  zmq_close(null_client);
  zmq_close(plain_client);

  /* Garbage bytes on the raw TCP port. */
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(strrchr(ep, ':') + 1))};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n\x01\x02\x03\xff\xfe";
  assert_int_equal(send(fd, junk, sizeof junk, MSG_NOSIGNAL), (ssize_t)sizeof junk);
  char buf[256];
  while (recv(fd, buf, sizeof buf, 0) > 0) { /* the head closes on us */
  }
  close(fd);
  s = wait_refused(head, 3);
  assert_int_equal(s.refused_mechanism + s.refused_protocol, 3);
  assert_int_equal(s.refused_key, 0);
  assert_int_equal(s.accepted, 0);
  assert_int_equal(sf_transport_refused(head), 3);

  /* Nothing reached the ROUTER; a listed worker still gets through. */
  char peer[256], body[64];
  size_t peer_len;
  assert_int_equal(router_recv(sf_transport_socket(head), 200, peer, &peer_len, body, sizeof body, NULL), -1);
  sf_transport *w1 = connect_ok(f, ep, f->w1_key, f->head_pub);
  round_trip(sf_transport_socket(head), sf_transport_socket(w1), "after the attack", f->w1_z85);
  sf_transport_close(&w1);
  sf_transport_close(&head);
}

static void test_fail_closed(void **state) {
  fixture *f = *state;
  sf_transport *t = NULL;
  sf_error err;
  sf_transport_options o = head_options(f);
  o.allowed_keys = NULL;
  assert_int_equal(sf_transport_listen(f->ctx, &o, &t, &err), SF_EDENIED);
  assert_null(t);
  assert_non_null(strstr(err.message, "shardflow keygen"));
  o.allowed_keys = "";
  assert_int_equal(sf_transport_listen(f->ctx, &o, &t, &err), SF_EDENIED);
  o = head_options(f);
  o.secret_key_file = NULL;
  assert_int_equal(sf_transport_listen(f->ctx, &o, &t, &err), SF_EDENIED);
  o = head_options(f);
  o.allowed_keys = "/nonexistent/allowed";
  assert_int_equal(sf_transport_listen(f->ctx, &o, &t, &err), SF_ENOENT);
  assert_string_equal(err.url, "/nonexistent/allowed");
  /* A public key file where the secret key belongs. */
  o = head_options(f);
  o.secret_key_file = f->head_pub;
  assert_int_equal(sf_transport_listen(f->ctx, &o, &t, &err), SF_EFORMAT);
  assert_non_null(strstr(err.message, "secret key"));
  /* A malformed allow-list names the line. */
  char bad[128];
  path_in(f, bad, sizeof bad, "bad-allowed");
  FILE *b = fopen(bad, "w");
  fprintf(b, "# ok\n%s\nnot a key\n", f->w1_z85);
  fclose(b);
  o = head_options(f);
  o.allowed_keys = bad;
  assert_int_equal(sf_transport_listen(f->ctx, &o, &t, &err), SF_EFORMAT);
  assert_int_equal(err.line, 3);
  /* A client without keys cannot connect over tcp:// either. */
  sf_transport_options c = {.endpoint = "tcp://127.0.0.1:9"};
  assert_int_equal(sf_transport_connect(f->ctx, &c, &t, &err), SF_EDENIED);
  /* Bad endpoints. */
  o = head_options(f);
  o.endpoint = "udp://127.0.0.1:0";
  assert_int_equal(sf_transport_listen(f->ctx, &o, &t, &err), SF_EINVAL);
  /* One CURVE listener per context. */
  o = head_options(f);
  sf_transport *first = listen_ok(f, &o);
  assert_int_equal(sf_transport_listen(f->ctx, &o, &t, &err), SF_EINVAL);
  assert_non_null(strstr(err.message, "per context"));
  /* Address in use: a plaintext listener on the first one's port. */
  sf_transport_options p = {.endpoint = sf_transport_endpoint(first), .plaintext = true};
  assert_int_equal(sf_transport_listen(f->ctx, &p, &t, &err), SF_ENET);
  assert_non_null(strstr(err.message, "port"));
  sf_transport_close(&first);
}

static void test_plaintext_only_when_asked(void **state) {
  fixture *f = *state;
  sf_transport *t = NULL;
  sf_error err;
  sf_transport_options o = {.endpoint = "tcp://127.0.0.1:0", .plaintext = true, .allowed_keys = f->allowed};
  assert_int_equal(sf_transport_listen(f->ctx, &o, &t, &err), SF_EINVAL); /* plaintext cannot check keys */
  o.allowed_keys = NULL;
  sf_transport *head = listen_ok(f, &o);
  sf_transport_options c = {.endpoint = sf_transport_endpoint(head), .plaintext = true};
  sf_transport *w = NULL;
  assert_int_equal(sf_transport_connect(f->ctx, &c, &w, &err), 0);
  round_trip(sf_transport_socket(head), sf_transport_socket(w), "clear text", NULL);
  sf_transport_close(&w);
  sf_transport_close(&head);

  /* ipc:// needs no keys. */
  char ipc[160];
  snprintf(ipc, sizeof ipc, "ipc://%s/head.sock", f->dir);
  sf_transport_options i = {.endpoint = ipc};
  assert_int_equal(sf_transport_listen(f->ctx, &i, &head, &err), 0);
  assert_string_equal(sf_transport_endpoint(head), ipc);
  assert_int_equal(sf_transport_connect(f->ctx, &i, &w, &err), 0);
  round_trip(sf_transport_socket(head), sf_transport_socket(w), "over ipc", NULL);
  sf_transport_close(&w);
  sf_transport_close(&head);
}

static void test_oversized_message_dropped(void **state) {
  fixture *f = *state;
  /* Two listed workers: w1 is legitimate, w2 (also listed) sends too much. */
  FILE *a = fopen(f->allowed, "a");
  char w2_z85[SF_CURVE_KEY_Z85_LEN + 1];
  sf_error err;
  assert_int_equal(sf_curve_key_load(f->w2_key, w2_z85, NULL, &err), 0);
  fprintf(a, "public-key = \"%s\"\n", w2_z85);
  fclose(a);
  sf_transport_options o = head_options(f);
  o.max_message_bytes = 4096;
  sf_transport *head = listen_ok(f, &o);
  const char *ep = sf_transport_endpoint(head);
  sf_transport *w1 = connect_ok(f, ep, f->w1_key, f->head_pub);
  round_trip(sf_transport_socket(head), sf_transport_socket(w1), "before", f->w1_z85);
  sf_transport *w2 = connect_ok(f, ep, f->w2_key, f->head_pub);
  round_trip(sf_transport_socket(head), sf_transport_socket(w2), "small", w2_z85);
  size_t big = 64 << 10;
  char *payload = calloc(1, big);
  assert_int_equal(zmq_send(sf_transport_socket(w2), payload, big, 0), (int)big);
  assert_int_equal(zmq_send(sf_transport_socket(w2), "after big", 9, 0), 9);
  free(payload);
  /* The oversized message never arrives (libzmq drops the sender's connection); w1 is unharmed. */
  char peer[256], body[64];
  size_t peer_len;
  for (int i = 0; i < 3; i++) round_trip(sf_transport_socket(head), sf_transport_socket(w1), "during", f->w1_z85);
  int got = router_recv(sf_transport_socket(head), 500, peer, &peer_len, body, sizeof body, NULL);
  assert_true(got == -1 || strcmp(body, "after big") == 0); /* never the big one */
  round_trip(sf_transport_socket(head), sf_transport_socket(w1), "after", f->w1_z85);
  sf_transport_close(&w2);
  sf_transport_close(&w1);
  sf_transport_close(&head);
}

static void test_key_files(void **state) {
  fixture *f = *state;
  sf_error err;
  char pub[SF_CURVE_KEY_Z85_LEN + 1], sec[SF_CURVE_KEY_Z85_LEN + 1], pub2[SF_CURVE_KEY_Z85_LEN + 1];
  /* Modes as written. */
  struct stat st;
  assert_int_equal(stat(f->w1_key, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);
  assert_int_equal(stat(f->w1_pub, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0644);
  /* The public key from either file; the pair checks out against libzmq. */
  assert_int_equal(sf_curve_key_load(f->w1_pub, pub, NULL, &err), 0);
  assert_string_equal(pub, f->w1_z85);
  assert_int_equal(sf_curve_key_load(f->w1_key, pub2, sec, &err), 0);
  assert_string_equal(pub2, f->w1_z85);
  char derived[SF_CURVE_KEY_Z85_LEN + 1];
  assert_int_equal(zmq_curve_public(derived, sec), 0);
  assert_string_equal(derived, pub);
  /* No secret key in a .pub. */
  assert_int_equal(sf_curve_key_load(f->w1_pub, pub, sec, &err), SF_EFORMAT);
  /* Group/other-readable secret key: refused, naming the file and chmod 600. */
  assert_int_equal(chmod(f->w1_key, 0640), 0);
  assert_int_equal(sf_curve_key_load(f->w1_key, pub, sec, &err), SF_EDENIED);
  assert_string_equal(err.url, f->w1_key);
  assert_non_null(strstr(err.message, "chmod 600"));
  /* ...and so is a worker that would use it. */
  sf_transport *t = NULL;
  sf_transport_options c = {.endpoint = "tcp://127.0.0.1:9", .secret_key_file = f->w1_key, .server_key_file = f->head_pub};
  assert_int_equal(sf_transport_connect(f->ctx, &c, &t, &err), SF_EDENIED);
  assert_int_equal(sf_curve_key_load(f->w1_key, pub, NULL, &err), 0); /* the public half is public */
  assert_int_equal(chmod(f->w1_key, 0600), 0);
  /* Missing, existing, malformed, mismatched. */
  char path[160];
  path_in(f, path, sizeof path, "nope.key");
  assert_int_equal(sf_curve_key_load(path, pub, sec, &err), SF_ENOENT);
  assert_non_null(strstr(err.message, "shardflow keygen"));
  assert_int_equal(sf_curve_keygen(f->dir, "w1", NULL, &err), SF_EIO);
  assert_non_null(strstr(err.message, "exists"));
  assert_int_equal(sf_curve_keygen(f->dir, "a/b", NULL, &err), SF_EINVAL);
  path_in(f, path, sizeof path, "bad.pub");
  FILE *b = fopen(path, "w");
  fprintf(b, "public-key = \"not-a-z85-key\"\n");
  fclose(b);
  assert_int_equal(sf_curve_key_load(path, pub, NULL, &err), SF_EFORMAT);
  assert_int_equal(err.line, 1);
  char other_pub[41], other_sec[41];
  assert_int_equal(zmq_curve_keypair(other_pub, other_sec), 0);
  path_in(f, path, sizeof path, "mixed.key");
  b = fopen(path, "w");
  fprintf(b, "curve\n    public-key = \"%s\"\n    secret-key = \"%s\"\n", f->w1_z85, other_sec);
  fclose(b);
  chmod(path, 0600);
  assert_int_equal(sf_curve_key_load(path, pub, sec, &err), SF_EFORMAT);
  assert_non_null(strstr(err.message, "belong together"));
  /* A bare key (one line) is a public key file too. */
  path_in(f, path, sizeof path, "bare.pub");
  b = fopen(path, "w");
  fprintf(b, "%s\n", other_pub);
  fclose(b);
  assert_int_equal(sf_curve_key_load(path, pub, NULL, &err), 0);
  assert_string_equal(pub, other_pub);
}

/* The first 20 refusals are logged, then one line says the rest are counted; the totals come at close. */
static void test_refusal_log_limit(void **state) {
  fixture *f = *state;
  sf_transport_options o = head_options(f);
  sf_transport *head = listen_ok(f, &o);
  char log_path[128];
  path_in(f, log_path, sizeof log_path, "stderr.log");
  fflush(stderr);
  int saved = dup(2);
  FILE *log = fopen(log_path, "w");
  dup2(fileno(log), 2);
  for (int i = 0; i < 25; i++) {
    void *d = raw_dealer(f->ctx, sf_transport_endpoint(head), ZMQ_NULL);
    wait_refused(head, (uint64_t)i + 1);
    zmq_close(d);
  }
  uint64_t refused = sf_transport_refused(head);
  sf_transport_close(&head);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  fclose(log);
  assert_int_equal(refused, 25);
  FILE *in = fopen(log_path, "r");
  char line[2048];
  int logged = 0, notes = 0, totals = 0;
  while (fgets(line, sizeof line, in)) {
    if (strstr(line, ": refused a client from")) logged++;
    if (strstr(line, "counted, not logged")) notes++;
    if (strstr(line, "refused 25 connection(s)")) totals++;
  }
  fclose(in);
  assert_int_equal(logged, 20);
  assert_int_equal(notes, 1);
  assert_int_equal(totals, 1);
}

/*
 * Keys that others could change are refused, as OpenSSH's StrictModes refuses an authorized_keys: an
 * allow-list (its file, its directory, a *.pub in it) writable by group or others or owned by another
 * user (root excepted), and a secret key file owned by another user. The message names the path and the fix.
 */
static void test_loose_permissions_refused(void **state) {
  fixture *f = *state;
  sf_error err;
  sf_transport *head = NULL;
  sf_transport_options o = head_options(f);
  assert_int_equal(chmod(f->allowed, 0666), 0);
  assert_int_equal(sf_transport_listen(f->ctx, &o, &head, &err), SF_EDENIED);
  assert_string_equal(err.url, f->allowed);
  assert_non_null(strstr(err.message, "chmod go-w"));
  assert_int_equal(chmod(f->allowed, 0644), 0);
  head = listen_ok(f, &o);
  sf_transport_close(&head);
  char dir[128], pub[192], cmd[512];
  path_in(f, dir, sizeof dir, "allowed.d");
  assert_int_equal(mkdir(dir, 0755), 0);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s/'", f->w1_pub, dir);
  assert_int_equal(system(cmd), 0);
  snprintf(pub, sizeof pub, "%s/w1.pub", dir);
  o.allowed_keys = dir;
  for (mode_t loose = 0775; loose <= 0777; loose += 2) { /* group-writable, then world-writable */
    assert_int_equal(chmod(dir, loose), 0);
    assert_int_equal(sf_transport_listen(f->ctx, &o, &head, &err), SF_EDENIED);
    assert_string_equal(err.url, dir);
    assert_non_null(strstr(err.message, "chmod go-w"));
  }
  assert_int_equal(chmod(dir, 0755), 0);
  assert_int_equal(chmod(pub, 0666), 0);
  assert_int_equal(sf_transport_listen(f->ctx, &o, &head, &err), SF_EDENIED);
  assert_string_equal(err.url, pub);
  assert_non_null(strstr(err.message, "chmod go-w"));
  assert_int_equal(chmod(pub, 0644), 0);
  head = listen_ok(f, &o);
  sf_transport_close(&head);
  if (geteuid() != 0) return; /* only root can give a file to another user */
  char key[SF_CURVE_KEY_Z85_LEN + 1], sec[SF_CURVE_KEY_Z85_LEN + 1];
  const char *theirs[] = {pub, dir, f->allowed};
  for (size_t i = 0; i < sizeof theirs / sizeof *theirs; i++) {
    assert_int_equal(chown(theirs[i], 65534, 65534), 0);
    o.allowed_keys = i == 2 ? f->allowed : dir;
    assert_int_equal(sf_transport_listen(f->ctx, &o, &head, &err), SF_EDENIED);
    assert_string_equal(err.url, theirs[i]);
    assert_non_null(strstr(err.message, "owned by"));
    assert_int_equal(chown(theirs[i], 0, 0), 0);
  }
  assert_int_equal(chown(f->w1_key, 65534, 65534), 0);
  assert_int_equal(sf_curve_key_load(f->w1_key, key, sec, &err), SF_EDENIED);
  assert_string_equal(err.url, f->w1_key);
  assert_non_null(strstr(err.message, "owned by"));
  assert_int_equal(chown(f->w1_key, 0, 0), 0);
  assert_int_equal(sf_curve_key_load(f->w1_key, key, sec, &err), 0);
}

/* The line parser key files and allow-lists share (engine/group/transport_keys.h): one line in, what it holds out. */
static void test_key_line_parse(void **state) {
  static const char key[] = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"; /* RFC 26's example public key */
  static const struct {
    const char *line;
    bool ok;
    const char *name, *value; /* NULL: none */
  } cases[] = {
      {"", true, NULL, NULL},
      {"   # a comment", true, NULL, NULL},
      {"curve", true, NULL, NULL},
      {"metadata   # CZMQ section", true, NULL, NULL},
      {"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7", true, NULL, key},
      {"  rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7  # worker 1", true, NULL, key},
      {"    public-key = \"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7\"", true, "public-key", key},
      {"name = w1 # bare value", true, "name", "w1"},
      {"name = \"w1\" trailing", false, NULL, NULL},
      {"name = \"unterminated", false, NULL, NULL},
      {"curvey", false, NULL, NULL},
      {"= value", false, NULL, NULL},
      {"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf", false, NULL, NULL}, /* 39 characters */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char line[128];
    snprintf(line, sizeof line, "%s", cases[i].line);
    char *name, *value;
    bool ok = sf_key_line_parse(line, &name, &value);
    if (ok != cases[i].ok) fail_msg("'%s': parsed %d, expected %d", cases[i].line, ok, cases[i].ok);
    if (!ok) continue;
    if (cases[i].name) assert_string_equal(name, cases[i].name);
    else assert_null(name);
    if (cases[i].value) assert_string_equal(value, cases[i].value);
    else assert_null(value);
  }
  uint8_t raw[32];
  assert_true(sf_curve_key_decode(key, raw));
  assert_false(sf_curve_key_decode("short", raw));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_listed_key_round_trip, setup, teardown),
      cmocka_unit_test_setup_teardown(test_allow_dir_and_reload, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unknown_key_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_null_plain_garbage_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fail_closed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_plaintext_only_when_asked, setup, teardown),
      cmocka_unit_test_setup_teardown(test_oversized_message_dropped, setup, teardown),
      cmocka_unit_test_setup_teardown(test_key_files, setup, teardown),
      cmocka_unit_test_setup_teardown(test_loose_permissions_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refusal_log_limit, setup, teardown),
      cmocka_unit_test(test_key_line_parse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
