package convstore

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// TestChangeOfMatchesSets: on random before/after task lists (tasks kept,
// changed by copy-on-write, dropped, appended, sometimes reordered, short
// and long), changeOf writes exactly the new or changed tasks, in order, and
// deletes exactly the dropped ones.
func TestChangeOfMatchesSets(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	next := 0
	newTask := func() *conversation.Task { next++; return &conversation.Task{ID: fmt.Sprintf("t%d", next)} }
	for range 20000 {
		old := &conversation.Context{ID: "c"}
		size := rng.IntN(12)
		if rng.IntN(10) == 0 {
			size = 60 + rng.IntN(20) // around and over smallTaskList
		}
		for range size {
			old.Tasks = append(old.Tasks, newTask())
		}
		n := &conversation.Context{ID: "c"}
		for _, tk := range old.Tasks {
			switch rng.IntN(5) {
			case 0: // dropped
			case 1: // changed: a copy
				cp := *tk
				n.Tasks = append(n.Tasks, &cp)
			default:
				n.Tasks = append(n.Tasks, tk)
			}
		}
		for range rng.IntN(3) {
			n.Tasks = append(n.Tasks, newTask())
		}
		if rng.IntN(6) == 0 {
			rng.Shuffle(len(n.Tasks), func(i, j int) { n.Tasks[i], n.Tasks[j] = n.Tasks[j], n.Tasks[i] })
		}
		var wantPut, wantDel []string
		for _, tk := range n.Tasks {
			if !slices.Contains(old.Tasks, tk) {
				wantPut = append(wantPut, tk.ID)
			}
		}
		for _, tk := range old.Tasks {
			if !slices.ContainsFunc(n.Tasks, func(x *conversation.Task) bool { return x.ID == tk.ID }) {
				wantDel = append(wantDel, tk.ID)
			}
		}
		ch := changeOf("a", old, n)
		var put []string
		for _, r := range ch.Put {
			put = append(put, r.ID)
		}
		if !slices.Equal(put, wantPut) || !slices.Equal(ch.Del, wantDel) {
			t.Fatalf("old %v new %v: put %v del %v; want put %v del %v", taskIDs(old), taskIDs(n), put, ch.Del, wantPut, wantDel)
		}
	}
}

func taskIDs(c *conversation.Context) []string {
	var out []string
	for _, t := range c.Tasks {
		out = append(out, t.ID)
	}
	return out
}
