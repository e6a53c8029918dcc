package capture

import (
	"os"
	"strconv"
	"strings"
)

// capNetAdmin is CAP_NET_ADMIN's bit in a capability set
// (linux/capability.h): reading or changing iptables or nftables needs it.
const capNetAdmin = 12

// mayReadFirewall says whether this process has CAP_NET_ADMIN in its
// effective set (/proc/self/status CapEff). Unknown (no /proc) counts as
// yes: the rules are then read, as before, and a refusal reported.
func mayReadFirewall() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(b), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			set, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err != nil || set&(1<<capNetAdmin) != 0
		}
	}
	return true
}
