-- dtrun/raster.lua: draws the SVG subset that dtrun/plot.lua writes (rect, line, polyline, text, rotated text) into
-- an RGB image, written as PNG (dt_io_write_png: zlib). Text uses a built-in 5x7 bitmap font (ASCII).
local ffi = require "ffi"
local dtffi = require "dt.ffi"

local M = {}

-- The 5x7 font: 5 column bytes per character from ' ' (32) to '~' (126), bit 0 the top row.
local FONT = table.concat {
   "0000000000", "00005f0000", "0007000700", "147f147f14", "242a7f2a12", "2313086462", "3649552250", "0005030000",
   "001c224100", "0041221c00", "14083e0814", "08083e0808", "0050300000", "0808080808", "0060600000", "2010080402",
   "3e5149453e", "00427f4000", "4261514946", "2141454b31", "1814127f10", "2745454539", "3c4a494930", "0171090503",
   "3649494936", "064949291e", "0036360000", "0056360000", "0814224100", "1414141414", "0041221408", "0201510906",
   "324979413e", "7e1111117e", "7f49494936", "3e41414122", "7f4141221c", "7f49494941", "7f09090901", "3e4149497a",
   "7f0808087f", "00417f4100", "2040413f01", "7f08142241", "7f40404040", "7f020c027f", "7f0408107f", "3e4141413e",
   "7f09090906", "3e4151215e", "7f09192946", "4649494931", "01017f0101", "3f4040403f", "1f2040201f", "3f4038403f",
   "6314081463", "0708700807", "6151494543", "007f414100", "0204081020", "0041417f00", "0402010204", "4040404040",
   "0001020400", "2054545478", "7f48444438", "3844444420", "384444487f", "3854545418", "087e090102", "0c5252523e",
   "7f08040478", "00447d4000", "2040443d00", "7f10284400", "00417f4000", "7c04180478", "7c08040478", "3844444438",
   "7c14141408", "081414187c", "7c08040408", "4854545420", "043f444020", "3c4040207c", "1c2040201c", "3c4030403c",
   "4428102844", "0c5050503c", "4464544c44", "0836410000", "00007f0000", "0041360800", "0804081008",
}

local function glyph(ch)
   local i = ch:byte() - 31
   if i < 1 or i > 95 then i = 32 end -- '?' for anything else
   local cols = {}
   for c = 0, 4 do cols[c] = tonumber(FONT:sub((i - 1) * 10 + c * 2 + 1, (i - 1) * 10 + c * 2 + 2), 16) end
   return cols
end

local NAMED = { white = { 255, 255, 255 }, black = { 0, 0, 0 } }

-- { r, g, b } of "#rgb", "#rrggbb", "white", "black"; nil for "none" or nothing.
local function color(s)
   if not s or s == "none" then return nil end
   if NAMED[s] then return NAMED[s] end
   local hex = s:match("^#(%x+)$")
   if hex and #hex == 3 then hex = hex:gsub(".", "%0%0") end
   if not hex or #hex ~= 6 then error(("raster: unsupported colour '%s'"):format(s), 0) end
   return { tonumber(hex:sub(1, 2), 16), tonumber(hex:sub(3, 4), 16), tonumber(hex:sub(5, 6), 16) }
end

local Canvas = {}
Canvas.__index = Canvas

local function canvas(w, h)
   local px = ffi.new("uint8_t[?]", w * h * 3)
   ffi.fill(px, w * h * 3, 255)
   return setmetatable({ w = w, h = h, px = px }, Canvas)
end

function Canvas:dot(x, y, c)
   x, y = math.floor(x + 0.5), math.floor(y + 0.5)
   if x < 0 or y < 0 or x >= self.w or y >= self.h then return end
   local i = (y * self.w + x) * 3
   self.px[i], self.px[i + 1], self.px[i + 2] = c[1], c[2], c[3]
end

-- A square pen of side `width` along the segment.
function Canvas:line(x1, y1, x2, y2, c, width)
   local n = math.max(1, math.ceil(math.max(math.abs(x2 - x1), math.abs(y2 - y1)) * 2))
   local r = math.max(0, math.floor((width or 1) / 2 - 0.25))
   for k = 0, n do
      local x, y = x1 + (x2 - x1) * k / n, y1 + (y2 - y1) * k / n
      for dy = -r, r do
         for dx = -r, r do self:dot(x + dx, y + dy, c) end
      end
   end
end

function Canvas:fill_rect(x, y, w, h, c)
   for yy = math.floor(y + 0.5), math.floor(y + h + 0.5) - 1 do
      for xx = math.floor(x + 0.5), math.floor(x + w + 0.5) - 1 do self:dot(xx, yy, c) end
   end
end

-- Text with its baseline at y (anchor start, middle or end along the writing direction); rotated: reads upwards.
function Canvas:text(s, x, y, c, anchor, bold, rotated)
   local adv = 6
   local len = #s * adv - 1
   local off = anchor == "middle" and -len / 2 or anchor == "end" and -len or 0
   for i = 1, #s do
      local cols = glyph(s:sub(i, i))
      for col = 0, 4 do
         for row = 0, 6 do
            if bit.band(cols[col], bit.lshift(1, row)) ~= 0 then
               local u, v = off + (i - 1) * adv + col, row - 7 -- along the text, and down from the baseline
               for b = 0, bold and 1 or 0 do
                  if rotated then self:dot(x + v, y - u - b, c) else self:dot(x + u + b, y + v, c) end
               end
            end
         end
      end
   end
end

local function attrs(s)
   local a = {}
   for k, v in s:gmatch('([%w-]+)="([^"]*)"') do a[k] = v end
   return a
end

local function unescape(s)
   return (s:gsub("&(%a+);", { lt = "<", gt = ">", amp = "&", quot = '"' }))
end

-- The SVG text's picture as a canvas.
function M.draw(svg)
   local root = attrs(svg:match("<svg([^>]*)>") or error("raster: not an SVG", 0))
   local cv = canvas(tonumber(root.width), tonumber(root.height))
   for tag, body, text in svg:gmatch("<(%a+)([^>]*)>([^<]*)") do
      local a = attrs(body)
      local stroke = color(a.stroke)
      if tag == "rect" then
         local x, y, w, h = tonumber(a.x or 0), tonumber(a.y or 0), tonumber(a.width), tonumber(a.height)
         local fill = color(a.fill or "black")
         if fill then cv:fill_rect(x, y, w, h, fill) end
         if stroke then
            cv:line(x, y, x + w, y, stroke)
            cv:line(x + w, y, x + w, y + h, stroke)
            cv:line(x + w, y + h, x, y + h, stroke)
            cv:line(x, y + h, x, y, stroke)
         end
      elseif tag == "line" then
         cv:line(tonumber(a.x1), tonumber(a.y1), tonumber(a.x2), tonumber(a.y2), stroke, tonumber(a["stroke-width"]))
      elseif tag == "polyline" then
         local px, py
         for x, y in a.points:gmatch("([-%d.e+]+),([-%d.e+]+)") do
            x, y = tonumber(x), tonumber(y)
            if px then cv:line(px, py, x, y, stroke, tonumber(a["stroke-width"])) end
            px, py = x, y
         end
      elseif tag == "text" then
         local tx, ty = (a.transform or ""):match("translate%(([-%d.]+) ([-%d.]+)%)")
         local rotated = tx ~= nil
         cv:text(unescape(text), tonumber(tx or a.x), tonumber(ty or a.y), color(a.fill or "black"),
            a["text-anchor"], a["font-weight"] == "bold", rotated)
      end
   end
   return cv
end

-- Write the SVG text's picture to path as PNG.
function M.write_png(svg, path)
   local cv = M.draw(svg)
   dtffi.check(dtffi.C.dt_io_write_png(path, cv.px, cv.w, cv.h))
   return cv
end

return M
