/* store_table.c: the store server's key table: chained hashing (FNV-1a), doubled when the load factor passes 1. */
#include "store_table.h"

#include <stdlib.h>
#include <string.h>

static uint64_t hash_key(const uint8_t *k, uint32_t n) {
  uint64_t h = 1469598103934665603ull;
  for (uint32_t i = 0; i < n; i++) h = (h ^ k[i]) * 1099511628211ull;
  return h;
}

static store_entry **find_slot(store_table *t, const uint8_t *k, uint32_t n) {
  store_entry **e = &t->buckets[hash_key(k, n) & (t->nbuckets - 1)];
  while (*e && ((*e)->klen != n || memcmp((*e)->key, k, n))) e = &(*e)->next;
  return e;
}

static bool grow(store_table *t) {
  size_t n = t->nbuckets * 2;
  store_entry **b = calloc(n, sizeof *b);
  if (!b) return false;
  for (size_t i = 0; i < t->nbuckets; i++) {
    for (store_entry *e = t->buckets[i], *next; e; e = next) {
      next = e->next;
      store_entry **slot = &b[hash_key(e->key, e->klen) & (n - 1)];
      e->next = *slot;
      *slot = e;
    }
  }
  free(t->buckets);
  t->buckets = b;
  t->nbuckets = n;
  return true;
}

static void free_entry(store_entry *e) {
  free(e->key);
  free(e->val);
  free(e);
}

bool store_table_init(store_table *t) {
  t->nkeys = 0;
  t->nbuckets = 64;
  t->buckets = calloc(t->nbuckets, sizeof *t->buckets);
  return t->buckets != NULL;
}

void store_table_free(store_table *t) {
  for (size_t i = 0; t->buckets && i < t->nbuckets; i++) {
    for (store_entry *e = t->buckets[i], *next; e; e = next) {
      next = e->next;
      free_entry(e);
    }
  }
  free(t->buckets);
  t->buckets = NULL;
}

store_entry *store_table_get(store_table *t, const uint8_t *k, uint32_t klen) { return *find_slot(t, k, klen); }

bool store_table_put(store_table *t, const uint8_t *k, uint32_t klen, const uint8_t *v, uint32_t vlen) {
  uint8_t *val = malloc((size_t)vlen + 1);
  if (!val) return false;
  if (vlen) memcpy(val, v, vlen);
  val[vlen] = 0;
  store_entry **slot = find_slot(t, k, klen);
  if (*slot) {
    free((*slot)->val);
    (*slot)->val = val;
    (*slot)->vlen = vlen;
    return true;
  }
  store_entry *e = calloc(1, sizeof *e);
  uint8_t *key = malloc(klen);
  if (!e || !key) {
    free(e);
    free(key);
    free(val);
    return false;
  }
  memcpy(key, k, klen);
  e->key = key;
  e->klen = klen;
  e->val = val;
  e->vlen = vlen;
  e->next = *slot;
  *slot = e;
  t->nkeys++;
  if (t->nkeys > t->nbuckets) grow(t); /* on failure the chains just get longer */
  return true;
}

bool store_table_delete(store_table *t, const uint8_t *k, uint32_t klen) {
  store_entry **slot = find_slot(t, k, klen);
  store_entry *e = *slot;
  if (!e) return false;
  *slot = e->next;
  free_entry(e);
  t->nkeys--;
  return true;
}
