# gen_cdef.cmake: wraps the preprocessed public headers (IN) into a Lua module (OUT) returning the cdef text.
file(READ "${IN}" text)
string(REGEX REPLACE "__attribute__ *\\(\\([^)]*\\)\\)" "" text "${text}")
file(WRITE "${OUT}.tmp" "-- generated from runtime/include by tools/gen_cdef.cmake; do not edit\nreturn [==[\n${text}]==]\n")
file(RENAME "${OUT}.tmp" "${OUT}")
