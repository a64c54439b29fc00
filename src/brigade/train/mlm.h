// Masked-language-model pre-training for model.type = "bert" (issue 8). Work in progress.
#pragma once
#include <string>

#include "brigade/train/config.h"
#include "brigade/train/trainer.h"

namespace brigade::train {

// `brigade train` for model.type = "bert": trains, prints the final line, returns the exit code.
int train_bert_cli(const Recipe& r, const TrainOptions& opts);
// `brigade eval --ckpt DIR` for a bert checkpoint: prints the result, returns the exit code.
int eval_bert_cli(const std::string& ckpt_dir, int threads);

}  // namespace brigade::train
