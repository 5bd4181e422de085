#pragma once
/// @file Fits of the alpha-beta (latency-bandwidth) cost model `t = alpha + bytes / bandwidth` to
/// measured timings, and a hold-out check of such a fit (docs/MODEL.md "Compute costs",
/// docs/CALIBRATION.md). CPU only; Eigen stays inside fit.cpp.

#include <cstddef>
#include <span>

namespace cpsim::calibrate {

/// One measurement: `bytes` moved (the caller picks the convention, e.g. bytes on the wire per
/// rank, REFERENCES.md [nccl-tests]) and the time it took, in seconds.
struct TimingSample {
  double bytes;
  double time_s;
};

/// Result of `fit_alpha_beta`. Errors are relative and given as fractions (0.01 = 1 %), computed
/// over the samples the line was fitted to.
struct AlphaBetaFit {
  double alpha_s;                ///< fixed cost per operation, seconds; not clamped, may be < 0
  double bandwidth_bytes_per_s;  ///< 1 / slope; always > 0 and finite
  double mape;                   ///< mean of |predicted - measured| / measured
  double max_abs_rel_error;      ///< max of |predicted - measured| / measured
  std::size_t samples;           ///< number of samples fitted
};

/// Least-squares fit of t = alpha + bytes / bandwidth, weighted by 1/t so that relative error is
/// minimised (small and large messages count alike). The samples need not be sorted.
/// @throws InputError (field "samples") for fewer than 2 samples, a non-positive or non-finite
/// bytes
///         or time_s, all bytes equal, or a fitted bandwidth that is not positive and finite.
AlphaBetaFit fit_alpha_beta(std::span<const TimingSample> samples);

/// Error of a fit on samples it has not seen (fractions, as in `AlphaBetaFit`).
struct HoldoutError {
  double mape;
  double max_abs_rel_error;
  std::size_t held_out;  ///< number of held-out samples, `samples.size() / every_kth`
};

/// Holds out every k-th sample (k >= 2; the k-th, 2k-th, ... in the given order, i.e. 0-based
/// indices k-1, 2k-1, ...), fits on the rest with `fit_alpha_beta` and returns MAPE / max error on
/// the held-out points.
/// @throws InputError (field "every_kth") if every_kth < 2; (field "samples") if there are fewer
/// than
///         every_kth samples (nothing held out), for any invalid sample, or if the fit on the rest
///         fails.
HoldoutError holdout_error(std::span<const TimingSample> samples, std::size_t every_kth);

}  // namespace cpsim::calibrate
