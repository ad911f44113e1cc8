// kvlab viewer: a live session. The real decoders run on a worker thread and publish one
// Step (state.h) after every prefill and decode step; the UI only reads what is published.
//
// Every step runs twice: the cached decoder on the chosen cache variant, and the naive decoder
// over each sequence's whole prefix, so the Exactness panel compares real logits.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "serving.h"
#include "state.h"

namespace kvlab::viz {

class Session {
public:
    // Loads the model and checks the settings on the caller's thread: bad settings throw
    // kvlab::Error with a one-line message before any thread starts.
    explicit Session(const Settings& settings);
    ~Session();  // stops the worker after its current step
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;

    const SessionInfo& info() const { return info_; }
    // Every step published so far.
    std::vector<std::shared_ptr<const Step>> steps() const;
    int n_steps() const;
    bool done() const { return done_; }
    // Blocks until step k is published or the session has ended; true if it is there.
    bool wait_for(int k) const;
    // An error that ended the session early ("" if none).
    std::string failure() const;
    // The serving view's run (settings.serve), computed by the constructor; null otherwise.
    const ServeRun* serving() const { return serving_ ? &*serving_ : nullptr; }

private:
    struct Impl;
    void run();
    void publish(std::shared_ptr<Step> step);

    SessionInfo info_;
    std::unique_ptr<Impl> impl_;
    std::optional<ServeRun> serving_;
    mutable std::mutex mu_;
    mutable std::condition_variable cv_;
    std::vector<std::shared_ptr<const Step>> steps_;
    std::string failure_;
    std::atomic<bool> stop_{false}, done_{false};
    std::thread worker_;
};

}  // namespace kvlab::viz
