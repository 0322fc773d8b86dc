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

// Bilinear resampling of a CHW uint8 image with half-pixel centres (src = (dst + 0.5) * scale
// - 0.5, clamped at the borders), computed in double and rounded to nearest.
std::vector<uint8_t> resize_bilinear(const uint8_t* src, int c, int h, int w, int out_h, int out_w);

// Resize (shorter side) then centre crop, as ImageGeometry describes; DataError naming `path`
// when the image is smaller than the crop.
DecodedImage apply_geometry(DecodedImage img, const ImageGeometry& g, const std::string& path);

// Runs fn(i) for i in [0, n) on up to hardware_concurrency threads. Each i writes only its own
// output, so results do not depend on the schedule; if any fn throws, the exception of the
// lowest index is rethrown (so the reported error does not depend on timing either).
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

// Decodes `paths` in parallel, applies the geometry, and stacks them into ds.images; every image
// must end at the same size (DataError naming the first file that differs). Sets channels,
// height, width and n.
void decode_into(Dataset& ds, const std::vector<std::string>& paths, const ImageGeometry& g);

}  // namespace ditto::detail
