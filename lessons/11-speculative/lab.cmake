kvlab_lab(11 11-speculative WRONG rollback_short)
