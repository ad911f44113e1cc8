/* kvlab's cache plugin ABI: a KV cache's bookkeeping, written in any language with a C ABI, that
 * kvlab checks for exactness (kvlab verify --plugin libmycache.so).
 *
 * A cache maps one sequence's logical positions 0, 1, ... onto physical slots 0..n_slots-1.
 * kvlab owns the memory: for every layer and KV head it keeps n_slots rows of head_size floats,
 * writes position pos's K and V rows to the slot the plugin names, and reads them back from the
 * slots the plugin names when a query attends. The plugin owns only the mapping: which slot a
 * position lives in, when there is room, what a rollback frees. If two live positions share a
 * slot, or a slot moves after its row was written, the rows read back are not the rows written,
 * and kvlab's check (cached decode == naive decode, bit for bit) fails and names the call.
 *
 * C99, no C++ types: a plugin is a shared library exporting one function,
 *     const kvlab_cache_plugin *kvlab_cache_plugin_v1(void);
 * returning a table that lives as long as the library. Every call is made from one thread.
 * Errors: a function that can refuse returns non-zero and writes a one-line message into
 * err[0..err_len-1] (NUL-terminated; kvlab passes err_len >= 256).
 */
#ifndef KVLAB_CACHE_PLUGIN_H
#define KVLAB_CACHE_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVLAB_CACHE_PLUGIN_ABI_VERSION 1

/* What a cache is created for. */
typedef struct kvlab_cache_config {
    int32_t max_seq;  /* the most positions the sequence may hold */
    int32_t n_slots;  /* physical rows kvlab keeps per layer and KV head: slots are 0..n_slots-1 */
    int32_t n_layers; /* the model's shape, for a plugin that wants it (the mapping is per sequence) */
    int32_t n_kv_heads;
    int32_t head_size;
} kvlab_cache_config;

/* The plugin's own state: kvlab never looks inside. */
typedef struct kvlab_cache kvlab_cache;

typedef struct kvlab_cache_plugin {
    /* KVLAB_CACHE_PLUGIN_ABI_VERSION: kvlab refuses a table of another version. */
    uint32_t abi_version;
    /* A short name for reports ("ring", "my_block_manager"). */
    const char* name;
    /* An empty cache for `config`, or NULL with a message in err. */
    kvlab_cache* (*create)(const kvlab_cache_config* config, char* err, size_t err_len);
    /* Room for positions length..length+n-1 (length: the positions held now; n >= 1): 0, and
     * slot() answers for them from now on; or non-zero with a message, and nothing changed
     * (kvlab then expects the sequence as it was). */
    int (*reserve)(kvlab_cache* cache, int32_t length, int32_t n, char* err, size_t err_len);
    /* The slot of position pos (0 <= pos < the positions held), in 0..n_slots-1. It must not
     * change while pos is held: kvlab wrote pos's rows there. */
    int64_t (*slot)(const kvlab_cache* cache, int32_t pos);
    /* Rollback: forget positions n and later (0 <= n <= the positions held). */
    void (*release)(kvlab_cache* cache, int32_t n);
    /* Bytes of the plugin's own bookkeeping (tables, counts), for reports. */
    int64_t (*memory)(const kvlab_cache* cache);
    void (*destroy)(kvlab_cache* cache);
} kvlab_cache_plugin;

/* The symbol kvlab looks up. */
typedef const kvlab_cache_plugin* (*kvlab_cache_plugin_entry)(void);
#define KVLAB_CACHE_PLUGIN_SYMBOL "kvlab_cache_plugin_v1"

#ifdef __cplusplus
}
#endif

#endif /* KVLAB_CACHE_PLUGIN_H */
