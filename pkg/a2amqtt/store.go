package a2amqtt

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv/taskstore"
)

// MemoryStore is an in-memory taskstore.Store. It behaves like a2a-go's
// taskstore.InMemory (versions, optimistic concurrency, List filters and
// pagination, newest first) but copies tasks structurally instead of through
// gob: a2a-go's gob copy builds a fresh encoder/decoder (and recompiles the
// type) on every call, which profiling showed to be the largest single
// cost of a request on the MQTT responder. Listing is open to every caller
// (there is no per-requester identity at this layer), which ContextTasks
// relies on.
type MemoryStore struct {
	mu    sync.RWMutex
	tasks map[a2a.TaskID]*memTask
	now   func() time.Time
}

type memTask struct {
	task    *a2a.Task
	version taskstore.TaskVersion
	updated time.Time
}

var _ taskstore.Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty store.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{tasks: map[a2a.TaskID]*memTask{}, now: time.Now}
}

func validateStored(t *a2a.Task) error {
	if t == nil {
		return fmt.Errorf("task is nil: %w", a2a.ErrInvalidParams)
	}
	if t.ID == "" {
		return fmt.Errorf("task id is required: %w", a2a.ErrInvalidParams)
	}
	if t.ContextID == "" {
		return fmt.Errorf("task %s: context id is required: %w", t.ID, a2a.ErrInvalidParams)
	}
	return nil
}

// Create implements taskstore.Store.
func (s *MemoryStore) Create(_ context.Context, task *a2a.Task) (taskstore.TaskVersion, error) {
	if err := validateStored(task); err != nil {
		return taskstore.TaskVersionMissing, err
	}
	c := copyTask(task)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.tasks[task.ID]; ok {
		return taskstore.TaskVersionMissing, taskstore.ErrTaskAlreadyExists
	}
	s.tasks[task.ID] = &memTask{task: c, version: 1, updated: s.now()}
	return 1, nil
}

// Update implements taskstore.Store.
func (s *MemoryStore) Update(_ context.Context, req *taskstore.UpdateRequest) (taskstore.TaskVersion, error) {
	if req == nil {
		return taskstore.TaskVersionMissing, fmt.Errorf("update request is nil: %w", a2a.ErrInvalidParams)
	}
	if err := validateStored(req.Task); err != nil {
		return taskstore.TaskVersionMissing, err
	}
	c := copyTask(req.Task)
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.tasks[req.Task.ID]
	if !ok {
		return taskstore.TaskVersionMissing, a2a.ErrTaskNotFound
	}
	if req.PrevVersion != taskstore.TaskVersionMissing && cur.version != req.PrevVersion {
		return taskstore.TaskVersionMissing, taskstore.ErrConcurrentModification
	}
	v := cur.version + 1
	s.tasks[req.Task.ID] = &memTask{task: c, version: v, updated: s.now()}
	return v, nil
}

// Get implements taskstore.Store.
func (s *MemoryStore) Get(_ context.Context, id a2a.TaskID) (*taskstore.StoredTask, error) {
	s.mu.RLock()
	cur, ok := s.tasks[id]
	s.mu.RUnlock()
	if !ok {
		return nil, a2a.ErrTaskNotFound
	}
	// Stored tasks are never mutated in place (Update swaps the entry), so
	// copying outside the lock is safe.
	return &taskstore.StoredTask{Task: copyTask(cur.task), Version: cur.version}, nil
}

// List implements taskstore.Store: newest first, filtered by context,
// state and status time, paginated with an opaque cursor.
func (s *MemoryStore) List(_ context.Context, req *a2a.ListTasksRequest) (*a2a.ListTasksResponse, error) {
	if req == nil {
		req = &a2a.ListTasksRequest{}
	}
	pageSize := req.PageSize
	if pageSize == 0 {
		pageSize = 50
	}
	if pageSize < 1 || pageSize > 100 {
		return nil, fmt.Errorf("page size must be between 1 and 100, got %d: %w", pageSize, a2a.ErrInvalidRequest)
	}
	all := s.matching(req)
	start, err := pageStart(all, req.PageToken)
	if err != nil {
		return nil, err
	}
	page := all[start:]
	next := ""
	if len(page) > pageSize {
		page = page[:pageSize]
		last := page[len(page)-1]
		next = encodeCursor(last.updated, last.task.ID)
	}
	out := make([]*a2a.Task, 0, len(page))
	for _, t := range page {
		out = append(out, listView(t.task, req))
	}
	return &a2a.ListTasksResponse{Tasks: out, TotalSize: len(all), PageSize: pageSize, NextPageToken: next}, nil
}

// matching are the tasks req's filters select (context, state, status time), newest first
// (ties by descending id, the order the cursor continues in).
func (s *MemoryStore) matching(req *a2a.ListTasksRequest) []*memTask {
	s.mu.RLock()
	var all []*memTask
	for _, t := range s.tasks {
		if listSelects(req, t.task) {
			all = append(all, t)
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(all, func(a, b *memTask) int {
		if c := b.updated.Compare(a.updated); c != 0 {
			return c
		}
		return strings.Compare(string(b.task.ID), string(a.task.ID))
	})
	return all
}

// listSelects reports whether req's filters select task.
func listSelects(req *a2a.ListTasksRequest, task *a2a.Task) bool {
	switch {
	case req.ContextID != "" && task.ContextID != req.ContextID:
		return false
	case req.Status != a2a.TaskStateUnspecified && task.Status.State != req.Status:
		return false
	case req.StatusTimestampAfter != nil && task.Status.Timestamp != nil && task.Status.Timestamp.Before(*req.StatusTimestampAfter):
		return false
	}
	return true
}

// pageStart is the index in all (sorted as matching sorts) of the first task after the cursor
// token ("" starts at the beginning).
func pageStart(all []*memTask, token string) (int, error) {
	if token == "" {
		return 0, nil
	}
	at, id, err := decodeCursor(token)
	if err != nil {
		return 0, err
	}
	for i, t := range all {
		c := t.updated.Compare(at)
		if c < 0 || (c == 0 && strings.Compare(string(t.task.ID), string(id)) < 0) {
			return i, nil
		}
	}
	return len(all), nil
}

// listView is a copy of task as List returns it: the last historyLength messages (default 100),
// artifacts only when asked for.
func listView(task *a2a.Task, req *a2a.ListTasksRequest) *a2a.Task {
	hist := 100
	if req.HistoryLength != nil {
		hist = *req.HistoryLength
	}
	c := copyTask(task)
	if hist == 0 {
		c.History = []*a2a.Message{}
	} else if hist > 0 && len(c.History) > hist {
		c.History = c.History[len(c.History)-hist:]
	}
	if !req.IncludeArtifacts {
		c.Artifacts = nil
	}
	return c
}

func encodeCursor(t time.Time, id a2a.TaskID) string {
	return base64.RawURLEncoding.EncodeToString([]byte(t.Format(time.RFC3339Nano) + "|" + string(id)))
}

func decodeCursor(tok string) (time.Time, a2a.TaskID, error) {
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("bad page token: %w", a2a.ErrInvalidParams)
	}
	ts, id, ok := strings.Cut(string(raw), "|")
	if !ok {
		return time.Time{}, "", fmt.Errorf("bad page token: %w", a2a.ErrInvalidParams)
	}
	at, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("bad page token: %w", a2a.ErrInvalidParams)
	}
	return at, a2a.TaskID(id), nil
}

// copyTask deep-copies a task. Values inside metadata maps/slices are
// copied recursively; other values (strings, numbers, bools) are immutable.
func copyTask(t *a2a.Task) *a2a.Task {
	if t == nil {
		return nil
	}
	c := *t
	c.Artifacts = copyPtrSlice(t.Artifacts, copyArtifact)
	c.History = copyPtrSlice(t.History, copyMessage)
	c.Metadata = copyMeta(t.Metadata)
	c.Status.Message = copyMessage(t.Status.Message)
	if t.Status.Timestamp != nil {
		ts := *t.Status.Timestamp
		c.Status.Timestamp = &ts
	}
	return &c
}

func copyPtrSlice[T any](in []*T, cp func(*T) *T) []*T {
	if in == nil {
		return nil
	}
	out := make([]*T, len(in))
	for i, v := range in {
		out[i] = cp(v)
	}
	return out
}

func copyArtifact(a *a2a.Artifact) *a2a.Artifact {
	if a == nil {
		return nil
	}
	c := *a
	c.Extensions = slices.Clone(a.Extensions)
	c.Metadata = copyMeta(a.Metadata)
	c.Parts = copyPtrSlice(a.Parts, copyPart)
	return &c
}

func copyMessage(m *a2a.Message) *a2a.Message {
	if m == nil {
		return nil
	}
	c := *m
	c.Extensions = slices.Clone(m.Extensions)
	c.Metadata = copyMeta(m.Metadata)
	c.Parts = copyPtrSlice(m.Parts, copyPart)
	c.ReferenceTasks = slices.Clone(m.ReferenceTasks)
	return &c
}

func copyPart(p *a2a.Part) *a2a.Part {
	if p == nil {
		return nil
	}
	c := *p
	c.Metadata = copyMeta(p.Metadata)
	switch v := p.Content.(type) {
	case a2a.Raw:
		c.Content = a2a.Raw(slices.Clone([]byte(v)))
	case a2a.Data:
		c.Content = a2a.Data{Value: copyAny(v.Value)}
	}
	return &c
}

func copyMeta(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = copyAny(v)
	}
	return out
}

func copyAny(v any) any {
	switch x := v.(type) {
	case map[string]any:
		return copyMeta(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = copyAny(e)
		}
		return out
	case map[string]string:
		return maps.Clone(x)
	case []string:
		return slices.Clone(x)
	case []byte:
		return slices.Clone(x)
	}
	return v
}
