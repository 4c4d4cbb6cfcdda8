-- dt/rl/init.lua: `require "dt.rl"`: KV-cached batched generation, sampling, rewards, GRPO, placement, adaptive async,
-- the policy's trainer strategy and exact-match evaluation.
return {
   generate = require "dt.rl.generate",
   sample = require "dt.rl.sample",
   kvcache = require "dt.rl.kvcache",
   rewards = require "dt.rl.rewards",
   rollouts = require "dt.rl.rollouts",
   grpo = require "dt.rl.grpo",
   async = require "dt.rl.async",
   placement = require "dt.rl.placement",
   policy = require "dt.rl.policy",
   eval = require "dt.rl.eval",
}
