package tree

import (
	"context"
	"fmt"

	"github.com/thejerf/suture/v4"
)

// subtree is a group of services under a supervisor of their own that is
// built afresh every time the group starts: a stopped suture supervisor
// cannot be served again, and a rebuild is how the whole group restarts
// (a chaos kill of the group). Its children are runners, so their backoff
// state survives the rebuild.
//
// A rebuild does not wait for a child that overran its stop timeout (suture
// has reported and abandoned it): that child's runner refuses to run it
// again until its old Serve returns (runner.enter), and its siblings come
// back at once instead of staying down behind it.
type subtree struct {
	name     string
	children []*runner
	spec     suture.Spec
}

func (s *subtree) String() string { return s.name }

func (s *subtree) Serve(ctx context.Context) error {
	sup := suture.New(s.name, s.spec)
	for _, c := range s.children {
		sup.Add(c)
	}
	err := <-sup.ServeBackground(ctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("supervisor %s stopped: %w", s.name, err)
}
