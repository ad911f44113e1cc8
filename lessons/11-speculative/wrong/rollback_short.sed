# expect: differ from plain greedy decode
# After a rejection the target's cache is rolled back one position short, so one rejected draft's
# K and V rows stay in it and every later step attends to them (proofs/planted.h:
# spec-rollback-short, a cache whose truncate keeps one row too many).
s|^#include "lab.h"|#include "lab.h"\
#include "planted.h"|
s|^    return SpeculativeDecoder(target, draft, k).generate(prompt, steps);|    const std::unique_ptr<Cache> keeps_one = planted_cache(Mutant::spec_rollback_short, target.cache());  // the mistake\
    CachedDecoder short_target(target.backend(), *keeps_one);\
    return SpeculativeDecoder(short_target, draft, k).generate(prompt, steps);|
