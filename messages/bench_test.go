package messages

import "testing"

// BenchmarkCellSendWatch is one publish and one read of a latest value;
// BenchmarkChanSendRecv, the baseline, is the same through a buffered Go
// channel (which a slow reader would block).
func BenchmarkCellSendWatch(b *testing.B) {
	c := NewCell[int]()
	for i := 0; i < b.N; i++ {
		c.Send(i)
		if v, _, _ := c.Watch(); v != i {
			b.Fatal(v)
		}
	}
}

func BenchmarkChanSendRecv(b *testing.B) {
	c := make(chan int, 1)
	for i := 0; i < b.N; i++ {
		c <- i
		if v := <-c; v != i {
			b.Fatal(v)
		}
	}
}

func BenchmarkStreamSendTake(b *testing.B) {
	s := NewStream[int](0, nil)
	for i := 0; i < b.N; i++ {
		s.Send(i)
		if got := s.Take(); len(got) != 1 {
			b.Fatal(got)
		}
	}
}

// BenchmarkCellSendUnwatched is a writer publishing with nobody waiting.
func BenchmarkCellSendUnwatched(b *testing.B) {
	c := NewCell[int]()
	for i := 0; i < b.N; i++ {
		c.Send(i)
	}
}
