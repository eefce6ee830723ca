package conversation

import (
	"fmt"
	"time"
)

// Agent holds every context of one agent in memory and applies Decide,
// Observe and Expire to it: maps keyed by context id and by task id make a
// decision O(1) in the number of contexts, and a heap ordered by each
// context's NextDeadline makes Expire O(due · log n). It is what a service
// replica rebuilds from a store on recovery (Load) and what the tests and
// benchmarks drive. Not safe for concurrent use; no goroutines, no I/O.
type Agent struct {
	contexts map[string]*Context
	tasks    map[string]string // task id → context id
	live     int               // contexts that are not tombstones
	// byCaller counts the live contexts per requester that opened them (no
	// zero entries): the per-caller share.
	byCaller map[string]int
	due      deadlines
	// onChange sees every state change (old nil: created; n nil: deleted);
	// a store journals them.
	onChange func(old, n *Context)
}

// OnChange registers fn to be called, synchronously, with a context's state
// before and after every change the Agent makes (old nil: created, n nil:
// deleted). Contexts are immutable values: fn may keep them.
func (a *Agent) OnChange(fn func(old, n *Context)) { a.onChange = fn }

// NewAgent returns an empty Agent.
func NewAgent() *Agent {
	return &Agent{
		contexts: map[string]*Context{},
		tasks:    map[string]string{},
		byCaller: map[string]int{},
		due:      deadlines{slots: map[string]*dlSlot{}},
	}
}

// Load inserts a stored context (recovery). It refuses a context id it
// already holds and a task id that another context holds, so a corrupt
// store cannot make a task change context.
func (a *Agent) Load(c *Context) error {
	if c == nil || c.ID == "" {
		return fmt.Errorf("load context: missing context id")
	}
	if _, ok := a.contexts[c.ID]; ok {
		return fmt.Errorf("load context %s: already loaded", c.ID)
	}
	for i := range c.Tasks {
		if other, ok := a.tasks[c.Tasks[i].ID]; ok {
			return fmt.Errorf("load context %s: task %s already belongs to context %s", c.ID, c.Tasks[i].ID, other)
		}
	}
	a.put(c.ID, nil, c)
	return nil
}

// Context returns the stored context (nil when unknown). Do not mutate it.
func (a *Agent) Context(id string) *Context { return a.contexts[id] }

// TaskContext returns the id of the context holding task id.
func (a *Agent) TaskContext(taskID string) (string, bool) {
	id, ok := a.tasks[taskID]
	return id, ok
}

// Len returns how many contexts (tombstones included) and tasks are held.
func (a *Agent) Len() (contexts, tasks int) { return len(a.contexts), len(a.tasks) }

// Live returns how many contexts are not tombstones (some may have expired
// since the last Expire).
func (a *Agent) Live() int { return a.live }

// Range calls fn for every context until fn returns false (map order).
func (a *Agent) Range(fn func(*Context) bool) {
	for _, c := range a.contexts {
		if !fn(c) {
			return
		}
	}
}

// CallerContexts returns how many live contexts requester opened.
func (a *Agent) CallerContexts(requester string) int { return a.byCaller[requester] }

// View builds the decision view of a request.
func (a *Agent) View(req Request) View {
	v := View{ContextID: req.ContextID, TaskContextID: a.tasks[req.TaskID], LiveContexts: a.live,
		CallerContexts: a.byCaller[req.Requester], Callers: len(a.byCaller)}
	if v.CallerContexts == 0 {
		v.Callers++ // the requester itself
	}
	if req.TaskID == "" {
		v.TaskContextID = ""
	}
	if v.ContextID == "" {
		v.ContextID = v.TaskContextID
	}
	v.Context = a.contexts[v.ContextID]
	return v
}

// Decide rules on a request and applies the decision to the Agent.
func (a *Agent) Decide(p Policy, now time.Time, req Request) Decision {
	v := a.View(req)
	var swept []Expiration
	if v.Context == nil && a.atLimit(p, v) {
		// The live counts include contexts that expired since the last
		// sweep; sweep before refusing so the limits count unexpired ones.
		swept = a.Expire(p, now)
		v = a.View(req)
	}
	d := Decide(p, now, v, req)
	if d.Changed {
		a.put(v.ContextID, v.Context, d.Context)
	}
	if len(swept) > 0 {
		d.Expirations = append(swept, d.Expirations...)
	}
	return d
}

// atLimit reports whether a new context would meet the agent's limit or the
// caller's share.
func (a *Agent) atLimit(p Policy, v View) bool {
	if l := p.MaxActiveContextsPerAgent; l > 0 && v.LiveContexts >= l {
		return true
	}
	l := p.CallerShare(v.Callers)
	return l > 0 && v.CallerContexts >= l
}

// Observe applies a reply event to the context holding its task.
func (a *Agent) Observe(p Policy, now time.Time, ev Event) Outcome {
	id, ok := a.tasks[ev.TaskID]
	if !ok {
		return Outcome{}
	}
	c := a.contexts[id]
	o := Observe(p, now, c, ev)
	if o.Changed {
		a.put(id, c, o.Context)
	}
	return o
}

// Expire applies Expire to every context whose NextDeadline has passed and
// returns what changed.
func (a *Agent) Expire(p Policy, now time.Time) []Expiration {
	var out []Expiration
	for a.due.Len() > 0 {
		id, at := a.due.peek()
		if now.UnixNano() < at {
			break
		}
		c := a.contexts[id]
		x := Expire(p, now, c)
		if !x.Changed {
			// Deadline passed but nothing to do: drop the stale entry.
			a.due.remove(id)
			continue
		}
		a.put(id, c, x.Context)
		if x.notable() {
			out = append(out, x)
		}
	}
	return out
}

// put replaces context id's old state by n (nil: delete), keeping the task
// index, the live count and the deadline heap in step.
func (a *Agent) put(id string, old, n *Context) {
	if a.onChange != nil && (old != nil || n != nil) {
		a.onChange(old, n)
	}
	added, removed := TaskDiff(old, n)
	for _, t := range removed {
		if a.tasks[t] == id {
			delete(a.tasks, t)
		}
	}
	for _, t := range added {
		a.tasks[t] = id
	}
	if old != nil && old.Expired == nil {
		a.live--
		if a.byCaller[old.Requester]--; a.byCaller[old.Requester] <= 0 {
			delete(a.byCaller, old.Requester)
		}
	}
	if n == nil {
		delete(a.contexts, id)
		a.due.remove(id)
		return
	}
	if n.Expired == nil {
		a.live++
		a.byCaller[n.Requester]++
	}
	a.contexts[id] = n
	if n.NextDeadline.IsZero() {
		a.due.remove(id)
	} else {
		a.due.set(id, n.NextDeadline)
	}
}

// deadlines is a binary min-heap of context deadlines with a slot per
// context for O(log n) updates. Deadlines are compared inline (unix ns in
// the item array, no pointer chasing) and an update touches no map but the
// one look-up: a decision pays O(log n) cache-friendly steps, not O(log n)
// map writes.
type deadlines struct {
	items []dlItem
	slots map[string]*dlSlot
}

type dlItem struct {
	at   int64
	slot *dlSlot
}

type dlSlot struct {
	id    string
	index int
}

func (h *deadlines) Len() int { return len(h.items) }

// peek returns the earliest deadline's context id and time.
func (h *deadlines) peek() (string, int64) { return h.items[0].slot.id, h.items[0].at }

func (h *deadlines) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].slot.index = i
	h.items[j].slot.index = j
}

func (h *deadlines) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if h.items[parent].at <= h.items[i].at {
			return
		}
		h.swap(i, parent)
		i = parent
	}
}

func (h *deadlines) down(i int) {
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.items[r].at < h.items[l].at {
			m = r
		}
		if h.items[i].at <= h.items[m].at {
			return
		}
		h.swap(i, m)
		i = m
	}
}

func (h *deadlines) set(id string, at time.Time) {
	ns := at.UnixNano()
	if s, ok := h.slots[id]; ok {
		old := h.items[s.index].at
		h.items[s.index].at = ns
		if ns < old {
			h.up(s.index)
		} else {
			h.down(s.index)
		}
		return
	}
	s := &dlSlot{id: id, index: len(h.items)}
	h.slots[id] = s
	h.items = append(h.items, dlItem{at: ns, slot: s})
	h.up(s.index)
}

func (h *deadlines) remove(id string) {
	s, ok := h.slots[id]
	if !ok {
		return
	}
	delete(h.slots, id)
	i, last := s.index, len(h.items)-1
	if i != last {
		h.swap(i, last)
	}
	h.items[last] = dlItem{}
	h.items = h.items[:last]
	if i != last {
		h.down(i)
		h.up(i)
	}
}
