# Shared by the benchmark scripts (sourced, not run): what a script needs
# before it starts, and the work directory whose background processes are
# stopped and removed on exit however the script ends.

# require NAME HINT BIN...: every BIN on PATH, else say what to install
# (HINT) and skip the benchmark (exit 0: a missing tool is not a failure).
require() {
	local name=$1 hint=$2
	shift 2
	for bin in "$@"; do
		if ! command -v "$bin" >/dev/null; then
			echo "$name: $bin not found ($hint): skipped"
			exit 0
		fi
	done
}

# require_root NAME WHY: skip the benchmark unless running as root.
require_root() {
	if [ "$(id -u)" != 0 ]; then
		echo "$1: needs root ($2): skipped"
		exit 0
	fi
}

# start_work: $work is a fresh directory; every pid appended to $pids is
# killed and reaped, and $work removed, on exit.
start_work() {
	work=$(mktemp -d)
	pids=()
	trap cleanup_work EXIT
}

cleanup_work() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
