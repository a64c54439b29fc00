// Corpus reading: KJV via /usr/bin/bible, a text file, or a folder of text files.
// See corpus.h for the contract. Not a tokenizer; no normalisation beyond CRLF -> LF.
#include "brigade/data/text/corpus.h"

#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "brigade/core/error.h"

namespace brigade::data {
namespace fs = std::filesystem;

namespace {

constexpr const char* kBiblePath = "/usr/bin/bible";
constexpr const char* kBibleData = "/usr/lib/bible.data";  // bible-kjv-text: what /usr/bin/bible reads

// "Ge1:1 ", "1Cor13:4 ", "SSol2:1 ": [digit]? letters digits ':' digits ' '.
size_t verse_prefix_len(std::string_view line) {
  size_t i = 0;
  if (i < line.size() && std::isdigit(static_cast<unsigned char>(line[i]))) ++i;
  size_t letters = i;
  while (i < line.size() && std::isalpha(static_cast<unsigned char>(line[i]))) ++i;
  if (i == letters) return 0;
  size_t d0 = i;
  while (i < line.size() && std::isdigit(static_cast<unsigned char>(line[i]))) ++i;
  if (i == d0 || i >= line.size() || line[i] != ':') return 0;
  size_t d1 = ++i;
  while (i < line.size() && std::isdigit(static_cast<unsigned char>(line[i]))) ++i;
  if (i == d1 || i >= line.size() || line[i] != ' ') return 0;
  return i + 1;
}

// Appends `raw` to `out` line by line: CRLF -> LF, and a final '\n' if missing.
int64_t append_lines(std::string& out, std::string_view raw) {
  int64_t lines = 0;
  size_t pos = 0;
  while (pos < raw.size()) {
    size_t nl = raw.find('\n', pos);
    size_t end = nl == std::string_view::npos ? raw.size() : nl;
    std::string_view line = raw.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    out.append(line);
    out.push_back('\n');
    ++lines;
    pos = end + 1;
  }
  return lines;
}

std::string read_file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  BRIGADE_CHECK(in.good(), DataError, "corpus file '{}' cannot be opened; check that it exists and is readable",
                p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  BRIGADE_CHECK(!in.bad(), DataError, "corpus file '{}' could not be read completely; check the disk", p.string());
  return std::move(ss).str();
}

bool has_text(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return !std::isspace(static_cast<unsigned char>(c)); });
}

bool is_hidden(const fs::path& root, const fs::path& p) {
  for (const auto& part : fs::relative(p, root)) {
    std::string s = part.string();
    if (!s.empty() && s[0] == '.' && s != "." && s != "..") return true;
  }
  return false;
}

// Every regular, non-hidden file under `root`, recursively, sorted by path. A symbolic link to a
// file of the folder is skipped, so each text is read once (Debian's fortunes folder links
// "cookie.u8" to "cookie").
std::vector<fs::path> list_folder(const fs::path& root, const std::string& spec) {
  std::vector<fs::path> paths;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file() && !is_hidden(root, it->path())) paths.push_back(it->path());
  }
  BRIGADE_CHECK(!ec, DataError, "corpus folder '{}' cannot be listed ({}); check its permissions", spec, ec.message());
  std::sort(paths.begin(), paths.end());
  std::set<fs::path> real;
  for (const fs::path& p : paths)
    if (!fs::is_symlink(p, ec)) real.insert(fs::weakly_canonical(p, ec));
  std::erase_if(
      paths, [&](const fs::path& p) { return fs::is_symlink(p, ec) && real.count(fs::weakly_canonical(p, ec)) > 0; });
  return paths;
}

}  // namespace

std::vector<std::string> corpus_source_files(const std::string& spec) {
  BRIGADE_CHECK(!spec.empty(), DataError, "data.corpus is empty; set it to \"kjv\", a text file or a folder");
  std::vector<std::string> out;
  std::error_code ec;
  if (spec == "kjv") {
    if (fs::is_regular_file(kBibleData, ec)) out.push_back(kBibleData);
    return out;
  }
  const fs::path root = fs::absolute(fs::path(spec), ec);
  auto st = fs::status(root, ec);
  BRIGADE_CHECK(!ec && fs::exists(st), DataError,
                "corpus '{}' does not exist; set data.corpus to \"kjv\", a text file or a folder", spec);
  if (fs::is_directory(st)) {
    for (const fs::path& p : list_folder(root, spec)) out.push_back(p.lexically_normal().string());
  } else {
    out.push_back(root.lexically_normal().string());
  }
  return out;
}

std::string encode_utf8(char32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else
      return false;
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return false;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

std::string read_kjv() {
  BRIGADE_CHECK(fs::exists(kBiblePath), DataError,
                "corpus 'kjv' needs {} (Debian bible-kjv), which is not installed; run scripts/install-deps.sh "
                "or `apt-get install bible-kjv bible-kjv-text`, or set data.corpus to a text file",
                kBiblePath);
  std::string cmd = std::string(kBiblePath) + " -f 'gen1:1-rev22:21' 2>/dev/null";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  BRIGADE_CHECK(pipe != nullptr, DataError, "corpus 'kjv': could not run {}; check that it is executable", kBiblePath);
  std::string raw;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, pipe)) > 0) raw.append(buf, got);
  int status = ::pclose(pipe);
  BRIGADE_CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0, DataError,
                "corpus 'kjv': {} failed (status {}); reinstall bible-kjv-text (scripts/install-deps.sh)", kBiblePath,
                status);

  std::string out;
  out.reserve(raw.size());
  size_t pos = 0;
  while (pos < raw.size()) {
    size_t nl = raw.find('\n', pos);
    size_t end = nl == std::string::npos ? raw.size() : nl;
    std::string_view line(raw.data() + pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    line.remove_prefix(verse_prefix_len(line));
    if (!has_text(line)) continue;
    out.append(line);
    out.push_back('\n');
  }
  BRIGADE_CHECK(has_text(out), DataError,
                "corpus 'kjv': {} printed no verses; reinstall bible-kjv-text (scripts/install-deps.sh)", kBiblePath);
  return out;
}

Corpus read_corpus(const std::string& spec, const WarningFn& warn) {
  Corpus c;
  c.source = spec;
  BRIGADE_CHECK(!spec.empty(), DataError, "data.corpus is empty; set it to \"kjv\", a text file or a folder");
  if (spec == "kjv") {
    c.text = read_kjv();
    c.file_starts.push_back(0);
  } else {
    fs::path root(spec);
    std::error_code ec;
    auto st = fs::status(root, ec);
    BRIGADE_CHECK(!ec && fs::exists(st), DataError,
                  "corpus '{}' does not exist; set data.corpus to \"kjv\", a text file or a folder", spec);
    if (fs::is_directory(st)) {
      const std::vector<fs::path> paths = list_folder(root, spec);
      for (const auto& p : paths) {
        std::string bytes = read_file_bytes(p);
        if (bytes.find('\0') != std::string::npos || !is_valid_utf8(bytes)) {
          c.skipped.push_back(p.string());
          if (warn) warn(fmt::format("skipping '{}': not UTF-8 text (binary?)", p.string()));
          continue;
        }
        c.file_starts.push_back(c.text.size());
        append_lines(c.text, bytes);
        c.files.push_back(p.string());
      }
    } else {
      BRIGADE_CHECK(fs::is_regular_file(st), DataError,
                    "corpus '{}' is neither a regular file nor a folder; point data.corpus at text", spec);
      std::string bytes = read_file_bytes(root);
      BRIGADE_CHECK(bytes.find('\0') == std::string::npos && is_valid_utf8(bytes), DataError,
                    "corpus file '{}' is not UTF-8 text (binary?); convert it to UTF-8 or choose another file", spec);
      c.file_starts.push_back(c.text.size());
      append_lines(c.text, bytes);
      c.files.push_back(root.string());
    }
  }
  BRIGADE_CHECK(has_text(c.text), DataError,
                "corpus '{}' is empty (no text{}); point data.corpus at a non-empty text file or folder", spec,
                c.skipped.empty() ? "" : fmt::format(", {} binary files skipped", c.skipped.size()));
  c.lines = static_cast<int64_t>(std::count(c.text.begin(), c.text.end(), '\n'));
  return c;
}

}  // namespace brigade::data
