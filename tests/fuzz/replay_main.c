/* Replays a fuzz target's corpus (every file under the given directories) as an ordinary test. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *data = malloc(n > 0 ? (size_t)n : 1);
  if (!data || fread(data, 1, (size_t)n, f) != (size_t)n) {
    fclose(f);
    free(data);
    return 1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(data, (size_t)n);
  free(data);
  return 0;
}

static int replay(const char *path, int *count) {
  struct stat st;
  if (stat(path, &st) != 0) {
    fprintf(stderr, "replay: %s does not exist\n", path);
    return 1;
  }
  if (!S_ISDIR(st.st_mode)) {
    (*count)++;
    return replay_file(path);
  }
  DIR *d = opendir(path);
  if (!d) return 1;
  int failed = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char child[4096];
    snprintf(child, sizeof child, "%s/%s", path, e->d_name);
    failed |= replay(child, count);
  }
  closedir(d);
  return failed;
}

int main(int argc, char **argv) {
  int count = 0, failed = 0;
  for (int i = 1; i < argc; i++) failed |= replay(argv[i], &count);
  printf("replayed %d inputs\n", count);
  if (count == 0) {
    fprintf(stderr, "replay: empty corpus\n");
    return 1;
  }
  return failed;
}
