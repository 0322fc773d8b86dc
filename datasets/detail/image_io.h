// Internal: file reading, JPEG decoding (libjpeg-turbo behind a setjmp/longjmp error manager),
// the bilinear resampler and a deterministic parallel loop, shared by the image loaders.
// Not installed; public headers never see libjpeg.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "datasets/dataset.h"

namespace ditto::detail {

// Whole file into memory; IoError naming the path when it cannot be opened or read.
std::vector<uint8_t> read_file_bytes(const std::string& path);

struct DecodedImage {
  int channels = 0, height = 0, width = 0;
  std::vector<uint8_t> pixels;  // CHW
};

// Decodes a JPEG held in memory to 3-channel CHW (grayscale is replicated into R, G, B).
// Any libjpeg error or warning (truncation, corrupt entropy data) becomes DataError naming
// `path` and the byte offset the decoder had reached. CMYK/YCCK are rejected.
DecodedImage decode_jpeg(const std::string& path, const std::vector<uint8_t>& bytes);
DecodedImage decode_jpeg_file(const std::string& path);
// The same with libjpeg's DCT-domain scaling: scale_denom(height, width) gets the header's size
// and returns 1, 2, 4 or 8; the image is decoded at ceil(size / denom) (faster, and the
// downscaling is libjpeg's own IDCT, deterministic for a given libjpeg build).
DecodedImage decode_jpeg(const std::string& path, const std::vector<uint8_t>& bytes,
                         const std::function<int(int height, int width)>& scale_denom);

// One output coordinate's bilinear taps along an axis: rows (or columns) i0 and i1 = min(i0 + 1,
// size - 1) weighted 1 - t and t, from the source position pos (clamped to [0, size - 1]).
struct Tap {
  int i0 = 0, i1 = 0;
  double t = 0;
};
Tap bilinear_tap(double pos, int size);
// out[c][y][x] = bilinear sample at (ys[y], xs[x]), in double, rounded to nearest uint8: the one
// sampler behind resize_bilinear and the streaming loader's crops.
void sample_bilinear(const uint8_t* src, int c, int h, int w, const std::vector<Tap>& ys, const std::vector<Tap>& xs,
                     uint8_t* out);

// Bilinear resampling of a CHW uint8 image with half-pixel centres (src = (dst + 0.5) * scale
// - 0.5, clamped at the borders), computed in double and rounded to nearest.
std::vector<uint8_t> resize_bilinear(const uint8_t* src, int c, int h, int w, int out_h, int out_w);

// Resize (shorter side) then centre crop, as ImageGeometry describes; DataError naming `path`
// when the image is smaller than the crop.
DecodedImage apply_geometry(DecodedImage img, const ImageGeometry& g, const std::string& path);

// The images of an image folder, root/<split>/<class>/*.jpg|*.jpeg (load_image_folder's rules),
// without decoding them: file paths, labels and class names (sorted by name), ds.name, ds.n and
// num_classes set. DataError / IoError as load_image_folder.
std::vector<std::string> list_image_folder(const std::string& root, const std::string& split, Dataset& ds);

// Runs fn(i) for i in [0, n) on up to hardware_concurrency threads. Each i writes only its own
// output, so results do not depend on the schedule; if any fn throws, the exception of the
// lowest index is rethrown (so the reported error does not depend on timing either).
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

// Decodes `paths` in parallel, applies the geometry, and stacks them into ds.images; every image
// must end at the same size (DataError naming the first file that differs). Sets channels,
// height, width and n.
void decode_into(Dataset& ds, const std::vector<std::string>& paths, const ImageGeometry& g);

}  // namespace ditto::detail
