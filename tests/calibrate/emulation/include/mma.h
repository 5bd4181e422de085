// Emulation stand-in for the CUDA header of this name (see ../cuda_emulation.hpp).
#pragma once
#include "../cuda_emulation.hpp"
