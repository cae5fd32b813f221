#include "moetron/data/image_io.h"

#include <png.h>

#include <cstring>

#include "moetron/core/error.h"

namespace moetron::data {

namespace {

png_uint_32 format_for(int64_t channels, const std::string& path) {
  MOETRON_CHECK(channels == 1 || channels == 3, "image for '", path,
                "' must have 1 (gray) or 3 (RGB) channels, got ", channels);
  return channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
}

}  // namespace

void write_png(const std::string& path, const Image& image) {
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = format_for(image.channels, path);
  MOETRON_CHECK(
      image.height > 0 && image.width > 0 &&
          image.pixels.size() == static_cast<size_t>(image.height * image.width * image.channels),
      "image for '", path, "' has ", image.pixels.size(), " bytes, not ", image.height, " x ",
      image.width, " x ", image.channels);
  const int ok = png_image_write_to_file(&png, path.c_str(), 0, image.pixels.data(), 0, nullptr);
  const std::string message = png.message;
  png_image_free(&png);
  MOETRON_CHECK(ok, "cannot write PNG '", path, "': ", message);
}

Image read_png(const std::string& path, int64_t channels) {
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&png, path.c_str())) {
    const std::string message = png.message;
    png_image_free(&png);
    MOETRON_FAIL("cannot read PNG '", path, "': ", message);
  }
  png.format = format_for(channels, path);
  Image image;
  image.height = png.height;
  image.width = png.width;
  image.channels = channels;
  image.pixels.resize(PNG_IMAGE_SIZE(png));
  // An opaque output format: alpha is composited onto this background.
  const png_color black{0, 0, 0};
  const int ok = png_image_finish_read(&png, &black, image.pixels.data(), 0, nullptr);
  const std::string message = png.message;
  png_image_free(&png);
  MOETRON_CHECK(ok, "cannot read PNG '", path, "': ", message);
  return image;
}

}  // namespace moetron::data
