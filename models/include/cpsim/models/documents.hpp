#pragma once
/// @file Packed batches: where document lengths come from (a file of lengths, a histogram, a
/// named distribution), a seeded sampler over them, and the packing of documents into sequences
/// of a fixed length as the launchers' data paths do it (docs/PACKING.md).

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace cpsim::models {

/// Document lengths in tokens, as a weighted list or a log-normal law.
struct LengthDistribution {
  enum class Kind : std::uint8_t { kWeighted, kLognormal };
  Kind kind = Kind::kWeighted;
  /// kWeighted: the lengths and their weights (a file of lengths: weight 1 each), both > 0.
  std::vector<std::int64_t> lengths;
  std::vector<double> weights;
  /// kLognormal: exp(N(ln median, sigma²)) rounded to tokens, clamped to [1, max_tokens].
  double median_tokens = 0.0;
  double sigma = 0.0;
  std::int64_t max_tokens = 0;
  std::string origin;  ///< the file or the spec, for messages and reports
  /// Mean length in tokens (kLognormal: of the clamped law, by its closed form before clamping).
  double mean_tokens() const;
};

/// `--lengths VALUE`: `lognormal:median=8K,sigma=1.2[,max=1M]`, else a file: one length a line
/// (`#` comments and blank lines skipped; `8K` suffixes allowed) or, for a `.json` file, a
/// histogram
/// `{"lengths": [...], "counts": [...]}`. @throws InputError naming `field` (and the file's line
/// or JSON path) for anything else.
LengthDistribution parse_length_distribution(const std::string& value, const std::string& field);

/// Draws document lengths from a distribution, deterministically for a seed on every platform
/// (the 64-bit Mersenne twister, with its own uniform and normal transforms: the standard
/// library's distributions differ between implementations).
class DocumentSampler {
 public:
  DocumentSampler(const LengthDistribution& lengths, std::uint64_t seed);
  std::int64_t next();

 private:
  double uniform();  ///< in [0, 1), 53 random bits
  const LengthDistribution* lengths_;
  std::mt19937_64 engine_;
  std::vector<double> cumulative_;  ///< kWeighted: running sums of the weights
};

/// How documents become sequences of S tokens (docs/PACKING.md, with each launcher's source).
enum class Packing : std::uint8_t {
  /// One token stream cut every S tokens, documents split at the cuts (Megatron-LM's GPT
  /// dataset, TorchTitan's concat-then-split, ArcticTraining's causal data).
  kConcat,
  /// In order; a document that does not fit closes the sequence, the rest is padding; documents
  /// longer than S are dropped (ArcticTraining's SFT packing).
  kGreedy,
  /// Into the first of kFirstFitWindow open sequences with room, else a new one (the oldest open
  /// one is then emitted); documents longer than S are dropped (TorchTitan's first-fit packing,
  /// its 8 bins).
  kFirstFit,
};
inline constexpr int kFirstFitWindow = 8;
const char* to_string(Packing p);
/// @throws InputError naming `field`.
Packing parse_packing(const std::string& text, const std::string& field);

/// One packed sequence: its documents' tokens in order. Document d starts at the sum of the
/// earlier documents' spans, a span being its tokens rounded up to `span_multiple` (padding that
/// attends nothing, e.g. TransformerEngine's 2·CP per document); the tokens after the last span
/// up to the sequence length are padding too.
struct PackedSequence {
  std::vector<std::int64_t> documents;
  std::int64_t span_multiple = 1;
  std::int64_t real_tokens() const;
  std::int64_t span(std::size_t d) const;
};

/// Packs documents drawn from `sampler` into `count` sequences of `sequence_tokens`, each
/// document's span rounded up to `span_multiple` (which divides `sequence_tokens`).
/// @throws InputError("lengths", ...) when 10,000 documents in a row are too long to keep.
std::vector<PackedSequence> pack_documents(DocumentSampler& sampler,
                                           std::int64_t sequence_tokens,
                                           std::int64_t span_multiple,
                                           Packing packing,
                                           int count);

}  // namespace cpsim::models
