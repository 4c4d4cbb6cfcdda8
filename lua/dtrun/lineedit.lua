-- dtrun/lineedit.lua: the REPL's line input: libedit editing, history, tab completion on a terminal, else plain lines.
local ffi = require "ffi"

ffi.cdef [[
char *readline(const char *prompt);
int add_history(const char *line);
int read_history(const char *file);
int write_history(const char *file);
void stifle_history(int max);
typedef char *(*dt_rl_generator)(const char *text, int state);
extern dt_rl_generator rl_completion_entry_function;
int isatty(int fd);
unsigned int umask(unsigned int mask);
char *strdup(const char *s);
void free(void *p);
]]

local M = {}

-- libedit, or nil and a message saying how to get it.
local function load_libedit()
   for _, name in ipairs({ "edit", "libedit.so.2" }) do
      local ok, lib = pcall(ffi.load, name)
      if ok then return lib end
   end
   return nil, "line editing is off: libedit was not found (install it: apt-get install libedit2); reading plain lines"
end

-- The completions of `text` ("tra", "model.blo", "trainer:add"): keys(expr) gives the names in the table `expr`
-- evaluates to ("" for the globals); returns the full texts that start with `text`, sorted.
function M.candidates(text, keys)
   local head, sep, tail = text:match("^(.*)([%.:])([%w_]*)$")
   if not head then head, sep, tail = "", "", text end
   if not tail:match("^[%a_]?[%w_]*$") or not (head == "" or head:match("^[%a_][%w_%.%[%]]*$")) then return {} end
   local out = {}
   for _, k in ipairs(keys(head) or {}) do
      if k:sub(1, #tail) == tail then out[#out + 1] = head .. sep .. k end
   end
   table.sort(out)
   return out
end

-- A reader: reader:line(prompt) returns the next line or nil at the end of input. On a terminal (and with libedit)
-- lines are edited, kept in the history file $HOME/.dtrun_history (created 0600) and completed with keys(expr)
-- (see M.candidates); otherwise they are read from stdin as they come.
function M.new(keys)
   local lib, why
   if ffi.C.isatty(0) == 1 then lib, why = load_libedit() end
   if why then io.stderr:write("dtrun: ", why, "\n") end
   if not lib then return { line = function(_, prompt)
      io.stdout:write(prompt)
      io.stdout:flush()
      return io.read("*l")
   end } end
   local home = os.getenv("HOME")
   local file = home and home ~= "" and (home .. "/.dtrun_history") or nil
   lib.stifle_history(1000)
   if file then lib.read_history(file) end
   local found, state = {}, 0
   -- libedit calls this with state 0 for a new word, then 1, 2, ... for its next candidates; it frees what it gets
   local generator = ffi.cast("dt_rl_generator", function(text, n)
      if n == 0 then
         local ok, list = pcall(M.candidates, ffi.string(text), keys)
         found, state = ok and list or {}, 0
      end
      state = state + 1
      return found[state] and ffi.C.strdup(found[state]) or nil
   end)
   lib.rl_completion_entry_function = generator
   local reader = { lib = lib, generator = generator }
   function reader.line(_, prompt)
      local p = lib.readline(prompt)
      if p == nil then return nil end
      local text = ffi.string(p)
      ffi.C.free(p)
      if text:match("%S") then
         lib.add_history(text)
         if file then
            -- a new history file is the user's alone: chunks may hold secrets
            local old = ffi.C.umask(tonumber("077", 8))
            lib.write_history(file)
            ffi.C.umask(old)
         end
      end
      return text
   end
   jit.off(reader.line) -- libedit calls back into Lua (completion): the call to readline must not be compiled
   return reader
end

return M
