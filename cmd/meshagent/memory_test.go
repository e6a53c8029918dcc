package main

import (
	"os"
	"strings"
	"testing"
)

// The executable's read-only mappings are found in smaps, with their
// resident and private sizes; writable ones are marked, other files ignored.
func TestReadOwnMappings(t *testing.T) {
	smaps := `00400000-00f9d000 r-xp 00000000 08:01 123 /usr/bin/meshagent
Size:              11892 kB
Rss:               10804 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me dw
00f9d000-01efa000 r--p 00b9d000 08:01 123 /usr/bin/meshagent
Rss:                 100 kB
Anonymous:             8 kB
01efa000-01f99000 rw-p 01afa000 08:01 123 /usr/bin/meshagent
Rss:                 636 kB
Anonymous:           216 kB
7f0000000000-7f0000100000 r-xp 00000000 08:01 456 /usr/lib/libc.so.6
Rss:                1216 kB
Anonymous:             0 kB
`
	got, err := readOwnMappings(strings.NewReader(smaps), "/usr/bin/meshagent")
	if err != nil {
		t.Fatal(err)
	}
	want := []mapping{
		{start: 0x400000, end: 0xf9d000, rss: 10804 << 10},
		{start: 0xf9d000, end: 0x1efa000, rss: 100 << 10, anonymous: 8 << 10},
		{start: 0x1efa000, end: 0x1f99000, writable: true, rss: 636 << 10, anonymous: 216 << 10},
	}
	if len(got) != len(want) {
		t.Fatalf("mappings = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("mapping %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// Dropping the code pages of this very test binary unmaps most of them, and
// the code keeps running (the pages fault back in from the page cache).
func TestDropCodePages(t *testing.T) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Skip("no /proc/self/exe:", err)
	}
	resident := func() int64 {
		f, err := os.Open("/proc/self/smaps")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		maps, err := readOwnMappings(f, exe)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, m := range maps {
			if !m.writable && m.anonymous == 0 {
				n += m.rss
			}
		}
		return n
	}
	before := resident()
	dropped, err := dropCodePages()
	if err != nil {
		t.Fatal(err)
	}
	after := resident()
	if dropped == 0 || after >= before {
		t.Fatalf("dropCodePages released %d bytes; read-only resident %d before, %d after", dropped, before, after)
	}
	// Still working: run code that was just unmapped.
	if _, err := readOwnMappings(strings.NewReader(""), exe); err != nil {
		t.Fatal(err)
	}
	t.Logf("read-only code and data of the test binary resident: %d KiB before, %d KiB after", before>>10, after>>10)
}
