package tree

import (
	"context"
	"fmt"

	"github.com/thejerf/suture/v4"

	"github.com/meshagent/meshagent/messages"
)

// subtree is a group of services under a supervisor of their own that is
// built afresh every time the group starts: a stopped suture supervisor
// cannot be served again, and a rebuild is how the whole group restarts
// (a chaos kill of the group, or its restartWhen). Its children are
// runners, so their backoff state survives the rebuild.
//
// A rebuild does not wait for a child that overran its stop timeout (suture
// has reported and abandoned it): that child's runner refuses to run it
// again until its old Serve returns (runner.enter), and its siblings come
// back at once instead of staying down behind it.
type subtree struct {
	name     string
	children []*runner
	spec     suture.Spec
	// restartWhen, if set, blocks until the group must be rebuilt (true),
	// or until ctx is done (false).
	restartWhen func(ctx context.Context) bool
}

func (s *subtree) String() string { return s.name }

func (s *subtree) Serve(ctx context.Context) error {
	sup := suture.New(s.name, s.spec)
	for _, c := range s.children {
		sup.Add(c)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := sup.ServeBackground(runCtx)

	restart := make(chan struct{})
	if s.restartWhen != nil {
		watchDone := make(chan struct{})
		defer func() { cancel(); <-watchDone }()
		go func() {
			defer close(watchDone)
			if s.restartWhen(runCtx) {
				close(restart)
			}
		}()
	}

	select {
	case err := <-done:
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("supervisor %s stopped: %w", s.name, err)
	case <-restart:
		cancel()
		<-done
		return fmt.Errorf("%s: restart condition met: %w", s.name, messages.ErrRestart)
	}
}
