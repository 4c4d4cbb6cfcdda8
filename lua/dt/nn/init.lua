-- dt/nn/init.lua: `require "dt.nn"`: the Module base and every layer and model, in one table.
--
--    local nn = require "dt.nn"
--    local model = nn.GPT { vocab = 256, seq = 256, dim = 384, layers = 6, heads = 6, seed = 1 }
--    local loss = model(idx, targets)
local module = require "dt.nn.module"
local layers = require "dt.nn.layers"
local attention = require "dt.nn.attention"
local transformer = require "dt.nn.transformer"

local nn = {
   Module = module.Module,
   ModuleList = module.ModuleList,
   is_module = module.is_module,
   register_grad_ready_hook = module.register_grad_ready_hook,
   CausalSelfAttention = attention.CausalSelfAttention,
}
for _, family in ipairs { layers, transformer } do
   for name, cls in pairs(family) do nn[name] = cls end
end

return nn
