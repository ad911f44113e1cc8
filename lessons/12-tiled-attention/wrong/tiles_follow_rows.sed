# expect: differ
# A prefill kernel with wider key tiles than the decode kernel's (as engines pick tiles from the
# number of query rows): a row prefilled gets other bits than the same row decoded.
s|    (void)rows;  // the tiles are fixed in key-index space|    if (rows > 1) tile = 2 * tile;  // the mistake: wider tiles for a prefill|
