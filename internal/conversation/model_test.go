package conversation

import (
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
