#pragma once
/// @file Where a GPU sits on a multi-socket host: its NUMA node and that node's CPUs, read from
/// Linux's sysfs (/sys/bus/pci/devices/<bus id>/numa_node, /sys/devices/system/node/node<N>/
/// cpulist). The host-copy sweeps allocate each GPU's pinned buffers from a thread bound to those
/// CPUs, so that the pages lie in the GPU's own node (Linux's default policy allocates on the
/// node of the CPU that first touches a page) and a copy does not cross the socket link.

#include <cctype>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace cpsim::calibrate {

/// The CPUs of a Linux CPU list ("0-15,32-47", "3", "" for none), ascending as written; empty
/// when the text is not such a list.
inline std::vector<int> parse_cpu_list(std::string_view text) {
  std::vector<int> cpus;
  auto number = [&text](std::size_t& at, int& out) {
    const std::size_t begin = at;
    long value = 0;
    while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at])) != 0) {
      value = value * 10 + (text[at] - '0');
      if (value > 1 << 20) {
        return false;
      }
      ++at;
    }
    out = static_cast<int>(value);
    return at > begin;
  };
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())) != 0) {
    text.remove_suffix(1);
  }
  std::size_t at = 0;
  while (at < text.size()) {
    int first = 0;
    int last = 0;
    if (!number(at, first)) {
      return {};
    }
    last = first;
    if (at < text.size() && text[at] == '-') {
      ++at;
      if (!number(at, last) || last < first) {
        return {};
      }
    }
    for (int c = first; c <= last; ++c) {
      cpus.push_back(c);
    }
    if (at < text.size()) {
      if (text[at] != ',') {
        return {};
      }
      ++at;
      if (at == text.size()) {
        return {};
      }
    }
  }
  return cpus;
}

struct NumaPlacement {
  int node = -1;          ///< -1: unknown (no sysfs entry, or one NUMA node reported as -1)
  std::vector<int> cpus;  ///< the node's CPUs; empty when unknown
};

/// The NUMA node of the PCI device `bus_id` (as cudaDeviceGetPCIBusId writes it,
/// "0000:3B:00.0"; sysfs names it in lower case) and its CPUs, under `sysfs` (normally "/sys").
inline NumaPlacement numa_placement(std::string_view bus_id,
                                    const std::filesystem::path& sysfs = "/sys") {
  std::string name(bus_id);
  for (char& c : name) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  NumaPlacement out;
  std::ifstream node_file(sysfs / "bus/pci/devices" / name / "numa_node");
  int node = -1;
  if (!(node_file >> node) || node < 0) {
    return out;
  }
  std::ifstream cpus_file(sysfs / "devices/system/node" / ("node" + std::to_string(node)) /
                          "cpulist");
  std::string list;
  std::getline(cpus_file, list);
  out.cpus = parse_cpu_list(list);
  if (!out.cpus.empty()) {
    out.node = node;
  }
  return out;
}

}  // namespace cpsim::calibrate
