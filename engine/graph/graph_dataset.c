/* The size of a graph's indexed dataset (sf_graph_dataset_size, a mix's inputs' for the plan): its shard list and each shard's index, as shard_source reads them. */
#include <string.h>

#include "graph.h"
#include "shard_index.h"
#include "shard_list.h"
#include "shardflow/shardflow.h"

int sf_graph_source_size(const sf_graph *graph, int node, uint64_t *samples, sf_error *error) {
  *samples = 0;
  const char *urls = sf_graph_node_option(graph, node, "urls"), *dir = sf_graph_node_option(graph, node, "index_dir");
  if (!urls || !urls[0])
    return sf_error_set(error, SF_EOPTION, SF_NOWHERE, "shard_source's urls is empty; give the shard list");
  sf_shard_list list;
  int r = sf_shard_list_expand(&list, urls, error);
  for (size_t i = 0; r == 0 && i < list.count; i++) {
    sf_shard_index index;
    r = sf_shard_index_load(&index, list.urls[i], dir, NULL, error);
    if (r == 0) *samples += index.count;
    sf_shard_index_clear(&index);
  }
  sf_shard_list_clear(&list);
  return r;
}

int sf_graph_dataset_size(const sf_graph *graph, uint64_t *samples, sf_error *error) {
  sf_error scratch;
  if (!error) error = &scratch;
  *samples = 0;
  int node = -1;
  for (int i = 0; node < 0 && i < sf_graph_node_count(graph); i++)
    if (strcmp(sf_graph_node_type(graph, i), "shard_source") == 0) node = i;
  if (node < 0) return sf_error_set(error, SF_ENOENT, SF_NOWHERE, "the graph has no shard_source: no dataset to count");
  return sf_graph_source_size(graph, node, samples, error);
}
