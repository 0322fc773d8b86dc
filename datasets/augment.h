// Data order and augmentation as pure functions of seeds, epoch and example index: the Loader
// calls exactly these, so any batch can be recomputed directly (and replayed) without the
// Loader, and nothing depends on threads or timing. Random words come from Philox
// (engine/philox.h), each purpose in a stream of its own.
#pragma once
#include <cstdint>
#include <vector>

namespace ditto {

struct Dataset;
struct LoaderOptions;

// Fisher–Yates shuffle of [0, n) driven by Philox keyed by seed_order, counter (step, epoch):
// step i (from n-1 down to 1) swaps i with j = r mod (i+1), r a 64-bit Philox word (modulo bias
// below n / 2^64).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed_order, int epoch);

// One example's augmentation: crop offset (dx, dy) in [0, 2*pad] into the zero-padded image,
// then a horizontal flip. Drawn from Philox keyed by seed_augment, counter (index, epoch).
struct AugmentDraw {
  int dx = 0, dy = 0;
  bool flip = false;
  bool operator==(const AugmentDraw& o) const { return dx == o.dx && dy == o.dy && flip == o.flip; }
};
AugmentDraw augment_draw(uint64_t seed_augment, int epoch, int64_t index, int pad, bool flip);

// dst[c][y][x] = padded[c][y + dy][x' + dx] where padded is src with `pad` zero pixels on
// every side and x' = (flip ? w-1-x : x). Same size as src (uint8 CHW).
void augment_image(const uint8_t* src, int c, int h, int w, int pad, const AugmentDraw& d, uint8_t* dst);

// tf.image.per_image_standardization on x = pixel / 255: (x - mean) / max(std, 1/sqrt(numel)),
// mean and (population) std over the whole image in double, result rounded to float.
void standardize_image(const uint8_t* src, int64_t numel, float* dst);

// The normalization step of prepare_example on an 8-bit CHW image of c planes of `plane` pixels:
// per-image standardization, or ((pixel / 255) - mean[c]) / std[c] in double, rounded to float.
void normalize_example(const uint8_t* src, int c, int64_t plane, const LoaderOptions& opts, float* dst);

// The full per-example pipeline the Loader runs (a streamed data set's source runs its own
// transform, then normalize_example): augmentation (when opts.augment), then either
// per-image standardization or ((pixel / 255) - mean[c]) / std[c] per channel (mean 0, std 1
// when not given), evaluated in double and rounded to float. Writes image_numel floats.
void prepare_example(const Dataset& ds, int64_t index, int epoch, const LoaderOptions& opts, float* dst);

}  // namespace ditto
