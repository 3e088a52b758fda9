#!/usr/bin/env bash
# `make install` into a temporary DESTDIR, then use it as a packager and an app developer would:
#   - the files: binaries, libterrace.so.<version> with its soname and symlinks, libterrace.a,
#     terrace.h and terrace_replay.h, terrace.pc, terrace.1 (a man page groff reads without warnings), LICENSE;
#   - the shared library exports exactly the functions the headers declare (nothing private, none
#     missing: gcc -aux-info lists the declarations, nm -D the exports);
#   - examples/simple.c built with `pkg-config --cflags --libs terrace` against the shared
#     library and with `--static` against libterrace.a; both run on the model: its chat template,
#     tokenize, greedy generation to the end of generation, detokenize — and give the same text
#     as the installed `terrace run` on the rendered prompt;
#   - `make uninstall` removes every file.
# usage: tests/test_install.sh MODEL.gguf
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=$1
N=48
D=$(mktemp -d /tmp/terrace-install.XXXXXX)
trap 'rm -rf "$D"' EXIT
PREFIX=/usr/local
P=$D$PREFIX
bad=0
ok() { echo "  ok    $*"; }
no() { echo "  FAIL  $*"; bad=1; }

make -s --no-print-directory install DESTDIR="$D" PREFIX=$PREFIX >/dev/null
VERSION=$(sed -n 's/^#define TR_VERSION_STRING "\(.*\)"/\1/p' include/terrace.h)
MAJOR=$(sed -n 's/^#define TR_VERSION_MAJOR \([0-9]*\)/\1/p' include/terrace.h)

# --- the files -----------------------------------------------------------------------------------
for f in bin/terrace bin/terrace-storaged lib/libterrace.so.$VERSION lib/libterrace.a \
         include/terrace.h include/terrace_replay.h lib/pkgconfig/terrace.pc share/man/man1/terrace.1 \
         share/doc/terrace/LICENSE; do
    [ -f "$P/$f" ] && ok "$f" || no "$f is not installed"
done
[ "$(readlink "$P/lib/libterrace.so.$MAJOR")" = "libterrace.so.$VERSION" ] &&
    [ "$(readlink "$P/lib/libterrace.so")" = "libterrace.so.$MAJOR" ] &&
    ok "symlinks libterrace.so -> .so.$MAJOR -> .so.$VERSION" || no "shared library symlinks"
soname=$(readelf -d "$P/lib/libterrace.so.$VERSION" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libterrace.so.$MAJOR" ] && ok "soname $soname" || no "soname '$soname'"
grep -q "MIT License" "$P/share/doc/terrace/LICENSE" && ok "LICENSE (MIT)" || no "LICENSE"
if warn=$(groff -man -ww -z "$P/share/man/man1/terrace.1" 2>&1) && [ -z "$warn" ] &&
    grep -q "terrace $VERSION" "$P/share/man/man1/terrace.1"; then
    ok "terrace.1 renders without warnings, names $VERSION"
else
    no "terrace.1: $warn"
fi

# --- exports = declarations ------------------------------------------------------------------------
printf '#include <terrace.h>\n#include <terrace_replay.h>\n' >"$D/decl.c"
gcc -std=c11 -I"$P/include" -aux-info "$D/decl.txt" -fsyntax-only "$D/decl.c"
grep -E '/include/terrace(_replay)?\.h:' "$D/decl.txt" | grep -o '\btr_[a-z0-9_]*\s*(' | tr -d ' (' |
    sort -u >"$D/declared"
nm -D --defined-only "$P/lib/libterrace.so.$VERSION" | awk '$2 ~ /^[TW]$/ {print $3}' |
    sort -u >"$D/exported"
nm -D --defined-only "$P/lib/libterrace.so.$VERSION" | awk '$2 !~ /^[TW]$/ {print $3}' \
    >"$D/other"
if cmp -s "$D/declared" "$D/exported"; then
    ok "the shared library exports the $(wc -l <"$D/exported") functions the headers declare, no others"
else
    no "exports differ from declarations (< declared only: missing TR_API; > exported only: not public):"
    diff "$D/declared" "$D/exported" | grep "^[<>]" | head -20 || true
fi
[ ! -s "$D/other" ] && ok "no exported data symbols" || no "exported data: $(tr '\n' ' ' <"$D/other")"
if command -v g++ >/dev/null; then
    g++ -std=c++11 -Wall -Wextra -Werror -I"$P/include" -fsyntax-only -x c++ "$D/decl.c" &&
        ok "terrace.h compiles as C++" || no "terrace.h does not compile as C++"
fi

# --- pkg-config, shared and static ---------------------------------------------------------------
export PKG_CONFIG_PATH="$P/lib/pkgconfig"
pc() { pkg-config --define-variable=prefix="$P" "$@" terrace; }
[ "$(pc --modversion)" = "$VERSION" ] && ok "pkg-config --modversion $VERSION" ||
    no "pkg-config --modversion: $(pc --modversion)"
CFLAGS="-std=c11 -Wall -Wextra -Werror -O2"
# shellcheck disable=SC2046
cc $CFLAGS examples/simple.c $(pc --cflags --libs) -o "$D/simple-shared"
# the static link takes the archive (the linker would pick the .so beside it for -lterrace) and
# the private libraries pkg-config --static lists
# shellcheck disable=SC2046
cc $CFLAGS examples/simple.c $(pc --static --cflags --libs | sed 's/-lterrace\b/-l:libterrace.a/') \
    -o "$D/simple-static"
readelf -d "$D/simple-shared" | grep -q "NEEDED.*\[libterrace.so.$MAJOR\]" &&
    ok "simple-shared needs libterrace.so.$MAJOR" || no "simple-shared does not link the shared library"
readelf -d "$D/simple-static" | grep -q "NEEDED.*libterrace" &&
    no "simple-static needs libterrace.so" || ok "simple-static carries the library itself"

# --- the same text as terrace run -----------------------------------------------------------------
MSG="What is the capital of France? Answer in one sentence."
LD_LIBRARY_PATH="$P/lib" "$D/simple-shared" "$MODEL" "$MSG" $N "$D/prompt.txt" >"$D/shared.txt"
"$D/simple-static" "$MODEL" "$MSG" $N >"$D/static.txt"
"$P/bin/terrace" run -m "$MODEL" -f "$D/prompt.txt" --temp 0 -n $N --no-display-prompt \
    >"$D/run.txt" 2>"$D/run.err"
echo "  prompt: $(head -c 200 "$D/prompt.txt" | tr '\n' '|')"
echo "  reply:  $(head -c 300 "$D/shared.txt" | tr '\n' '|')"
[ -s "$D/shared.txt" ] && [ "$(wc -c <"$D/shared.txt")" -gt 2 ] && ok "a reply" || no "no reply"
cmp -s "$D/shared.txt" "$D/run.txt" && ok "shared build = terrace run" ||
    { no "shared build differs from terrace run:"; diff "$D/shared.txt" "$D/run.txt" | head || true; }
cmp -s "$D/static.txt" "$D/shared.txt" && ok "static build = shared build" || no "static differs"
grep -q "stopped by end of generation" "$D/run.err" && ok "stopped at end of generation" ||
    echo "  note  terrace run stopped by: $(grep -o 'stopped by .*' "$D/run.err")"

# --- uninstall --------------------------------------------------------------------------------------
make -s --no-print-directory uninstall DESTDIR="$D" PREFIX=$PREFIX >/dev/null
left=$(find "$D$PREFIX" \( -type f -o -type l \) | head)
[ -z "$left" ] && ok "make uninstall removes every file" || no "left after uninstall: $left"
exit $bad
