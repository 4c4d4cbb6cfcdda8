-- dt/version.lua: the release version string.
return "0.1.0"
