// Acyclicity of the step's op graph, checked with Boost.Graph. A cycle here would be a deadlock in
// the engine (for example two ranks issuing collectives in different orders), so builders' output
// is checked before it is simulated.
#include <stdexcept>
#include <vector>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/topological_sort.hpp>
#include <fmt/format.h>

#include "cpsim/sim/engine.hpp"

namespace cpsim::sim {

void check_acyclic(const Workload& w) {
  // Vertices: one per op, then one per collective (the rendezvous). An op in a collective waits for
  // the rendezvous vertex, which waits for every member's predecessors.
  using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;
  const std::size_t n_ops = w.ops.size();
  Graph g(n_ops + w.collectives.size());
  std::vector<std::int32_t> last_on_stream(static_cast<std::size_t>(w.ranks) * kStreamCount, kNone);
  for (std::size_t i = 0; i < n_ops; ++i) {
    const Op& o = w.ops[i];
    const std::size_t target =
        o.collective == kNone ? i : n_ops + static_cast<std::size_t>(o.collective);
    for (std::int32_t e = o.deps_begin; e < o.deps_end; ++e) {
      boost::add_edge(static_cast<std::size_t>(w.edges[static_cast<std::size_t>(e)]), target, g);
    }
    const std::size_t q =
        static_cast<std::size_t>(o.rank) * kStreamCount + static_cast<std::size_t>(o.stream);
    if (last_on_stream[q] != kNone) {
      boost::add_edge(static_cast<std::size_t>(last_on_stream[q]), target, g);
    }
    last_on_stream[q] = static_cast<std::int32_t>(i);
    if (o.collective != kNone) {
      boost::add_edge(target, i, g);
    }
  }
  std::vector<std::size_t> order;
  order.reserve(boost::num_vertices(g));
  try {
    boost::topological_sort(g, std::back_inserter(order));
  } catch (const boost::not_a_dag&) {
    throw std::logic_error(
        fmt::format("op graph has a cycle ({} ops, {} collectives): the "
                    "schedule would deadlock",
                    n_ops, w.collectives.size()));
  }
}

}  // namespace cpsim::sim
