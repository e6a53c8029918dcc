package main

import (
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"
)

func TestNextParallelism(t *testing.T) {
	for _, tc := range []struct {
		name          string
		current, want int
		share         float64
	}{
		{"idle stays on one P", 1, 1, 0.001},
		{"a load between the thresholds does not take the second P", 1, 1, 0.1},
		{"a load takes Go's parallelism back", 1, 2, 0.9},
		{"a load that goes on keeps it", 2, 2, 0.9},
		{"a load that eases but goes on keeps it", 2, 2, 0.1},
		{"idle again, one P again", 2, 1, 0.01},
	} {
		if got := nextParallelism(tc.current, 1, 2, tc.share); got != tc.want {
			t.Errorf("%s: nextParallelism(%d, share %v) = %d, want %d", tc.name, tc.current, tc.share, got, tc.want)
		}
	}
}

// TestParallelismFollowsEachGC drives the follower with a made-up CPU
// clock through real GCs: each GC runs it once, and it keeps running.
func TestParallelismFollowsEachGC(t *testing.T) {
	var mu sync.Mutex
	var cpu time.Duration
	wall := time.Unix(1000, 0)
	var sets []int
	p := &parallelism{
		log: slog.New(slog.DiscardHandler), idle: 1, busy: 2, current: 1,
		set: func(n int) int { mu.Lock(); defer mu.Unlock(); sets = append(sets, n); return 0 },
		cpu: func() time.Duration { mu.Lock(); defer mu.Unlock(); return cpu },
		now: func() time.Time { mu.Lock(); defer mu.Unlock(); return wall },
	}
	p.lastCPU, p.lastWall = p.cpu(), p.now()
	t.Cleanup(func() { p.stopped.Store(true) })
	p.arm()
	// gcUntil runs GCs until the follower has set want, as its n-th call.
	gcUntil := func(n, want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			runtime.GC()
			mu.Lock()
			got := append([]int(nil), sets...)
			mu.Unlock()
			if len(got) >= n {
				if got[n-1] != want || len(got) > n {
					t.Fatalf("GOMAXPROCS set to %v, want call %d to be %d and no other", got, n, want)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no GC ran the follower: GOMAXPROCS set to %v, want call %d to be %d", got, n, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	advance := func(busy, elapsed time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		cpu += busy
		wall = wall.Add(elapsed)
	}
	advance(900*time.Millisecond, time.Second) // 0.9 of a core since the last GC
	gcUntil(1, 2)
	advance(10*time.Millisecond, time.Minute) // idle again
	gcUntil(2, 1)
	advance(0, time.Minute) // still idle: nothing to set
	runtime.GC()
	runtime.GC()
	advance(time.Second, time.Second) // and busy again: it still follows
	gcUntil(3, 2)
}
