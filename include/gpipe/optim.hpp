#pragma once
// Optimizers, applied by the Trainer on each stage's own device.

#include "gpipe/optim/adamw.hpp"
#include "gpipe/optim/sgd.hpp"
