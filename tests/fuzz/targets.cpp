// The fuzz targets; see targets.h.
#include "fuzz/targets.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/train/config.h"

namespace brigade::fuzz {

namespace {

// The input as a file (the reader maps a path), one per process, rewritten per input.
std::string as_file(const uint8_t* data, size_t size) {
  static const std::string path =
      (std::filesystem::temp_directory_path() / ("brigade_fuzz_" + std::to_string(::getpid()) + ".bin")).string();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  return path;
}

}  // namespace

int safetensors(const uint8_t* data, size_t size) {
  try {
    ckpt::SafetensorsReader r(as_file(data, size));
    for (const std::string& name : r.names()) {
      (void)r.info(name);
      (void)r.get(name);
    }
    for (const auto& [key, value] : r.metadata()) (void)key, (void)value;
  } catch (const Error&) {
    // refused with a clear error: what a bad file must give
  }
  return 0;
}

int recipe(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string toml = text;
  std::vector<std::string> overrides;
  const size_t at = text.find("\n--set\n");
  if (at != std::string::npos) {
    toml = text.substr(0, at);
    size_t pos = at + 7;
    while (pos < text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      overrides.push_back(text.substr(pos, end - pos));
      pos = end + 1;
    }
  }
  try {
    (void)train::parse_recipe(toml, "fuzz.toml", overrides, /*resolve=*/false);
  } catch (const Error&) {
  }
  return 0;
}

const std::vector<Target>& targets() {
  static const std::vector<Target> t{{"safetensors", safetensors}, {"recipe", recipe}};
  return t;
}

}  // namespace brigade::fuzz
