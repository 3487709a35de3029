/*
 * pack: packs documents of a token field into samples of exactly `length` tokens: a buffer of documents,
 * first-fit-decreasing within it, and per-token segment ids and positions (docs/data.md, "Packing documents").
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardflow/stage.h"

enum { OVERFLOW_SPLIT, OVERFLOW_TRUNCATE };
static const char *const overflow_names[] = {"split", "truncate", NULL};
enum { OUT_INT32, OUT_INT64 };
static const char *const dtype_names[] = {"int32", "int64", NULL};

/* The output fields beside FIELD itself, in this order in the output sample. */
enum { F_TOKENS, F_SEGMENT_IDS, F_POSITIONS, F_CU_SEQLENS, F_COUNT };
static const char *const suffixes[F_COUNT] = {"", ".segment_ids", ".positions", ".cu_seqlens"};

/*
 * One input document, shared by its pieces: a document split into several pieces may end up in several
 * output samples, and it is freed with its last piece.
 */
typedef struct doc {
  int refs;
  char *key;      /* owned */
  sf_buffer *url; /* owned reference, or NULL */
  uint64_t shard_index, index, pass;
  int64_t offset;
  sf_tensor tokens; /* owned reference: 1-D int32, int64 or uint16 */
} doc;

/* What a buffer holds: tokens [start, start + len) of a document (the whole of it unless it was split). */
typedef struct piece {
  doc *d; /* one reference */
  int64_t start, len;
} piece;

/*
 * A packed buffer waiting to leave: its pieces bin by bin (bin b is pieces[first[b] .. first[b + 1]), in
 * the order they came), bins in the order first-fit opened them. `next` is the next bin to emit.
 */
typedef struct packed {
  struct packed *next_packed;
  piece *pieces;  /* owned; a piece's reference is dropped when its bin leaves */
  int64_t *first; /* owned: nbins + 1 */
  int64_t nbins, next;
  uint64_t epoch;
} packed;

typedef struct pack {
  char *field;     /* option */
  int64_t length;  /* option */
  int64_t pad_id;  /* option */
  int64_t buffer;  /* option: pieces held before they are packed */
  int overflow;    /* option: OVERFLOW_* */
  bool cu_seqlens; /* option */
  int dtype;       /* option: OUT_* */
  char names[F_COUNT][SF_FIELD_NAME_MAX];
  char length_name[SF_FIELD_NAME_MAX]; /* FIELD.length: the count of real tokens, as tokenize writes it */
  piece *held;                         /* the buffer: `count` pieces in arrival order */
  int64_t count;
  uint64_t epoch;      /* epoch of the pieces held (and of the statistics below) */
  bool in_epoch;       /* documents of `epoch` came, and its statistics are not logged yet */
  packed *head, *tail; /* packed buffers, oldest first */
  sf_item held_item;   /* an epoch end, or a sample of the next epoch, that waits for the buffer to leave */
  bool eof;
  /* this epoch's account, logged at its end */
  uint64_t ep_documents, ep_overflowed, ep_samples, ep_tokens;
} pack;

static const sf_option options[] = {
    {"field", SF_OPT_STRING, offsetof(pack, field), "tokens", 0, 0,
     "the token field: a decoded 1-D int32, int64 or uint16 array per document (an npy member after decode, "
     "tokenize's output, a python stage's array); only the first FIELD.length tokens count where the sample has "
     "that integer scalar",
     NULL},
    {"length", SF_OPT_COUNT, offsetof(pack, length), "2048", 1, 1e7,
     "tokens per output sample: every output FIELD is exactly this long, padded with pad_id", NULL},
    {"pad_id", SF_OPT_INT, offsetof(pack, pad_id), "0", -2147483648.0, 2147483647.0,
     "token id written after the last document of a sample (segment id 0, position 0 there)", NULL},
    {"buffer", SF_OPT_COUNT, offsetof(pack, buffer), "1000", 1, 1e7,
     "documents (pieces of split ones) collected before they are packed, first-fit-decreasing, into samples; "
     "more fills samples better, and holds more tokens",
     NULL},
    {"overflow", SF_OPT_ENUM, offsetof(pack, overflow), "split", 0, 0,
     "a document longer than length: split = cut into pieces of length tokens (the last one shorter), each its "
     "own segment with positions from 0; truncate = keep its first length tokens. Counted either way",
     overflow_names},
    {"cu_seqlens", SF_OPT_BOOL, offsetof(pack, cu_seqlens), "false", 0, 0,
     "also output FIELD.cu_seqlens, int32 [k + 1]: 0 and the end of each of the sample's k documents "
     "(FlashAttention's varlen layout; batch it with batch's ragged)",
     NULL},
    {"dtype", SF_OPT_ENUM, offsetof(pack, dtype), "int32", 0, 0,
     "dtype of the output FIELD; a token id that does not fit int32 is an error record naming the document",
     dtype_names},
    {NULL},
};

/* Counter names (sf_node_counter_add): shown in the stage table, --stats-json and /metrics. */
#define C_DOCUMENTS "documents"
#define C_SPLIT     "split_documents"
#define C_TRUNCATED "truncated_documents"
#define C_TOKENS    "tokens"
#define C_SLOTS     "slots"

static const char *overflow_counter(const pack *p) { return p->overflow == OVERFLOW_SPLIT ? C_SPLIT : C_TRUNCATED; }

static int init(sf_node *node) {
  pack *p = sf_node_priv(node);
  if (!p->field || !*p->field)
    return sf_node_option_error(node, "field", "is empty; name the token field, e.g. field: npy or field: tokens");
  /* The longest output name is FIELD.segment_ids. */
  if (strlen(p->field) + strlen(".segment_ids") >= SF_FIELD_NAME_MAX)
    return sf_node_option_error(node, "field",
                                "'%s' is too long: its output FIELD.segment_ids must fit %d bytes; "
                                "rename it to at most %zu bytes first (stage rename)",
                                p->field, SF_FIELD_NAME_MAX - 1, SF_FIELD_NAME_MAX - 1 - strlen(".segment_ids"));
  for (int i = 0; i < F_COUNT; i++)
    snprintf(p->names[i], sizeof p->names[i], "%s%s", p->field, suffixes[i]);
  snprintf(p->length_name, sizeof p->length_name, "%s.length", p->field);
  p->held = calloc((size_t)p->buffer, sizeof *p->held);
  if (!p->held) return SF_ENOMEM;
  /* The counters show as 0 from the start; a failure here is a bug in the names, not the user's. */
  int r = 0;
  const char *names[] = {C_DOCUMENTS, overflow_counter(p), C_TOKENS, C_SLOTS};
  for (int i = 0; i < 4 && r == 0; i++)
    r = sf_node_counter_add(node, names[i], 0);
  return r;
}

static void doc_unref(doc **pd) {
  doc *d = *pd;
  *pd = NULL;
  if (!d || --d->refs > 0) return;
  free(d->key);
  sf_buffer_unref(&d->url);
  sf_tensor_clear(&d->tokens);
  free(d);
}

/* Token i of a 1-D tensor of one of the dtypes pack takes (loaded with memcpy: a view into a tar member's bytes
   may be unaligned). */
static int64_t token_at(const sf_tensor *t, int64_t i) {
  const uint8_t *at = (const uint8_t *)sf_tensor_data(t) + (size_t)(i * t->strides[0]) * sf_dtype_size(t->dtype);
  switch (t->dtype) {
  case SF_DTYPE_INT32: {
    int32_t v;
    memcpy(&v, at, sizeof v);
    return v;
  }
  case SF_DTYPE_UINT16: {
    uint16_t v;
    memcpy(&v, at, sizeof v);
    return v;
  }
  default: {
    int64_t v;
    memcpy(&v, at, sizeof v);
    return v;
  }
  }
}

typedef struct by_length {
  int64_t len, arrival;
} by_length;

/* Longest first; of equal lengths, the earlier first: a total order, so the packing is the same in every run. */
static int longer_first(const void *a, const void *b) {
  const by_length *x = a, *y = b;
  if (x->len != y->len) return x->len > y->len ? -1 : 1;
  return (x->arrival > y->arrival) - (x->arrival < y->arrival);
}

/*
 * Packs the buffer's pieces into bins of `length` tokens, first-fit-decreasing: pieces longest first (ties in
 * the order they came), each into the first bin, in the order bins were opened, with room for it, else into a
 * new bin. A max-tree over the bins' free room finds that bin in O(log n). The bins are queued to leave in the
 * order they were opened, each with its pieces in the order they came; the buffer is empty afterwards.
 */
static int pack_buffer(pack *p) {
  int64_t n = p->count;
  if (n == 0) return 0;
  size_t leaves = 1;
  while (leaves < (size_t)n)
    leaves <<= 1;
  by_length *order = malloc((size_t)n * sizeof *order);
  int64_t *tree = malloc(2 * leaves * sizeof *tree), *bin_of = malloc((size_t)n * sizeof *bin_of);
  packed *out = calloc(1, sizeof *out);
  if (out) {
    out->pieces = malloc((size_t)n * sizeof *out->pieces);
    out->first = calloc((size_t)n + 1, sizeof *out->first);
  }
  if (!order || !tree || !bin_of || !out || !out->pieces || !out->first) {
    free(order), free(tree), free(bin_of);
    if (out) free(out->pieces), free(out->first), free(out);
    return SF_ENOMEM;
  }
  for (int64_t i = 0; i < n; i++)
    order[i] = (by_length){p->held[i].len, i};
  qsort(order, (size_t)n, sizeof *order, longer_first);
  for (size_t i = 0; i < 2 * leaves; i++)
    tree[i] = p->length; /* every bin, opened or not, has room */
  int64_t nbins = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t len = order[i].len;
    size_t at = 1;
    while (at < leaves)
      at = tree[2 * at] >= len ? 2 * at : 2 * at + 1; /* the leftmost bin with room */
    int64_t bin = (int64_t)(at - leaves);
    bin_of[order[i].arrival] = bin;
    if (bin + 1 > nbins) nbins = bin + 1;
    tree[at] -= len;
    for (at >>= 1; at >= 1; at >>= 1)
      tree[at] = tree[2 * at] > tree[2 * at + 1] ? tree[2 * at] : tree[2 * at + 1];
  }
  /* Bin by bin, each bin's pieces in arrival order (a counting sort by bin, stable). */
  for (int64_t i = 0; i < n; i++)
    out->first[bin_of[i] + 1]++;
  for (int64_t b = 0; b < nbins; b++)
    out->first[b + 1] += out->first[b];
  for (int64_t i = 0; i < n; i++)
    out->pieces[out->first[bin_of[i]]++] = p->held[i];
  for (int64_t b = nbins; b > 0; b--)
    out->first[b] = out->first[b - 1]; /* each `first` moved to its bin's end */
  out->first[0] = 0;
  out->nbins = nbins;
  out->epoch = p->epoch;
  free(order), free(tree), free(bin_of);
  if (p->tail)
    p->tail->next_packed = out;
  else
    p->head = out;
  p->tail = out;
  p->ep_samples += (uint64_t)nbins;
  p->count = 0;
  return 0;
}

/* Makes the output sample of the next queued bin and hands it on. Returns 0, or SF_ENOMEM. */
static int emit_one(sf_node *node, pack *p) {
  packed *q = p->head;
  int64_t b = q->next++, k = q->first[b + 1] - q->first[b];
  piece *pcs = q->pieces + q->first[b];
  const doc *d0 = pcs[0].d;
  int64_t len = p->length, cu_len = k + 1;
  sf_tensor t[F_COUNT] = {0};
  int nfields = p->cu_seqlens ? F_COUNT : F_CU_SEQLENS, r = 0;
  r = sf_tensor_alloc(&t[F_TOKENS], p->dtype == OUT_INT32 ? SF_DTYPE_INT32 : SF_DTYPE_INT64, 1, &len);
  if (r == 0) r = sf_tensor_alloc(&t[F_SEGMENT_IDS], SF_DTYPE_INT32, 1, &len);
  if (r == 0) r = sf_tensor_alloc(&t[F_POSITIONS], SF_DTYPE_INT32, 1, &len);
  if (r == 0 && p->cu_seqlens) r = sf_tensor_alloc(&t[F_CU_SEQLENS], SF_DTYPE_INT32, 1, &cu_len);
  sf_sample *s = r == 0 ? sf_sample_new() : NULL;
  if (s && sf_sample_set_key(s, d0->key, strlen(d0->key)) < 0) sf_sample_destroy(&s);
  if (s) {
    int32_t *seg = sf_tensor_data(&t[F_SEGMENT_IDS]), *pos = sf_tensor_data(&t[F_POSITIONS]);
    int32_t *cu = p->cu_seqlens ? sf_tensor_data(&t[F_CU_SEQLENS]) : NULL;
    int32_t *out32 = p->dtype == OUT_INT32 ? sf_tensor_data(&t[F_TOKENS]) : NULL;
    int64_t *out64 = p->dtype == OUT_INT64 ? sf_tensor_data(&t[F_TOKENS]) : NULL;
    int64_t at = 0;
    if (cu) cu[0] = 0;
    for (int64_t j = 0; j < k; j++) {
      for (int64_t i = 0; i < pcs[j].len; i++, at++) {
        int64_t v = token_at(&pcs[j].d->tokens, pcs[j].start + i); /* checked to fit the output when it came */
        if (out32)
          out32[at] = (int32_t)v;
        else
          out64[at] = v;
        seg[at] = (int32_t)(j + 1);
        pos[at] = (int32_t)i;
      }
      if (cu) cu[j + 1] = (int32_t)at;
    }
    p->ep_tokens += (uint64_t)at;
    sf_node_counter_add(node, C_TOKENS, (uint64_t)at);
    sf_node_counter_add(node, C_SLOTS, (uint64_t)len);
    for (; at < len; at++) {
      if (out32)
        out32[at] = (int32_t)p->pad_id;
      else
        out64[at] = p->pad_id;
      seg[at] = 0;
      pos[at] = 0;
    }
    s->url = d0->url ? sf_buffer_ref(d0->url) : NULL;
    s->epoch = q->epoch;
    s->shard_index = d0->shard_index;
    s->index = d0->index;
    s->pass = d0->pass;
    s->offset = d0->offset;
    for (int i = 0; i < nfields; i++)
      if (!sf_sample_add_field(s, p->names[i], false, &t[i])) r = SF_ENOMEM; /* names fit: checked in init */
  }
  for (int i = 0; i < F_COUNT; i++)
    sf_tensor_clear(&t[i]);
  for (int64_t j = 0; j < k; j++)
    doc_unref(&pcs[j].d);
  if (q->next == q->nbins) {
    p->head = q->next_packed;
    if (!p->head) p->tail = NULL;
    free(q->pieces), free(q->first), free(q);
  }
  if (!s || r < 0) {
    sf_sample_destroy(&s);
    return SF_ENOMEM;
  }
  sf_item item = {.kind = SF_ITEM_SAMPLE, .epoch = s->epoch, .u.sample = s};
  sf_node_count_output(node, 1, sf_item_nbytes(&item));
  sf_node_push(node, &item);
  return 0;
}

/* Reports sample *ps as bad input and frees it. Returns 0, or the code when the error policy stops the run. */
static int reject(sf_node *node, sf_sample **ps, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int reject(sf_node *node, sf_sample **ps, int code, const char *fmt, ...) {
  sf_sample *s = *ps;
  char why[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  int r = sf_node_error(node, code, sf_sample_url(s), s->key, s->offset, "%s", why);
  sf_sample_destroy(ps);
  if (r < 0) return r;
  sf_node_count_skipped(node, 1);
  return 0;
}

/* The number of real tokens of document s: its field's length, cut to FIELD.length where it has one; -1 with
 *why set when FIELD.length is not a non-negative integer scalar. */
static int64_t real_length(const pack *p, sf_sample *s, const sf_tensor *t, const char **why) {
  int64_t n = t->shape[0];
  sf_field *lf = sf_sample_field(s, p->length_name);
  if (!lf) return n;
  const sf_tensor *l = &lf->tensor;
  if (lf->encoded || lf->recipe || l->ndim != 0 || (l->dtype != SF_DTYPE_INT64 && l->dtype != SF_DTYPE_INT32)) {
    *why = "is not an int32 or int64 scalar";
    return -1;
  }
  int64_t v = token_at(
      &(sf_tensor){
          .dtype = l->dtype, .ndim = 1, .shape = {1}, .strides = {1}, .offset = l->offset, .buffer = l->buffer},
      0);
  if (v < 0) {
    *why = "is negative";
    return -1;
  }
  return v < n ? v : n;
}

/* Takes document *ps into the buffer, as one piece or, split, several; packs the buffer whenever it is full. */
static int add_document(sf_node *node, pack *p, sf_sample **ps) {
  sf_sample *s = *ps;
  sf_field *f = sf_sample_field(s, p->field);
  if (!f)
    return reject(node, ps, SF_ESHAPE,
                  "has no field '%s' (pack's option field): name the token field, e.g. field: npy after a decode "
                  "stage, or tokenize's output",
                  p->field);
  if (f->encoded)
    return reject(node, ps, SF_ESHAPE,
                  "field '%s' is still encoded bytes: pack takes decoded token arrays; put a decode stage before "
                  "pack (a .npy member becomes an array)",
                  p->field);
  int r = sf_field_materialize(f);
  if (r < 0) {
    sf_sample_destroy(ps);
    return r;
  }
  const sf_tensor *t = &f->tensor;
  if (t->ndim != 1)
    return reject(node, ps, SF_ESHAPE, "field '%s' is a %d-D array: pack takes one 1-D array of token ids per document",
                  p->field, t->ndim);
  if (t->dtype != SF_DTYPE_INT32 && t->dtype != SF_DTYPE_INT64 && t->dtype != SF_DTYPE_UINT16)
    return reject(node, ps, SF_ESHAPE,
                  "field '%s' is %s: pack takes integer token ids (int32, int64 or uint16); write the documents' "
                  "arrays as integers",
                  p->field, sf_dtype_name(t->dtype));
  const char *why = NULL;
  int64_t n = real_length(p, s, t, &why);
  if (n < 0)
    return reject(node, ps, SF_ESHAPE, "field '%s' %s: it must say how many tokens are real", p->length_name, why);
  if (n == 0) { /* nothing to pack: dropped on purpose, and counted */
    sf_sample_destroy(ps);
    sf_node_count_filtered(node, 1);
    return 0;
  }
  bool over = n > p->length;
  if (over && p->overflow == OVERFLOW_TRUNCATE) n = p->length;
  if (p->dtype == OUT_INT32 && t->dtype == SF_DTYPE_INT64)
    for (int64_t i = 0; i < n; i++) {
      int64_t v = token_at(t, i);
      if (v < INT32_MIN || v > INT32_MAX)
        return reject(node, ps, SF_ESHAPE,
                      "field '%s' holds token id %" PRId64 " at position %" PRId64 ", which does not fit the output's "
                      "int32: set pack's dtype: int64",
                      p->field, v, i);
    }
  doc *d = calloc(1, sizeof *d);
  if (d && !(d->key = sf_sample_take_key(s))) d->key = strdup(""); /* a sample without a key */
  if (!d || !d->key) {
    free(d);
    sf_sample_destroy(ps);
    return SF_ENOMEM;
  }
  d->url = s->url ? sf_buffer_ref(s->url) : NULL;
  d->shard_index = s->shard_index, d->index = s->index, d->pass = s->pass, d->offset = s->offset;
  sf_tensor_ref(&d->tokens, t);
  sf_sample_destroy(ps); /* its other fields are dropped: an output sample holds only what pack makes */
  p->ep_documents++;
  sf_node_counter_add(node, C_DOCUMENTS, 1);
  if (over) {
    p->ep_overflowed++;
    sf_node_counter_add(node, overflow_counter(p), 1);
  }
  for (int64_t start = 0; start < n; start += p->length) {
    d->refs++;
    p->held[p->count++] = (piece){d, start, n - start < p->length ? n - start : p->length};
    if (p->count == p->buffer && (r = pack_buffer(p)) < 0) return r;
  }
  return 0;
}

/* Logs the epoch's account once its last documents are packed: the fill ratio is tokens / (samples * length). */
static void end_epoch(sf_node *node, pack *p) {
  if (!p->in_epoch) return;
  p->in_epoch = false;
  double slots = (double)p->ep_samples * (double)p->length;
  sf_node_log(node, SF_LOG_INFO,
              "epoch %" PRIu64 ": %" PRIu64 " documents (%" PRIu64 " %s) packed into %" PRIu64 " samples of %" PRId64
              " tokens, fill ratio %.4f (tokens / slots)",
              p->epoch, p->ep_documents, p->ep_overflowed, p->overflow == OVERFLOW_SPLIT ? "split" : "truncated",
              p->ep_samples, p->length, slots > 0 ? (double)p->ep_tokens / slots : 0.0);
  p->ep_documents = p->ep_overflowed = p->ep_samples = p->ep_tokens = 0;
}

/*
 * One push per step: queued bins leave first; an epoch end (or a sample of the next epoch, when no marker came)
 * packs what the buffer holds and waits in held_item until it has left. So the output is a function of the
 * input's order alone, epoch by epoch, however many replicas or workers feed it.
 */
static int step(sf_node *node) {
  pack *p = sf_node_priv(node);
  if (p->head) return emit_one(node, p);
  sf_item item;
  int r;
  if (p->held_item.kind != SF_ITEM_NONE) {
    item = p->held_item;
    p->held_item.kind = SF_ITEM_NONE;
  } else if (p->eof) {
    return SF_EOF;
  } else {
    r = sf_node_pop(node, &item);
    if (r == SF_EOF) {
      p->eof = true;
      if ((r = pack_buffer(p)) < 0) return r;
      end_epoch(node, p);
      return 0;
    }
    if (r < 0) return r;
  }
  bool next_epoch = item.kind == SF_ITEM_SAMPLE && p->in_epoch && item.epoch != p->epoch;
  if (item.kind == SF_ITEM_EPOCH_END || next_epoch) {
    if (p->count > 0) { /* the epoch's last buffer leaves before the marker or the next epoch's documents */
      p->held_item = item;
      return pack_buffer(p);
    }
    end_epoch(node, p);
  }
  switch (item.kind) {
  case SF_ITEM_EPOCH_END: sf_node_push(node, &item); return 0;
  case SF_ITEM_SAMPLE:
    p->epoch = item.epoch;
    p->in_epoch = true;
    item.u.sample->epoch = item.epoch;
    return add_document(node, p, &item.u.sample);
  default: /* nothing else belongs on a sample edge */ sf_item_clear(&item); return 0;
  }
}

static void uninit(sf_node *node) {
  pack *p = sf_node_priv(node);
  for (int64_t i = 0; i < p->count; i++)
    doc_unref(&p->held[i].d);
  free(p->held);
  while (p->head) {
    packed *q = p->head;
    for (int64_t i = q->first[q->next]; i < q->first[q->nbins]; i++)
      doc_unref(&q->pieces[i].d);
    p->head = q->next_packed;
    free(q->pieces), free(q->first), free(q);
  }
  sf_item_clear(&p->held_item);
}

const sf_stage_def sf_stage_pack = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "pack",
    .summary = "packs token documents into samples of exactly `length` tokens (first-fit-decreasing in a buffer) "
               "with segment ids, positions and cu_seqlens",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .priv_size = sizeof(pack),
    .options = options,
    .init = init,
    .step = step,
    .uninit = uninit,
};
