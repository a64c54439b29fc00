// Corpus reading for `brigade prepare`: the King James Bible ("kjv", read from
// Debian's bible-kjv program with the verse references stripped), one UTF-8 text
// file, or a folder of them. The result is plain text, one line per verse or
// input line. Not a tokenizer (tokenizer.h) and not a streaming reader: corpora
// are expected to fit in memory (the KJV is ~4.3 MB).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace brigade::data {

struct Corpus {
  std::string source;                // the spec as given: "kjv", a file or a folder
  std::string text;                  // UTF-8; lines end with '\n' (CRLF -> LF); files concatenated
  std::vector<std::string> files;    // files read, in order (empty for "kjv")
  std::vector<size_t> file_starts;   // where each file's text starts in `text` ({0} for "kjv"): documents
  std::vector<std::string> skipped;  // files skipped as binary / not UTF-8 (folders only)
  int64_t lines = 0;                 // number of '\n' in text
};

// Called once per skipped file with a one-line warning.
using WarningFn = std::function<void(const std::string&)>;

// `spec` is "kjv", a path to a text file, or a folder (every regular, non-hidden
// file under it, recursively, sorted by path; files with NUL bytes or invalid
// UTF-8 are skipped with a warning). Throws DataError when the corpus cannot be
// read or is empty (no non-whitespace text).
Corpus read_corpus(const std::string& spec, const WarningFn& warn = {});

// The files whose contents make up the corpus `spec`, as absolute paths: for "kjv"
// bible-kjv's data file (/usr/lib/bible.data) when it exists (else none); for a file
// the file; for a folder every regular, non-hidden file under it, sorted by path (the
// files read_corpus() reads or skips). Used to fingerprint a prepared folder's source
// (prepare.h). Throws DataError when `spec` is empty, missing or cannot be listed.
std::vector<std::string> corpus_source_files(const std::string& spec);

// The KJV as text, one verse per line, references ("Ge1:1 ") stripped. Runs
// /usr/bin/bible; DataError says how to install it when it is missing.
std::string read_kjv();

// True when `s` is valid UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
bool is_valid_utf8(std::string_view s);
// The UTF-8 bytes of one code point (at most U+10FFFF).
std::string encode_utf8(char32_t cp);

}  // namespace brigade::data
