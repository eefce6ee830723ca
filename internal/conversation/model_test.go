package conversation

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func tasks(ids ...string) *Context {
	c := &Context{}
	for _, id := range ids {
		c.Tasks = append(c.Tasks, &Task{ID: id})
	}
	return c
}

func TestTaskDiff(t *testing.T) {
	for _, tt := range []struct {
		before, after  *Context
		added, removed []string
	}{
		{nil, tasks("a"), []string{"a"}, nil},
		{tasks("a"), nil, nil, []string{"a"}},
		{tasks("a", "b"), tasks("a", "b"), nil, nil},
		{tasks("a", "b", "c"), tasks("b", "c", "d"), []string{"d"}, []string{"a"}},
		{tasks("a", "b", "c"), tasks("a", "c"), nil, []string{"b"}},
		{tasks("a", "b"), tasks("b", "a"), nil, nil},
		{tasks("a", "b"), tasks("b", "x", "a"), []string{"x"}, nil},
	} {
		added, removed := TaskDiff(tt.before, tt.after)
		if !slices.Equal(added, tt.added) || !slices.Equal(removed, tt.removed) {
			t.Errorf("TaskDiff(%v, %v) = %v, %v; want %v, %v", ids(tt.before), ids(tt.after), added, removed, tt.added, tt.removed)
		}
	}
}

func ids(c *Context) []string {
	if c == nil {
		return nil
	}
	var out []string
	for _, t := range c.Tasks {
		out = append(out, t.ID)
	}
	return out
}

// TestTaskDiffMatchesSets: on random task lists (the engine's shape, drop
// some and append, and arbitrary reorderings), TaskDiff equals the set
// difference, in list order.
func TestTaskDiffMatchesSets(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ref := func(before, after []string) (added, removed []string) {
		for _, id := range after {
			if !slices.Contains(before, id) {
				added = append(added, id)
			}
		}
		for _, id := range before {
			if !slices.Contains(after, id) {
				removed = append(removed, id)
			}
		}
		return added, removed
	}
	next := 0
	newID := func() string { next++; return fmt.Sprintf("t%d", next) }
	for range 20000 {
		var before []string
		for range rng.IntN(30) {
			before = append(before, newID())
		}
		var after []string
		for _, id := range before {
			if rng.IntN(4) != 0 {
				after = append(after, id)
			}
		}
		for range rng.IntN(3) {
			after = append(after, newID())
		}
		if rng.IntN(5) == 0 { // not the engine's shape: reordered
			rng.Shuffle(len(after), func(i, j int) { after[i], after[j] = after[j], after[i] })
		}
		added, removed := TaskDiff(tasks(before...), tasks(after...))
		wantA, wantR := ref(before, after)
		if !slices.Equal(added, wantA) || !slices.Equal(removed, wantR) {
			t.Fatalf("TaskDiff(%v, %v) = %v, %v; want %v, %v", before, after, added, removed, wantA, wantR)
		}
	}
}
