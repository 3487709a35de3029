/* Fuzz target: graph files (YAML through libyaml into the intermediate form, then validation). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shardflow/shardflow.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16) return 0;
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  sf_graph *g = NULL;
  sf_error e;
  if (sf_graph_load_string(&g, text, "fuzz.yaml", &e) == 0) {
    sf_graph_set(g, "seed", "3", &e);
    sf_graph_set(g, "batch.batch_size", "7", &e);
    sf_graph_validate(g, &e);
    sf_graph_destroy(&g);
  }
  free(text);
  return 0;
}
