// A model that is not in Brigade's zoo, trained through the library: the small CNN of
// MindSpore's mixed-precision example (conv 3 -> 32, ReLU, 2x2 max-pool, flatten, dense to 10
// classes, on 32 x 32 x 3 inputs). Everything here is user code outside src/: the model is an
// nn::Module, the task is the library's image-classification task (Fashion-MNIST, padded to 32 x 32
// and repeated to 3 channels by a fixed 1x1 convolution), and train::train supplies the rest as
// for any zoo model — the step, O2 fp16 with a static loss scale of 1024 (the recipe beside this
// file), the schedule, evaluation, metrics.jsonl, checkpoints, Ctrl-C.
//
//   build/bin/custom_cnn examples/custom_cnn/custom_cnn.toml [--set section.key=value ...]
//
// Exits 0 when the training loss fell (the mean of the first five logged steps against the last
// five), 2 when it did not, 1 on an error.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/core/rng.h"
#include "brigade/dist/process_group.h"
#include "brigade/nn/conv.h"
#include "brigade/nn/layers.h"
#include "brigade/nn/norm.h"
#include "brigade/train/config.h"
#include "brigade/train/tasks.h"
#include "brigade/train/trainer.h"

using namespace brigade;

namespace {

// conv 3 -> 32 (3x3, "same"), ReLU, 2x2 max-pool, flatten, dense 32 * 16 * 16 -> 10.
class SmallCNN : public nn::Module {
 public:
  SmallCNN() {
    conv = register_module("conv", std::make_shared<nn::Conv2d>(3, 32, 3, 1, 1, /*bias=*/true));
    pool = register_module("pool", std::make_shared<nn::MaxPool2d>(2, 2));
    fc = register_module("fc", std::make_shared<nn::Linear>(32 * 16 * 16, 10));
  }
  // torch's default initialisation: uniform in +-1/sqrt(fan_in) for every weight and bias.
  void init_weights(Generator& g) {
    for (auto& [name, p] : named_parameters()) {
      const bool is_conv = name.rfind("conv", 0) == 0;
      const double bound = 1.0 / std::sqrt(is_conv ? 3.0 * 3 * 3 : 32.0 * 16 * 16);
      std::vector<float> v(static_cast<size_t>(p.numel()));
      for (float& x : v) x = float((g.uniform_double() * 2.0 - 1.0) * bound);
      p.copy_(Tensor::from_vector(v, p.shape()));
    }
  }
  // images (N, 3, 32, 32) -> logits (N, 10)
  Tensor forward(const Tensor& x) const {
    Tensor h = pool->forward(fn::relu(conv->forward(x)));  // (N, 32, 16, 16)
    return fc->forward(fn::reshape(h, {x.size(0), 32 * 16 * 16}));
  }
  // Multiply-adds of one image: the conv 32 x 3 x 3 x 3 per output pixel of 32 x 32, the dense layer.
  static double flops_per_image() { return 3.0 * 2.0 * (32.0 * 27 * 32 * 32 + 8192.0 * 10); }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::MaxPool2d> pool;
  std::shared_ptr<nn::Linear> fc;
};

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s RECIPE [--set section.key=value ...]\n", argv[0]);
    return 1;
  }
  std::vector<std::string> sets;
  for (int i = 2; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--set") sets.emplace_back(argv[i + 1]);
  const train::Recipe r = train::load_recipe(argv[1], sets);

  auto cnn = std::make_shared<SmallCNN>();
  Generator g(r.run.seed);
  cnn->init_weights(g);
  // Fashion-MNIST's (N, 1, 28, 28) to the CNN's (N, 3, 32, 32): a 1x1 convolution of ones with
  // padding 2 copies the grey channel to three and pads with zeros. A constant, not a parameter.
  const Tensor to_rgb = Tensor::ones({3, 1, 1, 1});

  train::ImageClassifier c;
  c.module = cnn;
  c.forward = [m = cnn.get(), to_rgb](const Tensor& images) {
    return m->forward(fn::conv2d(images, to_rgb, Tensor(), /*stride=*/1, /*padding=*/2));  // (N, 10)
  };
  c.flops_per_image = SmallCNN::flops_per_image();
  c.description = "SmallCNN (user model: conv 3->32, ReLU, max-pool 2, dense 8192->10)";
  const std::unique_ptr<train::Task> task = train::image_classification_task(r, c);

  train::TrainOptions o;
  o.sample = false;
  const train::TrainResult res = train::train(r, o, *task);
  if (dist::Env::world_rank() != 0) return 0;
  std::printf("%s\n", res.evaluated ? res.final_line.c_str() : "no evaluation");

  std::vector<double> losses;
  std::ifstream f(r.run.out_dir + "/metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss") && !j.contains("val_loss")) losses.push_back(j["loss"].get<double>());
  }
  if (losses.size() < 10) {
    std::fprintf(stderr, "custom_cnn: only %zu logged steps; train for at least 10\n", losses.size());
    return 1;
  }
  double first = 0, last = 0;
  for (size_t i = 0; i < 5; ++i) first += losses[i] / 5, last += losses[losses.size() - 1 - i] / 5;
  std::printf(
      "custom_cnn: training loss %.4f (first 5 steps) -> %.4f (last 5), %lld of %lld steps skipped on "
      "overflow, final loss scale %g\n",
      first, last, static_cast<long long>(res.skipped_steps), static_cast<long long>(res.steps), res.loss_scale);
  return last < first ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  dist::Env::init(&argc, &argv);
  int code = 1;
  try {
    code = run(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "custom_cnn: error: %s\n", e.what());
  }
  dist::Env::finalize();
  return code;
}
