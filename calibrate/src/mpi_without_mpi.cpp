// The MPI world of a cpsim built without MPI: --mpi explains and refuses.
#include <memory>

#include "cpsim/calibrate/mpi_run.hpp"
#include "cpsim/models/error.hpp"

namespace cpsim::calibrate {

std::unique_ptr<ProcessGroup> make_mpi_world() {
  throw InputError("--mpi",
                   "this cpsim was built without MPI (no MPI found at configure time); install "
                   "an MPI (scripts/setup.sh: libopenmpi-dev, openmpi-bin) and rebuild, or import "
                   "multi-node nccl-tests logs with `cpsim calibrate import nccl-tests`");
}

}  // namespace cpsim::calibrate
