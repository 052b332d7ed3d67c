// src/core/env.h: the one reader of the library's environment variables (docs/tuning.md).
#include <gtest/gtest.h>

#include <cstdlib>

#include "src/core/env.h"

namespace fusedops {
namespace {

TEST(Env, TextAndFlag) {
  const char* name = "FUSEDOPS_TEST_ENV_FLAG";
  ::unsetenv(name);
  EXPECT_EQ(env::text(name), "");
  EXPECT_FALSE(env::flag(name));
  for (const char* off : {"", "0"}) {
    ::setenv(name, off, 1);
    EXPECT_FALSE(env::flag(name)) << "'" << off << "'";
  }
  for (const char* on : {"1", "yes", "true", "00"}) {
    ::setenv(name, on, 1);
    EXPECT_TRUE(env::flag(name)) << "'" << on << "'";
    EXPECT_EQ(env::text(name), on);  // read at each call
  }
  ::unsetenv(name);
}

TEST(Env, ForceIsReadOncePerName) {
  ::setenv("FUSEDOPS_TEST_ENV_ON", "1", 1);
  ::setenv("FUSEDOPS_TEST_ENV_OFF", "0", 1);
  ::setenv("FUSEDOPS_TEST_ENV_OTHER", "auto", 1);
  ::unsetenv("FUSEDOPS_TEST_ENV_UNSET");
  EXPECT_EQ(env::force("FUSEDOPS_TEST_ENV_ON"), 1);
  EXPECT_EQ(env::force("FUSEDOPS_TEST_ENV_OFF"), 0);
  EXPECT_EQ(env::force("FUSEDOPS_TEST_ENV_OTHER"), -1);
  EXPECT_EQ(env::force("FUSEDOPS_TEST_ENV_UNSET"), -1);
  ::setenv("FUSEDOPS_TEST_ENV_ON", "0", 1);  // the first reading stays for the process
  EXPECT_EQ(env::force("FUSEDOPS_TEST_ENV_ON"), 1);
  for (const char* n : {"FUSEDOPS_TEST_ENV_ON", "FUSEDOPS_TEST_ENV_OFF", "FUSEDOPS_TEST_ENV_OTHER"})
    ::unsetenv(n);
}

}  // namespace
}  // namespace fusedops
