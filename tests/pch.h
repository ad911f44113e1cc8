// The precompiled header of every test binary (tests/CMakeLists.txt, kvlab_test): Catch2,
// RapidCheck and fmt, which every test parses, and test_util.h on top of them. Parsing them
// once instead of in each of ~40 test files is about a sixth of the tests' build time. Nothing
// here may depend on a macro that one test defines differently from another.
#pragma once

#include <fmt/format.h>
#include <rapidcheck.h>
#include <rapidcheck/catch.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "test_util.h"
