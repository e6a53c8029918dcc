#!/bin/sh
# duplicates-code-only.sh: runs the `duplicates` tool (not part of this
# repository) on a copy of the tracked tree whose Go import blocks are blanked,
# line numbers kept. The tool passes over single import lines but not the
# lines inside `import ( ... )`, so two files that import the same six
# standard packages in Go's sorted order count as a pair; this shows the pairs
# of code. Generated Go files (*.pb.go: protoc writes one accessor per field,
# alike by construction) are left out of the copy, as the tool itself skips
# vendor. Extra arguments go to the tool (default: --most 200).
set -eu
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
git -C "$repo" ls-files -z -- . ':(exclude,glob)**/*.pb.go' |
	(cd "$repo" && xargs -0 cp --parents -t "$copy")
find "$copy" -name '*.go' | while read -r f; do
	awk '/^import \($/ { block = 1; print ""; next }
		block && /^\)$/ { block = 0; print ""; next }
		block { print ""; next }
		{ print }' "$f" >"$f.tmp"
	mv "$f.tmp" "$f"
done
cd "$copy"
if [ $# -eq 0 ]; then set -- --most 200; fi
duplicates --repo "$copy" --seconds 120 "$@"
