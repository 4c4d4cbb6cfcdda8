/* crc32c.c: CRC-32C (Castagnoli, as in iSCSI and TFRecord framing), table-driven, continuable. */
#include <pthread.h>

#include "dt_io.h"

#define CRC32C_POLY 0x82F63B78u /* reflected 0x1EDC6F41 */

static uint32_t table[256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void make_table(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
    table[i] = c;
  }
}

uint32_t dt_io_crc32c(uint32_t crc, const void *data, size_t n) {
  pthread_once(&table_once, make_table); /* the table is built once, whichever thread asks first */
  const unsigned char *p = data;
  crc = ~crc;
  for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}
