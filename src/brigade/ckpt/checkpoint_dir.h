// Checkpoint directories, whatever a run stores in them: written into "<dir>.tmp" (every file
// fsynced), then swapped in by two renames (<dir> -> <dir>.old, <dir>.tmp -> <dir>); a crash
// between them leaves <dir>.old (and the new <dir>.tmp), which recover_checkpoint() and
// open_checkpoint() move back. So a crash never leaves a half-written or missing checkpoint. A
// save that fails while writing <dir>.tmp (a full disk) removes it and says how many bytes the
// save needed and how many were free; the previous <dir> is untouched. Errors name the directory
// and the file. A directory is a Brigade checkpoint when it holds recipe.toml (train/checkpoint.h
// lists the files a training run writes).
// Integrity: commit_checkpoint() adds checksums.json to a Brigade checkpoint (every file's size
// and CRC-32, subfolders included), and open_checkpoint() checks every listed file against it
// (once per process and save), so a flipped byte or a cut file is a CheckpointError naming the
// file, never a silently wrong model. A checkpoint without checksums.json (older versions) is
// read unverified.
// Test hook: BRIGADE_CKPT_FAIL_AFTER_BYTES=N makes a save fail as a full disk would once the
// files it has written into <dir>.tmp hold more than N bytes (the file that crosses N is cut at N).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::ckpt {

// A save in two steps around the files (multi-process saves: rank 0 runs begin and commit; every
// rank may write its files into the returned temporary folder in between).
std::string begin_checkpoint(const std::string& dir);  // -> "<dir>.tmp", empty and fresh
void commit_checkpoint(const std::string& dir);        // checksums.json (with recipe.toml), then the atomic swap
// Runs `write` (files into the save's folder `tmp` = "<dir>.tmp", `needed` bytes in all). On any
// failure the partial folder is removed; an I/O failure is rethrown as one IoError that adds the
// bytes needed, the bytes free, and whether a previous <dir> is intact.
void guarded_write(const std::string& tmp, uint64_t needed, const std::function<void()>& write);
// Each file written inside guarded_write calls this after landing in `tmp` (the test hook above).
void fault_after_write(const std::filesystem::path& tmp, const std::filesystem::path& file);

// If <dir> is missing but <dir>.old holds a checkpoint, moves it back and removes that
// save's <dir>.tmp, silently (open_checkpoint() is the same repair, said aloud).
void recover_checkpoint(const std::string& dir);
// What every reader of a checkpoint directory (generate, eval, resume) calls first:
// repairs a save interrupted between its two renames (<dir> missing, <dir>.old holding
// a checkpoint: moves <dir>.old back and removes the unfinished <dir>.tmp), telling
// the user in one line through `say` (empty: stderr), and returns the directory
// (trailing '/' removed). Throws CheckpointError naming the folder and what to pass
// when there is no checkpoint there (no folder, nothing to restore; or no recipe.toml).
// A <dir>.tmp beside an existing <dir> is left alone (it may be a save in progress).
std::string open_checkpoint(const std::string& dir, const std::function<void(const std::string&)>& say = {});
inline constexpr const char* kChecksumFile = "checksums.json";
// Writes checksums.json for the files in `tmp` (commit_checkpoint calls it).
void write_checksums(const std::string& tmp);
// The size of checksums.json for files of these names and sizes.
uint64_t checksums_file_bytes(const std::vector<std::pair<std::string, uint64_t>>& files);
// Checks `dir`'s files against its checksums.json (none: nothing to check). CheckpointError
// naming the file that is missing, has another size or another CRC-32.
void verify_checkpoint(const std::string& dir);
// A checkpoint file's bytes; CheckpointError naming it when missing or unreadable.
std::string read_checkpoint_file(const std::filesystem::path& p);

// ZeRO checkpoints: the optimizer state as flat shards of the parameter space,
//   optimizer-<rank>-of-<dp>.safetensors  one tensor per state ("exp_avg", ...) holding
//                                         flat elements [lo, hi) (metadata lo, hi)
//   optimizer.index.json                  dp, numel, the layout (name, offset, numel)
//                                         and every shard's file and range
// so a run saved at one dp size resumes at another: each rank reads the ranges it
// now owns from whichever files hold them.
struct FlatLayoutEntry {
  std::string name;
  int64_t offset = 0, numel = 0;
};
void write_optimizer_shard(const std::string& tmp, int rank, int dp, int64_t lo, int64_t hi,
                           const std::map<std::string, Tensor>& flat_state);
void write_optimizer_index(const std::string& tmp, int dp, int64_t numel, const std::vector<FlatLayoutEntry>& layout,
                           const std::vector<std::pair<int64_t, int64_t>>& shard_ranges,
                           const std::vector<std::string>& state_names);
// State `name` -> flat elements [lo, hi) (gaps between parameters are zero), from either
// format: the shards above, or optimizer.safetensors ("<state>.<param>") re-cut by `layout`.
std::map<std::string, Tensor> read_optimizer_flat(const std::string& dir, const std::vector<FlatLayoutEntry>& layout,
                                                  int64_t lo, int64_t hi);
bool checkpoint_is_sharded(const std::string& dir);
// Whether `name`, a file an index inside a folder lists (a shard), names a file in that folder
// or below it: not empty, relative, no ".." component, no NUL, components of at most 255 bytes.
// Readers refuse any other name rather than read outside the folder.
bool path_stays_inside(const std::string& name);

}  // namespace brigade::ckpt
