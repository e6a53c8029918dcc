package messages

import (
	"strings"
	"sync"
	"testing"
	"time"
)

func TestCellEmptyThenLatest(t *testing.T) {
	c := NewCell[int]()
	if _, ok := c.Get(); ok {
		t.Fatal("new cell reports a value")
	}
	c.Send(1)
	c.Send(2)
	if v, ok := c.Get(); !ok || v != 2 {
		t.Fatalf("Get = %d,%v; want 2,true", v, ok)
	}
}

func TestCellWatchWakesOnSend(t *testing.T) {
	c := NewCell[string]()
	_, _, changed := c.Watch()
	select {
	case <-changed:
		t.Fatal("changed closed before any send")
	default:
	}
	c.Send("a")
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("watch not woken by send")
	}
	v, ok, changed2 := c.Watch()
	if v != "a" || !ok {
		t.Fatalf("Watch = %q,%v", v, ok)
	}
	select {
	case <-changed2:
		t.Fatal("fresh watch channel already closed")
	default:
	}
}

// A slow reader never blocks the writer and always ends on the newest value.
func TestCellSlowReaderSeesNewest(t *testing.T) {
	c := NewCell[int]()
	const n = 10000
	var wg sync.WaitGroup
	wg.Add(1)
	var last int
	go func() {
		defer wg.Done()
		for {
			v, _, changed := c.Watch()
			last = v
			if v == n {
				return
			}
			time.Sleep(time.Microsecond)
			<-changed
		}
	}()
	for i := 1; i <= n; i++ {
		c.Send(i)
	}
	wg.Wait()
	if last != n {
		t.Fatalf("reader ended on %d, want %d", last, n)
	}
}

func TestStreamOrderAndTake(t *testing.T) {
	s := NewStream[int](0, nil)
	for i := 0; i < 5; i++ {
		s.Send(i)
	}
	select {
	case <-s.Ready():
	default:
		t.Fatal("Ready not signalled")
	}
	got := s.Take()
	if len(got) != 5 || got[0] != 0 || got[4] != 4 {
		t.Fatalf("Take = %v", got)
	}
	if got := s.Take(); got != nil {
		t.Fatalf("second Take = %v, want nil", got)
	}
	select {
	case <-s.Ready():
		t.Fatal("Ready signalled for an empty stream")
	default:
	}
}

func TestStreamOverflowDropsOldestAndCounts(t *testing.T) {
	var reported []uint64
	s := NewStream[int](3, func(d uint64) { reported = append(reported, d) })
	for i := 0; i < 5; i++ {
		s.Send(i)
	}
	got := s.Take()
	if len(got) != 3 || got[0] != 2 || got[2] != 4 {
		t.Fatalf("Take = %v, want [2 3 4]", got)
	}
	if s.Dropped() != 2 || len(reported) != 2 || reported[1] != 2 {
		t.Fatalf("dropped=%d reported=%v", s.Dropped(), reported)
	}
}

// TrySend refuses past the bound, and neither drops nor counts.
func TestStreamTrySendRefusesPastTheBound(t *testing.T) {
	s := NewStream[int](2, func(uint64) { t.Error("TrySend reported a drop") })
	for i := 0; i < 2; i++ {
		if !s.TrySend(i) {
			t.Fatalf("TrySend(%d) refused under the bound", i)
		}
	}
	if s.TrySend(2) {
		t.Fatal("TrySend accepted past the bound")
	}
	if got := s.Take(); len(got) != 2 || got[0] != 0 || got[1] != 1 || s.Dropped() != 0 {
		t.Fatalf("Take = %v, dropped %d; want [0 1], 0", got, s.Dropped())
	}
	if !s.TrySend(3) {
		t.Fatal("TrySend refused once the consumer took what waited")
	}
}

func TestStreamConcurrentSendersLoseNothing(t *testing.T) {
	s := NewStream[int](100000, nil)
	const senders, each = 8, 1000
	var wg sync.WaitGroup
	for g := 0; g < senders; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				s.Send(i)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	total := 0
	for total < senders*each {
		select {
		case <-s.Ready():
			total += len(s.Take())
		case <-done:
			total += len(s.Take())
			if total != senders*each {
				t.Fatalf("received %d events, want %d", total, senders*each)
			}
		}
	}
}

func TestCertBundleNeverPrintsKey(t *testing.T) {
	b := CertBundle{KeyPEM: []byte("-----BEGIN PRIVATE KEY-----SECRET"), Version: "v1"}
	if s := b.String(); strings.Contains(s, "SECRET") {
		t.Fatalf("String leaks the key: %s", s)
	}
	if s := b.LogValue().String(); strings.Contains(s, "SECRET") {
		t.Fatalf("LogValue leaks the key: %s", s)
	}
}
