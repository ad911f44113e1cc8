// kvlab proofs: the sequence engine's property (core/sequence_engine.h), over any pool. Any
// interleaving of new requests (with prefix hits), appends, forks, rollbacks, frees and batched
// steps leaves every sequence's logits equal to naive decode of its own tokens, bit for bit; the
// pool's books agree with the block tables after every call; a refused call changes nothing.
// tests/test_sequence_engine.cpp runs it on kvlab's pool (and on planted bugs), lab 8's grader on
// a pool whose BlockManager a student wrote.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "paged.h"
#include "sequence_engine.h"

namespace kvlab::proofs {

// The pool a case runs on: BlockPool's first four constructor arguments.
using EnginePoolMaker =
    std::function<std::unique_ptr<BlockPool>(const Config&, int block_size, int n_blocks, bool prefix_caching)>;

// What passing cases reached: a generator must hit each path it claims to test.
struct EngineCoverage {
    int prefix_hits = 0, forks = 0, steps = 0, rollbacks = 0, frees = 0, refusals = 0;
};

// Everything a refused call must leave as it was: each live sequence's tokens and block table,
// and the pool's counts and reference counts.
std::string engine_state(const SequenceEngine& e);
// After a refused call: fails unless the engine is in the state `before` (engine_state) it was in.
void expect_unchanged(const SequenceEngine& e, const std::string& before, const std::string& what);

// The property (inside a RapidCheck case: it draws, and fails with the calls that led there).
// Prefix caching is drawn (on three times in four) and passed to the pool maker, which may
// ignore it.
void engine_property(const EnginePoolMaker& make_pool, EngineCoverage* coverage = nullptr);

// The books after a call: a block's refcount is the number of live block tables mapping it,
// available() counts every block none maps, and no write went into a block another could read.
// Returns "" when they agree, else what differs.
std::string check_books(const SequenceEngine& e);

}  // namespace kvlab::proofs
