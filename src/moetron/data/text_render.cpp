#include "moetron/data/text_render.h"

#include <ft2build.h>
#include FT_FREETYPE_H

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numbers>

#include "moetron/core/error.h"

namespace moetron::data {

namespace {

uint32_t below(PhiloxStream& rng, uint32_t n) {
  return rng.next_u32() % n;
}

// Standard normal by Box-Muller from two uniforms of the stream.
double normal(PhiloxStream& rng) {
  const double u1 = 1.0 - static_cast<double>(rng.next_uniform());  // (0, 1]
  const double u2 = rng.next_uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace

std::vector<std::string> dejavu_fonts(const std::string& font_dir) {
  std::vector<std::string> out;
  for (const char* name :
       {"DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf",
        "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf"}) {
    const std::string p = font_dir + "/" + name;
    if (std::filesystem::exists(p)) out.push_back(p);
  }
  MOETRON_CHECK(!out.empty(), "no DejaVu fonts under '", font_dir,
                "' (install fonts-dejavu-core): OCR images cannot be rendered");
  return out;
}

struct TextRenderer::Impl {
  FT_Library library = nullptr;
  std::vector<FT_Face> faces;
  std::vector<std::string> paths;
  ~Impl() {
    for (FT_Face f : faces) FT_Done_Face(f);
    if (library) FT_Done_FreeType(library);
  }
};

TextRenderer::TextRenderer(const std::vector<std::string>& font_paths)
    : impl_(std::make_unique<Impl>()) {
  MOETRON_CHECK(!font_paths.empty(), "the text renderer needs at least one font");
  MOETRON_CHECK(FT_Init_FreeType(&impl_->library) == 0, "cannot initialise FreeType");
  for (const auto& p : font_paths) {
    FT_Face face = nullptr;
    MOETRON_CHECK(FT_New_Face(impl_->library, p.c_str(), 0, &face) == 0, "cannot load font '", p,
                  "'");
    impl_->faces.push_back(face);
    impl_->paths.push_back(p);
  }
}

TextRenderer::~TextRenderer() = default;

int64_t TextRenderer::num_fonts() const {
  return static_cast<int64_t>(impl_->faces.size());
}

TextRenderer::Coverage TextRenderer::render_line(const std::string& text, int64_t font,
                                                 int pixel_size) const {
  MOETRON_CHECK(font >= 0 && font < num_fonts(), "font ", font, " out of range");
  FT_Face face = impl_->faces[static_cast<size_t>(font)];
  MOETRON_CHECK(FT_Set_Pixel_Sizes(face, 0, static_cast<FT_UInt>(pixel_size)) == 0,
                "cannot set pixel size ", pixel_size, " on font '",
                impl_->paths[static_cast<size_t>(font)], "'");
  // A canvas wide enough for any glyph run, baseline 2 em from the top.
  const int64_t rows = 4 * pixel_size,
                cols = static_cast<int64_t>(text.size() + 2) * 2 * pixel_size;
  const int64_t baseline = 2 * pixel_size;
  std::vector<uint8_t> canvas(static_cast<size_t>(rows * cols), 0);
  int64_t pen = pixel_size;
  for (const char ch : text) {
    if (FT_Load_Char(face, static_cast<unsigned char>(ch), FT_LOAD_RENDER) != 0) continue;
    const FT_GlyphSlot g = face->glyph;
    for (unsigned r = 0; r < g->bitmap.rows; ++r)
      for (unsigned c = 0; c < g->bitmap.width; ++c) {
        const int64_t y = baseline - g->bitmap_top + r, x = pen + g->bitmap_left + c;
        if (y < 0 || y >= rows || x < 0 || x >= cols) continue;
        uint8_t& dst = canvas[static_cast<size_t>(y * cols + x)];
        dst = std::max(dst, g->bitmap.buffer[r * static_cast<unsigned>(g->bitmap.pitch) + c]);
      }
    pen += g->advance.x >> 6;
  }
  int64_t top = rows, bottom = -1, left = cols, right = -1;
  for (int64_t y = 0; y < rows; ++y)
    for (int64_t x = 0; x < cols; ++x)
      if (canvas[static_cast<size_t>(y * cols + x)]) {
        top = std::min(top, y), bottom = std::max(bottom, y);
        left = std::min(left, x), right = std::max(right, x);
      }
  Coverage out;
  if (bottom < 0) return out;  // no ink (spaces only)
  out.rows = bottom - top + 1;
  out.cols = right - left + 1;
  out.alpha.resize(static_cast<size_t>(out.rows * out.cols));
  for (int64_t y = 0; y < out.rows; ++y)
    std::copy_n(canvas.begin() + (top + y) * cols + left, out.cols,
                out.alpha.begin() + y * out.cols);
  return out;
}

std::optional<Image> render_ocr_image(const TextRenderer& renderer, const std::string& text,
                                      PhiloxStream& rng, const OcrOptions& o) {
  MOETRON_CHECK(o.height >= 8 && o.width >= 8, "OCR images must be at least 8x8, got ", o.height,
                "x", o.width);
  MOETRON_CHECK(o.min_pixel_size >= 4 && o.min_pixel_size <= o.max_pixel_size,
                "OCR font sizes must satisfy 4 <= min <= max, got ", o.min_pixel_size, "..",
                o.max_pixel_size);
  const auto font = static_cast<int64_t>(below(rng, static_cast<uint32_t>(renderer.num_fonts())));
  const int px =
      o.min_pixel_size +
      static_cast<int>(below(rng, static_cast<uint32_t>(o.max_pixel_size - o.min_pixel_size + 1)));
  const bool dark_on_light = below(rng, 10) < 7;
  const double paper = dark_on_light ? 170 + below(rng, 86) : below(rng, 80);
  const double ink = dark_on_light ? below(rng, 80) : 170 + below(rng, 86);
  const double sigma = o.max_noise * rng.next_uniform();
  const uint32_t x_draw = rng.next_u32(), y_draw = rng.next_u32();
  const TextRenderer::Coverage cov = renderer.render_line(text, font, px);
  // One pixel of margin all round, so no glyph touches the border.
  if (cov.rows == 0 || cov.cols > o.width - 2 || cov.rows > o.height - 2) return std::nullopt;
  const int64_t x0 = 1 + x_draw % static_cast<uint32_t>(o.width - 1 - cov.cols);
  const int64_t y0 = 1 + y_draw % static_cast<uint32_t>(o.height - 1 - cov.rows);
  Image img;
  img.height = o.height, img.width = o.width, img.channels = 1;
  img.pixels.resize(static_cast<size_t>(o.height * o.width));
  for (int64_t y = 0; y < o.height; ++y)
    for (int64_t x = 0; x < o.width; ++x) {
      double a = 0;
      if (y >= y0 && y < y0 + cov.rows && x >= x0 && x < x0 + cov.cols)
        a = cov.alpha[static_cast<size_t>((y - y0) * cov.cols + (x - x0))] / 255.0;
      const double v = paper + (ink - paper) * a + sigma * normal(rng);
      img.pixels[static_cast<size_t>(y * o.width + x)] =
          static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
    }
  return img;
}

}  // namespace moetron::data
