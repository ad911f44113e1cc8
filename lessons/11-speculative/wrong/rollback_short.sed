# expect: differ from plain greedy decode
# After a rejection the caches are rolled back one position short, so one rejected draft's K and
# V rows stay in the cache and every later step attends to them (core/mutants.h:
# spec_rollback_short).
s|^    return SpeculativeDecoder(target, draft, k).generate(prompt, steps);|    SpeculativeDecoder d(target, draft, k);\
    d.mutant = Mutant::spec_rollback_short;  // the mistake\
    return d.generate(prompt, steps);|
