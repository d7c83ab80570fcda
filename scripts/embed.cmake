# Turns a text file into a C++ raw string literal include (used for stdlib/std.tally).
file(READ ${IN} CONTENT)
file(WRITE ${OUT} "R\"tally_stdlib(${CONTENT})tally_stdlib\"")
