package capture

import (
	"fmt"
	"os/exec"
	"strings"
)

// ipCommand runs the ip(8) tool; "File exists" (already set up) and, when
// removing, "No such file"/"Cannot find" are not errors.
func (a *Applier) ipCommand(removing bool, args ...string) error {
	a.execs.Add(1)
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err == nil {
		return nil
	}
	msg := strings.TrimSpace(string(out))
	low := strings.ToLower(msg)
	if !removing && (strings.Contains(low, "file exists") || strings.Contains(low, "already assigned")) {
		return nil
	}
	if removing && (strings.Contains(low, "no such") || strings.Contains(low, "cannot find")) {
		return nil
	}
	if isPermission(msg) {
		return fmt.Errorf("%w (ip %s: %s)", ErrPermission, strings.Join(args, " "), msg)
	}
	return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, msg)
}

// SetupRouting does what istio-iptables does after the rules: in TPROXY mode
// route marked packets to the local host (ip rule fwmark MARK lookup TABLE;
// ip route add local default dev lo table TABLE, both families), and with
// IPv6 add ::6/128 to lo (the inbound passthrough source address).
func (a *Applier) SetupRouting(cfg RulesConfig) error {
	if cfg.InboundInterceptionMode == "TPROXY" {
		for _, fam := range a.routeFamilies(cfg) {
			if err := a.ipCommand(false, fam, "rule", "add", "fwmark", cfg.InboundTProxyMark, "lookup", cfg.InboundTProxyRouteTable); err != nil {
				return err
			}
			if err := a.ipCommand(false, fam, "route", "add", "local", "default", "dev", "lo", "table", cfg.InboundTProxyRouteTable); err != nil {
				return err
			}
		}
	}
	if cfg.EnableIPv6 {
		if err := a.ipCommand(false, "-6", "addr", "add", "::6/128", "dev", "lo"); err != nil {
			return err
		}
	}
	return nil
}

// CleanupRouting removes the TPROXY policy routing SetupRouting added (the
// ::6 address stays, as with Istio).
func (a *Applier) CleanupRouting(cfg RulesConfig) error {
	if cfg.InboundInterceptionMode != "TPROXY" {
		return nil
	}
	for _, fam := range a.routeFamilies(cfg) {
		if err := a.ipCommand(true, fam, "rule", "del", "fwmark", cfg.InboundTProxyMark, "lookup", cfg.InboundTProxyRouteTable); err != nil {
			return err
		}
		if err := a.ipCommand(true, fam, "route", "del", "local", "default", "dev", "lo", "table", cfg.InboundTProxyRouteTable); err != nil {
			return err
		}
	}
	return nil
}

func (a *Applier) routeFamilies(cfg RulesConfig) []string {
	if cfg.EnableIPv6 {
		return []string{"-4", "-6"}
	}
	return []string{"-4"}
}
