// ditto's public entry point: everything a program needs to build networks with pinned kernels,
// load data, train and checkpoint (link ditto::ditto). Training runs, the paper's ensemble
// protocols and the noise lab are in <ditto/experiments.h> (link ditto::experiments).
//
//   #include <ditto/ditto.h>
//   ditto::Context ctx(ditto::Device::cuda(0), ditto::Policy::parse({"*=deterministic"}));
//   auto net = ditto::make_net(ctx, {"resnet18", 10, 3});
//   net->init(ctx, /*seed_init=*/1);
//   ditto::Var loss = ditto::softmax_cross_entropy(ctx, "loss", net->forward(ctx, ditto::Var(images), true), labels);
//   ctx.tape().backward(ctx, loss);
//
// The same include works in the source tree (the include/ folder is on ditto's include path)
// and from an installed package (find_package(ditto); the headers sit under include/ditto/).
#pragma once

// engine: tensors, contexts and their kernel policy, autodiff, optimizers, checkpoints
#include "engine/checkpoint.h"
#include "engine/collective.h"
#include "engine/context.h"
#include "engine/digest.h"
#include "engine/tensor_ops.h"
#include "engine/error.h"
#include "engine/external.h"
#include "engine/fingerprint.h"
#include "engine/graph.h"
#include "engine/knob.h"
#include "engine/loss_scale.h"
#include "engine/manifest.h"
#include "engine/optim.h"
#include "engine/param.h"
#include "engine/philox.h"
#include "engine/policy.h"
#include "engine/profiler.h"
#include "engine/tape.h"
#include "engine/task_kind.h"
#include "engine/tensor.h"
#include "engine/timer.h"
#include "engine/tracer.h"
#include "engine/tuning.h"

// kernels: one header per op family
#include "kernels/activation.h"
#include "kernels/batchnorm.h"
#include "kernels/bias.h"
#include "kernels/concat.h"
#include "kernels/conv2d.h"
#include "kernels/ctc.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/grid_sample.h"
#include "kernels/linear.h"
#include "kernels/loss.h"
#include "kernels/precision.h"
#include "kernels/metrics.h"
#include "kernels/pixel_xent.h"
#include "kernels/pool.h"
#include "kernels/reduction.h"
#include "kernels/roi_align.h"
#include "kernels/scatter.h"
#include "kernels/spmm.h"
#include "kernels/sync_batchnorm.h"
#include "kernels/upsample.h"

// nets: layers, the Net interface, make_net and the ZooNet builder
#include "nets/embedding.h"
#include "nets/module.h"
#include "nets/nets.h"
#include "nets/zoo.h"

// datasets: in-memory datasets and the seeded loader
#include "datasets/augment.h"
#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "datasets/stream.h"
