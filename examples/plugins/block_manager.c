/* A cache plugin for kvlab (include/kvlab/cache_plugin.h, version 3) in the style of nano-vllm's
 * block manager: a sequence's positions live in blocks of block_size slots listed in its block
 * table; blocks are reference counted, so forks and requests with a common prefix share them;
 * after the forward pass that fills a block (step_done), it is published under a hash chained from
 * the hashes of the blocks before it, so a later request whose prompt starts with the same tokens
 * maps it instead of computing it again; a write into a block that is shared, or published, first
 * copies it (copy-on-write). Freed blocks keep their hash until they are taken again, oldest freed
 * first, so recent prefixes stay reusable.
 * Exact: kvlab verify --plugin build/examples/plugins/libkvlab_block_manager.so passes.
 *
 * Two more ways to build it, each exact:
 *   BLOCK_MANAGER_WHOLE      as nano-vllm itself: sequences are freed only whole (no release,
 *                            so kvlab preempts and recomputes instead of rolling back), no fork,
 *                            block size 16 only, at most 32 sequences;
 *   BLOCK_MANAGER_DEDUP      as SGLang's radix cache: a block that fills with the same tokens
 *                            after the same prefix as a published one moves onto it at step_done,
 *                            and its own rows are freed (a deduplicating move).
 * And builds with a planted bug each, for the check to catch:
 *   BLOCK_MANAGER_UNCHAINED  a block's hash covers its own tokens only, not the prefix before
 *                            them, so a prompt that differs early but repeats a later block maps
 *                            rows that were computed after another prefix;
 *   BLOCK_MANAGER_NO_COW     a block shared by a fork is written in place, under the other
 *                            sequence's rows;
 *   BLOCK_MANAGER_DEDUP_TOKENS  (with BLOCK_MANAGER_DEDUP) a filled block moves onto any
 *                            published block holding the same tokens, after whatever prefix. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvlab/cache_plugin.h"

#if defined(BLOCK_MANAGER_UNCHAINED)
#define BLOCK_MANAGER_NAME "block_manager_unchained"
#elif defined(BLOCK_MANAGER_NO_COW)
#define BLOCK_MANAGER_NAME "block_manager_no_cow"
#elif defined(BLOCK_MANAGER_WHOLE)
#define BLOCK_MANAGER_NAME "block_manager_whole"
#elif defined(BLOCK_MANAGER_DEDUP_TOKENS)
#define BLOCK_MANAGER_NAME "block_manager_dedup_tokens"
#elif defined(BLOCK_MANAGER_DEDUP)
#define BLOCK_MANAGER_NAME "block_manager_dedup"
#else
#define BLOCK_MANAGER_NAME "block_manager"
#endif

typedef struct block {
    int32_t refs;    /* block tables listing it */
    int published;   /* full, and findable by hash */
    uint64_t hash;   /* valid while published */
    int32_t* tokens; /* [block_size] the tokens its rows were computed for, to confirm a hash match */
} block;

struct kvlab_cache_pool {
    int32_t max_seq, block_size, n_blocks;
    block* blocks; /* [n_blocks] */
    int32_t* free; /* [n_blocks] a queue of the blocks no table lists, oldest freed first */
    int32_t n_free;
};

struct kvlab_cache {
    kvlab_cache_pool* pool;
    int32_t length;
    int32_t full;    /* logical blocks 0..full-1 were full at the last step_done (published or moved) */
    int32_t* table;  /* [max_seq / block_size + 1] the block of each logical block */
    int32_t* tokens; /* [max_seq] the tokens held */
};

static kvlab_cache_pool* create_pool(const kvlab_cache_config* config, char* err, size_t err_len) {
    const int32_t bs = config->block_size > 0 ? config->block_size : 1;
    kvlab_cache_pool* p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->max_seq = config->max_seq, p->block_size = bs, p->n_blocks = config->n_slots / bs;
    p->blocks = calloc((size_t)p->n_blocks, sizeof *p->blocks);
    p->free = calloc((size_t)p->n_blocks, sizeof *p->free);
    int ok = p->blocks && p->free && p->n_blocks > 0;
    for (int32_t b = 0; ok && b < p->n_blocks; b++) {
        p->blocks[b].tokens = calloc((size_t)bs, sizeof(int32_t));
        ok = p->blocks[b].tokens != NULL;
        p->free[p->n_free++] = b;
    }
    if (!ok) {
        snprintf(err, err_len, "block_manager: no memory for %d blocks of %d", p->n_blocks, bs);
        for (int32_t b = 0; p->blocks && b < p->n_blocks; b++) free(p->blocks[b].tokens);
        free(p->blocks), free(p->free), free(p);
        return NULL;
    }
    return p;
}

static void destroy_pool(kvlab_cache_pool* p) {
    if (!p) return;
    for (int32_t b = 0; b < p->n_blocks; b++) free(p->blocks[b].tokens);
    free(p->blocks), free(p->free), free(p);
}

/* FNV-1a over the parent's hash (unless the bug is planted) and the block's tokens. */
static uint64_t block_hash(uint64_t parent, const int32_t* tokens, int32_t n) {
    uint64_t h = 1469598103934665603ull;
#ifndef BLOCK_MANAGER_UNCHAINED
    for (int i = 0; i < 8; i++) h = (h ^ ((parent >> (8 * i)) & 0xff)) * 1099511628211ull;
#else
    (void)parent;
#endif
    for (int32_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) h = (h ^ (((uint32_t)tokens[i] >> (8 * k)) & 0xff)) * 1099511628211ull;
    return h;
}

static void take_from_queue(kvlab_cache_pool* p, int32_t b) {
    for (int32_t i = 0; i < p->n_free; i++)
        if (p->free[i] == b) {
            memmove(p->free + i, p->free + i + 1, (size_t)(p->n_free - i - 1) * sizeof *p->free);
            p->n_free--;
            return;
        }
}

/* A block for a table: the oldest freed, unpublished (its rows are about to be overwritten). */
static int32_t allocate(kvlab_cache_pool* p) {
    const int32_t b = p->free[0];
    take_from_queue(p, b);
    p->blocks[b].refs = 1;
    p->blocks[b].published = 0;
    return b;
}

static void let_go(kvlab_cache_pool* p, int32_t b) {
    if (--p->blocks[b].refs == 0) p->free[p->n_free++] = b;
}

static kvlab_cache* create(kvlab_cache_pool* pool, char* err, size_t err_len) {
    kvlab_cache* c = calloc(1, sizeof *c);
    if (c) {
        c->table = calloc((size_t)(pool->max_seq / pool->block_size + 1), sizeof *c->table);
        c->tokens = calloc((size_t)pool->max_seq, sizeof *c->tokens);
    }
    if (!c || !c->table || !c->tokens) {
        if (c) free(c->table), free(c->tokens), free(c);
        snprintf(err, err_len, "block_manager: out of memory");
        return NULL;
    }
    c->pool = pool;
    return c;
}

/* The published block of the full logical block b of `tokens` after a parent hash, or -1. */
static int32_t lookup(const kvlab_cache_pool* p, uint64_t h, const int32_t* tokens) {
    for (int32_t b = 0; b < p->n_blocks; b++) {
        const block* k = &p->blocks[b];
        if (k->published && k->hash == h && memcmp(k->tokens, tokens, (size_t)p->block_size * sizeof *tokens) == 0)
            return b;
    }
    return -1;
}

static int32_t attach_prefix(kvlab_cache* c, const int32_t* tokens, int32_t n) {
    kvlab_cache_pool* p = c->pool;
    const int32_t bs = p->block_size;
    uint64_t parent = 0;
    int32_t hit = 0;
    while (hit + bs <= n - 1) { /* the last token always runs */
        const uint64_t h = block_hash(parent, tokens + hit, bs);
        const int32_t b = lookup(p, h, tokens + hit);
        if (b < 0) break;
        if (p->blocks[b].refs++ == 0) take_from_queue(p, b);
        c->table[hit / bs] = b;
        parent = h, hit += bs;
    }
    memcpy(c->tokens, tokens, (size_t)hit * sizeof *tokens);
    c->length = hit;
    c->full = hit / bs;
    return hit;
}

#ifndef BLOCK_MANAGER_WHOLE
static kvlab_cache* fork_sequence(kvlab_cache* parent, char* err, size_t err_len) {
    kvlab_cache* c = create(parent->pool, err, err_len);
    if (!c) return NULL;
    const int32_t bs = parent->pool->block_size, n_blocks = (parent->length + bs - 1) / bs;
    c->length = parent->length;
    c->full = parent->full;
    memcpy(c->table, parent->table, (size_t)n_blocks * sizeof *c->table);
    memcpy(c->tokens, parent->tokens, (size_t)parent->length * sizeof *c->tokens);
    for (int32_t b = 0; b < n_blocks; b++) parent->pool->blocks[c->table[b]].refs++;
    return c;
}
#endif

/* Blocks a reserve of n positions after `length` needs: new ones, and a copy of the last if shared. */
static int32_t blocks_needed(const kvlab_cache* c, int32_t length, int32_t n) {
    const int32_t bs = c->pool->block_size, have = (length + bs - 1) / bs, want = (length + n + bs - 1) / bs;
    const block* last = length % bs ? &c->pool->blocks[c->table[have - 1]] : NULL;
    return want - have + (last && (last->refs > 1 || last->published) ? 1 : 0);
}

static int reserve(kvlab_cache* c, int32_t length, int32_t n, const int32_t* tokens, kvlab_slot_copy* copies,
                   int32_t max_copies, int32_t* n_copies, char* err, size_t err_len) {
    kvlab_cache_pool* p = c->pool;
    const int32_t bs = p->block_size;
    if (length != c->length || n < 1 || length + n > p->max_seq || blocks_needed(c, length, n) > p->n_free ||
        max_copies < 1) {
        snprintf(err, err_len, "block_manager: no room for %d positions after %d (%d blocks free)", n, length,
                 p->n_free);
        return 1;
    }
    if (length % bs) { /* the last block is partly filled: the new rows go into it */
        const int32_t b = c->table[length / bs];
        const block* k = &p->blocks[b];
#ifdef BLOCK_MANAGER_NO_COW
        const int copy = k->published; /* the planted bug: a fork's shared block is written in place */
#else
        const int copy = k->refs > 1 || k->published;
#endif
        if (copy) {
            const int32_t to = allocate(p);
            copies[0] = (kvlab_slot_copy){(int64_t)b * bs, (int64_t)to * bs, length % bs};
            *n_copies = 1;
            let_go(p, b);
            c->table[length / bs] = to;
        }
    }
    for (int32_t pos = length; pos < length + n; pos++) {
        if (pos % bs == 0) c->table[pos / bs] = allocate(p);
        c->tokens[pos] = tokens[pos - length];
    }
    c->length = length + n;
    return 0;
}

#ifdef BLOCK_MANAGER_DEDUP
/* A published block other than `own` holding the same rows as `own` will (hash h of these tokens
 * after the same prefix), or -1. */
static int32_t duplicate_of(const kvlab_cache_pool* p, int32_t own, uint64_t h, const int32_t* tokens) {
    for (int32_t b = 0; b < p->n_blocks; b++) {
        const block* k = &p->blocks[b];
#ifdef BLOCK_MANAGER_DEDUP_TOKENS
        (void)h; /* the planted bug: same tokens, whatever came before them */
        const int same = k->published;
#else
        const int same = k->published && k->hash == h;
#endif
        if (b != own && same && memcmp(k->tokens, tokens, (size_t)p->block_size * sizeof *tokens) == 0) return b;
    }
    return -1;
}
#endif

/* The forward pass wrote the latest rows: each block they filled is published under its chained
 * hash (only rows already computed are ever shared), or, deduplicating, moves onto a published
 * block with the same rows. */
static int step_done(kvlab_cache* c, kvlab_slot_move* moves, int32_t max_moves, int32_t* n_moves, char* err,
                     size_t err_len) {
    kvlab_cache_pool* p = c->pool;
    const int32_t bs = p->block_size;
    for (int32_t b = c->full; b < c->length / bs; b++) {
        block* k = &p->blocks[c->table[b]];
        const uint64_t parent = b > 0 ? p->blocks[c->table[b - 1]].hash : 0;
        const uint64_t h = block_hash(parent, c->tokens + b * bs, bs);
#ifdef BLOCK_MANAGER_DEDUP
        const int32_t same = duplicate_of(p, c->table[b], h, c->tokens + b * bs);
        if (same >= 0) {
            if (*n_moves == max_moves) {
                snprintf(err, err_len, "block_manager: more moves than kvlab has room for (%d)", max_moves);
                return 1;
            }
            moves[(*n_moves)++] = (kvlab_slot_move){b * bs, bs, (int64_t)same * bs};
            if (p->blocks[same].refs++ == 0) take_from_queue(p, same);
            let_go(p, c->table[b]);
            c->table[b] = same;
            continue;
        }
#else
        (void)moves, (void)max_moves, (void)n_moves, (void)err, (void)err_len;
#endif
        if (k->published) continue; /* shared from another sequence, already findable */
        k->hash = h;
        memcpy(k->tokens, c->tokens + b * bs, (size_t)bs * sizeof *k->tokens);
        k->published = 1;
    }
    c->full = c->length / bs;
    return 0;
}

static int64_t slot(const kvlab_cache* c, int32_t pos) {
    const int32_t bs = c->pool->block_size;
    return pos >= 0 && pos < c->length ? (int64_t)c->table[pos / bs] * bs + pos % bs : -1;
}

static void release(kvlab_cache* c, int32_t n) {
    const int32_t bs = c->pool->block_size;
    if (n >= c->length) return;
    for (int32_t b = (n + bs - 1) / bs; b < (c->length + bs - 1) / bs; b++) let_go(c->pool, c->table[b]);
    c->length = n;
    if (c->full > n / bs) c->full = n / bs;
}

static int64_t memory(const kvlab_cache_pool* p) {
    return (int64_t)sizeof *p + (int64_t)p->n_blocks * (int64_t)(sizeof(block) + sizeof(int32_t) * (1 + p->block_size));
}

static void destroy(kvlab_cache* c) {
    if (!c) return;
    release(c, 0);
    free(c->table), free(c->tokens), free(c);
}

#ifdef BLOCK_MANAGER_WHOLE
static const int32_t block_sizes[] = {16};
#endif

/* attended is NULL: a query attends all of 0..pos */
static const kvlab_cache_plugin table = {.abi_version = KVLAB_CACHE_PLUGIN_ABI_VERSION,
                                         .name = BLOCK_MANAGER_NAME,
                                         .create_pool = create_pool,
                                         .destroy_pool = destroy_pool,
                                         .create = create,
                                         .attach_prefix = attach_prefix,
#ifdef BLOCK_MANAGER_WHOLE
                                         .fork = NULL,
                                         .release = NULL,
                                         .block_sizes = block_sizes,
                                         .n_block_sizes = 1,
                                         .max_sequences = 32,
#else
                                         .fork = fork_sequence,
                                         .release = release,
#endif
                                         .reserve = reserve,
                                         .slot = slot,
                                         .memory = memory,
                                         .destroy = destroy,
                                         .step_done = step_done};

const kvlab_cache_plugin* kvlab_cache_plugin_v3(void) { return &table; }
