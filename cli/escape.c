/* Names from shards and inputs made safe to print: control characters and bytes that are not UTF-8 escaped. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

size_t sf_cli_utf8_next(const unsigned char *s, size_t n, uint32_t *code_point) {
  size_t len;
  uint32_t min, cp;
  if (s[0] < 0x80)
    len = 1, min = 0, cp = s[0];
  else if ((s[0] & 0xe0) == 0xc0)
    len = 2, min = 0x80, cp = s[0] & 0x1f;
  else if ((s[0] & 0xf0) == 0xe0)
    len = 3, min = 0x800, cp = s[0] & 0x0f;
  else if ((s[0] & 0xf8) == 0xf0)
    len = 4, min = 0x10000, cp = s[0] & 0x07;
  else
    return 0;
  if (len > n) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  if (code_point) *code_point = cp;
  return len;
}

bool sf_cli_is_format_control(uint32_t cp) {
  /* C1 controls (U+009B is a terminal's CSI), and the characters that reorder or break what a line
   * shows (bidirectional marks, embeddings, overrides and isolates; line and paragraph separators). */
  return (cp >= 0x80 && cp <= 0x9f) || cp == 0x61c || cp == 0x200e || cp == 0x200f || (cp >= 0x2028 && cp <= 0x202e) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

size_t sf_cli_escape(const char *s, char *out, size_t size) {
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s), used = 0, written = 0;
  char piece[16];
  while (n > 0) {
    uint32_t cp = 0;
    size_t len = sf_cli_utf8_next(p, n, &cp);
    if (len == 0) {
      snprintf(piece, sizeof piece, "\\x%02x", *p); /* a byte that is not UTF-8 */
      len = 1;
    } else if (cp == '\\') {
      strcpy(piece, "\\\\");
    } else if (cp == '\t' || cp == '\n' || cp == '\r') {
      snprintf(piece, sizeof piece, "\\%c", cp == '\t' ? 't' : cp == '\n' ? 'n' : 'r');
    } else if (cp < 0x20 || cp == 0x7f) {
      snprintf(piece, sizeof piece, "\\x%02x", (unsigned)cp);
    } else if (sf_cli_is_format_control(cp)) {
      snprintf(piece, sizeof piece, "\\u%04x", (unsigned)cp);
    } else {
      memcpy(piece, p, len);
      piece[len] = '\0';
    }
    size_t k = strlen(piece);
    if (written == used && used + k < size) { /* once one piece does not fit, none after it goes in */
      memcpy(out + used, piece, k);
      written += k;
    }
    used += k;
    p += len;
    n -= len;
  }
  if (size) out[written] = '\0';
  return used;
}
