// The transformer blocks of the step: built block by block (layer_forward, layer_backward), or
// each an instance of one template recorded once per build (BuildOptions::repeat_layers). A
// template is the same emission recorded apart from the step, with the block's inputs as ports
// (layer_template.hpp), then removed from the workload: instances are what building every block
// would append, by construction.
#include <stdexcept>

#include "step_builder.hpp"

namespace cpsim::sim::detail {
namespace {

bool full_checkpointing(const models::TrainingRecipe& r) {
  return r.checkpointing == models::CheckpointMode::kFull;
}

}  // namespace

TensorSet StepBuilder::port_like(TensorSet bound) {
  if (!bound.valid()) {
    return {};
  }
  TensorSet port = b_.tensor("layer_port", 0, MemCategory::kOther);
  if (w_.tensors[static_cast<std::size_t>(bound.base)].producer != kNone) {
    OpSpec& s = next_spec("layer_port", Stream::kCompute, OpKind::kElementwise);
    s.outputs.push_back(port);
    b_.op(s);
  }
  return port;
}

void StepBuilder::note_template(std::int32_t id, const LayerTemplate& t) {
  Workload::TemplateShape& shape = w_.template_shapes.at(static_cast<std::size_t>(id));
  if (noted_templates_[static_cast<std::size_t>(id)]++ > 0) {
    shape = {};  // recorded twice: its instances need not share one template
    return;
  }
  shape.ops = t.size().ops;
  shape.tensors = t.size().tensors;
  shape.ported_ops = t.ported_ops();
}

void StepBuilder::record_body(LayerBody& body, TensorSet x, TensorSet params, bool grad) {
  const Mark scratch = b_.mark();
  const TensorSet x_port = port_like(x), params_port = port_like(params);
  b_.set_port_ops(scratch.ops, b_.mark().ops);
  const Mark begin = b_.mark();
  const SavedLayer sv = layer_forward(x_port, params_port, grad);
  body.tmpl = LayerTemplate::record(w_, begin, b_.mark(), {Port::of(x_port), Port::of(params_port)},
                                    b_.simulated_ranks());
  note_template(&body == &fwd_ ? Workload::kForwardBlock : Workload::kRecomputeBlock, body.tmpl);
  body.out = sv.out;
  body.first_op = sv.first_op;
  b_.set_port_ops(kNone, kNone);
  b_.truncate(scratch);
}

void StepBuilder::record_backward(TensorSet x, TensorSet params, TensorSet dy, TensorSet grads) {
  // The backward reads what the forward (or the recomputation) of its block saved: a block is
  // emitted first, in the same scratch, and the backward refers to it as a segment port.
  const bool full_ac = full_checkpointing(r_);
  const LayerBody& forward = full_ac ? rec_ : fwd_;
  const Phase phase = b_.phase();
  const Mark scratch = b_.mark();
  const TensorSet x_port = port_like(x), params_port = port_like(params);
  const TensorSet dy_port = port_like(dy), grads_port = port_like(grads);
  b_.set_port_ops(scratch.ops, b_.mark().ops);
  const Mark body = b_.mark();
  b_.set_phase(full_ac ? Phase::kRecompute : Phase::kForward);
  SavedLayer sv = layer_forward(x_port, params_port, /*grad=*/true);
  const Mark body_end = b_.mark();
  if (const Mark n = forward.tmpl.size();
      body_end.ops - body.ops != n.ops || body_end.tensors - body.tensors != n.tensors ||
      body_end.collectives - body.collectives != n.collectives) {
    throw std::logic_error("a block's forward differs from its template");
  }
  keep_for_backward(sv);
  b_.set_phase(Phase::kBackward);
  const TensorSet dx =
      layer_backward(sv, dy_port, params_port, grads_port, full_ac && r_.checkpoint_reentrant);
  bwd_.tmpl = LayerTemplate::record(w_, body_end, b_.mark(),
                                    {Port::of(x_port), Port::of(params_port), Port::of(dy_port),
                                     Port::of(grads_port), Port::segment(body, body_end)},
                                    b_.simulated_ranks());
  note_template(Workload::kBackwardBlock, bwd_.tmpl);
  bwd_.out = dx;
  b_.set_phase(phase);
  b_.set_port_ops(kNone, kNone);
  b_.truncate(scratch);
}

void StepBuilder::keep_for_backward(SavedLayer& sv) const {
  if (r_.checkpointing == models::CheckpointMode::kSelective) {
    // The attention core is not saved: backward re-runs it from the local Q and K/V.
    sv.q_h = {};
    sv.kv_h = {};
    sv.o_h = {};
    sv.lse = {};
  }
}

StepBuilder::LayerEnds StepBuilder::body_instance(
    LayerBody& body, int l, TensorSet x, TensorSet params, bool grad) {
  if (body.tmpl.empty()) {
    record_body(body, x, params, grad);
  }
  const Mark at = body.tmpl.instantiate(w_, l, {Binding::of(x), Binding::of(params)});
  body_at_[static_cast<std::size_t>(l)] = at;
  w_.instances.push_back({at.ops, at.tensors, at.edges, at.collectives,
                          &body == &fwd_ ? Workload::kForwardBlock : Workload::kRecomputeBlock});
  return {body.tmpl.in(at, body.out), body.tmpl.in(at, body.first_op)};
}

void StepBuilder::enter_layer(int layer) {
  layer_experts_ = m_.experts_at(layer);
  const models::LayerAttention kind = m_.attention_of(layer);
  const bool windowed =
      kind == models::LayerAttention::kSliding && m_.sliding_window < shape_.seq_tokens;
  layer_window_tokens_ = windowed ? m_.sliding_window : 0;
  layer_window_share_ = windowed ? models::window_share(shape_.seq_tokens, m_.sliding_window) : 1.0;
  if (kind == models::LayerAttention::kChunked) {  // whole-sequence kernels only (schedule.cpp)
    layer_window_share_ = models::chunk_share(shape_.seq_tokens, m_.attention_chunk);
  }
}

StepBuilder::LayerEnds StepBuilder::forward_layer(int l, TensorSet x, TensorSet params) {
  enter_layer(l);
  const bool grad = !full_checkpointing(r_);
  if (repeat_layers_) {
    return body_instance(fwd_, l, x, params, grad);
  }
  SavedLayer sv = layer_forward(x, params, grad);
  const LayerEnds ends{sv.out, sv.first_op};
  if (grad) {
    keep_for_backward(sv);
    saved_[static_cast<std::size_t>(l)] = std::move(sv);
  }
  return ends;
}

OpSet StepBuilder::recompute_layer(int l, TensorSet x, TensorSet params) {
  enter_layer(l);
  b_.set_phase(Phase::kRecompute);
  OpSet first_op;
  if (repeat_layers_) {
    first_op = body_instance(rec_, l, x, params, /*grad=*/true).first_op;
  } else {
    SavedLayer sv = layer_forward(x, params, /*grad=*/true);
    first_op = sv.first_op;
    saved_[static_cast<std::size_t>(l)] = std::move(sv);
  }
  b_.set_phase(Phase::kBackward);
  return first_op;
}

TensorSet StepBuilder::backward_layer(
    int l, TensorSet x, TensorSet dy, TensorSet params, TensorSet grads) {
  const auto li = static_cast<std::size_t>(l);
  enter_layer(l);
  if (!repeat_layers_) {
    return layer_backward(saved_[li], dy, params, grads,
                          full_checkpointing(r_) && r_.checkpoint_reentrant);
  }
  if (bwd_.tmpl.empty()) {
    record_backward(x, params, dy, grads);
  }
  const Mark at = bwd_.tmpl.instantiate(w_, l,
                                        {Binding::of(x), Binding::of(params), Binding::of(dy),
                                         Binding::of(grads), Binding::at(body_at_[li])});
  w_.instances.push_back({at.ops, at.tensors, at.edges, at.collectives, Workload::kBackwardBlock});
  return bwd_.tmpl.in(at, bwd_.out);
}

}  // namespace cpsim::sim::detail
