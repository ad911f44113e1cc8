/* Cache plugins that misbehave, one way per build (HOSTILE_CRASH, HOSTILE_RANGE, HOSTILE_REFUSE,
 * HOSTILE_HANG): kvlab verify --plugin must give each a one-line verdict and never crash itself.
 * Otherwise slot = position, which is exact while the slots last. Written for ABI version 1, so
 * that kvlab's reading of version 1 stays tested. */
#define KVLAB_CACHE_PLUGIN_V1
#include <stdio.h>
#include <stdlib.h>

#include "kvlab/cache_plugin.h"

struct kvlab_cache {
    int32_t n_slots, length;
};

static kvlab_cache* create(const kvlab_cache_config* config, char* err, size_t err_len) {
    (void)err, (void)err_len;
    kvlab_cache* c = calloc(1, sizeof *c);
    if (c) c->n_slots = config->n_slots;
    return c;
}

static int reserve(kvlab_cache* c, int32_t length, int32_t n, char* err, size_t err_len) {
#ifdef HOSTILE_REFUSE
    (void)c;
    snprintf(err, err_len, "no room for %d positions after %d, ever", n, length);
    return 1;
#else
    if (length + n > c->n_slots) {
        snprintf(err, err_len, "no room");
        return 1;
    }
    c->length = length + n;
    return 0;
#endif
}

static int64_t slot(const kvlab_cache* c, int32_t pos) {
#ifdef HOSTILE_CRASH
    if (pos >= 3) return *(volatile int64_t*)(size_t)(pos - 3); /* a read through a null pointer */
#endif
#ifdef HOSTILE_RANGE
    if (pos >= 2) return c->n_slots + pos; /* past the last slot */
#endif
#ifdef HOSTILE_HANG
    if (pos >= 2)
        for (volatile int spin = 1; spin;) {
        }
#endif
    return pos < c->length ? pos : -1;
}

static void release(kvlab_cache* c, int32_t n) {
    if (n < c->length) c->length = n;
}

static int64_t memory(const kvlab_cache* c) { return (int64_t)sizeof *c; }

static void destroy(kvlab_cache* c) { free(c); }

static const kvlab_cache_plugin table = {
    KVLAB_CACHE_PLUGIN_ABI_VERSION, "hostile", create, reserve, slot, release, memory, destroy};

const kvlab_cache_plugin* kvlab_cache_plugin_v1(void) { return &table; }
