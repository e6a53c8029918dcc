package loopback

import (
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// The address is published while the server serves (with the port chosen
// for port 0), and withdrawn when it stops; a stop ends nothing in error.
func TestServerPublishesItsAddressWhileServing(t *testing.T) {
	var s Server
	if s.Addr() != "" {
		t.Fatalf("Addr before Start = %q", s.Addr())
	}
	if err := s.Start(grpc.NewServer(), "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	_, port, err := net.SplitHostPort(s.Addr())
	if err != nil || port == "0" {
		t.Fatalf("Addr while serving = %q, want the port chosen", s.Addr())
	}
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatalf("dial the address published: %v", err)
	}
	conn.Close()
	if s.Stop(time.After(5 * time.Second)) {
		t.Error("an idle server's stop was forced")
	}
	if s.Addr() != "" || s.Err() != nil {
		t.Errorf("after Stop: Addr %q, Err %v; want both empty", s.Addr(), s.Err())
	}
}

// A port already taken fails Start and publishes nothing.
func TestServerStartFailsOnATakenPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var s Server
	if err := s.Start(grpc.NewServer(), ln.Addr().String()); err == nil {
		t.Fatal("Start on a taken port succeeded")
	}
	if s.Addr() != "" {
		t.Errorf("Addr = %q after a failed Start", s.Addr())
	}
}
