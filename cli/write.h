/* `shardflow write`'s parts: the inputs it reads (write_input.c), encoding (write_encode.c), the command (write.c);
 * the shards themselves are written by engine/io/tar_writer.c. */
#ifndef SF_CLI_WRITE_H
#define SF_CLI_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tar_writer.h"
#include "shardflow/buffer.h"
#include "shardflow/tensor.h"

enum sf_write_format { SF_WRITE_PPM, SF_WRITE_PNG, SF_WRITE_JPG, SF_WRITE_ORIG };
/* Their names, as --format takes them; ppm, png and jpg are also the members' extensions. */
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
  const char *subdir;
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

#endif
