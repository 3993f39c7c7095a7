# Writes OUT: a C++ source defining `const char NAME[]` with the bytes of IN
# (NUL-terminated). Run as: cmake -DIN=... -DOUT=... -DNAME=... -P embed.cmake
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," bytes "${hex}")
file(WRITE "${OUT}" "// Generated from ${IN} by cmake/embed.cmake.\nextern const char ${NAME}[];\nconst char ${NAME}[] = {${bytes}'\\0'};\n")
