// Provides main() for every Catch2 v2 test binary in the repository.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
