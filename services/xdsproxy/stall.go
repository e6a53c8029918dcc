package xdsproxy

// The watchdog of a control plane that keeps a stream open and answers
// nothing (istio/istio#57064); package stallwatch holds the rule.

// watchStall asks the owner every quarter of the timeout whether the
// stream stalled, until done is closed; it returns the stall error, or nil
// when done.
func (st *stream[R]) watchStall(done <-chan struct{}) error {
	every := st.svc.cfg.StallTimeout / 4
	for {
		select {
		case <-done:
			return nil
		case <-st.svc.clock.After(every):
		}
		if err := st.stalled(st.inflight.Load() > 0); err != nil {
			return err
		}
	}
}
