kvlab_lab(12 12-tiled-attention WRONG tiles_follow_rows decode_fast_path no_rescale)
