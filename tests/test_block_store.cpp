// The prefix tier below the pool (core/block_store.h): records that name what produced their
// rows; host memory, directory and Redis stores; a fresh pool (a later process) restoring a
// prefix bitwise equal to a cold prefill; and every kind of bad record (corrupt, truncated,
// another model's or format's, another block's, gone) refused and recomputed, never used.
// `kvlab verify store` (tests/test_verify.cpp) runs the same claim over drawn models and
// workloads, with its planted store-unchecked.
#include <rapidcheck/catch.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "block_store.h"
#include "cli_util.h"
#include "cpu_backend.h"
#include "hostile_store.h"
#include "model.h"
#include "scheduler.h"
#include "speculative.h"

using namespace kvlab;

namespace {

// dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq
const Config kConfig{16, 24, 2, 4, 2, 32, 40};

// Requests that share a base prompt (a system prompt), each with its own suffix and output.
std::vector<ServeRequest> shared_prefix_workload(std::uint64_t seed, int n_requests, int base_len) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> token(0, kConfig.vocab_size - 1), len(1, 6);
    std::vector<int> base(static_cast<std::size_t>(base_len));
    for (int& t : base) t = token(rng);
    std::vector<ServeRequest> out;
    for (int i = 0; i < n_requests; i++) {
        ServeRequest r{base, len(rng), i};
        for (int k = len(rng); k > 0; k--) r.prompt.push_back(token(rng));
        out.push_back(std::move(r));
    }
    return out;
}

struct Served {
    std::vector<std::vector<float>> logits;  // [requests] each [max_new_tokens, vocab_size]
    BlockPool::StoreStats stats;
    int store_hit = 0;  // positions restored from the store, over every request
};

// Serves the requests on a fresh pool (as a fresh process would) over `store`; the pool's blocks go
// into the store at the end.
Served serve(const Model& m, KVFormat format, BlockStore* store, const std::vector<ServeRequest>& requests,
             int block_size, int n_blocks) {
    CpuBackend backend(m);
    SchedulerConfig sc;
    sc.block_size = block_size, sc.n_blocks = n_blocks, sc.max_batch_tokens = 16;
    sc.kv_format = format, sc.store = store;
    Scheduler s(backend, m, sc);
    for (const ServeRequest& r : requests) s.add(r);
    while (s.step()) RC_ASSERT(s.steps() < 10000);
    s.pool().flush_to_store();
    Served out;
    for (std::size_t i = 0; i < requests.size(); i++) {
        out.logits.push_back(s.result(int(i)).logits);
        out.store_hit += s.result(int(i)).store_hit;
    }
    out.stats = s.pool().store_stats();
    return out;
}

// Each request decoded alone, cold, on a contiguous cache in the format.
std::vector<std::vector<float>> alone(const Model& m, KVFormat format, const std::vector<ServeRequest>& requests) {
    CachedDecoder decoder(m);
    decoder.cache().set_kv_format(format);
    std::vector<std::vector<float>> out;
    for (const ServeRequest& r : requests) out.push_back(greedy_decode(decoder, r.prompt, r.max_new_tokens).logits);
    return out;
}

// The smallest pool that serves one request of max_seq, and a few blocks more: evictions happen.
int tight_pool(int block_size) { return (kConfig.max_seq + block_size - 1) / block_size + 3; }

KVFormat gen_format() {
    return *rc::gen::elementOf(std::vector<KVFormat>(std::begin(kKVFormats), std::end(kKVFormats)));
}

}  // namespace

TEST_CASE("block records: every single-bit flip, every truncation and every other identity is refused", "[store]") {
    rc::prop("a drawn block's record", [] {
        BlockShape shape;
        shape.block_size = *rc::gen::inRange(1, 5), shape.n_layers = *rc::gen::inRange(1, 3);
        shape.n_kv_heads = *rc::gen::inRange(1, 3), shape.head_size = 2 * *rc::gen::inRange(1, 3);
        shape.row_bytes = *rc::gen::inRange(1, 9), shape.format_id = *rc::gen::arbitrary<std::uint64_t>();
        BlockKey key{*rc::gen::arbitrary<std::uint64_t>(), *rc::gen::arbitrary<std::uint64_t>(),
                     *rc::gen::container<std::vector<int>>(std::size_t(shape.block_size), rc::gen::inRange(0, 512))};
        const auto k = *rc::gen::container<std::vector<std::uint8_t>>(std::size_t(shape.half_bytes()),
                                                                      rc::gen::arbitrary<std::uint8_t>());
        const auto v = *rc::gen::container<std::vector<std::uint8_t>>(std::size_t(shape.half_bytes()),
                                                                      rc::gen::arbitrary<std::uint8_t>());
        const std::vector<std::uint8_t> record = encode_block_record(key, shape, k, v);
        RC_ASSERT(check_block_record(record, key, shape) == "");
        const auto rows = record_rows(record, shape);
        RC_ASSERT(std::equal(k.begin(), k.end(), rows.begin()));
        RC_ASSERT(std::equal(v.begin(), v.end(), rows.begin() + std::ptrdiff_t(k.size())));
        for (std::size_t i = 0; i < record.size(); i++) {
            std::vector<std::uint8_t> bad = record;
            bad[i] ^= std::uint8_t(1u << (i % 8));
            RC_ASSERT(check_block_record(bad, key, shape) != "");
            RC_ASSERT(check_block_record(std::span(record).first(i), key, shape) != "");
        }
        BlockKey other = key;
        other.model++;
        RC_ASSERT(check_block_record(encode_block_record(other, shape, k, v), key, shape) == "other model");
        other = key, other.parent++;
        RC_ASSERT(check_block_record(encode_block_record(other, shape, k, v), key, shape) == "other block");
        other = key, other.tokens.back()++;
        RC_ASSERT(check_block_record(encode_block_record(other, shape, k, v), key, shape) == "other block");
        BlockShape format = shape;
        format.format_id++;
        RC_ASSERT(check_block_record(encode_block_record(key, format, k, v), key, shape) == "other KV format");
    });
}

TEST_CASE("store: a fresh pool over the store restores the prefix and decodes bitwise equal to a cold prefill",
          "[store]") {
    rc::prop("drawn formats, block sizes and workloads, a pool small enough to evict", [] {
        const KVFormat format = gen_format();
        const int bs = *rc::gen::inRange(2, 6);
        const Model m = random_model(kConfig, *rc::gen::inRange<std::uint64_t>(0, 1000));
        const auto requests = shared_prefix_workload(*rc::gen::arbitrary<std::uint64_t>(), 5, *rc::gen::inRange(8, 20));
        RC_TAG(kv_format_name(format));
        HostStore store;
        const auto want = alone(m, format, requests);
        const Served first = serve(m, format, &store, requests, bs, tight_pool(bs));
        RC_ASSERT(first.logits == want);
        RC_ASSERT(store.size() > 0);
        const Served second = serve(m, format, &store, requests, bs, tight_pool(bs));
        RC_ASSERT(second.logits == want);
        RC_ASSERT(second.stats.fetched > 0);  // the first request's base blocks, at least
        // Hits counted at each request's last admission: fetched blocks an admission gave back (no room
        // for a row) are pool hits when it comes again.
        RC_ASSERT(second.store_hit > 0);
        RC_ASSERT(second.store_hit <= second.stats.fetched * bs);
        RC_ASSERT(second.stats.n_rejected() == 0);
        // Another format's pool finds none of them (the key names the format): it fetches only
        // what it put there itself, as it would over an empty store.
        const KVFormat other = format == KVFormat::fp32 ? KVFormat::bf16 : KVFormat::fp32;
        const Served third = serve(m, other, &store, requests, bs, tight_pool(bs));
        HostStore empty;
        RC_ASSERT(third.logits == alone(m, other, requests));
        RC_ASSERT(third.stats.fetched == serve(m, other, &empty, requests, bs, tight_pool(bs)).stats.fetched);
        RC_ASSERT(third.stats.n_rejected() == 0);
    });
}

TEST_CASE("store: corrupt, truncated, other-model, other-format, other-block and gone records are recomputed",
          "[store]") {
    rc::prop("each damage, drawn formats and workloads", [] {
        const auto damage = *rc::gen::element(StoreDamage::flip, StoreDamage::flip_rows, StoreDamage::truncate,
                                              StoreDamage::other_model, StoreDamage::other_format,
                                              StoreDamage::other_block, StoreDamage::swapped, StoreDamage::gone);
        RC_TAG(std::string(to_string(damage)));
        const KVFormat format = gen_format();
        const int bs = *rc::gen::inRange(2, 6);
        const Model m = random_model(kConfig, *rc::gen::inRange<std::uint64_t>(0, 1000));
        const auto requests = shared_prefix_workload(*rc::gen::arbitrary<std::uint64_t>(), 4, *rc::gen::inRange(8, 20));
        HostileStore store(damage, 1.0, *rc::gen::arbitrary<std::uint64_t>());
        serve(m, format, &store, requests, bs, tight_pool(bs));
        const std::size_t stored = store.inner.size();
        const std::int64_t damaged = store.damaged(), clean = store.clean();  // the first pass's
        const Served second = serve(m, format, &store, requests, bs, tight_pool(bs));
        RC_ASSERT(second.logits == alone(m, format, requests));
        // Only whole records are used (`swapped` hands one out when it has no other key to give).
        RC_ASSERT(second.stats.fetched == store.clean() - clean);
        RC_ASSERT(store.damaged() > damaged);
        if (damage == StoreDamage::gone) {
            RC_ASSERT(second.stats.missed >= store.damaged() - damaged);
            RC_ASSERT(second.stats.n_rejected() == 0);
            return;
        }
        RC_ASSERT(second.stats.n_rejected() == store.damaged() - damaged);
        const std::map<StoreDamage, std::vector<std::string>> reasons{
            {StoreDamage::flip_rows, {"corrupt"}},
            {StoreDamage::truncate, {"truncated", "not a block record"}},
            {StoreDamage::other_model, {"other model"}},
            {StoreDamage::other_format, {"other KV format"}},
            {StoreDamage::other_block, {"other block"}}};
        if (const auto it = reasons.find(damage); it != reasons.end())
            for (const auto& [why, count] : second.stats.rejected)
                RC_ASSERT(std::find(it->second.begin(), it->second.end(), why) != it->second.end());
        // A refused record is erased: the recomputed block took its place at the end.
        RC_ASSERT(store.inner.size() >= stored);
    });
}

TEST_CASE("store: a directory outlives its store object, and damaged files on disk are refused", "[store]") {
    const Model m = random_model(kConfig, 11);
    const auto requests = shared_prefix_workload(5, 5, 17);
    const fs::path dir = scratch() / "blocks";
    for (const KVFormat format : {KVFormat::fp32, KVFormat::fp8_e4m3, KVFormat::int4}) {
        INFO(kv_format_name(format));
        fs::remove_all(dir);
        const auto want = alone(m, format, requests);
        {
            DirStore store(dir.string());
            CHECK(serve(m, format, &store, requests, 4, tight_pool(4)).logits == want);
        }
        DirStore restarted(dir.string());  // as a later process opens it
        const Served second = serve(m, format, &restarted, requests, 4, tight_pool(4));
        CHECK(second.logits == want);
        CHECK(second.stats.fetched > 0);
        // Truncate one file and flip a byte of every other: all refused, all recomputed.
        int n = 0;
        for (const auto& f : fs::directory_iterator(dir)) {
            if (n++ == 0) {
                fs::resize_file(f.path(), fs::file_size(f.path()) / 2);
                continue;
            }
            std::string bytes = slurp(f.path());
            bytes[bytes.size() / 2] ^= 0x10;
            std::ofstream(f.path(), std::ios::binary | std::ios::trunc) << bytes;
        }
        const Served third = serve(m, format, &restarted, requests, 4, tight_pool(4));
        CHECK(third.logits == want);
        CHECK(third.stats.fetched == 0);
        CHECK(third.stats.n_rejected() > 0);
        for (const auto& [why, count] : third.stats.rejected) CHECK((why == "corrupt" || why == "truncated"));
    }
    fs::create_directories(scratch() / "file_parent");
    std::ofstream(scratch() / "file_parent" / "x") << "not a folder";
    CHECK_THROWS_WITH(DirStore((scratch() / "file_parent" / "x").string()), Catch::Contains("not a directory"));
    CHECK_THROWS_WITH(open_block_store("memcached:1"), Catch::Contains("host[:SIZE], dir:PATH"));
    CHECK_THROWS_WITH(open_block_store("host:12XB"), Catch::Contains("--store host"));
}

namespace {

// A redis-server of the test's own on a Unix socket in the scratch folder, no persistence: stopped
// (SIGTERM) when destroyed. Absent redis-server or hiredis: the test is skipped (exit 77 under ctest).
class RedisServer {
public:
    explicit RedisServer(std::vector<std::string> extra = {}) : extra_(std::move(extra)) { start(); }
    ~RedisServer() { stop(); }
    std::string spec() const { return "redis:unix:" + socket_.string(); }
    static bool available() { return have_redis() && std::system("command -v redis-server >/dev/null 2>&1") == 0; }
    void start() {
        std::vector<std::string> args{"redis-server", "--port", "0", "--unixsocket", socket_.string(), "--save", "",
                                      "--appendonly", "no"};
        args.insert(args.end(), extra_.begin(), extra_.end());
        pid_ = ::fork();
        if (pid_ == 0) {
            std::vector<char*> argv;
            for (std::string& a : args) argv.push_back(a.data());
            argv.push_back(nullptr);
            // Its output is not ours: stdout and stderr to /dev/null, so no pipe of ours stays open.
            std::freopen("/dev/null", "w", stdout);
            std::freopen("/dev/null", "w", stderr);
            ::execvp("redis-server", argv.data());
            std::_Exit(127);
        }
        for (int i = 0; i < 200; i++) {  // up to 10 s for the socket to answer
            try {
                open_block_store(spec());
                return;
            } catch (const Error&) {
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }
        }
        FAIL("redis-server did not start on " << socket_);
    }
    void stop() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGTERM);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
        std::error_code ec;
        fs::remove(socket_, ec);
    }

private:
    std::vector<std::string> extra_;
    fs::path socket_ = scratch() / "redis.sock";
    pid_t pid_ = -1;
};

#define KVLAB_REDIS_OR_SKIP()                                                                         \
    if (!RedisServer::available()) {                                                                  \
        std::printf("SKIPPED: needs redis-server and a kvlab built with hiredis (libhiredis-dev)\n"); \
        if (Catch::getCurrentContext().getConfig()->hasTestFilters()) std::exit(77);                  \
        return;                                                                                       \
    }

}  // namespace

TEST_CASE("store: Redis keeps blocks for a later pool, and a restarted Redis is a miss, never a wrong block",
          "[store][redis]") {
    KVLAB_REDIS_OR_SKIP();
    const Model m = random_model(kConfig, 13);
    const auto requests = shared_prefix_workload(7, 6, 15);
    RedisServer redis;
    const std::unique_ptr<BlockStore> store = open_block_store(redis.spec());
    for (const KVFormat format : {KVFormat::fp32, KVFormat::bf16, KVFormat::int8}) {
        INFO(kv_format_name(format));
        const auto want = alone(m, format, requests);
        CHECK(serve(m, format, store.get(), requests, 4, tight_pool(4)).logits == want);
        const std::unique_ptr<BlockStore> other_connection = open_block_store(redis.spec());  // a second process
        const Served second = serve(m, format, other_connection.get(), requests, 4, tight_pool(4));
        CHECK(second.logits == want);
        CHECK(second.stats.fetched > 0);
        CHECK(second.stats.n_rejected() == 0);
    }
    // Redis restarts (no persistence): everything is gone, the old connection is dead.
    redis.stop();
    redis.start();
    const auto want = alone(m, KVFormat::fp32, requests);
    const Served after = serve(m, KVFormat::fp32, store.get(), requests, 4, tight_pool(4));
    CHECK(after.logits == want);
    CHECK(after.stats.fetched == 0);
    CHECK(after.stats.missed > 0);
    // The store reconnected: what that pool put is there for the next one.
    const Served again = serve(m, KVFormat::fp32, store.get(), requests, 4, tight_pool(4));
    CHECK(again.logits == want);
    CHECK(again.stats.fetched > 0);
    // Redis down: every call is a miss, counted as an error; decoding goes on exact.
    redis.stop();
    const Served down = serve(m, KVFormat::fp32, store.get(), requests, 4, tight_pool(4));
    CHECK(down.logits == want);
    CHECK(down.stats.fetched == 0);
    CHECK(store->errors() > 0);
    CHECK_THROWS_WITH(open_block_store(redis.spec()), Catch::Contains("cannot connect"));
}

TEST_CASE("store: keys Redis evicts under its memory limit are recomputed, bitwise equal", "[store][redis]") {
    KVLAB_REDIS_OR_SKIP();
    // Records of 2 x 4 x 4 x 16 x 64 bytes: a few dozen fit in the limit, the workload makes hundreds.
    const Config big{64, 96, 4, 4, 4, 64, 96};
    const Model m = random_model(big, 17);
    std::mt19937_64 rng(3);
    std::vector<ServeRequest> requests;
    for (int i = 0; i < 24; i++) {
        ServeRequest r{{}, 2, i};
        for (int k = 0; k < 80; k++) r.prompt.push_back(int(rng() % 64));
        requests.push_back(std::move(r));
    }
    RedisServer redis({"--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru"});
    const std::unique_ptr<BlockStore> store = open_block_store(redis.spec());
    const auto want = alone(m, KVFormat::fp32, requests);
    CpuBackend backend(m);
    const auto run = [&] {
        SchedulerConfig sc;
        sc.block_size = 16, sc.n_blocks = 12, sc.store = store.get();
        Scheduler s(backend, m, sc);
        for (const ServeRequest& r : requests) s.add(r);
        while (s.step()) REQUIRE(s.steps() < 10000);
        for (std::size_t i = 0; i < requests.size(); i++) CHECK(s.result(int(i)).logits == want[i]);
        return s.pool().store_stats();
    };
    run();
    const BlockPool::StoreStats second = run();
    CHECK(second.missed > 0);   // evicted by Redis
    CHECK(second.fetched > 0);  // and some still there
    CHECK(second.n_rejected() == 0);
}

TEST_CASE("kvlab serve-sim --store: a second process, and disaggregated prefill, bitwise equal to one process",
          "[store][cli]") {
    const std::string knobs = "--requests 60 --json --block-size 8 ";
    const Run one = run_kvlab("serve-sim " + knobs);
    REQUIRE(one.exit_code == 0);
    const auto base = nlohmann::json::parse(one.out);
    std::vector<std::string> specs{"dir:" + (scratch() / "cli_blocks").string()};
    std::unique_ptr<RedisServer> redis;
    if (RedisServer::available()) {
        redis = std::make_unique<RedisServer>();
        specs.push_back(redis->spec());
    }
    for (const std::string& spec : specs) {
        INFO(spec);
        const Run prefill = run_kvlab("serve-sim " + knobs + "--store " + spec + " --role prefill");
        INFO(prefill.err);
        REQUIRE(prefill.exit_code == 0);
        const auto p = nlohmann::json::parse(prefill.out);
        CHECK(p["store"]["flushed_blocks"].get<int>() + p["store"]["offloaded_blocks"].get<int>() > 0);
        const Run decode = run_kvlab("serve-sim " + knobs + "--store " + spec + " --role decode");
        REQUIRE(decode.exit_code == 0);
        const auto d = nlohmann::json::parse(decode.out);
        CHECK(d["store"]["fetched_blocks"].get<int>() > 0);
        CHECK(d["store"]["missed"].get<int>() == 0);  // every full prompt block was prefilled
        CHECK(d["check"]["bitwise_equal_alone"] == 60);
        CHECK(d["logits_sha256"] == base["logits_sha256"]);
    }
    const Run text = run_kvlab("serve-sim --requests 20 --store host");
    CHECK(text.exit_code == 0);
    CHECK(text.out.find("store       host memory") != std::string::npos);
    check_refused("serve-sim --role decode", "needs --store");
    check_refused("serve-sim --role split --store host", "both, prefill or decode");
    check_refused("serve-sim --store host --prefix-caching off", "--prefix-caching on");
    check_refused("serve-sim --store memcached:1", "redis:unix:PATH");
    check_refused("serve-sim --store redis:unix:" + (scratch() / "no.sock").string(), "cannot connect");
    check_refused("serve-sim --store redis:localhost:99999", "port in 1..65535");
}

TEST_CASE("host store: least recently used records go first, and a copy is a store of its own", "[store]") {
    HostStore store(300);
    const std::vector<std::uint8_t> a(100, 1), b(100, 2), c(100, 3), d(250, 4);
    CHECK(store.put("a", a));
    CHECK(store.put("b", b));
    CHECK(store.put("c", c));
    CHECK(store.get("a") == a);  // a is now the most recent: b goes first
    CHECK(store.put("d1", std::vector<std::uint8_t>(100, 5)));
    CHECK(!store.contains("b"));
    CHECK(store.contains("a"));
    CHECK(store.bytes() == 300);
    HostStore copy = store;
    copy.erase("a");
    CHECK(store.get("a") == a);  // the original keeps it
    CHECK(copy.put("d", d));     // 250 bytes: everything else in the copy goes
    CHECK(copy.size() == 1);
    CHECK(store.size() == 3);
    CHECK(!store.put("huge", std::vector<std::uint8_t>(301, 0)));  // more than the whole store: refused
    store = copy;
    CHECK(store.get("d") == d);
    CHECK(store.bytes() == 250);
}
