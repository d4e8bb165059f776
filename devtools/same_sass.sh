#!/usr/bin/env bash
# Build every example with two checkouts and compare what NVRTC made of each kernel: the cubin
# bytes, and (when they differ) the disassembly. Used to show that a template change that should
# only move text (the instruction-wrapper layer) leaves the machine code as it was.
#   devtools/same_sass.sh OLD_REPO NEW_REPO OUT_DIR [example.yaml ...]
set -u
old=$1 new=$2 out=$3; shift 3
examples=("$@")
[ ${#examples[@]} -eq 0 ] && examples=("$new"/examples/*.yaml)
for side in old new; do
    repo=${!side}
    for y in "${examples[@]}"; do
        name=$(basename "$y" .yaml)
        [ -d "$out/$side/$name" ] && continue
        (cd "$repo" && python -m compiler build "examples/$name.yaml" -o "$out/$side/$name" --no-proofs \
            >"$out/$side.$name.log" 2>&1) || echo "$side $name: build failed (see $out/$side.$name.log)"
    done
done
dis() { python - "$1" <<'PY'
import sys
from codegen.sass import disassemble
print(disassemble(open(sys.argv[1], "rb").read()).text)
PY
}
for y in "${examples[@]}"; do
    name=$(basename "$y" .yaml)
    for cubin in "$out/old/$name"/*.cubin; do
        [ -e "$cubin" ] || { echo "$name: no kernel"; continue; }
        f=$(basename "$cubin") other="$out/new/$name/$f"
        if [ ! -e "$other" ]; then echo "$name/$f: MISSING on new"; continue; fi
        if cmp -s "$cubin" "$other"; then echo "$name/$f: cubin identical"; continue; fi
        if diff <(cd "$old" && dis "$cubin") <(cd "$new" && dis "$other") >/dev/null; then
            echo "$name/$f: cubin bytes differ, SASS identical"
        else
            echo "$name/$f: SASS DIFFERS"
        fi
    done
done
