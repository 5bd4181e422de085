#include "cpsim/models/documents.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <numbers>
#include <sstream>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/json_io.hpp"
#include "cpsim/models/units.hpp"

namespace cpsim::models {

namespace {

constexpr std::int64_t kNoMaximum = std::int64_t{1} << 40;

std::string trimmed(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t\r");
  if (begin == std::string::npos) {
    return {};
  }
  return s.substr(begin, s.find_last_not_of(" \t\r") - begin + 1);
}

double positive_number(const std::string& text, const std::string& field) {
  std::size_t used = 0;
  double v = 0.0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !std::isfinite(v) || v <= 0.0) {
    throw InputError(field, fmt::format("expected a positive number, got '{}'", text));
  }
  return v;
}

// lognormal:median=8K,sigma=1.2[,max=1M]
LengthDistribution parse_lognormal(const std::string& value, const std::string& field) {
  LengthDistribution d;
  d.kind = LengthDistribution::Kind::kLognormal;
  d.origin = value;
  d.max_tokens = kNoMaximum;
  std::stringstream params(value.substr(value.find(':') + 1));
  std::string item;
  while (std::getline(params, item, ',')) {
    const auto eq = item.find('=');
    const std::string key = eq == std::string::npos ? item : item.substr(0, eq);
    const std::string text = eq == std::string::npos ? std::string{} : item.substr(eq + 1);
    const std::string where = field + " " + key;
    if (key == "median") {
      d.median_tokens = static_cast<double>(parse_length(text, where));
    } else if (key == "sigma") {
      d.sigma = positive_number(text, where);
    } else if (key == "max") {
      d.max_tokens = parse_length(text, where);
    } else {
      throw InputError(field, fmt::format("unknown parameter '{}' of lognormal (median=TOKENS, "
                                          "sigma=NUMBER, optional max=TOKENS)",
                                          key));
    }
  }
  if (d.median_tokens <= 0.0 || d.sigma <= 0.0) {
    throw InputError(field,
                     "lognormal needs median=TOKENS and sigma=NUMBER, e.g. "
                     "lognormal:median=8K,sigma=1.2");
  }
  return d;
}

LengthDistribution parse_histogram(const std::string& path, const std::string& field) {
  const Json j = parse_json(read_text_file(path, field), path);
  const JsonNode root(j, path, "");
  root.expect_object({"lengths", "counts"});
  const Json* lengths = find_member(j, "lengths");
  const Json* counts = find_member(j, "counts");
  if (lengths == nullptr || counts == nullptr || !lengths->is_array() || !counts->is_array() ||
      lengths->size() != counts->size() || lengths->empty()) {
    throw InputError(path,
                     "a histogram is {\"lengths\": [...], \"counts\": [...]}, two arrays of "
                     "the same non-zero size");
  }
  LengthDistribution d;
  d.origin = path;
  for (std::size_t i = 0; i < lengths->size(); ++i) {
    const std::string at = fmt::format("[{}]", i);
    const std::int64_t len = json_integer((*lengths)[i], json_field(path, "lengths" + at));
    const double count = json_number((*counts)[i], json_field(path, "counts" + at));
    if (len <= 0 || len > kNoMaximum) {
      throw InputError(json_field(path, "lengths" + at), "a length is 1 to 2^40 tokens");
    }
    if (count < 0.0) {
      throw InputError(json_field(path, "counts" + at), "a count is not negative");
    }
    if (count > 0.0) {
      d.lengths.push_back(len);
      d.weights.push_back(count);
    }
  }
  if (d.lengths.empty()) {
    throw InputError(json_field(path, "counts"), "every count is zero");
  }
  return d;
}

LengthDistribution parse_length_lines(const std::string& path, const std::string& field) {
  std::stringstream text(read_text_file(path, field));
  LengthDistribution d;
  d.origin = path;
  std::string line;
  for (int number = 1; std::getline(text, line); ++number) {
    const std::string t = trimmed(line);
    if (t.empty() || t.front() == '#') {
      continue;
    }
    d.lengths.push_back(parse_length(t, fmt::format("{}:{}", path, number)));
    d.weights.push_back(1.0);
  }
  if (d.lengths.empty()) {
    throw InputError(path, "no document lengths in the file (one length a line)");
  }
  return d;
}

}  // namespace

double LengthDistribution::mean_tokens() const {
  if (kind == Kind::kLognormal) {
    return median_tokens * std::exp(sigma * sigma / 2.0);
  }
  double sum = 0.0, total = 0.0;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    sum += weights[i] * static_cast<double>(lengths[i]);
    total += weights[i];
  }
  return sum / total;
}

LengthDistribution parse_length_distribution(const std::string& value, const std::string& field) {
  if (value.starts_with("lognormal:")) {
    return parse_lognormal(value, field);
  }
  if (value.find(':') != std::string::npos && value.find('/') == std::string::npos &&
      value.find('.') == std::string::npos) {
    throw InputError(field, fmt::format("unknown distribution '{}' (lognormal:median=..,sigma=.. "
                                        "or a file of lengths)",
                                        value.substr(0, value.find(':'))));
  }
  if (value.ends_with(".json")) {
    return parse_histogram(value, field);
  }
  return parse_length_lines(value, field);
}

DocumentSampler::DocumentSampler(const LengthDistribution& lengths, std::uint64_t seed)
    : lengths_(&lengths), engine_(seed) {
  double sum = 0.0;
  for (const double w : lengths.weights) {
    sum += w;
    cumulative_.push_back(sum);
  }
}

double DocumentSampler::uniform() {
  return static_cast<double>(engine_() >> 11) * 0x1.0p-53;
}

std::int64_t DocumentSampler::next() {
  if (lengths_->kind == LengthDistribution::Kind::kLognormal) {
    // Box–Muller: one standard normal from two uniforms (1 − u keeps the logarithm finite).
    const double u1 = 1.0 - uniform();
    const double u2 = uniform();
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    const double tokens = std::round(lengths_->median_tokens * std::exp(lengths_->sigma * z));
    const double clamped = std::clamp(tokens, 1.0, static_cast<double>(lengths_->max_tokens));
    return static_cast<std::int64_t>(clamped);
  }
  const double u = uniform() * cumulative_.back();
  const auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), u);
  const auto i = std::min<std::size_t>(static_cast<std::size_t>(it - cumulative_.begin()),
                                       cumulative_.size() - 1);
  return lengths_->lengths[i];
}

const char* to_string(Packing p) {
  switch (p) {
    case Packing::kConcat:
      return "concat";
    case Packing::kGreedy:
      return "greedy";
    case Packing::kFirstFit:
      return "first-fit";
  }
  return "?";
}

Packing parse_packing(const std::string& text, const std::string& field) {
  for (const Packing p : {Packing::kConcat, Packing::kGreedy, Packing::kFirstFit}) {
    if (text == to_string(p)) {
      return p;
    }
  }
  throw InputError(field, fmt::format("unknown packing '{}' (concat, greedy, first-fit)", text));
}

std::int64_t PackedSequence::real_tokens() const {
  std::int64_t sum = 0;
  for (const std::int64_t n : documents) {
    sum += n;
  }
  return sum;
}

std::int64_t PackedSequence::span(std::size_t d) const {
  return (documents[d] + span_multiple - 1) / span_multiple * span_multiple;
}

namespace {

std::int64_t rounded(std::int64_t tokens, std::int64_t multiple) {
  return (tokens + multiple - 1) / multiple * multiple;
}

// A sequence being filled: its documents and the tokens its spans leave free.
struct OpenSequence {
  PackedSequence sequence;
  std::int64_t free_tokens = 0;
};

}  // namespace

std::vector<PackedSequence> pack_documents(DocumentSampler& sampler,
                                           std::int64_t sequence_tokens,
                                           std::int64_t span_multiple,
                                           Packing packing,
                                           int count) {
  std::vector<PackedSequence> out;
  out.reserve(static_cast<std::size_t>(std::max(count, 0)));
  auto open = [&] { return OpenSequence{PackedSequence{{}, span_multiple}, sequence_tokens}; };
  // The next document a packing that drops the ones longer than the sequence keeps.
  auto next_kept = [&] {
    for (int dropped = 0; dropped < 10000; ++dropped) {
      if (const std::int64_t tokens = sampler.next(); tokens <= sequence_tokens) {
        return tokens;
      }
    }
    throw InputError("lengths", fmt::format("10000 documents in a row are longer than the "
                                            "sequence ({} tokens) and dropped by {} packing",
                                            sequence_tokens, to_string(packing)));
  };
  auto place = [&](OpenSequence& s, std::int64_t tokens) {
    s.sequence.documents.push_back(tokens);
    s.free_tokens -= rounded(tokens, span_multiple);
  };
  if (packing == Packing::kFirstFit) {
    std::deque<OpenSequence> window;
    while (static_cast<int>(out.size()) < count) {
      const std::int64_t tokens = next_kept();
      const std::int64_t span = rounded(tokens, span_multiple);
      auto fits = std::find_if(window.begin(), window.end(),
                               [&](const OpenSequence& s) { return s.free_tokens >= span; });
      if (fits == window.end()) {
        if (static_cast<int>(window.size()) == kFirstFitWindow) {
          out.push_back(std::move(window.front().sequence));
          window.pop_front();
        }
        window.push_back(open());
        fits = window.end() - 1;
      }
      place(*fits, tokens);
    }
    return out;
  }
  OpenSequence current = open();
  std::int64_t pending = 0;  // tokens of the current document not placed yet
  while (static_cast<int>(out.size()) < count) {
    if (pending == 0) {
      pending = packing == Packing::kGreedy ? next_kept() : sampler.next();
    }
    if (rounded(pending, span_multiple) <= current.free_tokens) {
      place(current, pending);
      pending = 0;
    } else if (packing == Packing::kConcat && current.free_tokens > 0) {
      // The cut falls inside the document: its head ends this sequence, its tail (a document of
      // its own to the mask) opens the next one.
      const std::int64_t head = current.free_tokens;
      place(current, head);
      pending -= head;
    }
    if (current.free_tokens == 0 || pending > 0) {
      out.push_back(std::move(current.sequence));
      current = open();
    }
  }
  return out;
}

}  // namespace cpsim::models
