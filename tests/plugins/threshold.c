/* A block-table cache plugin (include/kvlab/cache_plugin.h) for tests/test_plugin.cpp, built
 * once as it is (threshold_clean, exact) and once per planted bug that shows only at a size:
 *
 *   BUG_POSITION=P      slot() of position P answers position P - 1's slot: positions 97, 257
 *                       and 4097
 *   BUG_LOGICAL_BLOCK=B a sequence's block B is given block B - 1's block again (an inline
 *                       table of B entries whose overflow path reuses the last one): block 21
 *   BUG_BLOCK_BITS=8    block ids kept in 8 bits: block 256 aliases block 0
 *   BUG_SLOT_BITS=10    slot() answers in 10 bits: slot 1024 aliases slot 0
 *   BUG_FULL_EIGHTHS=7  once 7/8 of the blocks are taken, the allocator hands out the top of its
 *                       free stack without popping it: the next allocation gets it again
 *   BUG_LEAK            a rollback or a finished sequence never gives its blocks back: the pool
 *                       refuses while kvlab's books show it has room
 *
 * Positions live in blocks of block_size slots listed in a sequence's table, taken from a stack
 * of free blocks (lowest id on top, so ids grow with the pool's fill). No fork, no prefix reuse,
 * no copies: a sequence's blocks are its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVLAB_CACHE_PLUGIN_V2 /* written for version 2, which kvlab still reads */
#include "kvlab/cache_plugin.h"

#ifndef PLUGIN_NAME
#define PLUGIN_NAME "threshold_clean"
#endif

#ifdef BUG_BLOCK_BITS
typedef uint8_t block_id; /* the planted bug: too narrow for the pool's blocks */
#else
typedef int32_t block_id;
#endif

struct kvlab_cache_pool {
    int32_t max_seq, block_size, n_blocks;
    int32_t* free; /* [capacity] a stack of free blocks, the top at free[n_free - 1] */
    int32_t n_free, capacity; /* capacity > n_blocks: a planted bug may give a block back twice */
};

struct kvlab_cache {
    kvlab_cache_pool* pool;
    int32_t length;
    block_id* table; /* [max_seq / block_size + 1] the block of each logical block */
};

static kvlab_cache_pool* create_pool(const kvlab_cache_config* config, char* err, size_t err_len) {
    const int32_t bs = config->block_size > 0 ? config->block_size : 1;
    kvlab_cache_pool* p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->max_seq = config->max_seq, p->block_size = bs, p->n_blocks = config->n_slots / bs;
    p->capacity = 2 * p->n_blocks + 64;
    p->free = calloc((size_t)p->capacity, sizeof *p->free);
    if (!p->free || p->n_blocks < 1) {
        snprintf(err, err_len, PLUGIN_NAME ": no room for %d blocks of %d", p->n_blocks, bs);
        free(p->free), free(p);
        return NULL;
    }
    for (int32_t i = 0; i < p->n_blocks; i++) p->free[i] = p->n_blocks - 1 - i; /* block 0 on top */
    p->n_free = p->n_blocks;
    return p;
}

static void destroy_pool(kvlab_cache_pool* p) {
    if (p) free(p->free), free(p);
}

static kvlab_cache* create(kvlab_cache_pool* pool, char* err, size_t err_len) {
    kvlab_cache* c = calloc(1, sizeof *c);
    if (c) c->table = calloc((size_t)(pool->max_seq / pool->block_size + 1), sizeof *c->table);
    if (!c || !c->table) {
        if (c) free(c);
        snprintf(err, err_len, PLUGIN_NAME ": out of memory");
        return NULL;
    }
    c->pool = pool;
    return c;
}

static int32_t take_block(kvlab_cache_pool* p) {
#ifdef BUG_FULL_EIGHTHS
    if ((int64_t)(p->n_blocks - p->n_free) * 8 >= (int64_t)p->n_blocks * BUG_FULL_EIGHTHS)
        return p->free[p->n_free - 1]; /* the planted bug: not popped */
#endif
    return p->free[--p->n_free];
}

static int reserve(kvlab_cache* c, int32_t length, int32_t n, const int32_t* tokens, kvlab_slot_copy* copies,
                   int32_t max_copies, int32_t* n_copies, char* err, size_t err_len) {
    kvlab_cache_pool* p = c->pool;
    const int32_t bs = p->block_size, have = (length + bs - 1) / bs, want = (length + n + bs - 1) / bs;
    (void)tokens, (void)copies, (void)max_copies, (void)n_copies;
    if (length != c->length || length + n > p->max_seq || want - have > p->n_free) {
        snprintf(err, err_len, PLUGIN_NAME ": no room for %d positions after %d (%d blocks free)", n, length,
                 p->n_free);
        return 1;
    }
    for (int32_t b = have; b < want; b++) {
#ifdef BUG_LOGICAL_BLOCK
        if (b == BUG_LOGICAL_BLOCK) { /* the planted bug: the last inline entry again */
            c->table[b] = c->table[b - 1];
            continue;
        }
#endif
        c->table[b] = (block_id)take_block(p);
    }
    c->length = length + n;
    return 0;
}

static int64_t slot(const kvlab_cache* c, int32_t pos) {
    const int32_t bs = c->pool->block_size;
#ifdef BUG_POSITION
    if (pos == BUG_POSITION) pos--; /* the planted bug */
#endif
    if (pos < 0 || pos >= c->length) return -1;
    const int64_t s = (int64_t)c->table[pos / bs] * bs + pos % bs;
#ifdef BUG_SLOT_BITS
    return s & ((1 << BUG_SLOT_BITS) - 1); /* the planted bug: a 10-bit field */
#else
    return s;
#endif
}

static void give_back(kvlab_cache* c, int32_t from_block) {
    kvlab_cache_pool* p = c->pool;
    const int32_t bs = p->block_size;
#ifdef BUG_LEAK
    from_block = (c->length + bs - 1) / bs; /* the planted bug: none given back */
#endif
    for (int32_t b = (c->length + bs - 1) / bs - 1; b >= from_block; b--) {
#ifdef BUG_LOGICAL_BLOCK
        if (b == BUG_LOGICAL_BLOCK) continue; /* its block is block b - 1's */
#endif
        if (p->n_free < p->capacity) p->free[p->n_free++] = c->table[b];
    }
}

static void release(kvlab_cache* c, int32_t n) {
    if (n >= c->length) return;
    give_back(c, (n + c->pool->block_size - 1) / c->pool->block_size);
    c->length = n;
}

static int64_t memory(const kvlab_cache_pool* p) { return (int64_t)sizeof *p + (int64_t)p->n_blocks * 4; }

static void destroy(kvlab_cache* c) {
    if (!c) return;
    release(c, 0);
    free(c->table), free(c);
}

static const kvlab_cache_plugin table = {.abi_version = KVLAB_CACHE_PLUGIN_ABI_VERSION,
                                         .name = PLUGIN_NAME,
                                         .create_pool = create_pool,
                                         .destroy_pool = destroy_pool,
                                         .create = create,
                                         .reserve = reserve,
                                         .slot = slot,
                                         .release = release,
                                         .memory = memory,
                                         .destroy = destroy};

const kvlab_cache_plugin* kvlab_cache_plugin_v2(void) { return &table; }
