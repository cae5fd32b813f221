// Images of the multimodal tasks: PNG files, scenes and their captions,
// rendered text.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "moetron/core/error.h"
#include "moetron/data/image_io.h"
#include "moetron/data/scene_images.h"
#include "moetron/data/text_render.h"

namespace moetron::data {
namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("moetron_mmimg_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

TEST(Png, RoundTripsRgbAndGray) {
  for (const int64_t channels : {1, 3}) {
    Image img;
    img.height = 5, img.width = 7, img.channels = channels;
    for (int64_t i = 0; i < 5 * 7 * channels; ++i)
      img.pixels.push_back(static_cast<uint8_t>(i * 37));
    const std::string path = temp_path("img.png");
    write_png(path, img);
    const Image back = read_png(path, channels);
    EXPECT_EQ(back.height, 5);
    EXPECT_EQ(back.width, 7);
    EXPECT_EQ(back.channels, channels);
    EXPECT_EQ(back.pixels, img.pixels);
    fs::remove(path);
  }
}

TEST(Png, BadFileIsAnErrorNamingIt) {
  const std::string path = temp_path("bad.png");
  std::ofstream(path) << "not a png at all";
  try {
    read_png(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  fs::remove(path);
  EXPECT_THROW(read_png(temp_path("missing.png")), Error);
}

// The test's own idea of the palette: a pixel's colour name is the nearest of these.
std::string colour_of(const Image& img, int64_t x, int64_t y) {
  const struct {
    const char* name;
    int r, g, b;
  } known[] = {{"red", 220, 30, 30},     {"green", 30, 180, 40},   {"blue", 40, 70, 230},
               {"yellow", 235, 220, 40}, {"purple", 150, 50, 200}, {"orange", 245, 140, 20},
               {"white", 235, 235, 235}, {"cyan", 40, 210, 220},   {"background", 35, 35, 35}};
  const uint8_t* p = &img.pixels[static_cast<size_t>((y * img.width + x) * 3)];
  std::string best;
  int best_d = 1 << 30;
  for (const auto& k : known) {
    const int d =
        (p[0] - k.r) * (p[0] - k.r) + (p[1] - k.g) * (p[1] - k.g) + (p[2] - k.b) * (p[2] - k.b);
    if (d < best_d) best_d = d, best = k.name;
  }
  return best;
}

// Shape and size read from the pixels of `colour` inside the box around
// (cx, cy): row widths at the top, middle and bottom of the ink.
std::pair<std::string, std::string> shape_from_pixels(const Image& img, const SceneShape& s,
                                                      const std::string& colour) {
  std::vector<int> widths;
  for (int64_t y = s.cy - s.radius; y <= s.cy + s.radius; ++y) {
    int w = 0;
    for (int64_t x = s.cx - s.radius; x <= s.cx + s.radius; ++x)
      w += colour_of(img, x, y) == colour;
    if (w > 0) widths.push_back(w);
  }
  const int top = widths.front(), mid = widths[widths.size() / 2], bottom = widths.back();
  std::string kind = "circle";
  if (top == mid && mid == bottom) {
    kind = "square";
  } else if (bottom > top + 2 && bottom >= mid) {
    kind = "triangle";
  } else if (top == 1) {
    kind = "diamond";
  }
  return {kind, widths.size() <= 10 ? "small" : "large"};
}

TEST(Scenes, CaptionsDescribeWhatWasDrawn) {
  PhiloxStream rng(7, "test.scenes");
  const auto heldout = heldout_combinations(7);
  const std::regex object("a (small|large) (\\w+) (\\w+)");
  const std::regex relation("(left of|above|below)");
  for (int n = 0; n < 200; ++n) {
    const Scene scene = generate_scene(rng, SceneOptions{}, heldout, false);
    ASSERT_EQ(scene.image.pixels.size(), 32u * 32u * 3u);
    std::vector<std::smatch> objects;
    for (auto it = std::sregex_iterator(scene.caption.begin(), scene.caption.end(), object);
         it != std::sregex_iterator(); ++it)
      objects.push_back(*it);
    ASSERT_EQ(objects.size(), scene.shapes.size()) << scene.caption;
    for (size_t i = 0; i < objects.size(); ++i) {
      const SceneShape& s = scene.shapes[i];
      const std::string colour = objects[i][2];
      EXPECT_EQ(colour_of(scene.image, s.cx, s.cy), colour) << scene.caption << " shape " << i;
      const auto [kind, size] = shape_from_pixels(scene.image, s, colour);
      EXPECT_EQ(kind, objects[i][3].str()) << scene.caption << " shape " << i;
      EXPECT_EQ(size, objects[i][1].str()) << scene.caption << " shape " << i;
    }
    std::vector<std::string> relations;
    for (auto it = std::sregex_iterator(scene.caption.begin(), scene.caption.end(), relation);
         it != std::sregex_iterator(); ++it)
      relations.push_back((*it)[1]);
    ASSERT_EQ(relations.size() + 1, scene.shapes.size()) << scene.caption;
    for (size_t i = 0; i < relations.size(); ++i) {
      const SceneShape &a = scene.shapes[i], &b = scene.shapes[i + 1];
      const int64_t dx = b.cx - a.cx, dy = b.cy - a.cy;
      const std::string want = dx >= std::abs(dy) ? "left of" : (dy > 0 ? "above" : "below");
      EXPECT_EQ(relations[i], want) << scene.caption;
    }
  }
}

TEST(Scenes, HeldOutCombinationsOnlyInHeldOutScenes) {
  const auto heldout = heldout_combinations(3);
  ASSERT_EQ(heldout.size(), 4u);
  EXPECT_NE(heldout, heldout_combinations(4));
  auto has_heldout = [&](const Scene& s) {
    for (const auto& shape : s.shapes)
      for (const auto& [colour, kind] : heldout)
        if (shape.colour == colour && shape.kind == kind) return true;
    return false;
  };
  PhiloxStream rng(3, "test.heldout");
  for (int n = 0; n < 300; ++n) EXPECT_FALSE(has_heldout(generate_scene(rng, {}, heldout, false)));
  for (int n = 0; n < 50; ++n) EXPECT_TRUE(has_heldout(generate_scene(rng, {}, heldout, true)));
}

TEST(Scenes, SameStreamSameScene) {
  PhiloxStream a(11, "s"), b(11, "s"), c(12, "s");
  const Scene x = generate_scene(a, {}, heldout_combinations(1), false);
  const Scene y = generate_scene(b, {}, heldout_combinations(1), false);
  const Scene z = generate_scene(c, {}, heldout_combinations(1), false);
  EXPECT_EQ(x.image.pixels, y.image.pixels);
  EXPECT_EQ(x.caption, y.caption);
  EXPECT_NE(x.image.pixels, z.image.pixels);
}

TEST(TextRender, InkWhereTheTextIsAndLongTextRejected) {
  TextRenderer renderer(dejavu_fonts());
  const auto cov = renderer.render_line("Hello", 0, 12);
  EXPECT_GT(cov.cols, 20);  // five glyphs of a 12-pixel font
  EXPECT_LT(cov.cols, 40);
  EXPECT_GE(cov.rows, 8);
  int64_t ink = 0;
  for (const uint8_t a : cov.alpha) ink += a > 128;
  EXPECT_GT(ink, 40);
  EXPECT_LT(ink, cov.rows * cov.cols * 2 / 3);

  OcrOptions o;
  o.max_noise = 0;
  PhiloxStream rng(5, "ocr");
  int rendered = 0;
  for (int n = 0; n < 40; ++n) {
    const auto img = render_ocr_image(renderer, "quiet", rng, o);
    ASSERT_TRUE(img.has_value());  // five letters fit 64 pixels at every size
    ASSERT_EQ(img->pixels.size(), 16u * 64u);
    // Without noise the border is paper; the text differs from it by at least 90 levels.
    const int paper = img->pixels[0];
    int64_t far = 0;
    for (const uint8_t p : img->pixels) far += std::abs(p - paper) > 90;
    EXPECT_GT(far, 15) << n;
    for (int64_t x = 0; x < 64; ++x) EXPECT_EQ(img->pixels[static_cast<size_t>(x)], paper);
    ++rendered;
  }
  EXPECT_EQ(rendered, 40);
  EXPECT_FALSE(render_ocr_image(renderer, "a sentence far too long for it", rng, o).has_value());
  EXPECT_THROW(TextRenderer({"/nonexistent/font.ttf"}), Error);
}

}  // namespace
}  // namespace moetron::data
