// Caches kvlab did not write: a C plugin's bookkeeping (include/kvlab/cache_plugin.h) under the
// exact property, in process (verify_plugin) and from the command line, where a plugin that
// crashes, hangs, refuses or answers out of range gets a verdict and kvlab never crashes.
#include <catch2/catch.hpp>
#include <string>

#include "cli_util.h"
#include "plugin_cache.h"
#include "test_util.h"
#include "verify.h"

using namespace kvlab;

namespace {

std::string plugin_path(const std::string& name) { return std::string(KVLAB_PLUGIN_DIR) + "/libkvlab_" + name + ".so"; }

}  // namespace

TEST_CASE("cache plugin: free_list's books are exact under prefill, decode and rollback", "[plugin]") {
    const VerifyRow r = verify_plugin(plugin_path("free_list"), VerifyOptions{});
    INFO(r.counterexample);
    CHECK(r.ok);
    CHECK(r.cases == 100);
    CHECK(r.name == "plugin free_list");
}

TEST_CASE("cache plugin counter-test: a rollback that frees a held slot is caught, shrunk, naming the call",
          "[plugin][counter]") {
    const VerifyRow r = verify_plugin(plugin_path("free_list_off_by_one"), VerifyOptions{});
    INFO(r.counterexample);
    CHECK_FALSE(r.ok);
    CHECK_THAT(r.counterexample, Catch::Contains("roll back to") && Catch::Contains("which is still held") &&
                                     Catch::Contains("reserve(length="));
    CHECK(r.counterexample_T == 0);  // a bookkeeping verdict, not a logit difference
}

TEST_CASE("cache plugin: a slot out of range and a refusal fail the check with the call and its value", "[plugin]") {
    const VerifyRow range = verify_plugin(plugin_path("hostile_range"), VerifyOptions{});
    CHECK_FALSE(range.ok);
    CHECK_THAT(range.counterexample, Catch::Contains("slot(pos=2) returned") && Catch::Contains("slots (0.."));
    const VerifyRow refuse = verify_plugin(plugin_path("hostile_refuse"), VerifyOptions{});
    CHECK_FALSE(refuse.ok);
    CHECK_THAT(refuse.counterexample, Catch::Contains("reserve(length=0, n=1) refused: no room"));
}

TEST_CASE("cache plugin: a file that is not a plugin is refused in one line", "[plugin]") {
    CHECK_THROWS_WITH(CachePlugin(plugin_path("no_such_plugin")), Catch::Contains("does not load"));
    CHECK_THROWS_WITH(CachePlugin(std::string(KVLAB_BINARY)), Catch::Contains("does not load"));
    check_refused("verify --plugin " + plugin_path("no_such_plugin"), "does not load");
    check_refused("verify exact --plugin " + plugin_path("free_list"), "excludes --plugin");
}

TEST_CASE("kvlab verify --plugin: exact passes, a planted bug fails, and a crash or a hang is a verdict",
          "[plugin][cli]") {
    const Run good = run_kvlab("verify --plugin " + plugin_path("free_list"));
    CHECK(good.exit_code == 0);
    CHECK_THAT(good.out, Catch::Contains("plugin free_list") && Catch::Contains("bitwise equal"));
    const Run bug = run_kvlab("verify --plugin " + plugin_path("free_list_off_by_one") + " --json");
    CHECK(bug.exit_code == 1);
    CHECK_THAT(bug.out, Catch::Contains("\"ok\": false") && Catch::Contains("which is still held"));
    // The child dies of the plugin's own null read (or, under AddressSanitizer, is ended by it):
    // kvlab reports it with the step it was on and exits 1.
    const Run crash = run_kvlab("verify --plugin " + plugin_path("hostile_crash"));
    INFO(crash.out << crash.err);
    CHECK(!crash.signaled);
    CHECK(crash.exit_code == 1);
    CHECK_THAT(crash.out, Catch::Contains("CRASHED") && Catch::Contains("the last step: plugin hostile"));
    const Run hang = run_kvlab("verify --plugin " + plugin_path("hostile_hang") + " --plugin-timeout 2");
    CHECK(hang.exit_code == 1);
    CHECK_THAT(hang.out, Catch::Contains("HUNG") && Catch::Contains("no answer in 2 s"));
}
