package convstore

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// ItemKind says what a history item holds.
type ItemKind byte

// History item kinds.
const (
	// ItemMessage is a message of a task: the requester's (ROLE_USER) or
	// the agent's (a status message, a direct Message result).
	ItemMessage ItemKind = 1
	// ItemArtifact is an artifact of a task.
	ItemArtifact ItemKind = 2
)

// Item is one piece of a context's history content (history mode Messages):
// a message or an artifact of one of its tasks, as A2A v1.0 JSON. Items are
// immutable once held by Memory; each is one small journal record, so
// keeping history never re-encodes a context or a task.
type Item struct {
	// Seq orders a context's items (assigned by Memory; oldest first).
	Seq    uint64
	TaskID string
	Kind   ItemKind
	// Key is the messageId or artifactId: a message already held is not
	// added twice; an artifact with the same id replaces the one held.
	Key string
	// Append: the artifact's parts are appended to the artifact held under
	// Key (an artifact update chunk with append=true).
	Append bool
	// Data is the message or artifact as A2A v1.0 JSON.
	Data []byte
}

// same reports whether two items hold the same message or artifact.
func (it *Item) same(o *Item) bool {
	return it.Kind == o.Kind && it.Key == o.Key && it.TaskID == o.TaskID
}

// ContentRecord is one history item as a journal record.
type ContentRecord struct {
	Seq  uint64
	Data []byte
}

// history is the content Memory keeps for one context, within a byte bound
// (the oldest items go first). Look-ups scan the items: a context holds
// at most its byte bound's worth (a few hundred small messages), and a
// scan costs less than an index's memory on every item.
type history struct {
	items []*Item // by Seq
	bytes int
	next  uint64
}

func newHistory() *history { return &history{} }

func (h *history) find(it *Item) *Item {
	for _, o := range h.items {
		if o.same(it) {
			return o
		}
	}
	return nil
}

// add takes item into h (bounded by limit bytes of Data) and returns the
// records to write and the sequence numbers to delete.
func (h *history) add(it Item, limit int) (put []ContentRecord, del []uint64) {
	old := h.find(&it)
	if old != nil && it.Kind == ItemMessage {
		return nil, nil // the same message again (a retry, a task snapshot)
	}
	if old != nil && it.Append {
		// A chunk that does not decode replaces the artifact: history
		// keeps what the agent sent last rather than nothing.
		if merged, err := appendArtifact(old.Data, it.Data); err == nil {
			it.Data = merged
		}
	}
	if old != nil {
		del = append(del, h.remove(old))
	}
	if len(it.Data) > limit {
		// One item larger than the whole bound is not kept (it would
		// push every other item out and still not fit).
		return nil, del
	}
	it.Seq = h.next
	h.next++
	held := it
	h.items = append(h.items, &held)
	h.bytes += len(held.Data)
	for h.bytes > limit && len(h.items) > 0 {
		del = append(del, h.remove(h.items[0]))
	}
	return []ContentRecord{{Seq: held.Seq, Data: encodeItem(&held)}}, del
}

// remove drops it and returns its sequence number.
func (h *history) remove(it *Item) uint64 {
	if i := slices.Index(h.items, it); i >= 0 {
		h.items = slices.Delete(h.items, i, i+1)
	}
	h.bytes -= len(it.Data)
	return it.Seq
}

// dropTasks removes the items of the given tasks.
func (h *history) dropTasks(tasks []string) (del []uint64) {
	for _, it := range slices.Clone(h.items) {
		if slices.Contains(tasks, it.TaskID) {
			del = append(del, h.remove(it))
		}
	}
	return del
}

// load inserts a recovered item.
func (h *history) load(it *Item) {
	h.items = append(h.items, it)
	h.bytes += len(it.Data)
	h.next = max(h.next, it.Seq+1)
}

// appendArtifact appends the parts of chunk to the artifact old (A2A
// artifact update with append=true); the chunk's other fields win when set.
func appendArtifact(old, chunk []byte) ([]byte, error) {
	var a, c a2a.Artifact
	if err := json.Unmarshal(old, &a); err != nil {
		return nil, fmt.Errorf("history artifact: %w", err)
	}
	if err := json.Unmarshal(chunk, &c); err != nil {
		return nil, fmt.Errorf("history artifact chunk: %w", err)
	}
	a.Parts = append(a.Parts, c.Parts...)
	if c.Name != "" {
		a.Name = c.Name
	}
	if c.Description != "" {
		a.Description = c.Description
	}
	b, err := json.Marshal(&a)
	if err != nil {
		return nil, fmt.Errorf("history artifact: %w", err)
	}
	return b, nil
}

const itemVersion = 1

func encodeItem(it *Item) []byte {
	e := enc{b: make([]byte, 0, 16+len(it.TaskID)+len(it.Key)+len(it.Data))}
	e.byte(itemVersion)
	e.s(it.TaskID)
	e.byte(byte(it.Kind))
	e.s(it.Key)
	e.bytes(it.Data)
	return e.b
}

func decodeItem(seq uint64, b []byte) (*Item, error) {
	d := dec{b: b}
	if d.byte() != itemVersion {
		return nil, fmt.Errorf("history item %d: record version: %w", seq, errRecord)
	}
	it := &Item{Seq: seq, TaskID: d.s(), Kind: ItemKind(d.byte()), Key: d.s(), Data: d.bytes()}
	if d.err != nil {
		return nil, fmt.Errorf("history item %d: %w", seq, d.err)
	}
	return it, nil
}
