// Rendered text for the OCR task: a line of text drawn with FreeType from
// the DejaVu fonts into a small grayscale image, at a random size and
// position, dark on light or light on dark, with Gaussian noise.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/data/image_io.h"

namespace moetron::data {

struct OcrOptions {
  int64_t height = 16, width = 64;              // image [height, width, 1]
  int min_pixel_size = 9, max_pixel_size = 14;  // FreeType em size in pixels
  double max_noise = 12;  // noise standard deviation drawn in [0, max_noise] (0-255 scale)
};

// The fonts-dejavu-core faces (Sans, Sans-Bold, Serif, Serif-Bold, SansMono,
// SansMono-Bold) found under `font_dir`; throws naming the folder when none is.
std::vector<std::string> dejavu_fonts(
    const std::string& font_dir = "/usr/share/fonts/truetype/dejavu");

// One FreeType library with the given faces loaded. Not thread-safe (one
// renderer per thread).
class TextRenderer {
 public:
  explicit TextRenderer(const std::vector<std::string>& font_paths);  // throws naming a bad font
  ~TextRenderer();
  TextRenderer(const TextRenderer&) = delete;
  TextRenderer& operator=(const TextRenderer&) = delete;
  int64_t num_fonts() const;

  // Glyph coverage (0-255) of `text` (printable ASCII) in font `font` at
  // `pixel_size`, cropped to its ink: [rows, cols] row-major.
  struct Coverage {
    int64_t rows = 0, cols = 0;
    std::vector<uint8_t> alpha;
  };
  Coverage render_line(const std::string& text, int64_t font, int pixel_size) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// An OCR image of `text` with random font, size, position, polarity and
// noise from `rng`, or nullopt when the text does not fit at the drawn size.
std::optional<Image> render_ocr_image(const TextRenderer& renderer, const std::string& text,
                                      PhiloxStream& rng, const OcrOptions& opts);

}  // namespace moetron::data
