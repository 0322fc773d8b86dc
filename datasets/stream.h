// Streamed image folders (ImageNet-style): root/<split>/<class>/*.jpg of any size, listed once
// and decoded on the fly by the Loader's worker threads, never held in memory as a whole.
//
// Each example is made from its file by one of two transforms, both a bilinear crop-and-resize to
// size x size (8-bit, rounded, as load_image_folder's geometry), then the Loader's normalization:
//   training (LoaderOptions::augment)   torchvision's RandomResizedCrop(size, scale, ratio) +
//       RandomHorizontalFlip: up to ten draws of an area fraction in [scale_min, scale_max] and a
//       log-uniform aspect ratio in [ratio_min, ratio_max]; the first box that fits gives the crop
//       (an offset drawn uniformly), else the centre crop of the clamped ratio. Every draw is
//       Philox keyed by (seed_augment, epoch, index), so a batch's bits do not depend on the
//       number of worker threads, their timing, or which rank's loader makes it.
//   evaluation (otherwise)   resize the shorter side to `resize`, centre crop size x size — with
//       dct_scaling off, bitwise load_image_folder(root, split, {resize, size}).
// With dct_scaling, a file whose crop covers at least 2x, 4x or 8x the output size is decoded by
// libjpeg at 1/2, 1/4 or 1/8 scale (its IDCT downscales; the choice depends on the file's size and
// the crop box alone): faster, deterministic, but other bits than full decoding.
// Read-ahead: the Loader prepares up to threads + 1 batches ahead (LoaderOptions::threads).
// Bilinear without antialiasing (torchvision's PIL path antialiases: expect small differences).
// Corrupt or truncated files are DataErrors naming the file, raised where the batch is used.
//
// This header is installed: it pulls in no libjpeg, fmt or json headers.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "datasets/dataset.h"

namespace ditto {

struct LoaderOptions;

struct StreamTransform {
  int size = 224;                                  // output height and width
  int resize = 256;                                // evaluation: shorter side before the centre crop
  double scale_min = 0.08, scale_max = 1.0;        // training: crop area as a fraction of the image
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // training: crop aspect ratio (width / height)
  bool dct_scaling = true;                         // decode large files at 1/2, 1/4, 1/8 when enough
  // Normalization the trainer uses for streamed data (computing it would decode every file):
  // ImageNet's channel mean and standard deviation on the [0, 1] scale.
  std::vector<float> mean = {0.485f, 0.456f, 0.406f}, std = {0.229f, 0.224f, 0.225f};
};

// A training crop: rows [y, y + h), columns [x, x + w) of the source image, mirrored when flip.
// draws: how many of the ten draws were made (11: none fitted, the centre fallback).
struct CropBox {
  int y = 0, x = 0, h = 0, w = 0;
  bool flip = false;
  int draws = 0;
  bool operator==(const CropBox& o) const {
    return y == o.y && x == o.x && h == o.h && w == o.w && flip == o.flip && draws == o.draws;
  }
};
// RandomResizedCrop's box for an image of height x width, drawn from Philox keyed by
// (seed_augment, epoch, index); flip drawn too when `flip`.
CropBox random_resized_crop(uint64_t seed_augment, int epoch, int64_t index, int height, int width,
                            const StreamTransform& t, bool flip);

// What a Dataset holds instead of decoded images when it is streamed (Dataset::source).
class ImageSource {
 public:
  virtual ~ImageSource() = default;
  virtual int64_t size() const = 0;
  // Example `index` of `epoch` as the Loader wants it (channels x size x size floats): the
  // training transform when opts.augment (with opts.flip), else the evaluation one; then
  // opts's normalization (normalize_example, datasets/augment.h).
  virtual void prepare(int64_t index, int epoch, const LoaderOptions& opts, float* dst) const = 0;
  // The evaluation view as 8-bit CHW (report thumbnails).
  virtual std::vector<uint8_t> eval_image(int64_t index) const = 0;
  // Over the files' relative paths and contents and the transform: two files swapped between
  // classes, or one replaced by another of the same size, change it. The first call reads every
  // file once (XXH3 hashes far faster than a disk reads); the value is kept for later calls.
  virtual Fingerprint fingerprint() const = 0;
  virtual ChannelStats stats() const = 0;  // the transform's mean / std
  virtual std::shared_ptr<const ImageSource> first(int64_t n) const = 0;
  virtual std::string describe() const = 0;
};

// Lists root/<split>/<class>/*.jpg (load_image_folder's rules: classes and files sorted by name,
// other image formats refused) without decoding: a Dataset of n examples, 3 x size x size,
// with labels and class names and `source` set. DataError / IoError naming the folder or file;
// Error for a transform out of range (size < 1, resize < size, scales or ratios not increasing
// and positive, scale_max > 1, mean/std not three positive values).
Dataset stream_image_folder(const std::string& root, const std::string& split, const StreamTransform& t = {});

}  // namespace ditto
