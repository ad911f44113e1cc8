# expect: AddressSanitizer
# A memory error for lessons/grade 7 --sanitize (its test runs in sanitized builds alone): free()
# checks `block > n_blocks()` instead of `>=`, so free(n_blocks) reads allocated_[n_blocks], one
# past the end. Unsanitized, the outcome is whatever that byte holds (here malloc's bookkeeping,
# not 0: the bad free is accepted and the allocator check fails without saying why); under the
# sanitizer the check stops at the read, and the report names this file's line.
s/if (block < 0 || block >= n_blocks() || !allocated_/if (block < 0 || block > n_blocks() || !allocated_/
