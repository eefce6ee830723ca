package conversation

import (
	"fmt"
	"maps"
)

// check verifies the Agent's invariants: every task in exactly one context
// and indexed there, counters equal to recounts and never negative, history
// within its bound, tombstones empty, deadlines indexed.
func (a *Agent) check(p Policy) error {
	live := 0
	byCaller := map[string]int{}
	seen := map[string]string{}
	for id, c := range a.contexts {
		if c.ID != id {
			return fmt.Errorf("context stored under %s has id %s", id, c.ID)
		}
		if err := c.check(p); err != nil {
			return err
		}
		if c.Expired == nil {
			live++
			byCaller[c.Requester]++
		}
		for _, tid := range c.TaskIDs() {
			if other, dup := seen[tid]; dup {
				return fmt.Errorf("task %s in contexts %s and %s", tid, other, id)
			}
			seen[tid] = id
			if a.tasks[tid] != id {
				return fmt.Errorf("task %s of context %s indexed under %q", tid, id, a.tasks[tid])
			}
		}
		if s, ok := a.due.slots[id]; c.NextDeadline.IsZero() == ok || (ok && a.due.items[s.index].at != c.NextDeadline.UnixNano()) {
			return fmt.Errorf("context %s deadline %v not indexed right", id, c.NextDeadline)
		}
	}
	if len(seen) != len(a.tasks) {
		return fmt.Errorf("task index has %d entries, contexts hold %d tasks", len(a.tasks), len(seen))
	}
	if live != a.live {
		return fmt.Errorf("live count %d, recount %d", a.live, live)
	}
	if !maps.Equal(byCaller, a.byCaller) {
		return fmt.Errorf("per-caller live counts %v, recount %v", a.byCaller, byCaller)
	}
	if a.due.Len() != len(a.due.slots) {
		return fmt.Errorf("deadline heap %d items, index %d", a.due.Len(), len(a.due.slots))
	}
	for i, it := range a.due.items {
		if it.slot.index != i {
			return fmt.Errorf("deadline heap item %d thinks it is at %d", i, it.slot.index)
		}
		if i > 0 && a.due.items[(i-1)/2].at > it.at {
			return fmt.Errorf("deadline heap order broken at %d", i)
		}
	}
	return nil
}

// check verifies one context's invariants.
func (c *Context) check(p Policy) error {
	working, terminal := 0, 0
	ids := map[string]bool{}
	for _, t := range c.Tasks {
		if ids[t.ID] {
			return fmt.Errorf("context %s holds task %s twice", c.ID, t.ID)
		}
		ids[t.ID] = true
		if active(t.State) {
			working++
		}
		if t.Terminal() {
			terminal++
			if len(t.Streams) > 0 {
				return fmt.Errorf("terminal task %s keeps %d streams", t.ID, len(t.Streams))
			}
		}
		if interrupted(t.State) && t.WaitingSince.IsZero() {
			return fmt.Errorf("task %s waits without WaitingSince", t.ID)
		}
		if len(t.Streams) > p.maxStreams() {
			return fmt.Errorf("task %s has %d streams", t.ID, len(t.Streams))
		}
	}
	if c.Working < 0 {
		return fmt.Errorf("context %s working count %d is negative", c.ID, c.Working)
	}
	if c.Working != working {
		return fmt.Errorf("context %s working count %d, recount %d", c.ID, c.Working, working)
	}
	if len(c.Tasks) > p.history() && terminal > 0 {
		return fmt.Errorf("context %s holds %d tasks (bound %d) including %d finished ones", c.ID, len(c.Tasks), p.history(), terminal)
	}
	if c.Expired != nil && (len(c.Tasks) > 0 || c.Working != 0 || !c.ExpiresAt.IsZero()) {
		return fmt.Errorf("tombstone %s holds tasks or an expiry", c.ID)
	}
	if c.Expired == nil && len(c.ExpiredTasks) > 0 {
		return fmt.Errorf("live context %s lists expired tasks", c.ID)
	}
	if c.Expired == nil && len(c.Tasks) == 0 {
		return fmt.Errorf("live context %s without tasks", c.ID)
	}
	return nil
}
