#pragma once
// The model layer: layer concept, built-in layers, Stage, Pipeline, losses (compile time).

#include "gpipe/model/activation.hpp"
#include "gpipe/model/attention.hpp"
#include "gpipe/model/checkpoint.hpp"
#include "gpipe/model/cost.hpp"
#include "gpipe/model/embedding.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/layer.hpp"
#include "gpipe/model/layer_norm.hpp"
#include "gpipe/model/linear.hpp"
#include "gpipe/model/loss.hpp"
#include "gpipe/model/names.hpp"
#include "gpipe/model/pipeline.hpp"
#include "gpipe/model/residual.hpp"
#include "gpipe/model/stage.hpp"
#include "gpipe/model/transformer.hpp"
