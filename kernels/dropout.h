// Inverted dropout with a counter-based mask: replayable, identical on CPU and GPU.
//
// The mask is a pure function of (seed, step, layer, element index): with
// key = dropout_key(seed, step, layer), element i draws r = philox4x32(i / 4, 0, key).v[i % 4] and
// is dropped when philox_uniform(r) < p. Kept values are multiplied by the float 1 / (1 - p), so
// the expectation is unchanged. CPU and GPU compute the same mask and the same products, bit for
// bit. Backward recomputes the mask (nothing stored): dx = dy * scale where kept, 0 where dropped.
// One thread per 4 elements, no reductions: deterministic. There is no policy knob.
//
// p = 0 or training == false: the identity (x itself is returned). p outside [0, 1): ditto::Error.
// A bf16/f16 or channels-last x (a native activation, kernels/conv2d.h) is dropped out as its f32
// NCHW widening (exact) and cast back: the same mask over the NCHW order, the product rounded once.
#pragma once
#include <cstdint>
#include <string>

#include "engine/context.h"
#include "engine/philox.h"
#include "engine/tape.h"

namespace ditto {

// The Philox key of one layer's mask at one step.
inline uint64_t dropout_key(uint64_t seed, uint64_t step, const std::string& layer) {
  return mix_key(seed, mix_key(step, hash_name(layer)));
}

Var dropout(Context& ctx, const std::string& layer, const Var& x, float p, uint64_t seed, uint64_t step,
            bool training);

}  // namespace ditto
