/* Embeds shardflow in a C program: runs a graph file and checks and counts the batches it receives. */
#include <stdio.h>
#include <stdlib.h>

#include <shardflow/shardflow.h>

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: count_batches GRAPH [EPOCHS]\n");
    return 2;
  }
  sf_error err;
  char text[2048];
  sf_graph *graph;
  if (sf_graph_load_file(&graph, argv[1], &err) < 0) {
    fprintf(stderr, "%s\n", sf_error_format(&err, text, sizeof text));
    return 1;
  }
  sf_pipeline_options options;
  sf_pipeline_options_init(&options);
  if (argc > 2) options.epochs = atoll(argv[2]);
  sf_pipeline *pipeline;
  int r = sf_pipeline_new(&pipeline, graph, &options, &err);
  sf_graph_destroy(&graph);
  if (r < 0) {
    fprintf(stderr, "%s\n", sf_error_format(&err, text, sizeof text));
    return 1;
  }
  unsigned long long batches = 0, samples = 0, bad = 0;
  for (;;) {
    sf_batch *batch;
    r = sf_pipeline_next(pipeline, &batch, 60.0);
    if (r == SF_EOF) {
      printf("epoch %llu: %llu batches, %llu samples\n", (unsigned long long)sf_pipeline_epoch(pipeline), batches,
             samples);
      if (sf_pipeline_epoch(pipeline) >= (unsigned long long)(argc > 2 ? atoll(argv[2]) : 1)) break;
      batches = samples = 0;
      continue;
    }
    if (r < 0) {
      fprintf(stderr, "stopped: %s\n", sf_strerror(r));
      sf_pipeline_destroy(&pipeline);
      return 1;
    }
    /* Every field must have the batch size as its leading dimension. */
    for (int i = 0; i < batch->n_fields; i++)
      if (batch->fields[i].tensor.ndim < 1 || batch->fields[i].tensor.shape[0] != batch->size) bad++;
    batches++;
    samples += (unsigned long long)batch->size;
    sf_batch_destroy(&batch);
  }
  sf_pipeline_destroy(&pipeline);
  if (bad) {
    fprintf(stderr, "%llu fields without the batch dimension\n", bad);
    return 1;
  }
  return 0;
}
