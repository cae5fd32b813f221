// The config's field table (train/config.cpp): each key bound to its member,
// so parsing, overrides, validation messages and to_toml share one list.
// Internal to train/config*.cpp.
#pragma once

#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "moetron/train/config.h"

namespace moetron::train {

using Value = std::variant<int64_t*, uint64_t*, double*, bool*, std::string*>;

struct Field {
  const char* key;
  std::function<Value(Config&)> bind;
};

template <typename Member>
Field field(const char* key, Member Config::*section, auto member) {
  return {key, [section, member](Config& c) -> Value { return &((c.*section).*member); }};
}

// [multimodal], [vision], [audio], [multitask] (train/config_multimodal.cpp).
std::vector<Field> multimodal_fields();
void validate_multimodal(const Config& c);

}  // namespace moetron::train
