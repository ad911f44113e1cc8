/* Version 2 cache plugins that break one rule of the ABI each, one way per build, for kvlab's
 * checks to name: HOSTILE_MOVE (a held position's slot moves without a copy), HOSTILE_COPY (a
 * copy onto a slot that a held position has), HOSTILE_FORK (a fork whose child has slots of its
 * own, without the parent's rows), HOSTILE_WINDOW (a query attends only the last two positions),
 * HOSTILE_PREFIX (a prefix hit on slots that hold no rows for it). Otherwise each sequence has
 * max_seq slots of its own and position pos lives in the region's slot pos: exact. */
#include <stdio.h>
#include <stdlib.h>

#define KVLAB_CACHE_PLUGIN_V2 /* written for version 2, which kvlab still reads */
#include "kvlab/cache_plugin.h"

struct kvlab_cache_pool {
    int32_t max_seq, n_regions;
    int* used; /* [n_regions] whether a sequence has region r */
};

struct kvlab_cache {
    kvlab_cache_pool* pool;
    int32_t region, length;
};

static kvlab_cache_pool* create_pool(const kvlab_cache_config* config, char* err, size_t err_len) {
    kvlab_cache_pool* p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->max_seq = config->max_seq, p->n_regions = config->n_slots / config->max_seq;
    p->used = calloc((size_t)p->n_regions, sizeof *p->used);
    if (!p->used) {
        snprintf(err, err_len, "hostile_v2: out of memory");
        free(p);
        return NULL;
    }
    return p;
}

static void destroy_pool(kvlab_cache_pool* p) {
    if (p) free(p->used), free(p);
}

static kvlab_cache* create(kvlab_cache_pool* pool, char* err, size_t err_len) {
    for (int32_t r = 0; r < pool->n_regions; r++)
        if (!pool->used[r]) {
            kvlab_cache* c = calloc(1, sizeof *c);
            if (!c) break;
            pool->used[r] = 1, c->pool = pool, c->region = r;
            return c;
        }
    snprintf(err, err_len, "hostile_v2: no free region");
    return NULL;
}

#ifdef HOSTILE_FORK
static kvlab_cache* hostile_fork(kvlab_cache* parent, char* err, size_t err_len) {
    kvlab_cache* c = create(parent->pool, err, err_len);
    if (c) c->length = parent->length; /* the broken rule: the parent's positions, in other slots */
    return c;
}
#else
#define hostile_fork NULL
#endif

#ifdef HOSTILE_PREFIX
static int32_t hostile_attach(kvlab_cache* c, const int32_t* tokens, int32_t n) {
    (void)tokens;
    c->length = n - 1; /* the broken rule: "reused" rows that were never written there */
    return n - 1;
}
#else
#define hostile_attach NULL
#endif

static int reserve(kvlab_cache* c, int32_t length, int32_t n, const int32_t* tokens, kvlab_slot_copy* copies,
                   int32_t max_copies, int32_t* n_copies, char* err, size_t err_len) {
    (void)tokens;
    if (length != c->length || length + n > c->pool->max_seq) {
        snprintf(err, err_len, "hostile_v2: no room");
        return 1;
    }
#ifdef HOSTILE_COPY
    if (length >= 2 && max_copies >= 1) { /* the broken rule: onto position 1's slot */
        copies[0] =
            (kvlab_slot_copy){(int64_t)c->region * c->pool->max_seq, (int64_t)c->region * c->pool->max_seq + 1, 1};
        *n_copies = 1;
    }
#else
    (void)copies, (void)max_copies, (void)n_copies;
#endif
    c->length = length + n;
    return 0;
}

static int64_t slot(const kvlab_cache* c, int32_t pos) {
    if (pos < 0 || pos >= c->length) return -1;
#ifdef HOSTILE_MOVE
    if (pos == 0 && c->length >= 3) return (int64_t)c->region * c->pool->max_seq + c->pool->max_seq - 1;
#endif
    return (int64_t)c->region * c->pool->max_seq + pos;
}

#ifdef HOSTILE_WINDOW
static int32_t hostile_attended(const kvlab_cache* c, int32_t pos, int32_t* positions, int32_t max_positions) {
    (void)c;
    int32_t n = 0;
    for (int32_t p = pos >= 1 ? pos - 1 : 0; p <= pos && n < max_positions; p++) positions[n++] = p;
    return n;
}
#else
#define hostile_attended NULL
#endif

static void release(kvlab_cache* c, int32_t n) {
    if (n < c->length) c->length = n;
}

static int64_t memory(const kvlab_cache_pool* p) { return (int64_t)sizeof *p; }

static void destroy(kvlab_cache* c) {
    if (!c) return;
    c->pool->used[c->region] = 0;
    free(c);
}

static const kvlab_cache_plugin table = {.abi_version = KVLAB_CACHE_PLUGIN_ABI_VERSION,
                                         .name = "hostile_v2",
                                         .create_pool = create_pool,
                                         .destroy_pool = destroy_pool,
                                         .create = create,
                                         .attach_prefix = hostile_attach,
                                         .fork = hostile_fork,
                                         .attended = hostile_attended,
                                         .reserve = reserve,
                                         .slot = slot,
                                         .release = release,
                                         .memory = memory,
                                         .destroy = destroy};

const kvlab_cache_plugin* kvlab_cache_plugin_v2(void) { return &table; }
