#pragma once
// Internal: a segment of a workload (one transformer layer's forward, recomputation or backward)
// recorded once with its ids relative to itself and appended again for every layer. An instance
// is what emitting the same ops again would append, by construction: the recorded ops are the
// emission of the same code, and the ids outside the segment are ports bound per instance.

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "builder.hpp"

namespace cpsim::sim::detail {

/// What a recorded segment may refer to outside itself.
///  - a tensor port: a tensor set that stands for one bound per instance. Reads and writes of it
///    and dependencies on its producer follow the bound tensor. Its producer, when it had one
///    before the segment, must lie in the ops given to Builder::set_port_ops while recording: a
///    dependency on it is then recorded even on the same stream, and each instance leaves it out
///    (or de-duplicates it) as Builder::op would with the bound tensor's producer.
///  - a segment port: the ops and tensors of another segment (the forward of the same layer, read
///    by its backward), bound to the start of that segment's instance. The two must have the same
///    ops and tensors in the same order (instances of one template).
struct Port {
  TensorSet tensor;
  Mark begin, end;  ///< segment port: [begin, end)
  static Port of(TensorSet t) { return {t, {}, {}}; }
  static Port segment(const Mark& begin, const Mark& end) { return {{}, begin, end}; }
};
/// What a port stands for in one instance: the tensor, or the start of the segment.
struct Binding {
  TensorSet tensor;
  Mark segment;
  static Binding of(TensorSet t) { return {t, {}}; }
  static Binding at(const Mark& m) { return {{}, m}; }
};

class LayerTemplate {
 public:
  LayerTemplate() = default;
  /// Segment [begin, end) of `w` (built for `ranks` simulated ranks). @throws std::logic_error when
  /// it refers to an op, tensor or collective outside itself that no port covers.
  static LayerTemplate record(
      const Workload& w, const Mark& begin, const Mark& end, ListRef<Port> ports, int ranks);

  bool empty() const { return ops_.empty(); }
  /// Appends an instance to `w` with its ops in `layer` and port i bound to `bindings[i]`; returns
  /// where it begins. @throws std::logic_error when a binding does not fit its port (validity, or a
  /// producer where the recorded port had none) or a tensor would be produced twice.
  Mark instantiate(Workload& w, std::int32_t layer, ListRef<Binding> bindings);

  /// The recorded (local) tensor or op `t` in the instance that begins at `at`.
  TensorSet in(const Mark& at, TensorSet t) const;
  OpSet in(const Mark& at, OpSet o) const;
  /// Sizes of the segment.
  Mark size() const { return size_; }
  /// The recorded ops (offsets in the segment, ascending) with an edge outside the segment (a
  /// port). Every other op of an instance is the recorded op with its edges, tensors and
  /// collective moved by the instance's start: two instances whose starts differ by Δ have those
  /// ops equal up to Δ wherever their earlier ported ops have as many edges.
  const std::vector<std::int32_t>& ported_ops() const { return ported_ops_; }

 private:
  /// An id outside the segment: port `port`; `index` is the rank (tensor port, its tensor or its
  /// producer) or the offset in the bound segment.
  enum class RefKind : std::uint8_t { kPortTensor, kPortProducer, kSegmentTensor, kSegmentOp };
  struct Ref {
    RefKind kind = RefKind::kPortTensor;
    std::int32_t port = 0, index = 0;
    bool operator==(const Ref&) const = default;
  };
  enum class PortKind : std::uint8_t { kNone, kTensor, kSegment };
  /// A recorded id: >= 0 local (offset in the segment), < 0 the ref ~id.
  std::int32_t encode(const Ref& r);
  std::int32_t encode_op(const Workload& w,
                         OpId d,
                         const Mark& begin,
                         const Mark& end,
                         ListRef<Port> ports,
                         int ranks);
  std::int32_t encode_tensor(
      TensorId x, const Mark& begin, const Mark& end, ListRef<Port> ports, int ranks);
  /// resolved_ for one instance.
  void resolve(const Workload& w, ListRef<Binding> bindings);

  Mark begin_;  ///< where the recording began (for in())
  Mark size_;
  std::vector<Op> ops_;  ///< deps/inputs/outputs ranges relative to the segment's first edge
  std::vector<Tensor> tensors_;
  std::vector<Collective> collectives_;
  std::vector<std::int32_t> edges_;  ///< encoded ids
  std::vector<Ref> refs_;
  std::unordered_map<std::int64_t, std::int32_t> ref_index_;  ///< while recording
  std::vector<PortKind> port_kinds_;
  /// Ports whose tensor had no producer before the segment: the bound one must have none either.
  std::vector<std::int32_t> unproduced_ports_;
  std::int32_t port_count_ = 0;
  std::vector<std::int32_t> resolved_;  ///< refs_ in the current instance (reused)
  std::vector<std::int32_t> ported_ops_;
};

}  // namespace cpsim::sim::detail
