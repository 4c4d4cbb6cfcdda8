-- recipes/ddp.lua: GPT pretraining with data parallelism: recipes/train.lua, which wraps its model with
-- ddp.wrap whenever it runs on more than one rank.
--
--    dtrun recipes/ddp.lua --nproc 2 steps=200
return dofile((arg[0]:match("^(.*/)") or "") .. "train.lua")
