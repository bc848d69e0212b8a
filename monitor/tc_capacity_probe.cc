// Prints the ceil of an htb class as the monitor reads it:
//   tc_capacity_probe <interface> <classid>   ->   "80000000"
// Used by tc_capacity_netns_test on a real shaped veth.
#include <cstdio>

#include "monitor/tc_capacity.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: tc_capacity_probe <interface> <classid>\n");
    return 2;
  }
  auto ceil = mlfabric::monitor::TcClassCapacity(argv[1], argv[2]).Read();
  if (!ceil.ok()) {
    std::fprintf(stderr, "%s\n", std::string(ceil.status().message()).c_str());
    return 1;
  }
  std::printf("%.0f\n", *ceil);
  return 0;
}
