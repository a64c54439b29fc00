// The tiny GPT recipe the end-to-end tests train through the `brigade` binary (tests/cli,
// tests/parallel), written once: its TOML text with the keys a test changes, a test folder
// holding the tiny corpus and that recipe, and the binary run in that folder (as one process,
// under mpirun, or in the background until a signal), and what a run wrote. Needs BRIGADE_BINARY_DIR (defined for
// brigade_test targets); kMpirun needs BRIGADE_MPIRUN.
#pragma once
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/test_support.h"

namespace brigade::test_support {

// The `brigade` binary of this build.
inline const std::string kBrigade = std::string(BRIGADE_BINARY_DIR) + "/bin/brigade";

#ifdef BRIGADE_MPIRUN
// The mpirun CMake found for the tests that launch one (empty when it found none).
inline const std::string kMpirun = BRIGADE_MPIRUN;
#endif

// The tiny GPT (vocab 128, 2 layers, 2 heads, 32 dims, context 32) on the tiny corpus
// (corpus.txt, prepared into data/), one thread, 12 steps of 8 rows, no periodic evaluation or
// checkpoint, lr 3e-3 after 2 warm-up steps; then `set`, like --set: each "section.key=value"
// (the value as TOML: strings quoted) replaces the key's value where the recipe has it, or is
// added at the end of its section (a new section at the end); a "section.key" without a value
// leaves the key out.
inline std::string tiny_gpt_recipe(const std::vector<std::string>& set = {}) {
  using Keys = std::vector<std::pair<std::string, std::string>>;
  std::vector<std::pair<std::string, Keys>> sections = {
      {"run", {{"name", "\"tiny\""}, {"out_dir", "\"run\""}, {"seed", "7"}, {"threads", "1"}}},
      {"model", {{"vocab_size", "128"}, {"block_size", "32"}, {"n_layer", "2"}, {"n_head", "2"}, {"n_embd", "32"}}},
      {"data", {{"corpus", "\"corpus.txt\""}, {"dir", "\"data\""}, {"val_fraction", "0.1"}}},
      {"train",
       {{"steps", "12"},
        {"batch_size", "8"},
        {"seq_len", "32"},
        {"eval_every", "0"},
        {"eval_batches", "2"},
        {"log_every", "1"},
        {"checkpoint_every", "0"}}},
      {"optim", {{"lr", "3e-3"}}},
      {"schedule", {{"warmup_steps", "2"}, {"min_lr", "3e-4"}}},
  };
  for (const std::string& s : set) {
    const size_t dot = s.find('.'), eq = s.find('=');
    const std::string section = s.substr(0, dot), key = s.substr(dot + 1, eq == std::string::npos ? eq : eq - dot - 1);
    auto sec = std::find_if(sections.begin(), sections.end(), [&](const auto& x) { return x.first == section; });
    if (sec == sections.end()) sec = sections.insert(sections.end(), {section, {}});
    Keys& keys = sec->second;
    auto kv = std::find_if(keys.begin(), keys.end(), [&](const auto& x) { return x.first == key; });
    if (eq == std::string::npos) {
      if (kv != keys.end()) keys.erase(kv);
    } else if (kv != keys.end()) {
      kv->second = s.substr(eq + 1);
    } else {
      keys.emplace_back(key, s.substr(eq + 1));
    }
  }
  std::string text;
  for (const auto& [section, keys] : sections) {
    text += "[" + section + "]\n";
    for (const auto& [key, value] : keys) text += key + " = " + value + "\n";
  }
  return text;
}

// Writes the tiny corpus (dir/corpus.txt) and `recipe` (dir/`file`); returns `dir`.
inline std::filesystem::path write_tiny_run(const std::filesystem::path& dir, const std::string& recipe,
                                            const std::string& file = "tiny.toml") {
  write_tiny_corpus(dir / "corpus.txt");
  std::ofstream(dir / file) << recipe;
  return dir;
}

// `brigade <args>` in `dir`, started by launcher(np, mpirun, env, limit_s): one process when np == 0.
inline CmdResult run_brigade(const std::filesystem::path& dir, const std::string& args, int np = 0,
                             const std::string& mpirun = "", const std::string& env = "", int limit_s = 300) {
  return run_in(dir, launcher(np, mpirun, env, limit_s) + " " + kBrigade + " " + args);
}

// The value of `key` at each step of a run's metrics.jsonl that logs it.
template <class T = double>
std::map<int64_t, T> per_step(const std::filesystem::path& metrics, const std::string& key) {
  std::map<int64_t, T> out;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains(key)) out[j.at("step").get<int64_t>()] = j[key].get<T>();
  }
  return out;
}

// The JSON file `p` (a test failure, and an empty object, where it is missing).
inline nlohmann::json json_file(const std::filesystem::path& p) {
  if (!std::filesystem::exists(p)) {
    ADD_FAILURE() << "no " << p;
    return nlohmann::json::object();
  }
  return nlohmann::json::parse(slurp(p));
}

// Starts `brigade <args>` in `dir` in the background (`env` settings before it), waits until
// `metrics` holds `lines` whole lines (a minute at most), sends it `signal` and waits for its end:
// its exit status and both outputs (dir/stdout.txt, dir/stderr.txt).
inline CmdResult interrupt_brigade(const std::filesystem::path& dir, const std::string& args,
                                   const std::filesystem::path& metrics, int signal, int lines = 1,
                                   const std::string& env = "") {
  const std::filesystem::path pidfile = dir / "pid", rc = dir / "rc.txt";
  const std::string cmd = "cd '" + dir.string() + "' && { " + env + " " + kBrigade + " " + args +
                          " >stdout.txt 2>stderr.txt & echo $! >'" + pidfile.string() + "'; wait $!; echo $? >'" +
                          rc.string() + "'; }";
  std::thread runner([cmd] { (void)std::system(cmd.c_str()); });
  auto logged = [&] {
    const std::string m = slurp(metrics);
    return std::count(m.begin(), m.end(), '\n') >= lines;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline && !logged())
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  while (slurp(pidfile).empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(::kill(pid_t(std::stol(slurp(pidfile))), signal), 0);
  runner.join();
  CmdResult r;
  r.code = std::stoi(slurp(rc));
  r.out = slurp(dir / "stdout.txt");
  r.err = slurp(dir / "stderr.txt");
  return r;
}

}  // namespace brigade::test_support
