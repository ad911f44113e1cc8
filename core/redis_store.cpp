// The Redis store (block_store.h), through hiredis's synchronous client. Built when CMake finds
// hiredis (KVLAB_HAVE_HIREDIS); otherwise opening one is an Error saying so.
#include <fmt/format.h>

#include <memory>

#include "block_store.h"
#include "config.h"

#ifdef KVLAB_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#endif

namespace kvlab {

#ifdef KVLAB_HAVE_HIREDIS

namespace {

// hiredis writes with write(): a Redis that closed the socket raises SIGPIPE, which would end the
// process. Each call blocks it on this thread, and takes away one that it raised.
class NoSigpipe {
public:
    NoSigpipe() {
        sigemptyset(&pipe_);
        sigaddset(&pipe_, SIGPIPE);
        sigset_t pending;
        sigpending(&pending);
        was_pending_ = sigismember(&pending, SIGPIPE) == 1;
        pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    }
    ~NoSigpipe() {
        sigset_t pending;
        sigpending(&pending);
        if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
            const timespec now{0, 0};
            sigtimedwait(&pipe_, nullptr, &now);
        }
        pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    }

private:
    sigset_t pipe_, old_;
    bool was_pending_ = false;
};

// A record store in Redis: SET, GET, EXISTS and DEL on the record's key. A dropped connection
// (Redis restarted) is made again once per call; a call that still fails is a miss.
class RedisStore final : public BlockStore {
public:
    explicit RedisStore(std::string address) : address_(std::move(address)) {
        std::string why;
        if (!connect(why))
            throw Error(fmt::format("store redis:{}: cannot connect ({})", one_line(address_), one_line(why)));
    }
    ~RedisStore() override {
        if (c_) redisFree(c_);
    }
    std::string describe() const override { return "redis " + one_line(address_); }
    bool contains(const std::string& key) override {
        const Reply r = command("EXISTS %b", key, {});
        return r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    }
    bool put(const std::string& key, std::span<const std::uint8_t> record) override {
        const Reply r = command("SET %b %b", key, record);
        return r && r->type == REDIS_REPLY_STATUS;
    }
    std::optional<std::vector<std::uint8_t>> get(const std::string& key) override {
        const Reply r = command("GET %b", key, {});
        if (!r || r->type != REDIS_REPLY_STRING) return std::nullopt;
        const auto* p = reinterpret_cast<const std::uint8_t*>(r->str);
        return std::vector<std::uint8_t>(p, p + r->len);
    }
    void erase(const std::string& key) override { command("DEL %b", key, {}); }

private:
    struct Free {
        void operator()(redisReply* r) const { freeReplyObject(r); }
    };
    using Reply = std::unique_ptr<redisReply, Free>;

    bool connect(std::string& why) {
        if (c_) redisFree(c_);
        const timeval timeout{2, 0};  // a store that does not answer in 2 s is not there
        if (address_.rfind("unix:", 0) == 0) {
            c_ = redisConnectUnixWithTimeout(address_.substr(5).c_str(), timeout);
        } else {
            const std::size_t colon = address_.rfind(':');
            int port = -1;
            try {
                port = colon == std::string::npos ? -1 : parse_int("port", address_.substr(colon + 1));
            } catch (const Error&) {
            }
            if (port < 1 || port > 65535) {
                c_ = nullptr;
                why = "give HOST:PORT with a port in 1..65535, or unix:PATH";
                return false;
            }
            c_ = redisConnectWithTimeout(address_.substr(0, colon).c_str(), port, timeout);
        }
        if (c_ && !c_->err && redisSetTimeout(c_, timeout) == REDIS_OK) return true;
        why = c_ ? c_->errstr : "out of memory";
        if (c_) redisFree(c_);
        c_ = nullptr;
        return false;
    }
    // One command with the key and an optional value as binary strings; null after a failure,
    // counted in errors() (an error reply too, such as Redis refusing a write when out of memory).
    Reply command(const char* format, const std::string& key, std::span<const std::uint8_t> value) {
        const NoSigpipe guard;
        for (int attempt = 0; attempt < 2; attempt++) {
            std::string why;
            if (!c_ && !connect(why)) break;
            Reply r(static_cast<redisReply*>(
                value.empty() ? redisCommand(c_, format, key.data(), key.size())
                              : redisCommand(c_, format, key.data(), key.size(), value.data(), value.size())));
            if (r && r->type == REDIS_REPLY_ERROR) break;
            if (r) return r;
            redisFree(c_);  // the connection is unusable after a failed call: the next try makes another
            c_ = nullptr;
        }
        errors_++;
        return nullptr;
    }

    std::string address_;
    redisContext* c_ = nullptr;
};

}  // namespace

std::unique_ptr<BlockStore> open_redis_store(const std::string& address) {
    return std::make_unique<RedisStore>(address);
}
bool have_redis() { return true; }

#else

std::unique_ptr<BlockStore> open_redis_store(const std::string& address) {
    throw Error(fmt::format("store redis:{}: this kvlab was built without hiredis (Debian: libhiredis-dev)",
                            one_line(address)));
}
bool have_redis() { return false; }

#endif

}  // namespace kvlab
