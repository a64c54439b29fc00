// The optimizer, schedule and clipping recipe keys (brigade_config): defaults, that each
// new value parses, and that invalid combinations are one-line ConfigErrors naming the
// keys and what to change. (The rest of recipe parsing is tests/train/test_config.cpp.)
#include <gtest/gtest.h>

#include "brigade/core/error.h"
#include "brigade/train/config.h"

using namespace brigade;
using brigade::train::parse_recipe;

namespace {

// Short runs: 100 steps, 10 warmup, unless the text says otherwise.
const char* kBase = "[train]\nsteps = 100\n[schedule]\nwarmup_steps = 10\n";

train::Recipe parse(const std::vector<std::string>& overrides) { return parse_recipe(kBase, "r.toml", overrides); }

void expect_error(const std::vector<std::string>& overrides, const std::vector<std::string>& needles) {
  try {
    parse(overrides);
    ADD_FAILURE() << "expected ConfigError for " << ::testing::PrintToString(overrides);
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    for (const auto& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "missing '" << n << "' in: " << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << "message should be one line: " << m;
  }
}

}  // namespace

TEST(OptimRecipe, DefaultsLeaveTheNewOptionsOff) {
  const train::Recipe r = parse_recipe("", "empty.toml");
  EXPECT_EQ(r.train.clip_value, 0.0);
  EXPECT_FALSE(r.optim.nesterov);
  EXPECT_EQ(r.schedule.step_every, 0);
  EXPECT_EQ(r.schedule.decay_steps, 0);
  EXPECT_EQ(r.schedule.decay_shape, "linear");
}

TEST(OptimRecipe, NewValuesParse) {
  EXPECT_EQ(parse({"optim.name=lamb"}).optim.name, "lamb");
  const train::Recipe s = parse({"optim.name=sgd", "optim.nesterov=true", "train.clip_value=0.5"});
  EXPECT_TRUE(s.optim.nesterov);
  EXPECT_EQ(s.train.clip_value, 0.5);
  EXPECT_EQ(parse({"schedule.name=linear"}).schedule.name, "linear");
  const train::Recipe st = parse({"schedule.name=step", "schedule.step_every=30", "schedule.step_gamma=0.5"});
  EXPECT_EQ(st.schedule.step_every, 30);
  EXPECT_EQ(st.schedule.step_gamma, 0.5);
  const train::Recipe w = parse({"schedule.name=wsd", "schedule.decay_steps=90", "schedule.decay_shape=sqrt"});
  EXPECT_EQ(w.schedule.decay_steps, 90);  // = steps - warmup: the longest allowed
  EXPECT_EQ(w.schedule.decay_shape, "sqrt");
  EXPECT_EQ(parse({"schedule.name=constant", "schedule.min_lr=1.0"}).schedule.min_lr, 1.0);  // no floor: allowed
}

TEST(OptimRecipe, InvalidCombinationsAreConfigErrors) {
  expect_error({"optim.name=lars"}, {"optim.name = \"lars\"", "\"lamb\"", "\"sgd\"", "did you mean 'lamb'"});
  expect_error({"optim.nesterov=true"}, {"optim.nesterov = true", "\"sgd\" only", "\"adamw\""});
  expect_error({"optim.name=sgd", "optim.nesterov=true", "optim.momentum=0"}, {"optim.nesterov", "optim.momentum > 0"});
  expect_error({"train.clip_value=-1"}, {"train.clip_value = -1", ">= 0"});
  expect_error({"schedule.name=cosin"}, {"schedule.name = \"cosin\"", "\"wsd\"", "did you mean 'cosine'"});
  for (const char* name : {"cosine", "linear", "step", "wsd"})
    expect_error({std::string("schedule.name=") + name, "schedule.min_lr=0.5", "schedule.step_every=30",
                  "schedule.decay_steps=20"},
                 {"schedule.min_lr = 0.5", "optim.lr", "below the peak"});
  expect_error({"schedule.name=step"}, {"schedule.step_every > 0", "e.g. 30"});
  expect_error({"schedule.name=step", "schedule.step_every=90"},
               {"schedule.step_every = 90", "90 steps after warmup", "never decay"});
  expect_error({"schedule.name=step", "schedule.step_every=30", "schedule.step_gamma=1"},
               {"schedule.step_gamma = 1", "(0, 1)"});
  expect_error({"schedule.step_every=30"}, {"schedule.step_every = 30", "only applies", "\"cosine\""});
  expect_error({"schedule.name=wsd"}, {"schedule.decay_steps > 0", "e.g. 20"});
  expect_error({"schedule.name=wsd", "schedule.decay_steps=91"},
               {"schedule.decay_steps = 91", "longer than the 90 steps after warmup", "train.steps 100",
                "schedule.warmup_steps 10"});
  expect_error({"schedule.name=linear", "schedule.decay_steps=20"}, {"schedule.decay_steps = 20", "only applies"});
  expect_error({"schedule.name=wsd", "schedule.decay_steps=20", "schedule.decay_shape=exp"},
               {"schedule.decay_shape = \"exp\"", "\"sqrt\""});
  expect_error({"schedule.decay_shape=cosine"}, {"schedule.decay_shape = \"cosine\"", "only applies", "\"wsd\""});
}

TEST(OptimRecipe, NewKeysRoundTripThroughToml) {
  const train::Recipe r = parse({"optim.name=sgd", "optim.nesterov=true", "train.clip_value=0.25", "schedule.name=wsd",
                                 "schedule.decay_steps=40", "schedule.decay_shape=cosine"});
  const train::Recipe back = parse_recipe(train::recipe_to_toml(r), "r.toml");
  EXPECT_EQ(back.optim, r.optim);
  EXPECT_EQ(back.schedule, r.schedule);
  EXPECT_EQ(back.train.clip_value, 0.25);
}
