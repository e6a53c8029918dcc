package loopback

import "testing"

func TestCheck(t *testing.T) {
	for addr, ok := range map[string]bool{
		"127.0.0.1:16012": true, "[::1]:0": true, "localhost:16010": true, "127.1.2.3:80": true,
		"0.0.0.0:16012": false, "10.0.0.1:16012": false, "example.com:1": false,
		"127.0.0.1": false, "127.0.0.1:http": false, "127.0.0.1:70000": false,
	} {
		if err := Check(addr); (err == nil) != ok {
			t.Errorf("Check(%q) = %v, want ok=%v", addr, err, ok)
		}
	}
}
