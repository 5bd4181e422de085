// Attention work under a document mask.
//
// Positions are continuous coordinates: a query range [a, b) against a key range [c, e) of the
// same document sees the region {(x, y): a ≤ x < b, c ≤ y < e, y ≤ x}. Its area is
// G(b) − G(a) with G(x) = ∫ clamp(t − c, 0, e − c) dt up to x:
//   G(x) = 0                          for x ≤ c
//        = (x − c)² / 2               for c < x ≤ e
//        = (e − c)² / 2 + (x − e)(e − c)  for x > e.
// An n-token causal block is n²/2 and a full block q·k, the cost model's FLOP convention
// (cost_model.cpp, visible_keys), so the ratio of two areas is the ratio of the kernel's FLOPs.
// A sequence is cut into pieces, each held by one ring position; a document's visible region is
// the sum over every (query piece, key piece) inside it, added to the cell of their positions.
#include "cpsim/sim/document_work.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace cpsim::sim {

namespace {

struct Piece {
  std::int64_t begin = 0, end = 0;
  int position = 0;
};

double visible_area(const Piece& q, const Piece& k) {
  const auto c = static_cast<double>(k.begin);
  const auto e = static_cast<double>(k.end);
  auto g = [&](double x) {
    if (x <= c) {
      return 0.0;
    }
    if (x <= e) {
      return (x - c) * (x - c) / 2.0;
    }
    return (e - c) * (e - c) / 2.0 + (x - e) * (e - c);
  };
  return g(static_cast<double>(q.end)) - g(static_cast<double>(q.begin));
}

// Head-tail: 2R chunks of [begin, begin + span), chunk c on position c or 2R−1−c.
void zigzag_pieces(std::int64_t begin, std::int64_t span, int ring, std::vector<Piece>& out) {
  const std::int64_t chunk = span / (2 * ring);
  for (int c = 0; c < 2 * ring; ++c) {
    out.push_back({begin + c * chunk, begin + (c + 1) * chunk, c < ring ? c : 2 * ring - 1 - c});
  }
}

// Processing-time round-robin (PyTorch 2.13.0 `_PTRRLoadBalancer`, REFERENCES.md
// [CP-split-torch]): the sequence in FlexAttention blocks of 128 tokens; a query block's cost is
// the number of key blocks its document mask touches (BlockMask kv_num_blocks +
// full_kv_num_blocks): from the block of its first real token's document start to itself, 0 for
// padding alone. Blocks by cost, descending (stable), are dealt R at a time, left to right in
// even rows and right to left in odd ones (`ptrr_scheduling`); position j holds column j.
std::vector<Piece> ptrr_pieces(const models::PackedSequence& s,
                               std::int64_t sequence_tokens,
                               int ring) {
  const std::int64_t blocks = sequence_tokens / kFlexBlockTokens;
  std::vector<std::int64_t> cost(static_cast<std::size_t>(blocks), 0);
  std::vector<bool> costed(static_cast<std::size_t>(blocks), false);
  std::int64_t at = 0;
  for (std::size_t d = 0; d < s.documents.size(); ++d) {
    const std::int64_t begin = at, end = at + s.documents[d];
    at += s.span(d);
    for (std::int64_t b = begin / kFlexBlockTokens; b * kFlexBlockTokens < end; ++b) {
      if (!costed[static_cast<std::size_t>(b)]) {
        costed[static_cast<std::size_t>(b)] = true;
        cost[static_cast<std::size_t>(b)] = b - begin / kFlexBlockTokens + 1;
      }
    }
  }
  std::vector<std::int64_t> order(static_cast<std::size_t>(blocks));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return cost[static_cast<std::size_t>(a)] > cost[static_cast<std::size_t>(b)];
  });
  std::vector<int> position(static_cast<std::size_t>(blocks));
  for (std::int64_t i = 0; i < blocks; ++i) {
    const std::int64_t row = i / ring, column = i % ring;
    const auto j = static_cast<int>(row % 2 == 0 ? column : ring - 1 - column);
    position[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] = j;
  }
  std::vector<Piece> pieces;
  for (std::int64_t b = 0; b < blocks; ++b) {
    pieces.push_back(
        {b * kFlexBlockTokens, (b + 1) * kFlexBlockTokens, position[static_cast<std::size_t>(b)]});
  }
  return pieces;
}

// The pieces of every position, in order.
std::vector<Piece> layout_pieces(const models::PackedSequence& s,
                                 std::int64_t sequence_tokens,
                                 int ring,
                                 models::RingLayout layout,
                                 DocumentSplit split) {
  if (split == DocumentSplit::kPtrrBlocks) {
    return ptrr_pieces(s, sequence_tokens, ring);
  }
  std::vector<Piece> pieces;
  if (split == DocumentSplit::kPerDocument) {
    std::int64_t at = 0;
    for (std::size_t d = 0; d < s.documents.size(); ++d) {
      zigzag_pieces(at, s.span(d), ring, pieces);
      at += s.span(d);
    }
    return pieces;
  }
  if (layout == models::RingLayout::kZigzag) {
    zigzag_pieces(0, sequence_tokens, ring, pieces);
    return pieces;
  }
  const std::int64_t chunk = sequence_tokens / ring;
  for (int i = 0; i < ring; ++i) {
    pieces.push_back({i * chunk, (i + 1) * chunk, i});
  }
  return pieces;
}

std::vector<double> visible_work(const models::PackedSequence& s,
                                 std::int64_t sequence_tokens,
                                 int ring,
                                 models::RingLayout layout,
                                 DocumentSplit split) {
  const std::vector<Piece> pieces = layout_pieces(s, sequence_tokens, ring, layout, split);
  std::vector<double> work(static_cast<std::size_t>(ring) * static_cast<std::size_t>(ring), 0.0);
  std::vector<Piece> inside;
  std::vector<double> before(static_cast<std::size_t>(ring));
  std::size_t first = 0;
  std::int64_t at = 0;
  for (std::size_t d = 0; d < s.documents.size(); ++d) {
    const std::int64_t begin = at, end = at + s.documents[d];
    at += s.span(d);
    while (first < pieces.size() && pieces[first].end <= begin) {
      ++first;
    }
    inside.clear();
    for (std::size_t p = first; p < pieces.size() && pieces[p].begin < end; ++p) {
      inside.push_back(
          {std::max(begin, pieces[p].begin), std::min(end, pieces[p].end), pieces[p].position});
    }
    // Pieces are in sequence order: a query piece sees every earlier key piece of its document
    // whole (its length × theirs, summed per position in `before`) and itself causally.
    std::fill(before.begin(), before.end(), 0.0);
    for (const Piece& q : inside) {
      const auto row = static_cast<std::size_t>(q.position * ring);
      const auto length = static_cast<double>(q.end - q.begin);
      for (int k = 0; k < ring; ++k) {
        work[row + static_cast<std::size_t>(k)] += length * before[static_cast<std::size_t>(k)];
      }
      work[row + static_cast<std::size_t>(q.position)] += visible_area(q, q);
      before[static_cast<std::size_t>(q.position)] += length;
    }
  }
  return work;
}

}  // namespace

const char* to_string(DocumentSplit s) {
  switch (s) {
    case DocumentSplit::kSequence:
      return "sequence";
    case DocumentSplit::kPerDocument:
      return "per-document";
    case DocumentSplit::kPtrrBlocks:
      return "ptrr-blocks";
  }
  return "?";
}

double DocumentWork::pair_factor(int i, int j) const {
  const auto cell = static_cast<std::size_t>(i * ring + j);
  return reference[cell] > 0.0 ? visible[cell] / reference[cell] : 0.0;
}

double DocumentWork::row(const std::vector<double>& m, int i) const {
  double sum = 0.0;
  for (int j = 0; j < ring; ++j) {
    sum += m[static_cast<std::size_t>(i * ring + j)];
  }
  return sum;
}

double DocumentWork::position_factor(int i) const {
  const double ref = row(reference, i);
  return ref > 0.0 ? row(visible, i) / ref : 0.0;
}

double DocumentWork::total_factor() const {
  double seen = 0.0, ref = 0.0;
  for (int i = 0; i < ring; ++i) {
    seen += row(visible, i);
    ref += row(reference, i);
  }
  return ref > 0.0 ? seen / ref : 0.0;
}

double DocumentWork::busiest_work() const {
  double busiest = 0.0;
  for (int i = 0; i < ring; ++i) {
    busiest = std::max(busiest, row(visible, i));
  }
  return busiest;
}

double DocumentWork::imbalance() const {
  double busiest = 0.0, sum = 0.0;
  for (int i = 0; i < ring; ++i) {
    busiest = std::max(busiest, row(visible, i));
    sum += row(visible, i);
  }
  return sum > 0.0 ? busiest / (sum / ring) : 1.0;
}

DocumentWork document_work(const models::PackedSequence& sequence,
                           std::int64_t sequence_tokens,
                           int ring,
                           models::RingLayout layout,
                           DocumentSplit split) {
  if (ring < 1) {
    throw std::invalid_argument("document_work: the ring has at least one position");
  }
  if (split == DocumentSplit::kPerDocument &&
      (layout != models::RingLayout::kZigzag || sequence.span_multiple % (2 * ring) != 0)) {
    throw std::invalid_argument(
        "document_work: a per-document split is head-tail, over spans that are multiples of 2R");
  }
  if (split == DocumentSplit::kPtrrBlocks && sequence_tokens % (kFlexBlockTokens * ring) != 0) {
    throw std::invalid_argument(
        "document_work: PTRR deals blocks of 128 tokens, a multiple of R of them");
  }
  std::int64_t spans = 0;
  for (std::size_t d = 0; d < sequence.documents.size(); ++d) {
    spans += sequence.span(d);
  }
  if (spans > sequence_tokens) {
    throw std::invalid_argument("document_work: the documents are longer than the sequence");
  }
  DocumentWork w;
  w.ring = ring;
  w.visible = visible_work(sequence, sequence_tokens, ring, layout, split);
  w.sequence = sequence;
  w.sequence_tokens = sequence_tokens;
  w.reference = visible_work(models::PackedSequence{{sequence_tokens}, 1}, sequence_tokens, ring,
                             layout, DocumentSplit::kSequence);
  return w;
}

}  // namespace cpsim::sim
