# expect: no counterexample
# The planted split-K that does not split: it loops over the chunks but carries one running sum
# through them, so every output keeps the textbook order: nothing for the grader to catch, and
# nothing learned about why order matters.
s|^            for (int p = 0; p < parts; p++) {  // what thread p would sum on its own|            float s = 0.0f;  // the mistake: one sum for all chunks, so the chunks change nothing\n&|
/^                float s = 0.0f;$/d
/^            float total = 0.0f;/,/^            for (float s : partial)/d
s|^            y\[std::int64_t(r) \* ldy + o\] = total;|            y[std::int64_t(r) * ldy + o] = s;|
