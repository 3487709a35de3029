/* `shardflow write`: packs an ImageFolder tree, a tar of one, MNIST IDX files, or any fields into WebDataset shards. */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/write.h"
#include "shard_index.h"
#include "tar_writer.h"
#include "url.h"
#include "shardflow/stage.h"

static const char *const layout_names[] = {[SF_WRITE_IMAGEFOLDER] = "imagefolder", [SF_WRITE_FILES] = "files", NULL};

static const sf_cli_option write_table[] = {
    {.row = {"format", SF_OPT_ENUM, offsetof(sf_write_options, format), "ppm",
             .help = "image field: ppm decodes to binary P6 .ppm (.pgm for gray IDX images); png/jpg re-encode; "
                     "orig keeps the source bytes and extension",
             .enum_names = sf_write_format_names},
     .value = "FORMAT"},
    {.row = {"quality", SF_OPT_INT, offsetof(sf_write_options, quality), "95", 1, 100, "JPEG quality for --format jpg"},
     .value = "Q"},
    {.row = {"maxcount", SF_OPT_COUNT, offsetof(sf_write_options, maxcount), "2000", 1, 1e15, "samples per shard"},
     .value = "N"},
    {.row = {"maxsize", SF_OPT_SIZE, offsetof(sf_write_options, maxsize), "3G", 1, 1e18,
             "start a new shard before one would exceed this many bytes (k, M, G = 1000^n; Ki, MiB, GiB = 1024^n)"},
     .value = "BYTES"},
    {.row = {"repeat", SF_OPT_COUNT, offsetof(sf_write_options, repeat), "1", 1, 1e6, "write the whole set N times"},
     .value = "N"},
    {.row = {"shuffle-seed", SF_OPT_SEED, offsetof(sf_write_options, seed), "0", .help = "seed of the sample order"},
     .value = "S"},
    {.row = {"no-shuffle", SF_OPT_BOOL, offsetof(sf_write_options, no_shuffle),
             .help = "keep the input order (ImageFolder: class-sorted; IDX: file order). By default every repeat is "
                     "written in a fresh seeded random order, so each shard mixes classes."}},
    {.row = {"start-index", SF_OPT_COUNT, offsetof(sf_write_options, start_index), "0", 0, 1e15,
             "key of the first sample"},
     .value = "N"},
    {.row = {"layout", SF_OPT_ENUM, offsetof(sf_write_options, layout), "imagefolder",
             .help = "what a directory INPUT holds: imagefolder (DIR/<class>/<image>, written as <format> + cls) or "
                     "files (DIR/KEY.EXT: the files of one KEY form one sample, written as they are)",
             .enum_names = layout_names},
     .value = "LAYOUT"},
    {.row = {"root", SF_OPT_STRING, offsetof(sf_write_options, root),
             .help = "a manifest's paths and --layout files' entries must resolve (symlinks and .. followed) to "
                     "files under DIR; others are refused. Without it they may name any file you can read"},
     .value = "DIR"},
    {.row = {"subdir", SF_OPT_STRING, offsetof(sf_write_options, subdir),
             .help = "read the tree under NAME/ (e.g. train, test)"},
     .value = "NAME"},
    {.row = {"jobs", SF_OPT_INT, offsetof(sf_write_options, jobs), NULL, 1, 1024,
             "decode threads (default: online CPUs)"},
     .value = "N"},
    {.row = {"no-index", SF_OPT_BOOL, offsetof(sf_write_options, no_index),
             .help = "write no index (SHARD.sfidx, as `shardflow index` writes it) beside each local shard; URL "
                     "patterns never get one"}},
    {.row = {"quiet", SF_OPT_BOOL, offsetof(sf_write_options, quiet), .help = "no summary"}, .short_name = 'q'},
    {.row = {NULL}},
};

/*
 * Writes the index of every shard written (shard_source's order: global / block read by it), from the shard
 * itself as the tar reader sees it: the same spans `shardflow index` finds. Local shards only.
 */
static int write_indexes(const sf_write_options *o, int64_t shards) {
  for (int64_t i = 0; i < shards; i++) {
    char path[PATH_MAX];
    sf_shard_pattern_format(&o->out, i, path, sizeof path);
    if (sf_url_kind_of(path) != SF_URL_PATH) return 0;
    sf_shard_index index;
    sf_error err;
    char line[2048];
    char *at = NULL;
    int r = sf_shard_index_build(&index, path, &err);
    if (r == 0 && !(at = sf_shard_index_path(path, NULL))) r = sf_error_set(&err, SF_ENOMEM, SF_NOWHERE, "out of memory");
    if (r == 0) r = sf_shard_index_write(&index, at, &err);
    free(at);
    sf_shard_index_clear(&index);
    if (r < 0) return sf_cli_fail(&sf_cli_write, "the shards are written, but not their index: %s (--no-index "
                                  "writes none)", sf_error_format(&err, line, sizeof line));
  }
  return 0;
}

/* Writes every repeat of the list, each in its own seeded order, as samples KEY.<format> and KEY.cls. */
static int write_shards(const sf_write_list *l, const sf_write_options *o, sf_tar_writer *w, sf_error *err) {
  size_t *order = malloc((l->n ? l->n : 1) * sizeof *order);
  if (!order) return sf_error_set(err, SF_ENOMEM, SF_NOWHERE, "out of memory");
  int r = 0;
  int64_t key = o->start_index;
  for (int64_t rep = 0; r == 0 && rep < o->repeat; rep++) {
    sf_write_order(order, l->n, o, rep);
    for (size_t i = 0; r == 0 && i < l->n; i++) {
      const sf_write_item *it = &l->v[order[i]];
      char name[32], cls[24];
      snprintf(name, sizeof name, "%07lld", (long long)key++);
      int cls_len = snprintf(cls, sizeof cls, "%d", it->cls);
      sf_tar_field fields[2] = {{it->out_ext, sf_buffer_data(it->out), sf_buffer_size(it->out)},
                                {"cls", cls, (size_t)cls_len}};
      r = sf_tar_writer_add(w, name, fields, 2, err);
    }
  }
  free(order);
  return r;
}

/* Checks the operands and the options that depend on them; returns 0 or the usage error's status. */
static int check_args(int argc, char **argv, int first, sf_write_options *o) {
  /* GNU getopt moved the operands to the end, so options may follow them too. */
  if (argc - first != 2)
    return sf_cli_usage_error(&sf_cli_write, "expected INPUT and OUTPUT_PATTERN, got %d operand(s)", argc - first);
  o->input = argv[first];
  if (o->subdir) {
    size_t len = strlen(o->subdir);
    while (len > 1 && o->subdir[len - 1] == '/') len--;
    static char sub[PATH_MAX];
    if (len == 0 || len >= sizeof sub)
      return sf_cli_usage_error(&sf_cli_write, "--subdir: '%s' is not a directory name", o->subdir);
    memcpy(sub, o->subdir, len);
    sub[len] = 0;
    o->subdir = sub;
  }
  sf_error err;
  if (sf_shard_pattern_parse(&o->out, argv[first + 1], &err) < 0)
    return sf_cli_usage_error(&sf_cli_write, "OUTPUT_PATTERN: %s", err.message);
  if (strncmp(o->input, "idx:", 4) == 0) {
    const char *comma = strchr(o->input + 4, ',');
    if (!comma || comma == o->input + 4 || !comma[1])
      return sf_cli_usage_error(&sf_cli_write, "INPUT '%s': write idx:IMAGES.gz,LABELS.gz", o->input);
    if (o->subdir) return sf_cli_usage_error(&sf_cli_write, "--subdir does not apply to idx: inputs");
  }
  return 0;
}

/* Reads INPUT into list; returns 0 or 1 after printing what is wrong. */
static int collect(sf_write_list *list, const sf_write_options *o) {
  struct stat st;
  int r;
  if (strncmp(o->input, "idx:", 4) == 0) {
    const char *spec = o->input + 4, *comma = strchr(spec, ',');
    char *images = strndup(spec, (size_t)(comma - spec));
    r = images ? sf_write_collect_idx(list, images, comma + 1) : sf_cli_fail(&sf_cli_write, "out of memory");
    free(images);
    return r;
  }
  if (stat(o->input, &st) < 0)
    return sf_cli_fail(&sf_cli_write,
                       "cannot open INPUT %s: %s (give a directory, a .tar/.tar.gz/.tar.zst or "
                       "idx:IMAGES,LABELS)",
                       o->input, strerror(errno));
  if (S_ISDIR(st.st_mode)) {
    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s%s%s", o->input, o->subdir ? "/" : "", o->subdir ? o->subdir : "");
    r = sf_write_collect_tree(list, root);
    if (r == 0 && list->n == 0)
      r = sf_cli_fail(&sf_cli_write, "%s has no images as CLASS/IMAGE.(jpg|png|ppm|pgm)%s", root,
                      o->subdir ? "" : " (pass --subdir NAME to read the tree under NAME/)");
  } else {
    r = sf_write_collect_archive(list, o->input, o->subdir);
  }
  if (r == 0) r = sf_write_assign_classes(list) < 0 ? sf_cli_fail(&sf_cli_write, "out of memory") : 0;
  if (r == 0 && list->n == 0) return sf_cli_fail(&sf_cli_write, "%s holds no images", o->input);
  /* A tree one level too deep still "works" with one class or none: say what to pass. */
  size_t nested = 0;
  for (size_t i = 0; r == 0 && i < list->n; i++)
    nested += strchr(list->v[i].name + list->v[i].class_len + 1, '/') != NULL;
  if (r == 0 && nested == list->n)
    fprintf(stderr,
            "shardflow write: warning: every image in %s sits below CLASS/SUBDIR/ (classes: %s%s); "
            "if the tree is under a directory, pass --subdir NAME\n",
            o->input, list->classes[0], list->n_classes > 1 ? ", ..." : "");
  else if (r == 0 && list->n_classes == 1)
    fprintf(stderr,
            "shardflow write: warning: %s has only one class (%s); if the tree sits under a "
            "directory, pass --subdir NAME\n",
            o->input, list->classes[0]);
  return r;
}

static int write_main(int argc, char **argv) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  sf_write_options o = {.jobs = cpus > 0 ? (cpus > 256 ? 256 : cpus) : 1};
  int first, status;
  if (!sf_cli_parse(&sf_cli_write, argc, argv, &o, &first, &status)) return status;
  if ((status = check_args(argc, argv, first, &o)) != 0) return status;
  sf_write_list list = {0};
  sf_write_samples samples = {0};
  bool fields = sf_write_fields_input(&o);
  if (o.root && !fields)
    return sf_cli_usage_error(&sf_cli_write, "--root applies to a .jsonl manifest or --layout files, not to %s",
                              o.input);
  int r = fields ? sf_write_collect_samples(&samples, &o) : collect(&list, &o);
  if (r == 0 && !fields) r = sf_write_encode_all(&list, &o);
  sf_tar_writer *w = NULL;
  sf_tar_writer_stats stats = {0};
  sf_error err;
  char line[2048];
  if (r == 0 && sf_tar_writer_new(&w, &o.out, o.maxcount, o.maxsize, &err) < 0)
    r = sf_cli_fail(&sf_cli_write, "%s", sf_error_format(&err, line, sizeof line));
  if (r == 0 && (fields ? sf_write_samples_write(&samples, &o, w, &err) : write_shards(&list, &o, w, &err)) < 0)
    r = sf_cli_fail(&sf_cli_write, "%s", sf_error_format(&err, line, sizeof line));
  sf_error close_err;
  if (r != 0) /* the open shard is incomplete: nothing of it may appear under its name */
    sf_tar_writer_discard(&w);
  else if (sf_tar_writer_close(&w, &stats, &close_err) < 0)
    r = sf_cli_fail(&sf_cli_write, "%s", sf_error_format(&close_err, line, sizeof line));
  if (r == 0 && !o.no_index) r = write_indexes(&o, stats.shards);
  bool idx = strncmp(o.input, "idx:", 4) == 0;
  if (r == 0 && !o.quiet) {
    char first_path[PATH_MAX], last_path[PATH_MAX];
    sf_shard_pattern_format(&o.out, 0, first_path, sizeof first_path);
    sf_shard_pattern_format(&o.out, stats.shards - 1, last_path, sizeof last_path);
    printf("wrote %lld shard%s (%s .. %s): %lld samples (%zu %s x %lld), %lld bytes", (long long)stats.shards,
           stats.shards == 1 ? "" : "s", first_path, last_path, (long long)stats.samples, fields ? samples.n : list.n,
           fields ? "samples" : "images", (long long)o.repeat, (long long)stats.bytes);
    if (!idx && !fields) printf(", %zu classes", list.n_classes);
    if (list.skipped) printf(", %zu non-image files skipped", list.skipped);
    if (samples.skipped) printf(", %zu files without an extension skipped", samples.skipped);
    putchar('\n');
  }
  sf_write_list_free(&list);
  sf_write_samples_free(&samples);
  return r;
}

const sf_cli_command sf_cli_write = {
    .name = "write", /* SF_WRITE_COMMAND, written out: test_cli finds the commands by their literal names */
    .run = write_main,
    .args = "[OPTIONS] INPUT OUTPUT_PATTERN",
    .summary = "create WebDataset shards",
    .about = "Writes WebDataset shards (key %07d, fields <format> and cls) from:\n"
             "  DIR                      an ImageFolder tree DIR/<class>/<image> (class index =\n"
             "                           position of the class name in the sorted class list)\n"
             "  ARCHIVE.tar[.gz|.zst]    a tar of such a tree (see --subdir)\n"
             "  idx:IMAGES,LABELS        MNIST / Fashion-MNIST IDX files (gzip'd or plain)\n"
             "Any fields, written as they are (keys as given, members KEY.FIELD sorted; --format\n"
             "does not apply):\n"
             "  DIR --layout files       files DIR/KEY.EXT: all files of one KEY form one sample\n"
             "                           (KEY up to the first dot, as WebDataset splits names)\n"
             "  MANIFEST.jsonl           one JSON object per line: {\"__key__\": \"k\", \"jpg\": \"a.jpg\",\n"
             "                           \"txt\": {\"inline\": \"a caption\"}}: a string is a file path\n"
             "                           (relative to the manifest's directory); {\"inline\": V} is\n"
             "                           the member itself: a string as UTF-8, other JSON compact\n"
             "A key may hold '/' (a WebDataset key naming a subdirectory, train/0001) but not a\n"
             "leading '/', an empty component, a dot, control characters or bytes that are not\n"
             "UTF-8; such keys, and field names or file names like them, are refused naming the\n"
             "manifest line or the file. A manifest's paths (absolute, with ..) and --layout files'\n"
             "symlinks may name any file you can read, and it goes into the shard: with a manifest\n"
             "from elsewhere, pass --root DIR to refuse files that do not resolve under DIR.\n"
             "OUTPUT_PATTERN holds one %d conversion for the shard number, e.g.\n"
             "out/cifar-train-%06d.tar (shards are numbered from 0), or a URL such as\n"
             "s3://bucket/train/shard-%06d.tar (s3://, gs://, az://, http(s)://: each shard is written to\n"
             "$TMPDIR, uploaded as by `shardflow cp` and read back, then removed).",
    .notes = "A shard appears whole or not at all: a local one is written to a partial file next\n"
             "to it and renamed into place when done; a URL's is staged in $TMPDIR at a fresh,\n"
             "unpredictable name, created exclusively (a symlink planted there is not followed),\n"
             "then uploaded. A write that fails removes the shard it was writing (shards finished\n"
             "before stay). Members are ustar, with pax headers only for names ustar cannot hold\n"
             "(keys longer than 100 bytes, non-ASCII).",
    .options = write_table,
};
