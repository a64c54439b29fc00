// Recipe parsing: strict TOML (toml++) into the Recipe struct, `--set` overrides,
// validation with messages that say what to change, and recipe_to_toml().
// One table (kFields) lists every key with its type and its place in Recipe; parsing,
// overrides, suggestions and serialisation all walk that table, so adding a key
// is one line there plus the struct field (and docs/recipes.md).
// Not the trainer: this file knows nothing about models or data beyond the values.
#include "brigade/train/config.h"
#include "brigade/train/finetune.h"
#include "brigade/train/registry.h"

#include <omp.h>
#include <toml++/toml.h>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "brigade/core/error.h"

namespace brigade::train {
namespace {

enum class Kind { Int, Int32, UInt64, Float, String, Bool };

struct Field {
  const char* section;
  const char* key;
  Kind kind;
  void* (*ptr)(Recipe&);
  std::string name() const { return std::string(section) + "." + key; }
};

#define BRIGADE_FIELD(sec, member, kind)                                         \
  Field {                                                                        \
#sec, #member, Kind::kind, [](Recipe & r) -> void* { return &r.sec.member; } \
  }

const std::vector<Field>& fields() {
  static const std::vector<Field> kFields = {
      BRIGADE_FIELD(run, name, String),
      BRIGADE_FIELD(run, out_dir, String),
      BRIGADE_FIELD(run, seed, UInt64),
      BRIGADE_FIELD(run, threads, Int32),
      BRIGADE_FIELD(model, type, String),
      BRIGADE_FIELD(model, vocab_size, Int),
      BRIGADE_FIELD(model, block_size, Int),
      BRIGADE_FIELD(model, n_layer, Int),
      BRIGADE_FIELD(model, n_head, Int),
      BRIGADE_FIELD(model, n_embd, Int),
      BRIGADE_FIELD(model, dropout, Float),
      BRIGADE_FIELD(model, layer_norm_eps, Float),
      BRIGADE_FIELD(model, init_std, Float),
      BRIGADE_FIELD(model, n_kv_head, Int),
      BRIGADE_FIELD(model, intermediate_size, Int),
      BRIGADE_FIELD(model, rope_theta, Float),
      BRIGADE_FIELD(model, rope_scaling, String),
      BRIGADE_FIELD(model, rope_scaling_factor, Float),
      BRIGADE_FIELD(model, rope_low_freq_factor, Float),
      BRIGADE_FIELD(model, rope_high_freq_factor, Float),
      BRIGADE_FIELD(model, rope_original_max_positions, Int),
      BRIGADE_FIELD(model, tie_embeddings, Bool),
      BRIGADE_FIELD(model, image_size, Int),
      BRIGADE_FIELD(model, patch_size, Int),
      BRIGADE_FIELD(model, num_classes, Int),
      BRIGADE_FIELD(model, in_channels, Int),
      BRIGADE_FIELD(model, width, Int),
      BRIGADE_FIELD(model, stem, String),
      BRIGADE_FIELD(model, memory_format, String),
      BRIGADE_FIELD(model, depths, String),
      BRIGADE_FIELD(model, window_size, Int),
      BRIGADE_FIELD(model, mlp_ratio, Float),
      BRIGADE_FIELD(model, text_layers, Int),
      BRIGADE_FIELD(model, text_heads, Int),
      BRIGADE_FIELD(model, text_width, Int),
      BRIGADE_FIELD(model, projection_dim, Int),
      BRIGADE_FIELD(model, stages, String),
      BRIGADE_FIELD(model, width_coefficient, Float),
      BRIGADE_FIELD(model, depth_coefficient, Float),
      BRIGADE_FIELD(model, depthwise_padding, String),
      BRIGADE_FIELD(model, vision_from, String),
      BRIGADE_FIELD(model, lm_from, String),
      BRIGADE_FIELD(model, resampler_depth, Int),
      BRIGADE_FIELD(model, resampler_heads, Int),
      BRIGADE_FIELD(model, resampler_latents, Int),
      BRIGADE_FIELD(model, cross_attn_every_n_layers, Int),
      BRIGADE_FIELD(model, init_from, String),
      BRIGADE_FIELD(data, corpus, String),
      BRIGADE_FIELD(data, dir, String),
      BRIGADE_FIELD(data, val_fraction, Float),
      BRIGADE_FIELD(data, augment, Bool),
      BRIGADE_FIELD(data, mlm_probability, Float),
      BRIGADE_FIELD(data, format, String),
      BRIGADE_FIELD(data, chat_template, String),
      BRIGADE_FIELD(train, steps, Int),
      BRIGADE_FIELD(train, batch_size, Int),
      BRIGADE_FIELD(train, seq_len, Int),
      BRIGADE_FIELD(train, eval_every, Int),
      BRIGADE_FIELD(train, eval_batches, Int),
      BRIGADE_FIELD(train, eval_at_start, Bool),
      BRIGADE_FIELD(train, log_every, Int),
      BRIGADE_FIELD(train, checkpoint_every, Int),
      BRIGADE_FIELD(train, early_stop, Bool),
      BRIGADE_FIELD(train, patience, Int),
      BRIGADE_FIELD(train, min_delta, Float),
      BRIGADE_FIELD(train, grad_clip, Float),
      BRIGADE_FIELD(train, clip_value, Float),
      BRIGADE_FIELD(train, accumulation, Int),
      BRIGADE_FIELD(train, accumulation_mode, String),
      BRIGADE_FIELD(train, accumulation_max, Int),
      BRIGADE_FIELD(train, ramp_steps, Int),
      BRIGADE_FIELD(train, noise_ema, Float),
      BRIGADE_FIELD(train, loss_on, String),
      BRIGADE_FIELD(train, nonfinite, String),
      BRIGADE_FIELD(train, spike_zscore, Float),
      BRIGADE_FIELD(train, spike_window, Int),
      BRIGADE_FIELD(optim, name, String),
      BRIGADE_FIELD(optim, lr, Float),
      BRIGADE_FIELD(optim, weight_decay, Float),
      BRIGADE_FIELD(optim, beta1, Float),
      BRIGADE_FIELD(optim, beta2, Float),
      BRIGADE_FIELD(optim, eps, Float),
      BRIGADE_FIELD(optim, momentum, Float),
      BRIGADE_FIELD(optim, nesterov, Bool),
      BRIGADE_FIELD(schedule, name, String),
      BRIGADE_FIELD(schedule, warmup_steps, Int),
      BRIGADE_FIELD(schedule, min_lr, Float),
      BRIGADE_FIELD(schedule, step_every, Int),
      BRIGADE_FIELD(schedule, step_gamma, Float),
      BRIGADE_FIELD(schedule, decay_steps, Int),
      BRIGADE_FIELD(schedule, decay_shape, String),
      BRIGADE_FIELD(parallel, dp, Int),
      BRIGADE_FIELD(parallel, zero, Int),
      BRIGADE_FIELD(parallel, allreduce, String),
      BRIGADE_FIELD(parallel, bucket_mb, Float),
      BRIGADE_FIELD(parallel, overlap, Bool),
      BRIGADE_FIELD(parallel, tp, Int),
      BRIGADE_FIELD(parallel, timeout_s, Float),
      BRIGADE_FIELD(parallel, pp, Int),
      BRIGADE_FIELD(parallel, microbatches, Int),
      BRIGADE_FIELD(parallel, schedule, String),
      BRIGADE_FIELD(parallel, virtual_stages, Int),
      BRIGADE_FIELD(parallel, stage_layers, String),
      BRIGADE_FIELD(parallel, max_in_flight, Int),
      BRIGADE_FIELD(parallel, sync_batchnorm, Bool),
      BRIGADE_FIELD(parallel, deterministic, Bool),
      BRIGADE_FIELD(parallel, atom_rows, Int),
      BRIGADE_FIELD(memory, recompute, String),
      BRIGADE_FIELD(memory, every_k, Int),
      BRIGADE_FIELD(memory, budget_mb, Float),
      BRIGADE_FIELD(precision, level, String),
      BRIGADE_FIELD(precision, dtype, String),
      BRIGADE_FIELD(precision, loss_scale, String),
      BRIGADE_FIELD(precision, init_scale, Float),
      BRIGADE_FIELD(precision, growth_interval, Int),
      BRIGADE_FIELD(precision, growth, Float),
      BRIGADE_FIELD(precision, backoff, Float),
      BRIGADE_FIELD(precision, min_scale, Float),
      BRIGADE_FIELD(precision, max_scale, Float),
      BRIGADE_FIELD(precision, hysteresis, Int),
      BRIGADE_FIELD(finetune, method, String),
      BRIGADE_FIELD(lora, r, Int),
      BRIGADE_FIELD(lora, alpha, Float),
      BRIGADE_FIELD(lora, dropout, Float),
      BRIGADE_FIELD(lora, target_modules, String),
      BRIGADE_FIELD(lora, rslora, Bool),
      BRIGADE_FIELD(lora, base_dtype, String),
      BRIGADE_FIELD(sample, prompt, String),
      BRIGADE_FIELD(sample, tokens, Int),
      BRIGADE_FIELD(sample, temperature, Float),
      BRIGADE_FIELD(sample, top_k, Int),
  };
  return kFields;
}
#undef BRIGADE_FIELD

const char* const kSections[] = {"run",      "model",  "data",      "train",    "optim", "schedule",
                                 "parallel", "memory", "precision", "finetune", "lora",  "sample"};

const Field* find_field(std::string_view section, std::string_view key) {
  for (const auto& f : fields())
    if (section == f.section && key == f.key) return &f;
  return nullptr;
}

bool is_section(std::string_view s) {
  return std::find(std::begin(kSections), std::end(kSections), s) != std::end(kSections);
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// " (did you mean 'x'?)" or "" when nothing is close.
std::string suggest(std::string_view wrong, const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    size_t d = edit_distance(wrong, c);
    if (d < best_d) best_d = d, best = &c;
  }
  if (best && best_d <= std::max<size_t>(2, wrong.size() / 3)) return fmt::format(" (did you mean '{}'?)", *best);
  return "";
}

// Suggestion for an unknown "section.key": the same key in another section wins,
// then the closest full name.
std::string suggest_key(std::string_view section, std::string_view key) {
  for (const auto& f : fields())
    if (key == f.key && section != f.section) return fmt::format(" (did you mean '{}'?)", f.name());
  return suggest(std::string(section) + "." + std::string(key), recipe_keys());
}

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}

const char* expected_name(Kind k) {
  switch (k) {
    case Kind::Int:
    case Kind::Int32: return "an integer";
    case Kind::UInt64: return "a non-negative integer";
    case Kind::Float: return "a number";
    case Kind::String: return "a string";
    case Kind::Bool: return "true or false";
  }
  return "?";
}

std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7F)
          out += fmt::format("\\u{:04X}", unsigned(c));
        else
          out += char(c);
    }
  }
  return out + "\"";
}

std::string toml_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string show_value(const toml::node& n) {
  if (auto s = n.as_string()) return toml_string(s->get());
  if (auto i = n.as_integer()) return std::to_string(i->get());
  if (auto f = n.as_floating_point()) return toml_float(f->get());
  if (auto b = n.as_boolean()) return b->get() ? "true" : "false";
  return type_name(n);
}

std::string position(const std::string& origin, const toml::source_region& src) {
  const auto& b = src.begin;
  if (b.line == 0) return origin;
  return fmt::format("{}:{}:{}", origin, b.line, b.column);
}

// Stores `v` into the field; `where` prefixes the message ("recipe f.toml:3:9").
void assign(const Field& f, Recipe& r, const toml::node& v, const std::string& where) {
  auto type_error = [&]() {
    return ConfigError(fmt::format("{}: key '{}' must be {}, got {} ({}); fix the value in the recipe or --set", where,
                                   f.name(), expected_name(f.kind), type_name(v), show_value(v)));
  };
  void* p = f.ptr(r);
  switch (f.kind) {
    case Kind::Int: {
      auto i = v.as_integer();
      if (!i) throw type_error();
      *static_cast<int64_t*>(p) = i->get();
      break;
    }
    case Kind::Int32: {
      auto i = v.as_integer();
      if (!i) throw type_error();
      BRIGADE_CHECK(i->get() >= std::numeric_limits<int>::min() && i->get() <= std::numeric_limits<int>::max(),
                    ConfigError, "{}: key '{}' = {} does not fit a 32-bit integer; use a smaller value", where,
                    f.name(), i->get());
      *static_cast<int*>(p) = int(i->get());
      break;
    }
    case Kind::UInt64: {
      auto i = v.as_integer();
      if (!i) throw type_error();
      BRIGADE_CHECK(i->get() >= 0, ConfigError, "{}: key '{}' = {} must be >= 0; use a non-negative value", where,
                    f.name(), i->get());
      *static_cast<uint64_t*>(p) = uint64_t(i->get());
      break;
    }
    case Kind::Float: {
      if (auto d = v.as_floating_point())
        *static_cast<double*>(p) = d->get();
      else if (auto i = v.as_integer())
        *static_cast<double*>(p) = double(i->get());
      else
        throw type_error();
      break;
    }
    case Kind::String: {
      auto s = v.as_string();
      if (!s) throw type_error();
      *static_cast<std::string*>(p) = s->get();
      break;
    }
    case Kind::Bool: {
      auto b = v.as_boolean();
      if (!b) throw type_error();
      *static_cast<bool*>(p) = b->get();
      break;
    }
  }
}

std::string field_toml(const Field& f, const Recipe& r) {
  void* p = f.ptr(const_cast<Recipe&>(r));
  switch (f.kind) {
    case Kind::Int: return std::to_string(*static_cast<int64_t*>(p));
    case Kind::Int32: return std::to_string(*static_cast<int*>(p));
    case Kind::UInt64: return std::to_string(*static_cast<uint64_t*>(p));
    case Kind::Float: return toml_float(*static_cast<double*>(p));
    case Kind::String: return toml_string(*static_cast<std::string*>(p));
    case Kind::Bool: return *static_cast<bool*>(p) ? "true" : "false";
  }
  return "";
}

std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b, e - b + 1));
}

void apply_table(Recipe& r, const toml::table& root, const std::string& origin) {
  for (auto&& [k, v] : root) {
    const std::string sec(k.str());
    const std::string where = "recipe " + position(origin, k.source());
    if (!is_section(sec)) {
      if (v.is_table()) {
        throw ConfigError(
            fmt::format("{}: unknown section '[{}]'{}; sections are [run] [model] [data] [train] "
                        "[optim] [schedule] [parallel] [memory] [precision] [finetune] [lora] [sample]",
                        where, sec, suggest(sec, {std::begin(kSections), std::end(kSections)})));
      }
      std::string hint;
      for (const auto& f : fields())
        if (sec == f.key) {
          hint = fmt::format(" (did you mean '{}'?)", f.name());
          break;
        }
      throw ConfigError(
          fmt::format("{}: unknown top-level key '{}'{}; every key belongs under a [section] "
                      "header, e.g. [train] then steps = 1000",
                      where, sec, hint));
    }
    const toml::table* t = v.as_table();
    BRIGADE_CHECK(t != nullptr, ConfigError, "{}: '{}' must be a table ([{}]), got {}; write it as a section", where,
                  sec, sec, type_name(v));
    for (auto&& [kk, vv] : *t) {
      const std::string key(kk.str());
      const Field* f = find_field(sec, key);
      BRIGADE_CHECK(f != nullptr, ConfigError, "recipe {}: unknown key '{}.{}'{}; see docs/recipes.md for every key",
                    position(origin, kk.source()), sec, key, suggest_key(sec, key));
      assign(*f, r, vv, "recipe " + position(origin, vv.source()));
    }
  }
}

[[noreturn]] void range_error(const std::string& origin, const std::string& what) {
  throw ConfigError(fmt::format("recipe {}: {}", origin.empty() ? "<defaults>" : origin, what));
}

}  // namespace

std::vector<std::string> recipe_keys() {
  std::vector<std::string> out;
  for (const auto& f : fields()) out.push_back(f.name());
  return out;
}

void apply_override(Recipe& r, const std::string& text) {
  const size_t eq = text.find('=');
  const std::string key = trim(std::string_view(text).substr(0, eq == std::string::npos ? text.size() : eq));
  BRIGADE_CHECK(eq != std::string::npos && !key.empty(), ConfigError,
                "override '{}' must look like section.key=value (e.g. train.steps=500)", text);
  const size_t dot = key.find('.');
  const std::string sec = dot == std::string::npos ? std::string() : key.substr(0, dot);
  const std::string name = dot == std::string::npos ? key : key.substr(dot + 1);
  const Field* f = find_field(sec, name);
  if (!f) {
    std::string hint = dot == std::string::npos ? suggest_key("", name) : suggest_key(sec, name);
    throw ConfigError(
        fmt::format("override '{}': unknown key '{}'{}; keys look like section.key, see "
                    "docs/recipes.md",
                    text, key, hint));
  }
  const std::string raw = trim(std::string_view(text).substr(eq + 1));
  const std::string where = fmt::format("override '{}'", text);
  // Parse the value as TOML; anything that is not a single TOML value is a bare string.
  std::optional<toml::table> parsed;
  try {
    parsed = toml::parse("v = " + raw + "\n");
  } catch (const toml::parse_error&) {
  }
  const toml::node* node = nullptr;
  if (parsed && parsed->size() == 1) node = parsed->get("v");
  if (f->kind == Kind::String && !(node && node->is_string())) {
    assign(*f, r, toml::value<std::string>(raw), where);  // run.name=2024-01-01 stays the text typed
  } else if (node) {
    assign(*f, r, *node, where);
  } else {
    assign(*f, r, toml::value<std::string>(raw), where);  // -> "must be an integer, got a string"
  }
}

void validate_recipe(const Recipe& r, const std::string& origin) {
  auto fail = [&](const std::string& what) { range_error(origin, what); };
  auto positive = [&](int64_t v, const char* key) {
    if (v <= 0) fail(fmt::format("{} = {} must be > 0; set a positive value", key, v));
  };
  auto non_negative = [&](int64_t v, const char* key, const char* zero_means) {
    if (v < 0) fail(fmt::format("{} = {} must be >= 0 ({}); set a non-negative value", key, v, zero_means));
  };
  // A real-valued key within `bound` (">= a", "> a" or an interval such as "[a, b)"); `hint`
  // follows the message. NaN fails every bound.
  auto real = [&](double v, const char* key, std::string_view bound, std::string_view hint = "") {
    bool ok;
    if (bound[0] == '>') {
      const bool eq = bound[1] == '=';
      const double a = std::stod(std::string(bound.substr(eq ? 2 : 1)));
      ok = eq ? v >= a : v > a;
    } else {
      const size_t comma = bound.find(',');
      const double a = std::stod(std::string(bound.substr(1, comma - 1)));
      const double b = std::stod(std::string(bound.substr(comma + 1, bound.size() - comma - 2)));
      ok = (bound[0] == '[' ? v >= a : v > a) && (bound.back() == ']' ? v <= b : v < b);
    }
    if (!ok) fail(fmt::format("{} = {} must be {}{}{}", key, v, bound[0] == '>' ? "" : "in ", bound, hint));
  };
  // key = "v" must be one of `choices`: the message lists them (and `note`) and suggests the nearest.
  auto one_of = [&](const std::string& v, const char* key, const char* what, const std::vector<std::string>& choices,
                    const char* note = "") {
    if (std::find(choices.begin(), choices.end(), v) != choices.end()) return;
    std::string list;
    for (size_t i = 0; i < choices.size(); ++i)
      list += fmt::format("{}\"{}\"", i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ", choices[i]);
    fail(fmt::format("{} = \"{}\" is not {}; use {}{}{}", key, v, what, list, note, suggest(v, choices)));
  };
  for (const auto& f : fields()) {
    if (f.kind != Kind::Float) continue;
    double v = *static_cast<double*>(f.ptr(const_cast<Recipe&>(r)));
    if (!std::isfinite(v)) fail(fmt::format("{} = {} must be a finite number; set a real value", f.name(), v));
  }

  if (r.run.name.empty()) fail("run.name is empty; give the run a name");
  if (r.run.out_dir.empty()) fail("run.out_dir is empty; set a folder for checkpoints and metrics");
  if (r.run.threads < 0) fail(fmt::format("run.threads = {} must be >= 0 (0 = all cores)", r.run.threads));
  if (r.run.seed > uint64_t(std::numeric_limits<int64_t>::max()))
    fail(fmt::format("run.seed = {} does not fit a TOML integer; use a seed below 2^63", r.run.seed));

  // the model's own keys, data kind, checks and capabilities: its row of the registry
  validate_model(r, fail);
  validate_finetune(r, fail);
  constexpr int64_t kMinVocab = 16;
  if (r.model.vocab_size < kMinVocab || r.model.vocab_size > (int64_t(1) << 31) - 1)
    fail(fmt::format("model.vocab_size = {} is out of range; use a value between {} and 2^31-1 (4096 suits the KJV)",
                     r.model.vocab_size, kMinVocab));
  positive(r.model.block_size, "model.block_size");
  positive(r.model.n_layer, "model.n_layer");
  positive(r.model.n_head, "model.n_head");
  positive(r.model.n_embd, "model.n_embd");
  if (r.model.n_embd % r.model.n_head != 0)
    fail(fmt::format("model.n_embd = {} is not divisible by model.n_head = {}; choose n_embd as a multiple of n_head",
                     r.model.n_embd, r.model.n_head));
  real(r.model.dropout, "model.dropout", "[0, 1)", "; use e.g. 0.0 or 0.1");
  real(r.model.layer_norm_eps, "model.layer_norm_eps", "> 0", "; use e.g. 1e-5");
  real(r.model.init_std, "model.init_std", "> 0", "; use e.g. 0.02");

  if (r.data.corpus.empty()) fail("data.corpus is empty; use \"kjv\" or a path to a text file or folder");
  if (r.data.dir.empty()) fail("data.dir is empty; set the folder for prepared data");
  real(r.data.val_fraction, "data.val_fraction", "(0, 1)", "; use e.g. 0.05");

  positive(r.train.steps, "train.steps");
  positive(r.train.batch_size, "train.batch_size");
  positive(r.train.seq_len, "train.seq_len");
  if (r.train.seq_len > r.model.block_size)
    fail(fmt::format("train.seq_len = {} exceeds model.block_size = {}; lower train.seq_len or raise model.block_size",
                     r.train.seq_len, r.model.block_size));
  non_negative(r.train.eval_every, "train.eval_every", "0 = only at the end");
  positive(r.train.eval_batches, "train.eval_batches");
  positive(r.train.log_every, "train.log_every");
  non_negative(r.train.checkpoint_every, "train.checkpoint_every", "0 = only at the end");
  real(r.train.grad_clip, "train.grad_clip", ">= 0", " (0 = off)");
  real(r.train.clip_value, "train.clip_value", ">= 0", " (0 = off); it clamps each gradient element to [-v, v]");
  if (r.train.patience < 1)
    fail(fmt::format("train.patience = {} must be >= 1 (evaluations without improvement before early stopping)",
                     r.train.patience));
  real(r.train.min_delta, "train.min_delta", ">= 0", "; use e.g. 0 (any decrease counts) or 0.01");
  real(r.parallel.timeout_s, "parallel.timeout_s", ">= 0", " (0 = no watchdog); use e.g. 1800");
  one_of(r.train.nonfinite, "train.nonfinite", "a non-finite step policy", {"stop", "skip", "rollback"});
  real(r.train.spike_zscore, "train.spike_zscore", ">= 0", " (0 = off); use e.g. 5 (standard deviations)");
  if (r.train.spike_window < 2)
    fail(fmt::format("train.spike_window = {} must be >= 2 (steps of history for train.spike_zscore)",
                     r.train.spike_window));
  if (r.train.nonfinite == "rollback" && (r.parallel.tp > 1 || r.parallel.pp > 1))
    fail(
        "train.nonfinite = \"rollback\" is not supported with tensor or pipeline parallelism (parallel.tp / "
        "parallel.pp > 1) yet; use \"skip\" or \"stop\"");
  if (r.train.early_stop && r.train.eval_every == 0)
    fail(
        "train.early_stop = true needs periodic evaluations, but train.eval_every = 0 (only at the end); set "
        "train.eval_every to a positive period, e.g. 100");

  one_of(r.optim.name, "optim.name", "a known optimizer", {"lamb", "adamw", "sgd"});
  real(r.optim.lr, "optim.lr", "> 0", "; use e.g. 1e-3");
  real(r.optim.weight_decay, "optim.weight_decay", ">= 0", "; use e.g. 0.1 (or 0 for none)");
  real(r.optim.beta1, "optim.beta1", "[0, 1)", "; use e.g. 0.9");
  real(r.optim.beta2, "optim.beta2", "[0, 1)", "; use e.g. 0.95");
  real(r.optim.eps, "optim.eps", "> 0", "; use e.g. 1e-8");
  real(r.optim.momentum, "optim.momentum", "[0, 1)", "; use e.g. 0.9");
  if (r.optim.nesterov && r.optim.name != "sgd")
    fail(fmt::format("optim.nesterov = true applies to optim.name = \"sgd\" only, not \"{}\"; remove it or use sgd",
                     r.optim.name));
  if (r.optim.nesterov && r.optim.momentum == 0)
    fail("optim.nesterov = true needs optim.momentum > 0 (got 0); set e.g. optim.momentum = 0.9");

  positive(r.train.accumulation, "train.accumulation");
  const std::string& am = r.train.accumulation_mode;
  one_of(am, "train.accumulation_mode", "a known mode", {"static", "ramp", "noise_scale"});
  non_negative(r.train.accumulation_max, "train.accumulation_max", "0 = train.accumulation");
  non_negative(r.train.ramp_steps, "train.ramp_steps", "0 = no ramp");
  if (am == "static" && r.train.accumulation_max != 0 && r.train.accumulation_max != r.train.accumulation)
    fail(
        fmt::format("train.accumulation_max = {} has no effect with train.accumulation_mode = \"static\"; set "
                    "accumulation_mode = \"ramp\" or \"noise_scale\", or remove accumulation_max",
                    r.train.accumulation_max));
  if (am != "static" && r.train.accumulation_max <= r.train.accumulation)
    fail(
        fmt::format("train.accumulation_mode = \"{}\" needs train.accumulation_max > train.accumulation ({} <= {}); "
                    "raise accumulation_max",
                    am, r.train.accumulation_max, r.train.accumulation));
  if (am == "ramp" && r.train.ramp_steps <= 0)
    fail("train.accumulation_mode = \"ramp\" needs train.ramp_steps > 0 (steps to reach accumulation_max)");
  if (am == "noise_scale" && r.train.accumulation < 2)
    fail(
        fmt::format("train.accumulation_mode = \"noise_scale\" measures the gradient of one micro-batch against "
                    "the whole step, so it needs train.accumulation >= 2 (got {})",
                    r.train.accumulation));
  if (am == "noise_scale" && r.parallel.zero >= 2)
    fail(
        fmt::format("train.accumulation_mode = \"noise_scale\" needs the local micro-batch gradient, which ZeRO-{} "
                    "does not keep; use parallel.zero = 0 or 1",
                    r.parallel.zero));
  real(r.train.noise_ema, "train.noise_ema", "[0, 1)", "; use e.g. 0.9");

  if (r.parallel.dp < 1 || r.parallel.dp > 65536)
    fail(
        fmt::format("parallel.dp = {} must be between 1 and 65536; it must equal the number of processes "
                    "(mpirun -np <dp>)",
                    r.parallel.dp));
  if (r.parallel.zero < 0 || r.parallel.zero > 3)
    fail(
        fmt::format("parallel.zero = {} is not a ZeRO stage; use 0 (none), 1 (optimizer state), 2 (+ gradients) or "
                    "3 (+ parameters)",
                    r.parallel.zero));
  one_of(r.parallel.allreduce, "parallel.allreduce", "a known algorithm", {"mpi", "ring", "tree"});
  real(r.parallel.bucket_mb, "parallel.bucket_mb", "(0, 4096]", "; use e.g. 4 or 25");
  for (auto [key, v] : {std::pair<const char*, int64_t>{"tp", r.parallel.tp},
                        {"pp", r.parallel.pp},
                        {"microbatches", r.parallel.microbatches},
                        {"virtual_stages", r.parallel.virtual_stages}})
    if (v < 1 || v > 65536) fail(fmt::format("parallel.{} = {} must be between 1 and 65536", key, v));
  if (r.parallel.max_in_flight < 0)
    fail(fmt::format("parallel.max_in_flight = {} must be >= 0 (0 = no limit)", r.parallel.max_in_flight));
  const std::string& ps = r.parallel.schedule;
  one_of(ps, "parallel.schedule", "a pipeline schedule", {"gpipe", "1f1b", "interleaved", "zb-h1", "dynamic"});
  if (r.train.batch_size % r.parallel.microbatches != 0)
    fail(
        fmt::format("parallel.microbatches = {} must divide train.batch_size = {} (each pipeline micro-batch is "
                    "batch_size / microbatches rows)",
                    r.parallel.microbatches, r.train.batch_size));
  if (r.parallel.virtual_stages > 1 && ps != "interleaved" && ps != "dynamic")
    fail(
        fmt::format("parallel.virtual_stages = {} needs parallel.schedule = \"interleaved\" (or \"dynamic\"); "
                    "\"{}\" runs one stage per rank",
                    r.parallel.virtual_stages, ps));
  if (ps == "interleaved" && r.parallel.microbatches % r.parallel.pp != 0)
    fail(
        fmt::format("parallel.schedule = \"interleaved\" runs micro-batches in groups of parallel.pp = {}: "
                    "parallel.microbatches = {} must be a multiple of it",
                    r.parallel.pp, r.parallel.microbatches));
  if (r.parallel.atom_rows < 1)
    fail(fmt::format("parallel.atom_rows = {} must be >= 1 (rows per atom of parallel.deterministic)",
                     r.parallel.atom_rows));
  if (r.parallel.deterministic) {
    const int64_t rows = r.train.batch_size * r.train.accumulation, a = r.parallel.atom_rows;
    const std::string split = fmt::format("train.batch_size x train.accumulation = {} x {} = {} rows per rank",
                                          r.train.batch_size, r.train.accumulation, rows);
    if (rows % a != 0)
      fail(
          fmt::format("parallel.deterministic = true: {} is not a multiple of parallel.atom_rows = {}; every rank "
                      "must hold whole atoms",
                      split, a));
    else if (((rows / a) & (rows / a - 1)) != 0)
      fail(
          fmt::format("parallel.deterministic = true: {} make {} atoms of parallel.atom_rows = {} per rank; the "
                      "canonical summation tree needs a power of two (1, 2, 4, 8, ...): change batch_size, "
                      "accumulation or atom_rows",
                      split, rows / a, a));
    if (r.parallel.tp > 1 || r.parallel.pp > 1)
      fail(
          fmt::format("parallel.deterministic = true is for data parallelism; it does not combine with "
                      "parallel.tp = {} / parallel.pp = {} yet",
                      r.parallel.tp, r.parallel.pp));
    if (r.train.accumulation_mode != "static")
      fail(
          fmt::format("parallel.deterministic = true needs train.accumulation_mode = \"static\" (the atoms per "
                      "step are fixed), not \"{}\"",
                      r.train.accumulation_mode));
    if (r.parallel.sync_batchnorm)
      fail(
          "parallel.deterministic = true normalises each atom with its own statistics; it does not combine with "
          "parallel.sync_batchnorm = true");
    if (r.parallel.allreduce == "ring")
      fail(
          "parallel.allreduce = \"ring\" has no effect with parallel.deterministic = true (gradients are summed "
          "by the binomial tree, in a fixed order); remove it or set \"tree\"");
  }
  if (r.parallel.tp > 1 || r.parallel.pp > 1) {
    const std::string what = fmt::format("parallel.tp = {}, parallel.pp = {}", r.parallel.tp, r.parallel.pp);
    if (r.parallel.zero > 1)
      fail(
          fmt::format("{}: model parallelism combines with ZeRO-0 or ZeRO-1 on the dp axis; parallel.zero = {} "
                      "is not supported with it",
                      what, r.parallel.zero));
    if (r.train.accumulation_mode == "noise_scale")
      fail(
          fmt::format("{}: train.accumulation_mode = \"noise_scale\" is not supported with model parallelism; use "
                      "\"static\" or \"ramp\"",
                      what));
    if (r.optim.name == "lamb" && r.parallel.tp > 1)
      fail(
          fmt::format("{}: LAMB's trust ratios need whole-matrix norms, which tensor parallelism splits; use "
                      "optim.name = \"adamw\" or \"sgd\", or parallel.tp = 1",
                      what));
  }

  const std::string& rc = r.memory.recompute;
  one_of(rc, "memory.recompute", "a recompute policy", {"none", "full", "selective", "every_k", "budget"});
  if (r.memory.every_k < 1)
    fail(fmt::format("memory.every_k = {} must be >= 1 (recompute blocks 0, k, 2k, ...)", r.memory.every_k));
  real(r.memory.budget_mb, "memory.budget_mb", ">= 0");
  if (rc == "budget" && r.memory.budget_mb <= 0)
    fail("memory.recompute = \"budget\" needs memory.budget_mb > 0 (the peak activation MiB of a step)");
  if (rc != "budget" && r.memory.budget_mb > 0)
    fail(
        fmt::format("memory.budget_mb = {} has no effect with memory.recompute = \"{}\"; set recompute = "
                    "\"budget\" or remove budget_mb",
                    r.memory.budget_mb, rc));

  const PrecisionConfig& pc = r.precision;
  one_of(pc.level, "precision.level", "an AMP level", {"O0", "O1", "O2", "O3"},
         " (fp32; autocast; low-precision model with fp32 master weights; pure low precision)");
  one_of(pc.dtype, "precision.dtype", "a low-precision dtype", {"bf16", "fp16"});
  const std::string& ls = pc.loss_scale;
  one_of(ls, "precision.loss_scale", "a loss-scaling mode", {"auto", "none", "static", "dynamic", "adaptive"});
  if (!(pc.min_scale > 0 && pc.min_scale <= pc.init_scale && pc.init_scale <= pc.max_scale &&
        std::isfinite(pc.max_scale)))
    fail(
        fmt::format("precision: need 0 < min_scale <= init_scale <= max_scale (finite), got min_scale = {}, "
                    "init_scale = {}, max_scale = {}",
                    pc.min_scale, pc.init_scale, pc.max_scale));
  real(pc.growth, "precision.growth", "> 1", "; use e.g. 2");
  real(pc.backoff, "precision.backoff", "(0, 1)", "; use e.g. 0.5");
  positive(pc.growth_interval, "precision.growth_interval");
  positive(pc.hysteresis, "precision.hysteresis");
  if (pc.level == "O0" && (ls == "static" || ls == "dynamic" || ls == "adaptive"))
    fail(
        fmt::format("precision.loss_scale = \"{}\" with precision.level = \"O0\": fp32 gradients need no loss "
                    "scaling; set precision.level to \"O1\", \"O2\" or \"O3\", or loss_scale to \"auto\"",
                    ls));

  const std::string& sn = r.schedule.name;
  one_of(sn, "schedule.name", "a known schedule", {"constant", "cosine", "linear", "step", "wsd"});
  non_negative(r.schedule.warmup_steps, "schedule.warmup_steps", "0 = no warmup");
  if (r.schedule.warmup_steps > r.train.steps)
    fail(fmt::format("schedule.warmup_steps = {} exceeds train.steps = {}; lower the warmup or train longer",
                     r.schedule.warmup_steps, r.train.steps));
  real(r.schedule.min_lr, "schedule.min_lr", ">= 0");
  if (sn != "constant" && r.schedule.min_lr > r.optim.lr)
    fail(
        fmt::format("schedule.min_lr = {} exceeds optim.lr = {}; the floor of the \"{}\" schedule must be below the "
                    "peak lr",
                    r.schedule.min_lr, r.optim.lr, sn));
  const int64_t after_warmup = r.train.steps - r.schedule.warmup_steps;
  if (sn == "step" && r.schedule.step_every <= 0)
    fail(
        fmt::format("schedule.name = \"step\" needs schedule.step_every > 0 (got {}): the period in steps between "
                    "lr decays, e.g. {}",
                    r.schedule.step_every, std::max<int64_t>(after_warmup / 3, 1)));
  if (sn == "step" && r.schedule.step_every >= after_warmup)
    fail(
        fmt::format("schedule.step_every = {} is not below the {} steps after warmup, so the lr would never decay; "
                    "lower schedule.step_every or use schedule.name = \"constant\"",
                    r.schedule.step_every, after_warmup));
  if (sn != "step" && r.schedule.step_every != 0)
    fail(fmt::format("schedule.step_every = {} only applies to schedule.name = \"step\" (this is \"{}\"); remove it",
                     r.schedule.step_every, sn));
  real(r.schedule.step_gamma, "schedule.step_gamma", "(0, 1)", ": the lr factor per step period, e.g. 0.1 or 0.5");
  if (sn == "wsd" && r.schedule.decay_steps <= 0)
    fail(
        fmt::format("schedule.name = \"wsd\" needs schedule.decay_steps > 0 (got {}): the length of the final "
                    "decay, e.g. {} (20% of train.steps)",
                    r.schedule.decay_steps, std::max<int64_t>(r.train.steps / 5, 1)));
  if (sn == "wsd" && r.schedule.decay_steps > after_warmup)
    fail(
        fmt::format("schedule.decay_steps = {} is longer than the {} steps after warmup (train.steps {} - "
                    "schedule.warmup_steps {}); shorten the decay or the warmup",
                    r.schedule.decay_steps, after_warmup, r.train.steps, r.schedule.warmup_steps));
  if (sn != "wsd" && r.schedule.decay_steps != 0)
    fail(fmt::format("schedule.decay_steps = {} only applies to schedule.name = \"wsd\" (this is \"{}\"); remove it",
                     r.schedule.decay_steps, sn));
  const std::string& shape = r.schedule.decay_shape;
  one_of(shape, "schedule.decay_shape", "a known shape", {"linear", "cosine", "sqrt"});
  if (sn != "wsd" && shape != "linear")
    fail(
        fmt::format("schedule.decay_shape = \"{}\" only applies to schedule.name = \"wsd\" (this is \"{}\"); "
                    "remove it",
                    shape, sn));

  non_negative(r.sample.tokens, "sample.tokens", "0 = no sample");
  real(r.sample.temperature, "sample.temperature", "> 0", "; use e.g. 0.8 (small values approach greedy)");
  non_negative(r.sample.top_k, "sample.top_k", "0 = no top-k filter");
  if (r.sample.top_k > r.model.vocab_size)
    fail(fmt::format("sample.top_k = {} exceeds model.vocab_size = {}; lower sample.top_k", r.sample.top_k,
                     r.model.vocab_size));
}

Recipe parse_recipe(const std::string& toml_text, const std::string& origin, const std::vector<std::string>& overrides,
                    bool resolve) {
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw ConfigError(
        fmt::format("recipe {}:{}:{}: invalid TOML: {}; fix the syntax", origin, b.line, b.column, e.description()));
  }
  Recipe r;
  r.path = origin;
  apply_table(r, root, origin);
  for (const auto& o : overrides) apply_override(r, o);
  if (resolve) resolve_init_from(r, origin);
  validate_recipe(r, origin);
  return r;
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  std::error_code ec;
  BRIGADE_CHECK(fs::exists(path, ec), ConfigError,
                "recipe file '{}' not found; check the path (recipes/ holds examples, e.g. recipes/gpt-kjv.toml)",
                path);
  BRIGADE_CHECK(fs::is_regular_file(path, ec), ConfigError, "recipe '{}' is not a file; pass a .toml recipe file",
                path);
  std::ifstream in(path, std::ios::binary);
  BRIGADE_CHECK(in.good(), IoError, "recipe file '{}' cannot be opened; check its permissions", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  BRIGADE_CHECK(!in.bad(), IoError, "recipe file '{}' could not be read; check the disk", path);
  // An empty file would train every default (a 1300-step run on the Bible corpus): surely not meant.
  bool empty = true;
  {
    std::istringstream lines(ss.str());
    for (std::string line; empty && std::getline(lines, line);) {
      const size_t k = line.find_first_not_of(" \t\r");
      empty = k == std::string::npos || line[k] == '#';
    }
  }
  BRIGADE_CHECK(!empty, ConfigError,
                "recipe file '{}' is empty (no keys, only blanks or comments); write the run's settings in it, e.g. "
                "start from a copy of recipes/gpt-kjv.toml",
                path);
  return parse_recipe(ss.str(), path, overrides);
}

std::string recipe_to_toml(const Recipe& r) {
  std::string out = "# Brigade recipe: every key, defaults included (written by recipe_to_toml).\n";
  if (!r.path.empty()) out += "# Source: " + r.path + "\n";
  std::string_view current;
  for (const auto& f : fields()) {
    if (current != f.section) {
      current = f.section;
      out += fmt::format("\n[{}]\n", f.section);
    }
    out += fmt::format("{} = {}\n", f.key, field_toml(f, r));
  }
  return out;
}

std::vector<int64_t> parse_count_list(const std::string& key, const std::string& value) {
  std::vector<int64_t> out;
  std::stringstream in(value);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;  // not a number: reported below
    }
    BRIGADE_CHECK(used > 0 && item.find_first_not_of(' ', used) == std::string::npos, ConfigError,
                  "{} = \"{}\": \"{}\" is not a count; write counts separated by commas, e.g. \"3,4,5\"", key, value,
                  item);
    out.push_back(v);
  }
  return out;
}

std::vector<int64_t> swin_depths(const ModelConfig& m) {
  return m.depths.empty() ? std::vector<int64_t>{2, 2} : parse_count_list("model.depths", m.depths);
}

}  // namespace brigade::train

namespace brigade::train {

std::string did_you_mean(const std::string& wrong, const std::vector<std::string>& candidates) {
  return suggest(wrong, candidates);
}

std::map<std::string, std::string> recipe_values(const Recipe& r) {
  std::map<std::string, std::string> out;
  std::string section;
  std::istringstream in(recipe_to_toml(r));
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) out[section + "." + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

int resolve_threads(int64_t run_threads) {
  if (run_threads > 0) return int(run_threads);
  if (const char* v = std::getenv("OMP_NUM_THREADS"); v && std::atoi(v) > 0) return std::atoi(v);
  int local = 1;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* v = std::getenv(name); v && *v) {
      local = std::max(1, std::atoi(v));
      break;
    }
  return std::max(1, omp_get_num_procs() / local);
}

void set_threads(int64_t run_threads) { omp_set_num_threads(resolve_threads(run_threads)); }

}  // namespace brigade::train
