// PNG files read and written through libpng (its simplified png_image API):
// the images of the multimodal tasks exported for a person to look at, and
// the images `moetron generate --image F.png` reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moetron::data {

// An 8-bit image, row-major [height, width, channels] (channels 1: gray, 3: RGB).
struct Image {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;  // height * width * channels
};

// Writes `image` (channels 1 or 3) as an 8-bit PNG; throws moetron::Error
// naming the path when it cannot be written.
void write_png(const std::string& path, const Image& image);

// Reads any PNG (palette, 16-bit, alpha and interlaced ones included) as
// 8-bit pixels with `channels` channels: 1 (converted to gray) or 3 (RGB);
// alpha is composited onto black. Throws moetron::Error naming the path when
// the file is missing or not a valid PNG.
Image read_png(const std::string& path, int64_t channels = 3);

}  // namespace moetron::data
