/* main.c: the dtrun executable: a LuaJIT host that finds lua/ and hands argv to dtrun.cli. */
#define _GNU_SOURCE
#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dt_base.h"

#ifndef DT_BUILD_LUA_DIR
#error "DT_BUILD_LUA_DIR must be defined by the build"
#endif

static int file_exists(const char *path) { return access(path, R_OK) == 0; }

/* Lua search roots: an installed tree next to the executable wins over the build tree. */
static void lua_roots(char *buf, size_t n) {
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    char probe[PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/../share/dtrun/lua/dtrun/cli.lua", exe);
    if (file_exists(probe)) {
      snprintf(buf, n, "%s/../share/dtrun/lua", exe);
      return;
    }
  }
  snprintf(buf, n, "%s;%s", DT_BUILD_LUA_DIR, DT_SOURCE_LUA_DIR);
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg && getenv("DT_TRACEBACK") == NULL) return 1; /* plain message; DT_TRACEBACK=1 for the stack */
  luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
  return 1;
}

int main(int argc, char **argv) {
  dt_clear_error(); /* also keeps libdt linked so ffi.C sees its symbols */
  /* Line-buffered even into a pipe or file (| tee, CI logs, the agent's capture of a worker): each line appears
   * as it is printed, and stdout and stderr lines keep their order when both go to one place. LuaJIT's io.stdout,
   * io.stderr and print write through these FILEs. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  setvbuf(stderr, NULL, _IOLBF, 0);
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, "dtrun: cannot create a Lua state (out of memory)\n");
    return 1;
  }
  luaL_openlibs(L);

  char roots[2 * PATH_MAX + 8], path[8 * PATH_MAX];
  lua_roots(roots, sizeof roots);
  size_t used = 0;
  const char *extra = getenv("DT_LUA_PATH");
  if (extra && *extra) used += (size_t)snprintf(path + used, sizeof path - used, "%s;", extra);
  for (char *root = strtok(roots, ";"); root && used < sizeof path; root = strtok(NULL, ";"))
    used += (size_t)snprintf(path + used, sizeof path - used, "%s/?.lua;%s/?/init.lua;", root, root);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  snprintf(path + used, sizeof path - used, "%s", lua_tostring(L, -1));
  lua_pop(L, 1);
  lua_pushstring(L, path);
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);

  lua_createtable(L, argc, 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i);
  }
  lua_setglobal(L, "arg");

  lua_pushcfunction(L, traceback);
  lua_getglobal(L, "require");
  lua_pushstring(L, "dtrun.cli");
  int status = lua_pcall(L, 1, 1, 1);
  if (status == 0) {
    lua_getfield(L, -1, "main");
    lua_getglobal(L, "arg");
    status = lua_pcall(L, 1, 1, 1);
  }
  int code = 0;
  if (status != 0) {
    fprintf(stderr, "dtrun: %s\n", lua_tostring(L, -1));
    code = 1;
  } else if (lua_isnumber(L, -1)) {
    code = (int)lua_tointeger(L, -1);
  }
  fflush(stdout);
  lua_close(L);
  return code;
}
