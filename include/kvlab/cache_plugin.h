/* kvlab's cache plugin ABI: a KV cache's bookkeeping, written in any language with a C ABI, that
 * kvlab checks for exactness (kvlab verify --plugin libmycache.so).
 *
 * A pool has n_slots physical slots, shared by a family of sequences (a batch, a request and its
 * forks, requests reusing a prefix). A sequence maps its logical positions 0, 1, ... onto slots.
 * kvlab owns the memory: for every layer and KV head it keeps n_slots rows of head_size floats,
 * writes position pos's K and V rows to the slot the plugin names, and reads them back from the
 * slots the plugin names when a query attends. The plugin owns only the mapping: which slot a
 * position lives in, which slots two sequences share, when a shared slot must be copied before a
 * write, what a rollback frees, which rows a new request may reuse. kvlab checks every answer
 * against the rows it wrote: a slot that another sequence still holds, a slot that moved without
 * a copy, or a reused slot whose rows belong to another prefix fails the check, naming the call;
 * so does cached decode that differs from naive decode by a single bit.
 *
 * C99, no C++ types: a plugin is a shared library exporting one function,
 *     const kvlab_cache_plugin *kvlab_cache_plugin_v3(void);
 * returning a table that lives as long as the library. Every call is made from one thread.
 * Errors: a function that can refuse returns non-zero (or NULL) and writes a one-line message
 * into err[0..err_len-1] (NUL-terminated; kvlab passes err_len >= 256).
 *
 * A plugin declares what it does by what its table holds: a NULL optional function is a call it
 * does not make or answer (no fork, no prefix reuse, no partial release), and kvlab then draws no
 * operation that needs it, says so in its report, and checks everything else. Version 3 adds the
 * block sizes and sequence count a pool accepts, a call after each forward pass (step_done: where
 * engines publish prefix blocks, and may move positions onto identical rows), and lets release
 * be NULL (a block manager that frees sequences only whole).
 *
 * Versions 1 (one sequence per cache, no pool, no fork, no copies) and 2 are still read: a plugin
 * written for one defines KVLAB_CACHE_PLUGIN_V1 or KVLAB_CACHE_PLUGIN_V2 before including this
 * header and exports kvlab_cache_plugin_v1 or kvlab_cache_plugin_v2 instead.
 */
#ifndef KVLAB_CACHE_PLUGIN_H
#define KVLAB_CACHE_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a pool is created for. Version 1 reads the first five fields only. */
typedef struct kvlab_cache_config {
    int32_t max_seq;  /* the most positions one sequence may hold */
    int32_t n_slots;  /* physical rows kvlab keeps per layer and KV head: slots are 0..n_slots-1 */
    int32_t n_layers; /* the model's shape, for a plugin that wants it (the mapping is per sequence) */
    int32_t n_kv_heads;
    int32_t head_size;
    /* Version 2: the most sequences the pool holds at once (created or forked, not yet destroyed).
     * n_slots may be less than every sequence could hold: kvlab drives pools until a reserve is
     * refused, then frees and reuses. A refusal is accepted only when the pool is full: fewer
     * blocks wholly free (block_size slots from a multiple of block_size, none of them held by a
     * sequence; a prefix cache's unheld blocks count as free) than n / block_size rounded up,
     * plus one for a copy of a shared last block. A reserve refused with more room fails the
     * check, naming the room. */
    int32_t max_sequences;
    /* A block size for a plugin that maps positions in blocks (one of the table's block_sizes,
     * or 1..64 when it lists none; n_slots is a multiple of it). kvlab draws it, so a block-based
     * plugin's checks meet every block geometry it accepts; a plugin may ignore it. */
    int32_t block_size;
} kvlab_cache_config;

typedef struct kvlab_cache_pool kvlab_cache_pool; /* the plugin's pool: kvlab never looks inside */
typedef struct kvlab_cache kvlab_cache;           /* the plugin's sequence */

/* Copy-on-write: kvlab copies the rows of slots from..from+count-1 onto to..to+count-1, for every
 * layer and KV head, before it writes the step's rows. The runs must not overlap, and no slot
 * of the destination may be held by any sequence. */
typedef struct kvlab_slot_copy {
    int64_t from, to;
    int32_t count;
} kvlab_slot_copy;

/* Deduplication (step_done): positions pos..pos+count-1 of a sequence now live in slots
 * slot..slot+count-1, which hold rows computed for exactly the same tokens at the same positions
 * (another sequence's, or a prefix cache's); the sequence no longer holds its old slots. */
typedef struct kvlab_slot_move {
    int32_t pos, count;
    int64_t slot;
} kvlab_slot_move;

/* Versions 2 and 3: version 3 appends fields to version 2's, so a version 2 table is this one's
 * first part, through destroy (kvlab reads no further; release is required in version 2). */
typedef struct kvlab_cache_plugin_abi3 {
    /* 3 (or 2): kvlab refuses a table of a version it does not read. */
    uint32_t abi_version;
    /* A short name for reports ("ring", "my_block_manager"). */
    const char* name;
    /* A pool for `config`, or NULL with a message in err. */
    kvlab_cache_pool* (*create_pool)(const kvlab_cache_config* config, char* err, size_t err_len);
    /* Called after every sequence of the pool is destroyed. */
    void (*destroy_pool)(kvlab_cache_pool* pool);
    /* An empty sequence in `pool`, or NULL with a message in err. */
    kvlab_cache* (*create)(kvlab_cache_pool* pool, char* err, size_t err_len);
    /* Optional (NULL: no prefix reuse). An empty sequence is about to run tokens[0..n-1] (n >= 1):
     * map the longest prefix whose rows the pool already holds (computed for exactly these tokens
     * at these positions) and return its length, 0..n-1 (the last token always runs, for its
     * logits). slot() then answers for those positions. */
    int32_t (*attach_prefix)(kvlab_cache* cache, const int32_t* tokens, int32_t n);
    /* Optional (NULL: no fork). A new sequence holding every position of `parent` in the
     * parent's slots (parallel samples, beams), or NULL with a message. A later write into a
     * slot that both still map must first copy (reserve's copies). */
    kvlab_cache* (*fork)(kvlab_cache* parent, char* err, size_t err_len);
    /* Room for positions length..length+n-1 (length: the positions held now; n >= 1), whose tokens
     * are tokens[0..n-1]: 0, and slot() answers for them from now on; or non-zero with a message,
     * and nothing changed. copies[0..max_copies-1] receives the copies kvlab must make first, and
     * *n_copies their number (kvlab sets it to 0 before the call). A held position's slot may
     * change only through such a copy. */
    int (*reserve)(kvlab_cache* cache, int32_t length, int32_t n, const int32_t* tokens, kvlab_slot_copy* copies,
                   int32_t max_copies, int32_t* n_copies, char* err, size_t err_len);
    /* The slot of position pos (0 <= pos < the positions held), in 0..n_slots-1. */
    int64_t (*slot)(const kvlab_cache* cache, int32_t pos);
    /* Optional (NULL: all of 0..pos). The positions a query at pos attends, increasing, into
     * positions[0..max_positions-1]; returns how many. An exact cache attends all of 0..pos, and
     * kvlab verify reports a cache that drops one (a window, an eviction) at the first it drops. */
    int32_t (*attended)(const kvlab_cache* cache, int32_t pos, int32_t* positions, int32_t max_positions);
    /* Rollback: forget positions n and later (0 <= n <= the positions held). Optional in
     * version 3 (NULL: sequences are freed only whole, by destroy, as a block manager without
     * partial release frees them): kvlab then draws no rollback or speculative decoding, and
     * preempts instead (the sequence is destroyed and its tokens run again as a new request,
     * as an engine recomputes a preempted request). */
    void (*release)(kvlab_cache* cache, int32_t n);
    /* Bytes of the pool's bookkeeping (tables, counts, hashes), its sequences' included. */
    int64_t (*memory)(const kvlab_cache_pool* pool);
    /* The sequence is done: its slots go back to its pool. */
    void (*destroy)(kvlab_cache* cache);

    /* ---- Version 3 ---- */
    /* The block sizes a pool accepts, n_block_sizes of them, each in 1..1024; kvlab draws
     * config->block_size from them. NULL (n_block_sizes 0): any of 1..64. */
    const int32_t* block_sizes;
    int32_t n_block_sizes;
    /* The most sequences a pool holds at once; 0: as many as kvlab draws (up to 64). */
    int32_t max_sequences;
    /* Optional (NULL: none). The forward pass that wrote the rows of the sequence's latest
     * reserve has finished (a request's chunks all written, or a step's row): where an engine
     * publishes the blocks those rows completed, so that only rows already computed are ever
     * shared. It may also deduplicate: moves[0..max_moves-1] receives runs of positions that now
     * live in other slots holding identical rows (kvlab checks its books: rows computed for the
     * same tokens at the same positions, else the case fails naming the move), and *n_moves
     * their number (kvlab sets it to 0 first). 0, or non-zero with a message (a bug: the step
     * already succeeded). */
    int (*step_done)(kvlab_cache* cache, kvlab_slot_move* moves, int32_t max_moves, int32_t* n_moves, char* err,
                     size_t err_len);
} kvlab_cache_plugin_abi3;


/* Version 1: each cache is one sequence with slots 0..n_slots-1 to itself. */
typedef struct kvlab_cache_plugin_abi1 {
    uint32_t abi_version; /* 1 */
    const char* name;
    kvlab_cache* (*create)(const kvlab_cache_config* config, char* err, size_t err_len);
    int (*reserve)(kvlab_cache* cache, int32_t length, int32_t n, char* err, size_t err_len);
    int64_t (*slot)(const kvlab_cache* cache, int32_t pos);
    void (*release)(kvlab_cache* cache, int32_t n);
    int64_t (*memory)(const kvlab_cache* cache);
    void (*destroy)(kvlab_cache* cache);
} kvlab_cache_plugin_abi1;

/* The symbols kvlab looks up, newest first. */
#define KVLAB_CACHE_PLUGIN_SYMBOL_V3 "kvlab_cache_plugin_v3"
#define KVLAB_CACHE_PLUGIN_SYMBOL_V2 "kvlab_cache_plugin_v2"
#define KVLAB_CACHE_PLUGIN_SYMBOL_V1 "kvlab_cache_plugin_v1"

#if defined(KVLAB_CACHE_PLUGIN_V1)
typedef kvlab_cache_plugin_abi1 kvlab_cache_plugin;
#define KVLAB_CACHE_PLUGIN_ABI_VERSION 1
#elif defined(KVLAB_CACHE_PLUGIN_V2)
typedef kvlab_cache_plugin_abi3 kvlab_cache_plugin; /* its fields through destroy */
#define KVLAB_CACHE_PLUGIN_ABI_VERSION 2
#else
typedef kvlab_cache_plugin_abi3 kvlab_cache_plugin;
#define KVLAB_CACHE_PLUGIN_ABI_VERSION 3
#endif

#ifdef __cplusplus
}
#endif

#endif /* KVLAB_CACHE_PLUGIN_H */
