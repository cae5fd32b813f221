// Scenes for the caption task: small RGB images of 1-3 coloured shapes,
// placed without overlap, with a compositional caption derived from what
// was drawn:
//   "a small red circle"
//   "a small red circle left of a large blue square"
//   "a small red circle left of a large blue square which is above a small green triangle"
// Shapes are described left to right (by centre x, then y), so a scene has
// exactly one caption. The relation of each shape to the next is "left of"
// when the next one is at least as far to the right as it is up or down,
// otherwise "above" (the next one is lower) or "below".
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/data/image_io.h"

namespace moetron::data {

enum class ShapeKind : uint8_t { circle, square, triangle, diamond };
inline constexpr int kNumShapeKinds = 4;

struct SceneColour {
  const char* name;
  uint8_t r, g, b;
};
// The palette: red, green, blue, yellow, purple, orange, white, cyan.
const std::vector<SceneColour>& scene_colours();
const char* shape_name(ShapeKind k);
const char* size_name(bool large);  // "small" / "large"

struct SceneShape {
  int colour = 0;  // index into scene_colours()
  ShapeKind kind = ShapeKind::circle;
  bool large = false;
  int64_t cx = 0, cy = 0, radius = 0;  // centre (column, row) and half-extent in pixels
};

struct SceneOptions {
  int64_t size = 32;  // images are size x size x 3
  int min_shapes = 1, max_shapes = 3;
};

struct Scene {
  std::vector<SceneShape> shapes;  // in caption order (left to right)
  Image image;                     // [size, size, 3]
  std::string caption;
};

// (colour, shape) pairs that appear only in held-out scenes: one colour per
// shape kind, distinct colours, drawn from `seed`.
std::vector<std::pair<int, ShapeKind>> heldout_combinations(uint64_t seed);

// A random scene from `rng`. heldout = false: no shape has a held-out
// combination; heldout = true: at least one has. Throws on options that
// cannot fit (size below 16, shape counts outside [1, 3]).
Scene generate_scene(PhiloxStream& rng, const SceneOptions& opts,
                     const std::vector<std::pair<int, ShapeKind>>& heldout, bool heldout_scene);

// The caption of shapes already in caption order (exposed for tests).
std::string describe_scene(const std::vector<SceneShape>& shapes);

}  // namespace moetron::data
