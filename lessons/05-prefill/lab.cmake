kvlab_lab(05 05-prefill WRONG positions_restart drops_last_chunk ignores_chunk)
