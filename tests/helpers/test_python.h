// The Python interpreter the end-to-end tests drive: $FULLBURN_TEST_PYTHON
// (CTest sets it to the torch 2.x venv's for the *.torch2 tests), else
// Debian's /usr/bin/python3 with its torch 1.13; and a skip, saying why, for
// a test that needs a module that interpreter lacks.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "process.h"

namespace fullburn::testing {

inline const char* TestPython() {
  const char* named = std::getenv("FULLBURN_TEST_PYTHON");
  return named && *named ? named : "/usr/bin/python3";
}

inline bool TestPythonHas(const std::string& module) {
  return RunToEnd({TestPython(), "-c", "import " + module}).code == 0;
}

}  // namespace fullburn::testing

// GTEST_SKIP returns from the function it is in: the test's own body.
#define NEED_PYTHON_MODULE(module)                                                                 \
  do {                                                                                             \
    if (!::fullburn::testing::TestPythonHas(module))                                               \
      GTEST_SKIP() << ::fullburn::testing::TestPython() << " cannot import " << (module)           \
                   << ": scripts/torch2-venv.sh installs it with PyPI's PyTorch 2.x";             \
  } while (0)
