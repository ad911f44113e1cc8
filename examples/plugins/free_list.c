/* A cache plugin for kvlab (include/kvlab/cache_plugin.h): positions take slots one at a time
 * from a free list, most recently freed first, so after a rollback a sequence's slots are in no
 * particular order. A fork shares its parent's slots, counted per slot; since every new position
 * takes a fresh slot, no write ever lands in a shared one and no copy is ever needed.
 * Exact: kvlab verify --plugin build/examples/plugins/libkvlab_free_list.so passes.
 *
 * Built with FREE_LIST_OFF_BY_ONE (libkvlab_free_list_off_by_one.so) it has a planted bug for
 * the check to catch: a rollback to n also lets go of position n - 1's slot, which is still
 * held, so a later position takes that slot and would overwrite its rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVLAB_CACHE_PLUGIN_V2 /* written for version 2, which kvlab still reads */
#include "kvlab/cache_plugin.h"

#ifdef FREE_LIST_OFF_BY_ONE
#define FREE_LIST_NAME "free_list_off_by_one"
#else
#define FREE_LIST_NAME "free_list"
#endif

struct kvlab_cache_pool {
    int32_t max_seq, n_slots;
    int32_t* refs; /* [n_slots] the sequences holding each slot */
    int64_t* free; /* [n_slots] a stack of the slots nobody holds */
    int32_t n_free;
};

struct kvlab_cache {
    kvlab_cache_pool* pool;
    int32_t length;
    int64_t* slot_of; /* [max_seq] the slot of each held position */
};

static kvlab_cache_pool* create_pool(const kvlab_cache_config* config, char* err, size_t err_len) {
    if (config->n_slots < 1 || config->max_seq < 1) {
        snprintf(err, err_len, "free_list needs at least one slot and one position");
        return NULL;
    }
    kvlab_cache_pool* p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->max_seq = config->max_seq, p->n_slots = config->n_slots;
    p->refs = calloc((size_t)p->n_slots, sizeof *p->refs);
    p->free = calloc((size_t)p->n_slots, sizeof *p->free);
    if (!p->refs || !p->free) {
        free(p->refs), free(p->free), free(p);
        snprintf(err, err_len, "free_list: out of memory");
        return NULL;
    }
    for (int32_t i = 0; i < p->n_slots; i++) p->free[i] = p->n_slots - 1 - i; /* slot 0 on top */
    p->n_free = p->n_slots;
    return p;
}

static void destroy_pool(kvlab_cache_pool* p) {
    if (!p) return;
    free(p->refs), free(p->free), free(p);
}

static kvlab_cache* create(kvlab_cache_pool* pool, char* err, size_t err_len) {
    kvlab_cache* c = calloc(1, sizeof *c);
    if (c) c->slot_of = calloc((size_t)pool->max_seq, sizeof *c->slot_of);
    if (!c || !c->slot_of) {
        if (c) free(c);
        snprintf(err, err_len, "free_list: out of memory");
        return NULL;
    }
    c->pool = pool;
    return c;
}

static kvlab_cache* fork_sequence(kvlab_cache* parent, char* err, size_t err_len) {
    kvlab_cache* c = create(parent->pool, err, err_len);
    if (!c) return NULL;
    c->length = parent->length;
    memcpy(c->slot_of, parent->slot_of, (size_t)parent->length * sizeof *c->slot_of);
    for (int32_t pos = 0; pos < c->length; pos++) c->pool->refs[c->slot_of[pos]]++;
    return c;
}

static int reserve(kvlab_cache* c, int32_t length, int32_t n, const int32_t* tokens, kvlab_slot_copy* copies,
                   int32_t max_copies, int32_t* n_copies, char* err, size_t err_len) {
    kvlab_cache_pool* p = c->pool;
    (void)tokens, (void)copies, (void)max_copies, (void)n_copies;
    if (length != c->length || n < 1 || length + n > p->max_seq || n > p->n_free) {
        snprintf(err, err_len, "free_list: no room for %d positions after %d (%d slots free)", n, length, p->n_free);
        return 1;
    }
    for (int32_t i = 0; i < n; i++) {
        const int64_t s = p->free[--p->n_free];
        p->refs[s] = 1;
        c->slot_of[length + i] = s;
    }
    c->length = length + n;
    return 0;
}

static int64_t slot(const kvlab_cache* c, int32_t pos) { return pos >= 0 && pos < c->length ? c->slot_of[pos] : -1; }

static void let_go(kvlab_cache_pool* p, int64_t s) {
    if (p->refs[s] > 0 && --p->refs[s] == 0 && p->n_free < p->n_slots) p->free[p->n_free++] = s;
}

static void release(kvlab_cache* c, int32_t n) {
#ifdef FREE_LIST_OFF_BY_ONE
    const int32_t from = n > 0 && n < c->length ? n - 1 : n; /* the planted bug */
#else
    const int32_t from = n;
#endif
    for (int32_t pos = c->length - 1; pos >= from && pos >= 0; pos--) let_go(c->pool, c->slot_of[pos]);
    if (n < c->length) c->length = n;
}

static int64_t memory(const kvlab_cache_pool* p) {
    return (int64_t)sizeof *p + (int64_t)(sizeof(int32_t) + sizeof(int64_t)) * p->n_slots;
}

static void destroy(kvlab_cache* c) {
    if (!c) return;
    release(c, 0);
    free(c->slot_of), free(c);
}

/* attach_prefix and attended are NULL: no prefix reuse, and a query attends all of 0..pos */
static const kvlab_cache_plugin table = {.abi_version = KVLAB_CACHE_PLUGIN_ABI_VERSION,
                                         .name = FREE_LIST_NAME,
                                         .create_pool = create_pool,
                                         .destroy_pool = destroy_pool,
                                         .create = create,
                                         .fork = fork_sequence,
                                         .reserve = reserve,
                                         .slot = slot,
                                         .release = release,
                                         .memory = memory,
                                         .destroy = destroy};

const kvlab_cache_plugin* kvlab_cache_plugin_v2(void) { return &table; }
