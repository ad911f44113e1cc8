# expect: check the rows you read
# An off-by-one in the slot index: position t reads the rows of slot slots[t + 1], and the last
# position reads past the row's slots.
s|gpu::attention_head(att, q, rows, l, slots, |gpu::attention_head(att, q, rows, l, slots + 1 /* the mistake */, |
