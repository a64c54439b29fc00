// AtomicFile: write a file so that readers see either the old file or the whole
// new one: data goes to "<path>.tmp.<pid>", then fsync, rename over <path>, and
// fsync of the folder. Used for tokenizer.model, *.bin and meta.json.
// Not a general file API; errors are IoError naming the path.
#pragma once
#include <string>
#include <string_view>

namespace brigade::data {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // creates the temp file (parent folder must exist)
  ~AtomicFile();                          // removes the temp file unless commit() ran
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view s) { write(s.data(), s.size()); }
  void commit();  // fsync + close + rename + fsync(folder)

 private:
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// Whole-file convenience wrapper.
void write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace brigade::data
