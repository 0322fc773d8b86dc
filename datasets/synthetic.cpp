// Procedural class-dependent images (see make_synthetic in dataset.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "datasets/dataset.h"
#include "engine/error.h"
#include "engine/philox.h"

namespace ditto {

namespace {
constexpr double kPi = 3.14159265358979323846;
// Uniform in [0, 1) with 32 random bits, in double.
inline double unit(uint32_t bits) { return bits * (1.0 / 4294967296.0); }
}  // namespace

Dataset make_synthetic(int64_t n, int num_classes, int channels, int height, int width, uint64_t seed) {
  if (n < 0 || num_classes < 1 || channels < 1 || height < 1 || width < 1)
    throw Error(fmt::format("make_synthetic: n={} classes={} channels={} size={}x{}: need n >= 0 and positive sizes",
                            n, num_classes, channels, height, width));
  Dataset ds;
  ds.name = fmt::format("synthetic-{}c-seed{}", num_classes, seed);
  ds.n = n;
  ds.channels = channels;
  ds.height = height;
  ds.width = width;
  ds.num_classes = num_classes;
  for (int k = 0; k < num_classes; ++k) ds.class_names.push_back(fmt::format("class_{}", k));
  ds.images.resize(static_cast<std::size_t>(n) * ds.image_numel());
  ds.labels.resize(static_cast<std::size_t>(n));

  const uint64_t key = mix_key(seed, 0x73796e7468657469ull);  // "synthetic": a stream of its own
  const double side = std::min(height, width);
  const int64_t plane = int64_t(height) * width;
  std::vector<double> grating(static_cast<std::size_t>(plane)), gauss(static_cast<std::size_t>(plane));
  for (int64_t i = 0; i < n; ++i) {
    const int k = static_cast<int>(i % num_classes);
    ds.labels[i] = k;
    const Philox4x32 r0 = philox4x32(uint64_t(i), 0, key);  // grating jitter
    const Philox4x32 r1 = philox4x32(uint64_t(i), 1, key);  // distractor blob
    // Class parameters depend on k and K only; the per-example jitter (orientation within
    // +-1.5 of the spacing between classes, frequency +-25%) makes neighbouring classes overlap,
    // so no classifier reaches 100% and replicas disagree on the ambiguous examples, as on
    // real data (a determinism study needs examples near the decision boundary).
    const double spacing = kPi / num_classes;
    const double theta = k * spacing + (unit(r0.v[0]) - 0.5) * 3.0 * spacing;
    const double cycles = (k % 2 == 0 ? 2.0 : 3.5) * (0.75 + 0.5 * unit(r0.v[2]));
    const double freq = cycles / side;
    const double phase = 2 * kPi * unit(r0.v[1]);
    const double contrast = 0.5 + 0.5 * unit(r0.v[3]);
    const double ct = std::cos(theta), st = std::sin(theta);
    // The grating's colour is random per example: colour carries no class information, so the
    // class must be read from orientation and frequency, which overlap between classes.
    const double hue = unit(philox4x32(uint64_t(i), 3, key).v[0]);
    const double bx = unit(r1.v[0]) * width, by = unit(r1.v[1]) * height;
    const double sigma = (0.08 + 0.17 * unit(r1.v[2])) * side;
    const double amp = (unit(r1.v[3]) - 0.5) * 0.6;
    uint8_t* img = ds.images.data() + i * ds.image_numel();
    // The grating and the blob's Gaussian do not depend on the channel: once per pixel.
    for (int y = 0; y < height; ++y)
      for (int x = 0; x < width; ++x) {
        const double xc = x - 0.5 * (width - 1), yc = y - 0.5 * (height - 1);
        const double dx = x - bx, dy = y - by;
        grating[y * width + x] = std::sin(2 * kPi * freq * (xc * ct + yc * st) + phase);
        gauss[y * width + x] = std::exp(-(dx * dx + dy * dy) / (2 * sigma * sigma));
      }
    // Pixel p's noise is word p%4 of Philox block p/4: each block drawn once.
    int64_t noise_block = -1;
    Philox4x32 noise{};
    for (int c = 0; c < channels; ++c) {
      // How strongly the grating shows in each channel (zero-mean grating, so the channel means
      // carry no class information either). Blob colour is random per example too.
      const double colour = channels == 1 ? 1.0 : 0.55 + 0.45 * std::cos(2 * kPi * (hue + double(c) / channels));
      const double blob_colour = unit(philox4x32(uint64_t(i), 2 + uint64_t(c) / 4, key).v[c % 4]);
      for (int64_t q = 0; q < plane; ++q) {
        const double blob = amp * blob_colour * gauss[q];
        const int64_t p = c * plane + q;
        if (p / 4 != noise_block) {
          noise_block = p / 4;
          noise = philox4x32(uint64_t(i), (1ull << 32) + uint64_t(noise_block), key);
        }
        const double v = 0.5 + 0.35 * contrast * colour * grating[q] + blob + (unit(noise.v[p % 4]) - 0.5) * 0.5;
        img[p] = static_cast<uint8_t>(std::clamp(std::lround(v * 255.0), 0L, 255L));
      }
    }
  }
  ds.validate();
  return ds;
}

}  // namespace ditto
