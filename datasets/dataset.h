// Datasets held in memory, decoded once: images as uint8 NCHW, labels int32, optional
// per-example subgroup ids (for per-subgroup metrics). Every loader checks its input and
// throws DataError naming the file and the byte offset (binary files) or line (text files)
// for truncated or corrupt input and for labels out of range, and IoError for a file that
// cannot be opened. Nothing here depends on threads or timing: the same files give the same
// bytes.
//
// This header is installed: it pulls in no libjpeg, zlib, fmt or json headers.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/fingerprint.h"
#include "engine/task_kind.h"

namespace ditto {

class ImageSource;  // datasets/stream.h

struct ChannelStats {
  // Per channel, over every pixel of every image, on the [0, 1] scale (pixel / 255): the
  // scale LoaderOptions::mean / std are given in. std is the population standard deviation.
  std::vector<float> mean, std;
};

struct Dataset {
  std::string name;                    // e.g. "cifar10/train"
  int64_t n = 0;                       // number of examples
  int channels = 0, height = 0, width = 0;
  std::vector<uint8_t> images;         // n * channels * height * width, NCHW
  std::vector<int32_t> labels;         // n, each in [0, num_classes)
  int num_classes = 0;
  std::vector<std::string> class_names;     // num_classes entries
  std::vector<int32_t> subgroups;           // empty, or n ids in [0, subgroup_names.size())
  std::vector<std::string> subgroup_names;  // e.g. "Male=0", "Male=1"
  // What the targets are for (engine/task_kind.h). Classification: the labels are the targets.
  // Segmentation: targets hold one class per pixel (target_length = height * width per example,
  // each in [0, num_classes)); labels hold each image's main class. Sequence: targets hold each
  // example's symbols, each in [1, num_classes) (0 is the CTC blank), padded after its last symbol
  // with 0 to target_length; labels hold each sequence's length (so class_counts counts lengths).
  Task task = Task::Classification;
  int target_length = 0;                    // targets per example; 0 for classification
  std::vector<int32_t> targets;             // n * target_length
  // > 0: a categorical dataset. Each "image" (1 channel, height 1, width = the number of fields)
  // holds one category id per field, each in [0, categories); the loader hands a net these ids as
  // i32 {N, fields} rather than normalized pixels.
  int categories = 0;

  // A streamed data set (datasets/stream.h) has no `images`: each example is decoded when a
  // Loader asks for it, at channels x height x width. The statistics, fingerprint and take_first
  // below ask the source.
  std::shared_ptr<const ImageSource> source;

  int64_t size() const { return n; }
  int64_t image_numel() const { return int64_t(channels) * height * width; }
  // Example i's pixels; Error for a streamed data set (use source->eval_image).
  const uint8_t* image(int64_t i) const;
  const int32_t* target(int64_t i) const { return targets.data() + i * target_length; }
  // A sequence example's length: its symbols before the first 0 of its targets.
  int sequence_length(int64_t i) const;
  bool has_subgroups() const { return !subgroups.empty(); }
  bool streamed() const { return source != nullptr; }

  // Per-channel mean / std on the [0, 1] scale, accumulated in double in index order (a streamed
  // data set's source says them: datasets/stream.h).
  ChannelStats channel_stats() const;
  // Examples per class (num_classes entries) and per subgroup (empty without subgroups).
  std::vector<int64_t> class_counts() const;
  std::vector<int64_t> subgroup_counts() const;
  // One line: name, count, shape, classes with counts, subgroups with counts, fingerprint.
  std::string summary() const;
  // XXH3-128 (engine/fingerprint.h) of the images (a streamed source's own fingerprint), labels,
  // subgroups, the task with its target length and categories, and the targets.
  Fingerprint fingerprint() const;
  // Throws DataError when the sizes disagree or a label / subgroup id / target / category id is out
  // of range.
  void validate() const;
};

enum class Split { Train, Val, Test };
const char* split_name(Split s);

// CIFAR-10 binary release: dir/data_batch_1.bin .. data_batch_5.bin (Train) or
// dir/test_batch.bin (Test). Record = 1 label byte + 3072 bytes (R, G, B planes of 32x32).
Dataset load_cifar10(const std::string& dir, Split split);

// CIFAR-100 binary release: dir/train.bin or dir/test.bin. Record = coarse label byte + fine
// label byte + 3072 bytes. Class names come from fine_label_names.txt / coarse_label_names.txt
// in dir when present, else "fine_<k>" / "coarse_<k>".
enum class Cifar100Labels { Fine, Coarse };
Dataset load_cifar100(const std::string& dir, Split split, Cifar100Labels which = Cifar100Labels::Fine);

// Optional geometry for decoded JPEGs: resize so the shorter side is `resize` pixels (bilinear,
// half-pixel centres, no antialiasing), then centre-crop `crop` x `crop` (offset floor((h-crop)/2)).
// 0 leaves that step out. After it every image must have the same size (DataError otherwise).
struct ImageGeometry {
  int resize = 0;
  int crop = 0;
};

// Image folder: root/<split>/<class>/**/*.jpg|*.jpeg (case-insensitive). Classes are the
// subdirectories sorted by name; a class holds the images anywhere below its folder (as in
// torchvision's ImageFolder), hidden folders left out, sorted by path. Grayscale JPEGs are
// expanded to 3 channels. Other image formats (png, bmp, gif, webp) are rejected with DataError
// rather than skipped; files with other extensions are ignored. Decoding uses every core;
// the result does not depend on it. An empty split names root itself.
Dataset load_image_folder(const std::string& root, const std::string& split, ImageGeometry geometry = {});

// CelebA: root/img_align_celeba/*.jpg, root/list_attr_celeba.txt (count line, attribute-name
// line, then "file ±1 ..."), root/list_eval_partition.txt ("file 0|1|2" = train/val/test).
// label = 1 where label_attribute is +1. The subgroup attributes form one subgroup id
// sum_k bit_k << k (bit_k = attribute k is +1), named like "Male=1" or "Male=1,Young=0".
// Examples keep the order of the attribute file.
struct CelebAOptions {
  std::string label_attribute = "Blond_Hair";
  std::vector<std::string> subgroup_attributes = {"Male"};
  ImageGeometry geometry{};
};
Dataset load_celeba(const std::string& root, Split split, const CelebAOptions& options = {});

// MNIST IDX: dir/train-images-idx3-ubyte + train-labels-idx1-ubyte (Train) or t10k-* (Test),
// each read as given or, when absent, with a .gz suffix (read through zlib). Magic numbers
// (2051 images, 2049 labels), counts and sizes are checked; labels must be < 10. Offsets in
// errors for .gz files count bytes of the decompressed stream.
Dataset load_mnist(const std::string& dir, Split split);

// Procedural, class-dependent images of any size. Class k is an oriented sinusoid grating
// (orientation pi*k/K, two spatial frequencies alternating with k) with per-example random
// orientation jitter (+-1.5 class spacings, so classes overlap), frequency jitter, colour,
// phase, contrast, a random distractor blob and pixel noise, all drawn from Philox keyed by
// (seed, example index). No classifier reaches 100%: there are examples near the decision
// boundary, where run-to-run noise shows as churn. The class
// parameters do not depend on the seed, so a train set and a test set made with different
// seeds share one distribution. Labels are index % num_classes. Deterministic for a seed
// (the pattern is computed in double and rounded to uint8).
Dataset make_synthetic(int64_t n, int num_classes, int channels, int height, int width, uint64_t seed);

// ---- Datasets derived from digit images (datasets/digits.cpp), for the networks of the other
// task kinds (nets/detail/tasks.h). Every random choice is drawn from Philox keyed by (seed, example
// index), in a stream of each generator's own, and images are computed in double and rounded, so
// a generator's output is a pure function of its inputs and seed.

// Procedural MNIST stand-ins (the built-in synthetic variants): 1x28x28 uint8, ink 0..255 on a
// background of 0 like MNIST's, label index % 10. Digit k is drawn as the segments a seven-segment
// display lights for k, as anti-aliased strokes of random thickness (2 to 3.5 px) in a box of random
// size (10-14 x 16-20 px) with random slant (+-0.25) and offset (+-2 px) and random ink
// (200-255). Deterministic for a seed.
Dataset make_synthetic_digits(int64_t n, uint64_t seed);

// The ink threshold of digit segmentation: a pixel of at least this value (of 255) is ink.
// MNIST's strokes are 255 at the centre and fade out over one or two pixels; 128 keeps each stroke's
// core (13% of MNIST's pixels; 18% of the procedural digits').
constexpr int kInkThreshold = 128;

// Segmentation of digits (task segmentation): the same images, each pixel labelled 0 (background)
// or 1 + the image's digit where the pixel is ink (value >= ink_threshold). 11 classes:
// "background", "0" .. "9"; labels hold 1 + the digit. digits: 1-channel, 10 classes.
Dataset make_digit_segmentation(const Dataset& digits, int ink_threshold = kInkThreshold);

// The spatial transformer's data (classification): each digit rotated by an angle uniform in
// [-max_degrees, max_degrees] about its centre and translated to a uniform position (continuous,
// the whole 28x28 box inside) on a canvas x canvas black image; bilinear sampling of the source
// (zero outside it), in double. Labels and classes are the digits'. canvas >= the digits' sides.
Dataset make_rotated_translated(const Dataset& digits, int canvas, double max_degrees, uint64_t seed);
constexpr int kStnCanvas = 40;         // the side the stn network takes (nets/nets.h)
constexpr double kStnMaxDegrees = 45;

// Digit strings (task sequence): n images of height 28 and width 24 * max_length. Example i has a
// length L uniform in 1..max_length and L digits, each a uniformly drawn image of `digits`; digit k
// is pasted (its columns 2..25, which hold every MNIST digit's ink) at x = start + 24 k + jitter,
// start uniform in [0, width - 24 L] and jitter uniform in [-2, 2]; overlapping pixels keep the
// larger value. Targets: 1 + each digit, then 0 up to max_length. 11 classes: "blank", "0" .. "9";
// labels hold L. digits: 1x28x28, 10 classes.
Dataset make_digit_strings(const Dataset& digits, int64_t n, int max_length, uint64_t seed);
constexpr int kStringMaxLength = 3;    // 28 x 72 images: ctc-cnn decodes 9 columns

// Categorical data for the embedding-bag model (classification, categorical): n examples of
// `fields` binary features and a binary label. Field j is 1 with probability 0.2 + 0.6 * frac(0.37 j)
// (fixed per field); the label is 1 where sum_j w_j (2 x_j - 1) + noise > 0, with weights w_j =
// (1.5, -1.2, 1.0, -0.8, 0.6, -0.4, 0.3, ...) (a fixed, decaying sequence, zero after the eighth
// field) and noise uniform in [-1.5, 1.5], so no classifier reaches 100%. Ids: field j with value b
// is category 2 j + b (categories = 2 * fields). Class names "label=0", "label=1". The field
// parameters do not depend on the seed: train and test sets made with different seeds share one
// distribution.
Dataset make_synthetic_attributes(int64_t n, int fields, uint64_t seed);
constexpr int kCelebAFields = 39;      // CelebA's 40 attributes less the one predicted

// CelebA's attributes alone (no images are read), for the embedding-bag model: every attribute
// but options.label_attribute is a field (in the file's order), attribute value +1 / -1 as 1 / 0,
// category 2 j + value; labels and subgroups as load_celeba. The same files and checks as
// load_celeba but img_align_celeba/ is not needed.
Dataset load_celeba_attributes(const std::string& root, Split split, const CelebAOptions& options = {});

// A CHW uint8 image (1 channel: grayscale, 3: RGB) as a baseline JPEG in memory, libjpeg-turbo's
// compressor at `quality` (1..100) without chroma subsampling: for looking at examples (the
// experiment report's thumbnails), not for training data. Throws Error for other channel
// counts, sizes or qualities.
std::vector<uint8_t> encode_jpeg(const uint8_t* chw, int channels, int height, int width, int quality = 90);

// The first n examples (0 <= n <= ds.n, Error otherwise), class names and subgroups kept.
Dataset take_first(const Dataset& ds, int64_t n);

}  // namespace ditto
