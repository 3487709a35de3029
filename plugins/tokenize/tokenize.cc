/* Plugin `tokenize`: a text field to int32 SentencePiece token ids — C++ behind the C stage ABI. */
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include <sentencepiece_processor.h>

#include "shardflow/plugin.h"
#include "shardflow/stage.h"

namespace {

/* The node's private struct: zeroed and filled from the options table by the engine, so it stays a
 * plain standard-layout struct (offsetof) and the processor lives behind a pointer. */
struct tokenize {
  char *field;    /* text field to read (UTF-8 bytes, uint8 [n]) */
  char *model;    /* SentencePiece .model file */
  char *output;   /* name of the int32 [max_length] field written */
  int64_t max_length;
  int64_t pad_id;
  bool add_bos, add_eos;
  char length_name[SF_FIELD_NAME_MAX]; /* "<output>.length" */
  sentencepiece::SentencePieceProcessor *sp;
};

/* Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF. Returns the
 * byte offset of the first bad sequence, or -1 when the text is valid. */
int64_t bad_utf8_at(const uint8_t *s, size_t n) {
  for (size_t i = 0; i < n;) {
    uint8_t c = s[i];
    size_t len;
    uint32_t cp, min;
    if (c < 0x80) {
      i++;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2, cp = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3, cp = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return (int64_t)i;
    }
    if (n - i < len) return (int64_t)i;
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xc0) != 0x80) return (int64_t)i;
      cp = cp << 6 | (s[i + k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return (int64_t)i;
    i += len;
  }
  return -1;
}

int init_fail(sf_node *node, int code, const char *what) {
  sf_node_error(node, code, nullptr, nullptr, -1, "%s", what);
  return code;
}

int init(sf_node *node) {
  auto *t = static_cast<tokenize *>(sf_node_priv(node));
  try {
    if (!t->model || !t->model[0])
      return init_fail(node, SF_EOPTION, "option model is required: the path of a SentencePiece .model file "
                                         "(spm_train --model_prefix=NAME writes NAME.model)");
    if (!t->field || !t->field[0] || strlen(t->field) >= SF_FIELD_NAME_MAX)
      return init_fail(node, SF_EOPTION, "option field must name a field of 1 to 31 characters (txt)");
    if (!t->output || !t->output[0] || strlen(t->output) + strlen(".length") >= SF_FIELD_NAME_MAX)
      return init_fail(node, SF_EOPTION, "option output must name a field of 1 to 24 characters "
                                         "(its length field adds \".length\")");
    snprintf(t->length_name, sizeof t->length_name, "%s.length", t->output);
    t->sp = new sentencepiece::SentencePieceProcessor();
    auto status = t->sp->Load(t->model);
    if (!status.ok()) {
      std::string m = "model " + std::string(t->model) + ": cannot load the SentencePiece model (" +
                      status.ToString() + "); give option model the path of a .model file spm_train wrote";
      return init_fail(node, SF_ENOENT, m.c_str());
    }
    if ((t->add_bos && t->sp->bos_id() < 0) || (t->add_eos && t->sp->eos_id() < 0)) {
      std::string m = "model " + std::string(t->model) + " has no " + (t->add_bos && t->sp->bos_id() < 0 ? "<s>" : "</s>") +
                      " piece: train it with --bos_id/--eos_id >= 0, or turn add_bos/add_eos off";
      return init_fail(node, SF_EOPTION, m.c_str());
    }
    return 0;
  } catch (const std::bad_alloc &) {
    return SF_ENOMEM;
  } catch (...) {
    return init_fail(node, SF_EINTERNAL, "tokenize: unexpected C++ exception in init");
  }
}

/* Adds (or replaces) field `name` of the sample, taking over *tensor. */
int put_field(sf_sample *sample, const char *name, sf_tensor *tensor) {
  for (int i = 0; i < sample->n_fields; i++)
    if (strcmp(sample->fields[i].name, name) == 0) {
      sf_sample_remove_field(sample, i);
      break;
    }
  return sf_sample_add_field(sample, name, false, tensor) ? 0 : SF_ETOOBIG;
}

/* Tokenizes one sample in place. Returns 0, or a code with the reason in why. */
int tokenize_sample(const tokenize *t, sf_sample *sample, std::string &why) {
  sf_field *f = sf_sample_field(sample, t->field);
  if (!f) {
    why = "has no field '" + std::string(t->field) + "' (option field names the text field)";
    return SF_ENOENT;
  }
  int r = sf_field_materialize(f);
  if (r < 0) return r;
  if (f->tensor.dtype != SF_DTYPE_UINT8 || f->tensor.ndim != 1 || !sf_tensor_is_contiguous(&f->tensor)) {
    why = "field " + std::string(t->field) + " is not text (uint8 bytes [n])";
    return SF_ESHAPE;
  }
  const auto *text = static_cast<const uint8_t *>(sf_tensor_data(&f->tensor));
  size_t n = (size_t)f->tensor.shape[0];
  int64_t bad = bad_utf8_at(text, n);
  if (bad >= 0) {
    why = "field " + std::string(t->field) + ": invalid UTF-8 at byte " + std::to_string(bad);
    return SF_EFORMAT;
  }
  std::vector<int> ids;
  if (t->add_bos) ids.push_back(t->sp->bos_id());
  std::vector<int> body;
  auto status = t->sp->Encode(absl::string_view(reinterpret_cast<const char *>(text), n), &body);
  if (!status.ok()) {
    why = "field " + std::string(t->field) + ": SentencePiece: " + status.ToString();
    return SF_EFORMAT;
  }
  ids.insert(ids.end(), body.begin(), body.end());
  if (t->add_eos) ids.push_back(t->sp->eos_id());

  sf_tensor tokens = {}, length = {};
  int64_t shape = t->max_length;
  if ((r = sf_tensor_alloc(&tokens, SF_DTYPE_INT32, 1, &shape)) < 0) return r;
  auto *out = static_cast<int32_t *>(sf_tensor_data(&tokens));
  for (int64_t i = 0; i < t->max_length; i++) out[i] = i < (int64_t)ids.size() ? ids[i] : (int32_t)t->pad_id;
  if ((r = sf_tensor_alloc(&length, SF_DTYPE_INT64, 0, nullptr)) < 0) {
    sf_tensor_clear(&tokens);
    return r;
  }
  *static_cast<int64_t *>(sf_tensor_data(&length)) = (int64_t)ids.size();
  if (put_field(sample, t->output, &tokens) < 0 || put_field(sample, t->length_name, &length) < 0) {
    why = "has too many fields to add " + std::string(t->output) + " (at most 16)";
    return SF_ETOOBIG;
  }
  return 0;
}

int map(sf_node *node, sf_sample **ps) {
  auto *t = static_cast<tokenize *>(sf_node_priv(node));
  sf_sample *sample = *ps;
  std::string why;
  int r;
  try {
    r = tokenize_sample(t, sample, why);
  } catch (const std::bad_alloc &) {
    r = SF_ENOMEM;
  } catch (...) {
    r = SF_EINTERNAL, why = "unexpected C++ exception";
  }
  if (r < 0) /* the engine drops the sample: skipped, or the pipeline stops, as the graph's error_policy says */
    sf_node_error(node, r, sf_sample_url(sample), sample->key, sample->offset, "sample %s %s", sample->key,
                  why.empty() ? "could not be tokenized" : why.c_str());
  return r;
}

void uninit(sf_node *node) {
  auto *t = static_cast<tokenize *>(sf_node_priv(node));
  delete t->sp;
  t->sp = nullptr;
}

const sf_option options[] = {
    {"field", SF_OPT_STRING, offsetof(tokenize, field), "txt", 0, 0,
     "text field to tokenize (UTF-8 bytes, e.g. a .txt member)", nullptr},
    {"model", SF_OPT_STRING, offsetof(tokenize, model), nullptr, 0, 0,
     "SentencePiece model file (.model, written by spm_train); required", nullptr},
    {"output", SF_OPT_STRING, offsetof(tokenize, output), "tokens", 0, 0,
     "field to write: int32 token ids [max_length]; <output>.length gets the int64 count before cutting",
     nullptr},
    {"max_length", SF_OPT_INT, offsetof(tokenize, max_length), "128", 1, 1 << 20,
     "length of the output in tokens: longer texts are cut, shorter ones padded with pad_id", nullptr},
    {"pad_id", SF_OPT_INT, offsetof(tokenize, pad_id), "0", -2147483648.0, 2147483647.0,
     "token id written after the last token up to max_length", nullptr},
    {"add_bos", SF_OPT_BOOL, offsetof(tokenize, add_bos), "false", 0, 0,
     "put the model's <s> id before the text's tokens", nullptr},
    {"add_eos", SF_OPT_BOOL, offsetof(tokenize, add_eos), "false", 0, 0,
     "put the model's </s> id after the text's tokens", nullptr},
    {nullptr, SF_OPT_BOOL, 0, nullptr, 0, 0, nullptr, nullptr},
};

/* C++ has no compound literals (SF_PORTS): the port lists are arrays ended by a {nullptr, SF_PORT_NONE} row. */
const sf_port_def inputs[] = {{"in", SF_PORT_SAMPLE}, {nullptr, SF_PORT_NONE}};
const sf_port_def outputs[] = {{"out", SF_PORT_SAMPLE}, {nullptr, SF_PORT_NONE}};

const sf_stage_def stage_tokenize = {
    SF_STAGE_ABI_VERSION,
    "tokenize",
    "text field to int32 SentencePiece token ids, padded and cut to max_length (plugin)",
    inputs,
    outputs,
    SF_STAGE_MAP,
    sizeof(tokenize),
    options,
    init,
    nullptr, /* step: a map stage has none */
    map,
    uninit,
    nullptr, /* stats: nothing beyond the common counters */
};

const sf_stage_def *const stages[] = {&stage_tokenize, nullptr};

#ifndef TOKENIZE_BUILD_ID
#define TOKENIZE_BUILD_ID "tokenize-unknown"
#endif

const sf_plugin plugin = {SF_STAGE_ABI_VERSION, "tokenize", TOKENIZE_BUILD_ID, stages};

} // namespace

/**
 * The plugin's entry point (SF_PLUGIN_ENTRY): the `tokenize` stage.
 * Returns static data the loader borrows for the life of the process; never throws.
 */
extern "C" SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void) { return &plugin; }
