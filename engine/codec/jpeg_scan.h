/*
 * Entry points into a baseline JPEG's scan, so that a region decode can start libjpeg at the iMCU row
 * its rows need instead of entropy-decoding every row above them (ITU-T T.81: the marker segments of
 * Annex B, the Huffman tables of Annex C, the sequential decoding of Annex F.2).
 *
 * An entry is where an iMCU row's first MCU starts: the byte and bit of the scan, and each component's DC
 * predictor there. Walking the scan (sf_jpeg_scan_walk) finds them; sf_jpeg_scan_resume writes the head of
 * a JPEG that libjpeg decodes as the original's rows from an entry on: the original's header segments with
 * a smaller height, one iMCU row of flat stand-in blocks that leave each DC predictor as the entry has it
 * and end on the entry's bit, then the original's bytes from the entry on, unchanged.
 */
#ifndef SF_ENGINE_JPEG_SCAN_H
#define SF_ENGINE_JPEG_SCAN_H

#include <stddef.h>
#include <stdint.h>

enum { SF_JPEG_SCAN_MAX_COMPONENTS = 3, SF_JPEG_SCAN_MAX_BLOCKS = 6, SF_JPEG_SCAN_MAX_SEGMENTS = 24 };

/* Where an iMCU row starts in the scan: bit `bit` (0 = the most significant) of the data byte at `byte` (an
   offset into the whole JPEG), and the DC predictor of each component of the scan, in scan order. */
typedef struct sf_jpeg_entry {
  uint32_t byte;
  int16_t dc[SF_JPEG_SCAN_MAX_COMPONENTS];
  uint8_t bit;
} sf_jpeg_entry;

/* What walking and resuming a scan need of a JPEG's header. Points into the JPEG's bytes (not owned). */
typedef struct sf_jpeg_scan {
  const uint8_t *data;
  size_t size;
  size_t scan_start; /* the first byte of the entropy-coded data */
  size_t height_at;  /* the frame header's height field */
  int width, height;
  int components; /* of the scan, which has all of the frame's, interleaved */
  int row_height; /* pixel rows of one iMCU row: 8 x the largest vertical sampling factor */
  int mcus_per_row, rows;
  int blocks;                                       /* of one MCU */
  uint8_t block_component[SF_JPEG_SCAN_MAX_BLOCKS]; /* each block of an MCU: its component, in scan order */
  uint8_t dc_table[SF_JPEG_SCAN_MAX_COMPONENTS], ac_table[SF_JPEG_SCAN_MAX_COMPONENTS]; /* 0-3, 4-7 */
  const uint8_t *table[8];                        /* DC tables 0-3, then AC 0-3: their 16 counts, then their symbols */
  uint16_t code[8][256];                          /* each table's code of each symbol */
  uint8_t length[8][256];                         /* and its length, 0 where the table has no code for it */
  int segments;                                   /* the header segments libjpeg needs again, the scan header last */
  uint32_t segment[SF_JPEG_SCAN_MAX_SEGMENTS][2]; /* [start, end) byte offsets */
} sf_jpeg_scan;

/*
 * Reads the header of the JPEG in data[0, size) into *s. Returns 1 when entries apply: a baseline or
 * extended sequential Huffman JPEG of 8-bit samples, one scan with every component interleaved, no
 * restart interval, 1 component (1x1) or 3 of which only the first may be subsampled (1 or 2 each way),
 * Huffman tables as libjpeg accepts them, an EOI marker as its last two bytes. Returns 0 otherwise:
 * nothing is wrong, the caller decodes as before (a corrupt header is libjpeg's to report).
 */
int sf_jpeg_scan_open(sf_jpeg_scan *s, const uint8_t *data, size_t size);

/* The entry of iMCU row 0: the scan's first byte, the predictors 0. */
sf_jpeg_entry sf_jpeg_scan_first(const sf_jpeg_scan *s);

/*
 * Entropy-decodes iMCU rows [row, row + n) starting at *at (the entry of `row`), keeping no coefficient,
 * and writes the entries of rows row + 1 .. row + n to out[0 .. n). Returns 0; SF_EUNSUPPORTED when the data
 * cannot be walked (a code the table lacks, a marker or the end of the data before the last entry, a
 * predictor outside int16), where the caller decodes as before and libjpeg reports what is wrong;
 * SF_EINVAL when row + n is not below s->rows or *at is not in the scan; SF_ENOMEM.
 */
int sf_jpeg_scan_walk(const sf_jpeg_scan *s, const sf_jpeg_entry *at, int row, int n, sf_jpeg_entry *out);

/*
 * The head of a JPEG that decodes as one stand-in iMCU row followed by the original's rows from iMCU row
 * `row` (1 <= row < s->rows) on, whose entry is *at: its height is the original's less (row - 1) iMCU
 * rows. Writes it to *head (malloc'd, the caller frees) and its length to *head_size; the decoder reads the
 * original's bytes from offset *resume on after it. The stand-in's pixels are not the original's, and the
 * first row after them may take its chroma from them (fancy upsampling): use the rows from the second on.
 * Returns 0; SF_EUNSUPPORTED when the tables have no codes for such a row (the DC differences, an end of
 * block, the padding to the entry's bit); SF_EINVAL for a row outside [1, s->rows) or *at not in the scan;
 * SF_ENOMEM.
 */
int sf_jpeg_scan_resume(const sf_jpeg_scan *s, const sf_jpeg_entry *at, int row, uint8_t **head, size_t *head_size,
                        size_t *resume);

#endif
