// ditto's experiments layer (link ditto::experiments): the training loop and one training step,
// the paper's ensemble protocols and their reports, statistics, traces, and the noise lab's
// attribution and first-divergence search, and two runs' kernel choices compared. Includes <ditto/ditto.h>. report.h hands reports over
// as nlohmann::json, so a consumer needs that header library (the package config finds it).
#pragma once
#include "ditto.h"

#include "experiments/attribute.h"
#include "experiments/data_parallel.h"
#include "experiments/decomposition.h"
#include "experiments/diverge.h"
#include "experiments/ensemble.h"
#include "experiments/kernel_choices.h"
#include "experiments/report.h"
#include "experiments/run_dir.h"
#include "experiments/stats.h"
#include "experiments/step.h"
#include "experiments/task_scoring.h"
#include "experiments/trace.h"
#include "experiments/train.h"
