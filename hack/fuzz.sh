#!/usr/bin/env bash
# fuzz.sh: runs every fuzz target of the module (each Fuzz* function that
# `go test -list` finds) for FUZZTIME each, one after the other; `make fuzz`.
# Their seed corpora already run as ordinary tests in `make test`; this
# searches beyond them. Exits non-zero if any target finds a crash (Go then
# writes the input under the package's testdata/fuzz/<target>/: commit it
# with the fix, and it stays a regression test) or does not build.
#
#   FUZZTIME=30s hack/fuzz.sh [packages...]   (default ./...)
set -uo pipefail

fuzztime=${FUZZTIME:-30s}
go=${GO:-go}
cd "$(dirname "$0")/.." || exit 1
[ $# -gt 0 ] || set -- ./...

failed=()
ran=0
# Only packages with a test file declaring a fuzz target are listed: `go
# test -list` builds the package's tests.
for pkg in $("$go" list -f '{{.ImportPath}} {{.Dir}}' "$@" | while read -r path dir; do
	if grep -qs '^func Fuzz' "$dir"/*_test.go; then echo "$path"; fi
done); do
	targets=$("$go" test -list '^Fuzz' "$pkg" | grep '^Fuzz') || {
		echo "fuzz: $pkg: listing its fuzz targets failed" >&2
		failed+=("$pkg (list)")
		continue
	}
	for target in $targets; do
		echo "fuzz: $pkg $target for $fuzztime"
		ran=$((ran + 1))
		if ! "$go" test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"; then
			failed+=("$pkg $target")
		fi
	done
done

if [ ${#failed[@]} -gt 0 ]; then
	echo "fuzz: ${#failed[@]} of $ran targets failed:" >&2
	printf '  %s\n' "${failed[@]}" >&2
	exit 1
fi
echo "fuzz: $ran targets, $fuzztime each: no crash"
