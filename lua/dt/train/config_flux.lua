-- dt/train/config_flux.lua: Flux's config shape (the seed tutorial's config-8gpu.yaml) mapped onto recipes/grpo.lua's
-- keys, for --config files (dt.train.config_file calls M.map on every file; a file without Flux's keys is unchanged).
--
-- Flux's keys (its FluxConfig):
--   model_path (model.path), output_dir (run_dir), num_steps (steps), learning_rate (lr), seed, log_interval
--   (log_every), checkpoint_interval (checkpoint_every), prompts (flux train --prompts: the recipe's prompts);
--   batch_size: completions per step over all trainer ranks: grpo.prompts_per_step = batch_size / (trainer ranks x
--   group_size), a whole number or an error;
--   algorithm: name (grpo; a string alone too), group_size, clip_range (grpo.epsilon), kl_coef (grpo.beta),
--   max_grad_norm (clip), normalize_advantages (grpo.scale_rewards group | none), and any grpo key by its name;
--   adaptive_async: grpo.adaptive_async (dt.rl.async's keys; kp is its gain, ema_alpha = 1 - its ema);
--   rollout: max_tokens (grpo.max_new_tokens), top_k (-1: off), temperature, top_p, min_p, any grpo key;
--   distributed: world_size (the trainer ranks: checked), tensor_parallel x data_parallel = world_size
--   (tensor_parallel > 1 is the trainers' tp axis, model.mesh_shape = {{data_parallel, tensor_parallel}, {"dp", "tp"}},
--   colocated or separated, and batch_size counts completions over the data_parallel ranks; separated: at least
--   rollout_ranks of them), placement (colocated | separated: grpo.placement) and rollout_ranks, also at the top
--   level.
-- Flux settings with no meaning here (M.notes) get a one-line note; any other key is an error naming it.
local config_file = require "dt.train.config_file"

local fail, note, recipe_key, as_list = config_file.fail, config_file.note, config_file.recipe_key, config_file.as_list

local M = {}

M.notes = {
   model_type = "the architecture comes from model_path's config.json",
   gradient_accumulation_steps = "one optimizer step per batch of rollouts (grpo.num_iterations passes over it)",
   eval_interval = "the recipe measures greedy accuracy before and after training",
   sglang = "rollouts come from dtrun's own generation engine, not a server (grpo.placement=separated gives them ranks "
      .. "of their own)",
   megatron = "the trainers are DDP, FSDP (strategy=ddp|fsdp) or tensor-parallel (model.mesh_shape); distributed: sets "
      .. "their sizes",
   weight_sync = "trainer 0 broadcasts the full weights to the rollout ranks after each step (grpo.publish_dtype=bf16 "
      .. "halves the bytes)",
   batch_composer = "a batch is the rollouts of prompts_per_step prompts, in order",
   importance_correction = "the loss always weighs tokens by their importance ratio to the behaviour log-probs, "
      .. "clipped by grpo.epsilon",
   reward = "rewards are Lua functions in the recipe (dt.rl.rewards)",
   -- algorithm.*: what GRPO here has no use for
   entropy_coef = "no entropy bonus in GRPO here", value_coef = "GRPO has no value model",
   clip_range_vf = "GRPO has no value model", gamma = "one reward per completion: no discounting",
   gae_lambda = "group-relative advantages, no GAE", kl_target = "beta (kl_coef) is fixed",
   adv_estimator = "GRPO's group-relative advantages", policy_loss = "grpo.loss_type chooses the loss",
   -- adaptive_async.*: Flux's PID and staleness mix
   tolerance = "the controller moves the ratio by gain x (target - EMA of staleness) every step",
   ki = "the controller is proportional (kp = gain)", kd = "the controller is proportional (kp = gain)",
   max_steps_without_sync = "rollout ranks take every publish", max_version_gap = "staleness is bounded by the "
      .. "async ratio (at most 2 x num_iterations - 1 versions)",
   -- rollout.*: Flux's APRIL batching
   oversample_ratio = "a batch is exactly prompts_per_step prompts", min_yield_size = "a batch is exactly "
      .. "prompts_per_step prompts", batch_timeout = "generation has no timeout",
   use_length_prediction = "continuous batching refills finished slots instead",
   partial_reuse_threshold = "unfinished rollouts are not carried over", partial_buffer_max_factor = "unfinished "
      .. "rollouts are not carried over",
}
for _, k in ipairs { "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon" } do
   M.notes[k] = "recipes/grpo.lua's AdamW takes lr alone (edit its optim.AdamW line, or --deepspeed FILE)"
end
for _, k in ipairs { "wandb_project", "wandb_run_name" } do
   M.notes[k] = "metrics go to <run dir>/metrics.jsonl and TensorBoard"
end
for _, k in ipairs { "kl_normalizer", "iw_normalizer", "kl_weight", "iw_weight", "version_weight" } do
   M.notes[k] = "staleness here is the token-weighted version gap alone (README: Adaptive async)"
end

-- Flux's top-level keys that are recipe keys under another name, and its sections read after the others (they
-- depend on each other: batch_size on group_size and the placement). A key of either, of M.notes or adaptive_async
-- that is not a recipe key marks a file as Flux's.
local renamed = { model_path = "model.path", output_dir = "run_dir", num_steps = "steps", learning_rate = "lr",
   log_interval = "log_every", checkpoint_interval = "checkpoint_every" }
local later = { algorithm = true, rollout = true, distributed = true, batch_size = true, placement = true,
   rollout_ranks = true }

-- t (a loaded config file) in Flux's shape mapped onto the recipe's keys (see above), or t itself when it is not.
function M.map(t, schema, path)
   local is_flux = false
   for k in pairs(t) do
      if schema[k] == nil and (renamed[k] or later[k] or M.notes[k] or k == "adaptive_async") then is_flux = true end
   end
   if not is_flux then return t end
   if type(schema.grpo) ~= "table" then
      fail(path, "Flux's config shape (model_path, algorithm, adaptive_async, ...) is for recipes/grpo.lua")
   end
   local out, sections, grpo = {}, {}, {}
   out.grpo = grpo
   local function set_grpo(key, name, v)
      if schema.grpo[name] == nil then fail(path, "%s: this recipe's grpo table has no `%s` key for it", key, name) end
      grpo[name] = v
   end
   local function mapping(key, v)
      if type(v) ~= "table" or v[1] ~= nil then fail(path, "%s must be a mapping, got %s", key, type(v)) end
      return v
   end
   -- each key of section `name`: handlers[k] (a grpo key name, or function(v, key)), a note, or (grpo_keys) a grpo
   -- key of the same name
   local function section(name, v, handlers, grpo_keys)
      local keys = {}
      for k in pairs(mapping(name, v)) do keys[#keys + 1] = tostring(k) end
      table.sort(keys)
      for _, k in ipairs(keys) do
         local h, key = handlers[k], name .. "." .. k
         if type(h) == "string" then
            set_grpo(key, h, v[k])
         elseif h then
            h(v[k], key)
         elseif M.notes[k] then
            note(path, key, M.notes[k])
         elseif grpo_keys and schema.grpo[k] ~= nil then
            set_grpo(key, k, v[k])
         else
            local known = {}
            for hk in pairs(handlers) do known[hk] = true end
            fail(path, "unknown key %s (Flux's keys here: %s%s)", key, as_list(known),
               grpo_keys and ", or a grpo key" or "")
         end
      end
   end
   local top = {}
   for k in pairs(t) do top[#top + 1] = k end
   table.sort(top) -- notes in a fixed order; the recipe's own grpo table (after adaptive_async) wins over Flux's keys
   for _, k in ipairs(top) do
      local v = t[k]
      if renamed[k] then
         local a, b = renamed[k]:match("^(%w+)%.(%w+)$")
         if a then
            if type(schema[a]) ~= "table" or schema[a][b] == nil then
               fail(path, "%s: this recipe has no %s key for it", k, renamed[k])
            end
            out[a] = out[a] or {}
            out[a][b] = v
         else
            out[recipe_key(schema, renamed[k], k, path)] = v
         end
      elseif M.notes[k] then
         note(path, k, M.notes[k])
      elseif k == "adaptive_async" then -- dt.rl.async's keys by their names, and Flux's kp and ema_alpha
         local ours = {}
         local handlers = { kp = function(x) ours.gain = x end, ema_alpha = function(x) ours.ema = 1 - x end }
         for _, name in ipairs { "target_staleness", "min_async_ratio", "max_async_ratio", "max_offpolicy_kl", "gain",
            "ema" } do
            handlers[name] = function(x) ours[name] = x end
         end
         section(k, v, handlers)
         set_grpo(k, "adaptive_async", ours)
      elseif later[k] then
         sections[k] = v
      elseif k == "grpo" and type(v) == "table" then -- the recipe's own grpo keys beside Flux's
         for gk, gv in pairs(v) do grpo[gk] = gv end
      elseif schema[k] ~= nil then
         out[k] = v
      else
         fail(path, "unknown key %s (neither Flux's nor a key of this recipe)", tostring(k))
      end
   end
   local dist = {}
   if sections.algorithm ~= nil then
      local a = sections.algorithm
      if type(a) == "string" then a = { name = a } end
      section("algorithm", a, {
         name = function(x)
            if x ~= "grpo" then fail(path, "algorithm.name = %s: recipes/grpo.lua runs GRPO", tostring(x)) end
         end,
         group_size = "group_size", clip_range = "epsilon", kl_coef = "beta",
         max_grad_norm = function(x) out[recipe_key(schema, "clip", "algorithm.max_grad_norm", path)] = x end,
         normalize_advantages = function(x, key) set_grpo(key, "scale_rewards", x and "group" or "none") end }, true)
   end
   if sections.rollout ~= nil then
      section("rollout", sections.rollout, { max_tokens = "max_new_tokens",
         top_k = function(x, key) set_grpo(key, "top_k", x < 0 and 0 or x) end }, true)
   end
   for _, k in ipairs { "placement", "rollout_ranks" } do dist[k] = sections[k] end
   if sections.distributed ~= nil then
      section("distributed", sections.distributed, {
         world_size = function(x) dist.world_size = x end, tensor_parallel = function(x) dist.tp = x end,
         data_parallel = function(x) dist.dp = x end, placement = function(x) dist.placement = x end,
         rollout_ranks = function(x) dist.rollout_ranks = x end })
   end
   if dist.placement ~= nil then set_grpo("placement", "placement", dist.placement) end
   if dist.rollout_ranks ~= nil then set_grpo("rollout_ranks", "rollout_ranks", dist.rollout_ranks) end
   local world = tonumber(os.getenv("WORLD_SIZE")) or 1
   local separated = (grpo.placement or schema.grpo.placement) == "separated"
   local rollout_ranks = separated and (grpo.rollout_ranks or schema.grpo.rollout_ranks or 1) or 0
   local trainers = world - rollout_ranks
   if dist.world_size ~= nil and dist.world_size ~= trainers then
      fail(path, "distributed.world_size = %s trainer ranks, but this job has %d: start it with `dtrun --nproc %s` "
         .. "(or --gpus)", tostring(dist.world_size), trainers, tostring(dist.world_size + rollout_ranks))
   end
   if dist.tp and dist.dp and dist.tp * dist.dp ~= (dist.world_size or trainers) then
      fail(path, "distributed: tensor_parallel %s x data_parallel %s is not world_size %s", tostring(dist.tp),
         tostring(dist.dp), tostring(dist.world_size or trainers))
   end
   local data_ranks = trainers -- the ranks that draw their own rollouts (a tp group draws one set)
   if dist.tp and dist.tp > 1 then
      if type(schema.model) ~= "table" or schema.model.mesh_shape == nil then
         fail(path, "distributed.tensor_parallel: this recipe has no model.mesh_shape key for it")
      end
      if trainers % dist.tp ~= 0 then
         fail(path, "distributed.tensor_parallel = %s does not divide the %d trainer ranks: use a divisor of %d",
            tostring(dist.tp), trainers, trainers)
      end
      data_ranks = trainers / dist.tp
      if data_ranks < rollout_ranks then -- a rollout rank serves data ranks (a tp group trains on one batch)
         fail(path, "distributed.tensor_parallel = %s leaves %d data-parallel rank(s) of the %d trainers for %d "
            .. "rollout_ranks: lower rollout_ranks to at most %d or tensor_parallel", tostring(dist.tp), data_ranks,
            trainers, rollout_ranks, data_ranks)
      end
      out.model = out.model or {}
      out.model.mesh_shape = data_ranks > 1 and { { data_ranks, dist.tp }, { "dp", "tp" } } or { { dist.tp }, { "tp" } }
   end
   if sections.batch_size ~= nil then
      local b, group = sections.batch_size, grpo.group_size or schema.grpo.group_size
      local per = type(b) == "number" and b / (data_ranks * group) or 0
      if per < 1 or per % 1 ~= 0 then
         fail(path, "batch_size = %s completions per step: over %d %s rank(s) x group_size %s that is not a whole "
            .. "number of prompts per rank (make batch_size a multiple of %d)", tostring(b), data_ranks,
            data_ranks == trainers and "trainer" or "data-parallel", tostring(group), data_ranks * group)
      end
      set_grpo("batch_size", "prompts_per_step", per)
   end
   return out
end

return M
