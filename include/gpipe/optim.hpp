#pragma once
// Optimizers, applied by the Trainer on each stage's own device (what one provides:
// optim/optimizer.hpp).

#include "gpipe/optim/adamw.hpp"
#include "gpipe/optim/lr_schedule.hpp"
#include "gpipe/optim/optimizer.hpp"
#include "gpipe/optim/sgd.hpp"
#include "gpipe/optim/spike_guard.hpp"
