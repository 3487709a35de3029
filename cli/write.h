/* `shardflow write`'s parts: the inputs it reads (write_input.c, write_fields.c), encoding (write_encode.c), and the
 * command (write.c), which uses them and is used by none of them; the shards themselves are written by
 * engine/io/tar_writer.c. */
#ifndef SF_CLI_WRITE_H
#define SF_CLI_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tar_writer.h"
#include "shardflow/buffer.h"
#include "shardflow/tensor.h"

/* The command's name, in its parts' messages (sf_write_fail): sf_cli_write's .name. */
#define SF_WRITE_COMMAND "write"

enum sf_write_format { SF_WRITE_PPM, SF_WRITE_PNG, SF_WRITE_JPG, SF_WRITE_ORIG };
/* What a directory INPUT holds: an ImageFolder tree, or KEY.EXT files written as they are (write_fields.c). */
enum sf_write_layout { SF_WRITE_IMAGEFOLDER, SF_WRITE_FILES };
/* The formats' names, as --format takes them (write_encode.c); ppm, png and jpg are also the members' extensions. */
extern const char *const sf_write_format_names[];

/* The command's options (rows of its table point here) and operands. */
typedef struct sf_write_options {
  int format; /* enum sf_write_format */
  int64_t quality;
  int64_t maxcount;
  int64_t maxsize;
  int64_t repeat;
  int64_t start_index;
  uint64_t seed;
  bool no_shuffle;
  int64_t jobs;
  bool quiet;
  bool no_index;           /* --no-index: no SHARD.sfidx beside local shards */
  int layout; /* enum sf_write_layout */
  const char *subdir;
  const char *root; /* --root: manifest and --layout files inputs must resolve under it, or NULL */
  const char *input;
  sf_shard_pattern out;
} sf_write_options;

/* One distinct image: its source, its class, and (after encoding) the bytes every repeat writes. */
typedef struct sf_write_item {
  char *name;       /* for messages and sorting: "CLASS/REST" (tree) or "FILE[i]" (IDX) */
  size_t class_len; /* length of CLASS in name (tree inputs) */
  int cls;
  char ext[16];        /* lower-case source extension ("jpg", "png"...) */
  sf_buffer *src;      /* encoded source bytes (tree inputs), freed after encoding */
  sf_tensor pixels;    /* IDX: uint8 [H, W, 1] view of the images file */
  sf_buffer *out;      /* the <format> member's bytes */
  const char *out_ext; /* the <format> member's extension (points into ext or a literal) */
} sf_write_item;

typedef struct sf_write_list {
  sf_write_item *v;
  size_t n, cap;
  char **classes; /* class names, sorted (tree inputs) */
  size_t n_classes, cap_classes;
  size_t skipped; /* files that are not images we read */
} sf_write_list;

/*
 * The inputs. Each adds to list and returns 0, or prints what is wrong
 * ("shardflow write: ...", naming the file and what to do) and returns 1.
 */
/* An ImageFolder tree root/CLASS/.../IMAGE, class directories sorted. */
int sf_write_collect_tree(sf_write_list *list, const char *root);
/* A tar (.gz, .zst) of such a tree, or of one under subdir/ (NULL: at the top). */
int sf_write_collect_archive(sf_write_list *list, const char *file, const char *subdir);
/* MNIST / Fashion-MNIST IDX images and labels files, gzip'd or plain. */
int sf_write_collect_idx(sf_write_list *list, const char *images_path, const char *labels_path);

/* Sorts and deduplicates the tree's class names, gives each image its class index, and orders the images by
 * (class, path): torchvision's ImageFolder order. Returns 0 or SF_ENOMEM. */
int sf_write_assign_classes(sf_write_list *list);

void sf_write_list_free(sf_write_list *list);

/* Encodes every image as options->format on options->jobs threads. Returns 0, or prints the first image that
 * failed (and what to do) and returns 1. */
int sf_write_encode_all(sf_write_list *list, const sf_write_options *options);

/* Prints "shardflow write: message" on stderr (sf_cli_fail for the parts); returns 1. */
int sf_write_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Reads the whole file at path into a new buffer (*out, caller owns). Returns 0 or -errno. */
int sf_write_read_file(const char *path, sf_buffer **out);

/* The sample order of repeat rep: input order with --no-shuffle, else a seeded permutation (the same
 * command writes the same shards). order holds n indices. Both writers' (write.c's images, write_fields.c's
 * samples); defined in write_input.c with sf_write_read_file and sf_write_fail. */
void sf_write_order(size_t *order, size_t n, const sf_write_options *options, int64_t rep);

/* ---- arbitrary fields (write_fields.c) ---- */

/* One member of a sample: the field (EXT of KEY.EXT) and its bytes, from a file (path) or inline. */
typedef struct sf_write_member {
  char *field;
  char *path;       /* read when the sample is written; NULL for inline bytes */
  sf_buffer *bytes; /* inline bytes (manifest), or NULL */
} sf_write_member;

typedef struct sf_write_sample {
  char *key;
  sf_write_member *members; /* sorted by field */
  size_t n;
} sf_write_sample;

typedef struct sf_write_samples {
  sf_write_sample *v; /* sorted by key */
  size_t n, cap;
  size_t skipped; /* directory entries that are not KEY.EXT files */
} sf_write_samples;

/* True when INPUT is read as arbitrary fields: --layout files (a directory) or a .jsonl manifest. */
bool sf_write_fields_input(const sf_write_options *options);
/* Collects options->input's samples; returns 0, or prints what is wrong (file, line, field) and returns 1. */
int sf_write_collect_samples(sf_write_samples *samples, const sf_write_options *options);
/* Writes every repeat of the samples (keys as given) to writer. Returns 0 or an SF_E code with *error set. */
int sf_write_samples_write(const sf_write_samples *samples, const sf_write_options *options, sf_tar_writer *writer,
                           sf_error *error);
/* Frees what the samples hold (keys, members, inline bytes) and zeroes *samples. */
void sf_write_samples_free(sf_write_samples *samples);

#endif
