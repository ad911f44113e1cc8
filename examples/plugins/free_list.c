/* A cache plugin for kvlab (include/kvlab/cache_plugin.h): positions take slots from a free list,
 * most recently freed first, so after a rollback a sequence's slots are in no particular order.
 * Exact: kvlab verify --plugin build/examples/plugins/libkvlab_free_list.so passes.
 *
 * Built with FREE_LIST_OFF_BY_ONE (libkvlab_free_list_off_by_one.so) it has a planted bug for
 * the check to catch: a rollback to n also frees the slot of position n - 1, which is still
 * held, so the next position takes that slot and would overwrite its rows. */
#include <stdio.h>
#include <stdlib.h>

#include "kvlab/cache_plugin.h"

#ifdef FREE_LIST_OFF_BY_ONE
#define FREE_LIST_NAME "free_list_off_by_one"
#else
#define FREE_LIST_NAME "free_list"
#endif

struct kvlab_cache {
    int32_t max_seq, n_slots, length;
    int64_t* slot_of; /* [max_seq] the slot of each held position */
    int64_t* free;    /* [n_slots] a stack of free slots */
    int32_t n_free;
};

static kvlab_cache* create(const kvlab_cache_config* config, char* err, size_t err_len) {
    if (config->n_slots < 1 || config->max_seq < 1) {
        snprintf(err, err_len, "free_list needs at least one slot and one position");
        return NULL;
    }
    kvlab_cache* c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->max_seq = config->max_seq, c->n_slots = config->n_slots;
    c->slot_of = calloc((size_t)config->max_seq, sizeof *c->slot_of);
    c->free = calloc((size_t)config->n_slots, sizeof *c->free);
    if (!c->slot_of || !c->free) {
        free(c->slot_of), free(c->free), free(c);
        snprintf(err, err_len, "free_list: out of memory");
        return NULL;
    }
    /* slot 0 on top */
    for (int32_t i = 0; i < c->n_slots; i++) c->free[i] = c->n_slots - 1 - i;
    c->n_free = c->n_slots;
    return c;
}

static int reserve(kvlab_cache* c, int32_t length, int32_t n, char* err, size_t err_len) {
    if (length != c->length || n < 1 || length + n > c->max_seq || n > c->n_free) {
        snprintf(err, err_len, "free_list: no room for %d positions after %d (%d slots free)", n, length, c->n_free);
        return 1;
    }
    for (int32_t i = 0; i < n; i++) c->slot_of[length + i] = c->free[--c->n_free];
    c->length = length + n;
    return 0;
}

static int64_t slot(const kvlab_cache* c, int32_t pos) { return pos >= 0 && pos < c->length ? c->slot_of[pos] : -1; }

static void release(kvlab_cache* c, int32_t n) {
#ifdef FREE_LIST_OFF_BY_ONE
    const int32_t from = n > 0 && n < c->length ? n - 1 : n; /* the planted bug */
#else
    const int32_t from = n;
#endif
    for (int32_t pos = c->length - 1; pos >= from && c->n_free < c->n_slots; pos--)
        c->free[c->n_free++] = c->slot_of[pos];
    if (n < c->length) c->length = n;
}

static int64_t memory(const kvlab_cache* c) {
    return (int64_t)sizeof *c + (int64_t)sizeof(int64_t) * (c->max_seq + c->n_slots);
}

static void destroy(kvlab_cache* c) {
    if (!c) return;
    free(c->slot_of), free(c->free), free(c);
}

static const kvlab_cache_plugin table = {
    KVLAB_CACHE_PLUGIN_ABI_VERSION, FREE_LIST_NAME, create, reserve, slot, release, memory, destroy};

const kvlab_cache_plugin* kvlab_cache_plugin_v1(void) { return &table; }
