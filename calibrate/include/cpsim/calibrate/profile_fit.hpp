#pragma once
/// @file Turns raw calibration measurements into a hardware profile (docs/CALIBRATION.md "Fit").
/// CPU only. Every fitted coefficient is fitted in the form the simulator's cost model
/// (sim/src/cost_model.cpp) evaluates it, so the profile reproduces the measured times;
/// coefficients the raw file does not cover are copied from a base profile with their original
/// source.

#include <cstddef>
#include <string>
#include <vector>

#include "cpsim/calibrate/raw.hpp"
#include "cpsim/models/hardware.hpp"

namespace cpsim::calibrate {

/// Tile sizes of the cpsim-flash kernel (calibrate/cuda/flash_attention.cu), used for its
/// occupancy model when the base profile has no entry of that name.
inline constexpr std::int64_t kCpsimFlashBlockM = 64;
inline constexpr std::int64_t kCpsimFlashBlockN = 64;

struct FitOptions {
  /// Largest accepted hold-out MAPE (fraction) of a checked curve; see check_fit_quality.
  double max_mape = 0.15;
  /// Every k-th point (in x order, never the last) is held out, the curve refitted on the rest and
  /// the held-out times predicted. k >= 2.
  std::size_t holdout_every = 4;
  std::string profile_name = "measured";
  std::string base_name;  ///< name of the base profile, for the description
};

/// Error of one fitted curve or coefficient, as relative time errors (0.01 = 1 %).
struct CurveFit {
  std::string curve;         ///< profile JSON path, e.g. "collectives.intra_node.all_to_all"
  std::size_t samples = 0;   ///< measurements used
  double fit_mape = 0.0;     ///< predicted vs measured time over all samples, final fit
  double fit_max = 0.0;      ///< max relative error over all samples
  std::size_t held_out = 0;  ///< samples predicted by a fit that did not see them (0: none)
  double holdout_mape = 0.0;
  double holdout_max = 0.0;
  /// Checked curves count for --max-mape; informational ones (scalars, cross-checks of the
  /// occupancy model on few-head or rectangular shapes) are printed only.
  bool checked = true;
  std::string note;  ///< short remark printed with the row
  /// A measurement the fit left out, named (op, ranks, size, measured vs expected, why).
  struct Outlier {
    std::string name;
    double deviation = 0.0;  ///< measured / expected - 1
  };
  std::vector<Outlier> outliers;
  /// Error compared against the threshold: hold-out MAPE when points were held out, else fit MAPE.
  double gate_error() const { return held_out > 0 ? holdout_mape : fit_mape; }
};

/// Where an attention kernel's curves in the fitted profile come from.
struct AttentionKernelOrigin {
  std::string kernel;
  int measured_curves = 0;  ///< of the four (fwd/bwd × causal/full) fitted from samples
  int curves = 0;           ///< curves the profile has for it (4, or 0 when absent)
  std::size_t samples = 0;  ///< attention samples of this kernel in the raw files
};

struct ProfileFit {
  models::HardwareProfile profile;
  /// fa3, fa2, cudnn, sdpa, cpsim-flash, then any other kernel of the profile or the samples.
  std::vector<AttentionKernelOrigin> attention_origins;
  std::vector<CurveFit> curves;
  std::vector<std::string> notes;  ///< what was kept from the base, skipped, or looked suspicious
};

/// Fits `raw` onto a copy of `base`. Never throws for bad fit quality (see check_fit_quality).
/// @throws InputError (field names the raw sample set) when a sample set is present but cannot be
///         fitted, e.g. all collective sizes equal.
ProfileFit fit_profile(const RawCalibration& raw,
                       const models::HardwareProfile& base,
                       const FitOptions& options);

/// @throws InputError whose field is the first checked curve with gate_error() > max_mape, or
///         with an outlier off by more than max_mape (either way: a factor 1 + max_mape); the
///         message names the outlier.
void check_fit_quality(const ProfileFit& fit, double max_mape);

/// The fit table printed by `cpsim calibrate fit`.
std::string format_fit_report(const ProfileFit& fit, double max_mape);

/// Occupancy factor of the simulator's attention model (sim/src/cost_model.cpp,
/// CostModel::occupancy_factor): tiles over full waves of `sm_count` SMs, relative to the
/// published set-up (16 heads × 16K tokens per launch, tiles of `block` rows).
double attention_occupancy_factor(std::int64_t tiles, std::int64_t sm_count, std::int64_t block);

/// FLOPs of an attention call as the simulator counts them (FlashAttention convention, causal
/// mask bottom-right aligned; backward 2.5 × forward).
double attention_flops(const AttentionSample& s);

}  // namespace cpsim::calibrate
