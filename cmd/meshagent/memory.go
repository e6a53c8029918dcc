package main

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The agent's memory as a sidecar: what it holds is what every pod on the
// node pays for, so it gives back what only start-up needed (see
// bench/agent/rss.sh and docs/performance.md for the figures).

// sidecarGCPercent is the GC target the agent runs with unless GOGC is set.
// The agent's live heap is small (a few MiB: proto registries, Envoy's
// bootstrap types, the DNS name table), so Go's default of 100 lets the heap
// double under DNS load for garbage that one cycle would free; 50 keeps
// 3.5 MiB less resident under load at no measurable CPU cost (a GC cycle
// over a few MiB is cheap; 30k QPS through the DNS proxy: 24.3 µs of agent
// CPU per query at 50 against 25.2 at 100, within the noise). Istio's agent
// sets no GC target.
const sidecarGCPercent = 50

// setSidecarGC applies sidecarGCPercent unless the operator chose GOGC
// (gogc: set, even empty, as read by buildAgentConfig; Go's runtime then
// applies it itself).
func setSidecarGC(gogc *string, log *slog.Logger) {
	if gogc != nil {
		log.Debug("GC target from GOGC", "GOGC", *gogc)
		return
	}
	debug.SetGCPercent(sidecarGCPercent)
}

// releaseStartupMemory runs once, when the agent first becomes ready. Two
// things are resident then that idle running never touches again:
//   - start-up garbage (configuration parsing, Envoy's bootstrap): a full GC
//     and returning the free pages now, rather than when the scavenger gets
//     to them;
//   - code and read-only data of the executable that only start-up ran:
//     ~500 packages' init functions, flag and ProxyConfig parsing, the
//     bootstrap builder. The kernel maps a binary's pages in 64 KiB windows
//     around each page touched, so after start-up nearly all of the 40 MiB
//     binary's text, rodata and pclntab is mapped (about 24 MiB of the
//     idle agent's RSS). dropCodePages unmaps them; the pages stay in the
//     page cache (clean, shared with every process mapping the same file,
//     reclaimable), and those the agent uses again fault back in at once.
//     What stays resident is the code idle running and DNS traffic use.
//
// MESHAGENT_DROP_CODE_PAGES=0 keeps the code pages mapped: make
// bench-vs-istio measures the agent both ways, to weigh what the drop saves
// in RSS against the cgroup's working set, which still counts the dropped
// pages while they sit in the page cache (#24).
func releaseStartupMemory(log *slog.Logger) {
	debug.FreeOSMemory()
	if os.Getenv("MESHAGENT_DROP_CODE_PAGES") == "0" {
		return
	}
	dropped, err := dropCodePages()
	if err != nil {
		log.Warn("could not release start-up code pages", "error", err)
		return
	}
	log.Debug("released start-up memory", "code_pages_kib", dropped>>10)
}

// dropCodePages unmaps the resident pages of the executable's read-only
// file mappings (madvise MADV_DONTNEED) and returns how many bytes were
// resident in them. It skips any mapping that holds a private copy of a
// page (Anonymous > 0 in smaps: a relocated page of a PIE binary, or a
// debugger's breakpoint): dropping those would lose the change. Clean file
// pages of a private mapping are simply read again from the page cache.
func dropCodePages() (int64, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, err
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	maps, err := readOwnMappings(f, exe)
	if err != nil {
		return 0, err
	}
	var dropped int64
	for _, m := range maps {
		if m.writable || m.anonymous > 0 {
			continue
		}
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, m.start, m.end-m.start, unix.MADV_DONTNEED); e != 0 {
			return dropped, fmt.Errorf("madvise %#x-%#x: %w", m.start, m.end, e)
		}
		dropped += m.rss
	}
	return dropped, nil
}

// mapping is one line of /proc/self/smaps with the fields we read.
type mapping struct {
	start, end     uintptr
	writable       bool
	rss, anonymous int64 // bytes
}

// readOwnMappings returns the private mappings of the file path from an
// smaps listing.
func readOwnMappings(r io.Reader, path string) ([]mapping, error) {
	var out []mapping
	cur := -1 // index in out of the mapping whose fields follow, or -1
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if key, ok := strings.CutSuffix(fields[0], ":"); ok && len(fields) >= 2 {
			// "Rss:  1234 kB"
			if cur < 0 {
				continue
			}
			n, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				continue // VmFlags and the like
			}
			switch key {
			case "Rss":
				out[cur].rss = n << 10
			case "Anonymous":
				out[cur].anonymous = n << 10
			}
			continue
		}
		// "start-end perms offset dev inode path"
		cur = -1
		if len(fields) < 6 || strings.Join(fields[5:], " ") != path || !strings.HasSuffix(fields[1], "p") {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("smaps: bad range %q", fields[0])
		}
		out = append(out, mapping{start: uintptr(start), end: uintptr(end), writable: strings.Contains(fields[1], "w")})
		cur = len(out) - 1
	}
	return out, sc.Err()
}
