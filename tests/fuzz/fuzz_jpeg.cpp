// JPEG decoding (libjpeg-turbo behind ditto's error manager), then the image-folder geometry
// (resize and centre crop) on whatever decoded.
#include "datasets/detail/image_io.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  fuzz::expect_success_or_error([&] {
    ditto::detail::DecodedImage img = ditto::detail::decode_jpeg("fuzz.jpg", bytes);
    if (static_cast<int64_t>(img.height) * img.width > (1 << 20)) return;  // geometry cost, not a finding
    ditto::ImageGeometry g;
    g.resize = 24;
    g.crop = 16;
    ditto::detail::apply_geometry(std::move(img), g, "fuzz.jpg");
  });
  return 0;
}
