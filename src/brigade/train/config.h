// Recipe: one TOML file = model + data + optimizer + schedule + run settings.
// Parsing is strict: an unknown key or a value of the wrong type is a ConfigError
// that names the key and the file. `--set section.key=value` overrides any key
// (the value is parsed as TOML; bare words are strings). Defaults live here, in
// the struct initialisers, and docs/recipes.md lists every key.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace brigade::train {

struct RunConfig {
  std::string name = "run";
  std::string out_dir = "runs/run";  // checkpoints, metrics.jsonl
  uint64_t seed = 1337;
  int threads = 0;  // 0 = this process's share of the node's cores (resolve_threads)
  bool operator==(const RunConfig&) const = default;
};

struct ModelConfig {
  std::string type = "gpt";  // a row of the model registry (train/registry.h): "gpt" | "llama" | "bert" |
                             // "vit" | "resnet18" | "resnet50" | "swin" | "clip"
  int64_t vocab_size = 4096;
  int64_t block_size = 128;  // max sequence length (n_positions)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 256;
  double dropout = 0.0;
  double layer_norm_eps = 1e-5;
  double init_std = 0.02;
  // llama only:
  int64_t n_kv_head = 0;          // key/value heads (grouped-query attention); 0 = n_head
  int64_t intermediate_size = 0;  // SwiGLU width; 0 = 8 n_embd / 3 rounded up to a multiple of 64
  double rope_theta = 10000.0;    // rotary embedding base
  // Scaled rotary frequencies (ops/position.h): "none" | "linear" (inv_freq / factor) | "llama3"
  // (Llama 3.1's wavelength-dependent blend). The numbers default to 0 = unset: the chosen
  // scaling must set each one it reads, and "none" none of them.
  std::string rope_scaling = "none";
  double rope_scaling_factor = 0.0;         // linear, llama3: > 0
  double rope_low_freq_factor = 0.0;        // llama3: > 0
  double rope_high_freq_factor = 0.0;       // llama3: > rope_low_freq_factor
  int64_t rope_original_max_positions = 0;  // llama3: the pre-training context length, > 0
  bool tie_embeddings = false;              // the LM head is the token embedding (no lm_head.weight)
  // image classifiers only (vit: n_layer, n_head, n_embd, intermediate_size (0 = 4 n_embd), dropout,
  // layer_norm_eps and init_std as for the language models):
  int64_t image_size = 28;             // square input side (Fashion-MNIST: 28)
  int64_t patch_size = 7;              // vit: patch side, dividing image_size
  int64_t num_classes = 10;            // classifier outputs
  int64_t in_channels = 1;             // input channels (Fashion-MNIST: 1, grey)
  int64_t width = 64;                  // resnet: channels of the stem and stage 1 (torchvision: 64)
  std::string stem = "small";          // resnet: "small" (3x3 stride-1 conv, no max-pool: 28x28 inputs) |
                                       // "imagenet" (torchvision's 7x7 stride-2 conv + 3x3 stride-2 max-pool)
  std::string memory_format = "nchw";  // resnet: activation layout, "nchw" | "channels_last" (NHWC convs
                                       // and batch norms: faster on oneDNN, same model and checkpoints)
  // swin (n_embd = embed_dim, n_head = heads of stage 0, doubling per stage; patch_size as vit):
  std::string depths = "";  // blocks per stage, e.g. "2,2" ("" = "2,2")
  int64_t window_size = 7;  // attention window side (stage grids must be multiples, or smaller)
  double mlp_ratio = 4.0;   // MLP width / stage width
  // clip (image tower: n_layer, n_head, n_embd, intermediate_size, patch_size as vit):
  int64_t text_layers = 0;     // text transformer layers (0 = n_layer)
  int64_t text_heads = 0;      // text heads (0 = n_head)
  int64_t text_width = 0;      // text width (0 = n_embd); MLP 4 x text_width
  int64_t projection_dim = 0;  // shared embedding width (0 = n_embd)
  // align (text tower: n_layer, n_head, n_embd, intermediate_size (0 = 4 n_embd) as bert; image
  // tower: an EfficientNet given by EfficientNet's block strings, one per stage, comma-separated:
  // "r<repeats>_k<kernel>_s<stride>_e<expand ratio>_i<in>_o<out>" (HF's num_block_repeats,
  // kernel_sizes, strides, expand_ratios, in_channels, out_channels); "" = the 28x28 default of
  // registry.cpp (docs/models.md)):
  std::string stages = "";
  double width_coefficient = 1.0;      // channel multiplier (HF round_filters, divisor 8)
  double depth_coefficient = 1.0;      // repeat multiplier (ceil)
  std::string depthwise_padding = "";  // block indices whose stride-2 conv pads symmetrically, e.g. "4"
  // flamingo (docs/models.md): the frozen towers are Brigade checkpoint directories, the vision
  // tower a clip run's (its vision_model.*), the language model a gpt run's (its transformer.*);
  // their shapes come from the checkpoints' recipes.
  std::string vision_from = "";           // e.g. "runs/clip-fashion/checkpoint"
  std::string lm_from = "";               // e.g. "runs/gpt-kjv/checkpoint"
  int64_t resampler_depth = 2;            // Perceiver resampler layers
  int64_t resampler_heads = 4;            // its heads (head width = the vision width / heads)
  int64_t resampler_latents = 16;         // latents per image
  int64_t cross_attn_every_n_layers = 1;  // a gated cross-attention block before LM layers 0, n, 2n, ...
  // Start from pretrained weights (docs/finetuning.md): a Hugging Face model directory (config.json
  // + safetensors; gpt and llama) or a Brigade checkpoint directory (recipe.toml + model.safetensors;
  // any model). The model's shape keys are then read from it; "" = train from scratch (run.seed).
  std::string init_from = "";
  bool operator==(const ModelConfig&) const = default;
};

struct DataConfig {
  std::string corpus = "kjv";    // "kjv" (Debian bible-kjv) or a path to a text file or folder;
                                 // "fashion-mnist": the image data of the vision models (dir = its IDX files)
  std::string dir = "data/kjv";  // prepared data: tokenizer.model, train.bin, val.bin, meta.json
  double val_fraction = 0.05;
  bool augment = false;           // fashion-mnist: random crop (pad 2) + horizontal flip per training image
  double mlm_probability = 0.15;  // bert: fraction of positions chosen for masking (80/10/10 rule)
  // gpt / llama: "text" (a corpus prepared into token files) | "jsonl" (supervised fine-tuning samples
  // in data.corpus, a JSONL file: {"text"}, {"prompt", "completion"} or {"messages"}; data/text/sft.h)
  std::string format = "text";
  std::string chat_template = "chatml";  // jsonl messages: "chatml" | "llama-2" | "llama-3"
  bool operator==(const DataConfig&) const = default;
};

struct TrainConfig {
  int64_t steps = 1000;
  int64_t batch_size = 8;
  int64_t seq_len = 128;
  int64_t eval_every = 100;  // 0 = only at the end
  int64_t eval_batches = 16;
  bool eval_at_start = false;  // also evaluate (the whole val set) before the first step, as step 0
  int64_t log_every = 10;
  int64_t checkpoint_every = 0;              // 0 = only at the end
  bool early_stop = false;                   // stop when val loss stops improving; best model in <out_dir>/best
  int64_t patience = 5;                      // early_stop: evaluations without improvement before stopping
  double min_delta = 0.0;                    // early_stop: an improvement must lower val loss by more than this
  double grad_clip = 1.0;                    // global L2 norm; 0 = off
  double clip_value = 0.0;                   // clamp each gradient element to [-v, v] after grad_clip; 0 = off
  int64_t accumulation = 1;                  // micro-steps per optimizer step (batch_size rows each); the start
                                             // value for the adaptive modes
  std::string accumulation_mode = "static";  // "static" | "ramp" | "noise_scale" (train/accumulation.h)
  int64_t accumulation_max = 0;              // ceiling of the adaptive modes (0 = accumulation)
  int64_t ramp_steps = 0;                    // ramp: steps over which accumulation grows to accumulation_max
  double noise_ema = 0.9;                    // noise_scale: moving-average factor of the estimates
  std::string loss_on = "completion";        // data.format = "jsonl": "completion" (completions / assistant turns
                                             // only) | "all" (every token)
  // A non-finite loss or gradient norm (train/step_guard.h): "stop" (an error naming the step) |
  // "skip" (no update that step) | "rollback" (back to the last checkpoint, that step's batch skipped)
  std::string nonfinite = "stop";
  double spike_zscore = 0.0;   // skip a step whose loss or grad norm is this many standard deviations
                               // above the last spike_window steps' mean; 0 = off
  int64_t spike_window = 100;  // steps of history for spike_zscore
  bool operator==(const TrainConfig&) const = default;
};

struct OptimConfig {
  std::string name = "adamw";  // "adamw" | "lamb" | "sgd" (docs/optimizers.md)
  double lr = 1e-3;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double momentum = 0.9;  // sgd only
  bool nesterov = false;  // sgd only: Nesterov momentum (needs momentum > 0)
  bool operator==(const OptimConfig&) const = default;
};

struct ScheduleConfig {
  std::string name = "cosine";         // "constant" | "cosine" | "linear" | "step" | "wsd" (docs/optimizers.md)
  int64_t warmup_steps = 100;          // linear warmup, for every schedule
  double min_lr = 1e-4;                // floor of the decaying schedules
  int64_t step_every = 0;              // step only: decay period in steps (> 0)
  double step_gamma = 0.1;             // step only: lr factor per period
  int64_t decay_steps = 0;             // wsd only: length of the final decay (> 0)
  std::string decay_shape = "linear";  // wsd only: "linear" | "cosine" | "sqrt"
  bool operator==(const ScheduleConfig&) const = default;
};

// Data parallelism (see docs/distributed.md). Launch with `mpirun -np <dp>`;
// global batch = train.batch_size x train.accumulation x parallel.dp.
struct ParallelConfig {
  int64_t dp = 1;                 // data-parallel ranks; must equal the number of processes
  int64_t zero = 0;               // ZeRO stage: 0 (plain DDP), 1 (optimizer state), 2 (+ grads), 3 (+ params)
  std::string allreduce = "mpi";  // "mpi" | "ring" | "tree"
  double bucket_mb = 4.0;         // gradient bucket size (MiB), filled in reverse parameter order
  bool overlap = true;            // communicate buckets during the backward pass
  // Model parallelism (docs/model-parallel.md): processes = dp x tp x pp.
  int64_t tp = 1;                 // tensor-parallel ranks (Megatron: heads, MLP and vocabulary split)
  int64_t pp = 1;                 // pipeline stages (ranks); the blocks are cut into pp x virtual_stages
  int64_t microbatches = 1;       // pipeline micro-batches per batch_size rows (batch_size % microbatches == 0)
  std::string schedule = "1f1b";  // "gpipe" | "1f1b" | "interleaved" | "zb-h1" | "dynamic"
  int64_t virtual_stages = 1;     // interleaved: chunks per pipeline rank (dynamic: the most it may try)
  std::string stage_layers = "";  // blocks per stage, e.g. "3,4,5" ("" = cut by estimated cost)
  int64_t max_in_flight = 0;      // dynamic: the most micro-batches' activations a rank may hold (0 = no limit)
  // BatchNorm under data parallelism: false = each rank normalises with its own rows' statistics
  // (torch DDP's default; rank 0's running statistics are kept), true = statistics over the whole
  // data-parallel group (torch.nn.SyncBatchNorm): dp ranks of B rows then equal one process of dp x B.
  bool sync_batchnorm = false;
  // A collective that has not completed after this many seconds ends the job, naming the ranks
  // that did not arrive (dist/watchdog.h; under mpirun with 2+ ranks). 0 = wait for ever.
  double timeout_s = 1800.0;
  // Results that do not depend on the layout (docs/distributed.md "Deterministic mode"): every
  // micro-step is an atom of atom_rows rows and gradients are summed in one fixed tree over the
  // atoms, so dp, ZeRO stage and the batch_size x accumulation split of the same global batch give
  // bitwise the same run. batch_size x accumulation / atom_rows must be a power of two.
  bool deterministic = false;
  int64_t atom_rows = 1;
  bool operator==(const ParallelConfig&) const = default;
};

// Activation memory (see docs/memory.md "Activation recompute"): which transformer
// blocks the backward recomputes instead of keeping their activations.
struct MemoryConfig {
  std::string recompute = "none";  // "none" | "full" | "selective" | "every_k" | "budget"
  int64_t every_k = 2;             // every_k: full recompute of blocks 0, k, 2k, ...
  double budget_mb = 0.0;          // budget: peak activation MiB per step (0 = unset)
  bool operator==(const MemoryConfig&) const = default;
};

// Mixed precision (see docs/mixed-precision.md): the AMP level, the low-precision
// dtype and loss scaling (amp/policy.h, amp/loss_scaler.h).
struct PrecisionConfig {
  std::string level = "O0";         // "O0" (fp32) | "O1" (autocast) | "O2" (low-precision model, fp32
                                    // master weights) | "O3" (pure low precision, unstable)
  std::string dtype = "bf16";       // "bf16" | "fp16": the low precision of O1..O3
  std::string loss_scale = "auto";  // "auto" (dynamic for fp16, none otherwise) | "none" | "static" |
                                    // "dynamic" | "adaptive"
  double init_scale = 65536.0;      // static: the scale; dynamic/adaptive: the start (2^16)
  int64_t growth_interval = 1000;   // dynamic/adaptive: clean steps in a row before the scale grows
  double growth = 2.0;              // dynamic: growth factor
  double backoff = 0.5;             // dynamic/adaptive: factor on overflow
  double min_scale = 1.0;           // floor
  double max_scale = 16777216.0;    // ceiling (2^24)
  int64_t hysteresis = 2;           // adaptive: overflows in a row tolerated (skipped, no back-off)
  bool operator==(const PrecisionConfig&) const = default;
};

// Fine-tuning (docs/finetuning.md): which parameters train.
struct FinetuneConfig {
  std::string method = "full";  // "full": every parameter | "lora": LoRA adapters only, the rest frozen
  bool operator==(const FinetuneConfig&) const = default;
};

// LoRA (finetune.method = "lora"): y = W x + s B A dropout(x), s = alpha / r (rslora: alpha / sqrt(r)).
struct LoraConfig {
  int64_t r = 8;                    // adapter rank
  double alpha = 8.0;               // scale numerator (PEFT's lora_alpha)
  double dropout = 0.0;             // on the adapter's input
  std::string target_modules = "";  // comma-separated layer names ("c_attn"; "q_proj,v_proj"); "" = the model's
                                    // default (gpt: c_attn, llama: q_proj,v_proj)
  bool rslora = false;              // scale alpha / sqrt(r)
  std::string base_dtype = "f32";   // "f32" | "bf16": how the frozen base is stored (gpt, llama); the adapters
                                    // stay fp32 master weights either way
  bool operator==(const LoraConfig&) const = default;
};

struct SampleConfig {
  std::string prompt = "In the beginning";
  int64_t tokens = 64;
  double temperature = 0.8;
  int64_t top_k = 40;
  bool operator==(const SampleConfig&) const = default;
};

struct Recipe {
  std::string path;  // file it was read from ("" for defaults)
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  ScheduleConfig schedule;
  ParallelConfig parallel;
  MemoryConfig memory;
  PrecisionConfig precision;
  FinetuneConfig finetune;
  LoraConfig lora;
  SampleConfig sample;
  bool operator==(const Recipe&) const = default;  // compares path too
};

// Reads `path`, applies `overrides` ("section.key=value", in order), validates
// ranges and combinations (e.g. n_embd % n_head == 0, seq_len <= block_size).
Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from TOML text (for tests); `origin` names the source in messages. `resolve`: fill the
// model's shape from model.init_from (train/finetune.h); a checkpoint's saved recipe, already
// resolved, is read without it, so it loads when that directory is gone.
Recipe parse_recipe(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides = {}, bool resolve = true);
// The recipe as TOML (every key, defaults included), stored beside checkpoints.
std::string recipe_to_toml(const Recipe& r);

// Helpers (used by the functions above; exposed for the CLI and tests).
// Applies one "section.key=value" override; ConfigError names the override.
void apply_override(Recipe& r, const std::string& override_text);
// Range and combination checks; ConfigError "recipe ORIGIN: <what>; <what to change>".
void validate_recipe(const Recipe& r, const std::string& origin);
// Every recipe key as "section.key", in file order.
std::vector<std::string> recipe_keys();

// "3,4,5" -> {3, 4, 5}: comma-separated integers (spaces allowed after each). ConfigError naming
// `key` and the bad item otherwise (used for parallel.stage_layers and model.depths).
std::vector<int64_t> parse_count_list(const std::string& key, const std::string& value);

// model.depths for swin: the parsed list ("" = {2, 2}).
std::vector<int64_t> swin_depths(const ModelConfig& m);

// " (did you mean 'x'?)" for the candidate closest to `wrong`, or "" when none is close.
std::string did_you_mean(const std::string& wrong, const std::vector<std::string>& candidates);
// "section.key" -> value as recipe_to_toml writes it, for every key (comparing two recipes).
std::map<std::string, std::string> recipe_values(const Recipe& r);

// This process's OpenMP threads for run.threads: a positive value as given; 0 = this process's
// share of the node's cores: every core for one process, the cores divided by the ranks on this
// node under mpirun (OMPI_COMM_WORLD_LOCAL_SIZE, or MPICH's MPI_LOCALNRANKS), so that 2 ranks on
// 2 cores get 1 thread each rather than 2 that contend for the same cores; OMP_NUM_THREADS
// where the user set it. set_threads applies it (omp_set_num_threads).
int resolve_threads(int64_t run_threads);
void set_threads(int64_t run_threads);

}  // namespace brigade::train
