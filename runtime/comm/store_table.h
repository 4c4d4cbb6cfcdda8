/* store_table.h: the store server's key table: a chained hash map from byte-string keys to values. */
#ifndef DT_STORE_TABLE_H
#define DT_STORE_TABLE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct store_entry {
  struct store_entry *next;
  uint8_t *key, *val; /* val is NUL-terminated one past vlen (for integer parsing) */
  uint32_t klen, vlen;
} store_entry;

typedef struct store_table {
  store_entry **buckets;
  size_t nbuckets, nkeys;
} store_table;

/* False when out of memory. */
bool store_table_init(store_table *t);
void store_table_free(store_table *t);
/* The entry of a key, or NULL. */
store_entry *store_table_get(store_table *t, const uint8_t *k, uint32_t klen);
/* Insert or replace (copies key and value); false when out of memory, the table unchanged. */
bool store_table_put(store_table *t, const uint8_t *k, uint32_t klen, const uint8_t *v, uint32_t vlen);
/* Remove a key; true when it existed. */
bool store_table_delete(store_table *t, const uint8_t *k, uint32_t klen);

#endif
