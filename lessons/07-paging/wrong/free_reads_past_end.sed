# expect: AddressSanitizer
# Only lessons/grade 7 --sanitize catches this one (its test runs in sanitized builds alone): free()
# checks `block > n_blocks()` instead of `>=`, so free(n_blocks) reads allocated_[n_blocks], one
# past the end. That byte is usually 0, the call is refused as it should be, and every check
# passes; AddressSanitizer stops the check at the read and names this file's line.
s/if (block < 0 || block >= n_blocks() || !allocated_/if (block < 0 || block > n_blocks() || !allocated_/
