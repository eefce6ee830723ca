package convstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

func randomChanges(r *rand.Rand) []Change {
	bs := func() []byte {
		b := make([]byte, r.IntN(40))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return b
	}
	changes := make([]Change, 1+r.IntN(4))
	for i := range changes {
		ch := Change{Agent: fmt.Sprintf("o/u/a%d", r.IntN(9)), ContextID: fmt.Sprintf("C%d", r.IntN(99)), Delete: r.IntN(5) == 0}
		if r.IntN(3) > 0 {
			ch.Header = bs()
		}
		for range r.IntN(3) {
			ch.Put = append(ch.Put, TaskRecord{ID: fmt.Sprintf("T%d", r.IntN(99)), Data: bs()})
		}
		for range r.IntN(3) {
			ch.Del = append(ch.Del, fmt.Sprintf("T%d", r.IntN(99)))
		}
		for range r.IntN(3) {
			ch.PutContent = append(ch.PutContent, ContentRecord{Seq: r.Uint64(), Data: bs()})
		}
		for range r.IntN(3) {
			ch.DelContent = append(ch.DelContent, r.Uint64())
		}
		changes[i] = ch
	}
	return changes
}

// The log record of a group decodes to the same group, and no truncation
// or single-byte corruption of it decodes without an error or into the
// same group (the CRC guards the file; this guards the decoder).
func TestChangesRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		changes := randomChanges(r)
		b := encodeChanges(nil, changes)
		got, err := decodeChanges(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(normalize(got), normalize(changes)) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, changes)
		}
		if _, err := decodeChanges(b[:r.IntN(len(b))]); err == nil {
			t.Fatal("a truncated record decoded")
		}
	}
}

// normalize makes empty and nil byte slices compare equal.
func normalize(changes []Change) []Change {
	out := make([]Change, len(changes))
	for i, ch := range changes {
		if ch.Header != nil && len(ch.Header) == 0 {
			ch.Header = []byte{}
		}
		for k := range ch.Put {
			if len(ch.Put[k].Data) == 0 {
				ch.Put[k].Data = nil
			}
		}
		for k := range ch.PutContent {
			if len(ch.PutContent[k].Data) == 0 {
				ch.PutContent[k].Data = nil
			}
		}
		out[i] = ch
	}
	return out
}

// openTestBolt opens a bbolt journal with fsync, as deployed.
func openTestBolt(t *testing.T, path string) *BoltJournal {
	t.Helper()
	j, err := OpenBoltJournal(path, &BoltOptions{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// contextsIn is what a journal holds: context id → its tasks' states.
func contextsIn(t *testing.T, j Journal) map[string][]a2a.TaskState {
	t.Helper()
	got := map[string][]a2a.TaskState{}
	if err := j.Load(context.Background(), "", func(_ string, c *conversation.Context, _ []*Item) error {
		for _, task := range c.Tasks {
			got[c.ID] = append(got[c.ID], task.State)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// A change is durable once its ticket says so, though bbolt holds it only
// later: a crash in between (bbolt never applied it) loses nothing, and
// recovery applies the log exactly once, whatever part bbolt already held.
func TestBoltLogRecoversWhatBoltDidNotApply(t *testing.T) {
	path := filepath.Join(t.TempDir(), "conv.db")
	j := openTestBolt(t, path)
	m := NewMemory(j, true)
	p := conversation.DefaultPolicy()
	want := map[string][]a2a.TaskState{}
	for i := range 40 {
		ctxID := fmt.Sprintf("C%d", i)
		mustDecide(t, m, "o/u/a", p, t0, send(fmt.Sprintf("T%d", i), ctxID, "m", fmt.Sprintf("D%d", i)), conversation.KindNewContext)
		want[ctxID] = []a2a.TaskState{a2a.TaskStateSubmitted}
		if i == 19 {
			// Half of them in bbolt, the rest only in the log.
			if err := j.applyQueued(); err != nil {
				t.Fatal(err)
			}
		}
		if i%2 == 0 {
			mustObserve(t, m, "o/u/a", p, t0, status(fmt.Sprintf("T%d", i), fmt.Sprintf("D%d", i), a2a.TaskStateCompleted))
			want[ctxID] = []a2a.TaskState{a2a.TaskStateCompleted}
		}
	}
	j.mu.Lock()
	pending := len(j.queue)
	j.mu.Unlock()
	if pending == 0 {
		t.Fatal("the test needs changes that bbolt does not hold yet")
	}
	j.crash()
	for round := range 2 {
		j = openTestBolt(t, path)
		if got := contextsIn(t, j); !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d after the crash: %v, want %v", round, got, want)
		}
		// Recovery applied the log: a second crash replays nothing twice.
		j.crash()
	}
}

// A torn last record (a crash during its write, before its fdatasync
// returned, so nobody was told it is durable) is ignored, with everything
// before it kept; new records then overwrite it.
func TestBoltLogIgnoresATornTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "conv.db")
	j := openTestBolt(t, path)
	m := NewMemory(j, true)
	p := conversation.DefaultPolicy()
	for i := range 5 {
		mustDecide(t, m, "o/u/a", p, t0, send(fmt.Sprintf("T%d", i), fmt.Sprintf("C%d", i), "m", "D"), conversation.KindNewContext)
	}
	off := j.log.off
	mustDecide(t, m, "o/u/a", p, t0, send("T5", "C5", "m", "D"), conversation.KindNewContext)
	end := j.log.off
	j.crash()
	f, err := os.OpenFile(path+".log", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Flip a byte in the last record's payload.
	if _, err := f.WriteAt([]byte{0xff}, off+(end-off)/2+logHeader/2); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	j = openTestBolt(t, path)
	got := contextsIn(t, j)
	if len(got) != 5 || got["C5"] != nil {
		t.Fatalf("after a torn last record: %v, want C0..C4", got)
	}
	m = NewMemory(j, true)
	if err := m.Recover(context.Background(), "", nil); err != nil {
		t.Fatal(err)
	}
	mustDecide(t, m, "o/u/a", p, t0, send("T6", "C6", "m", "D"), conversation.KindNewContext)
	j.crash()
	j = openTestBolt(t, path)
	defer func() { _ = j.Close() }()
	if got := contextsIn(t, j); len(got) != 6 || got["C6"] == nil {
		t.Fatalf("after a record written over the torn one: %v", got)
	}
}

// Once bbolt holds all of it, the log starts again at offset 0; the stale
// records behind the new tail are never replayed (their sequence numbers
// are older), across many rewinds and crashes.
func TestBoltLogRewinds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "conv.db")
	p := conversation.DefaultPolicy()
	want := map[string][]a2a.TaskState{}
	n := 0
	rewinds := 0
	for round := range 4 {
		j := openTestBolt(t, path)
		j.rewindAt = 2 << 10
		m := NewMemory(j, true)
		if err := m.Recover(context.Background(), "", nil); err != nil {
			t.Fatal(err)
		}
		for range 60 {
			ctxID := fmt.Sprintf("C%d", n)
			before := j.log.off
			mustDecide(t, m, "o/u/a", p, t0, send(fmt.Sprintf("T%d", n), ctxID, "m", "D"), conversation.KindNewContext)
			if j.log.off < before {
				rewinds++
			}
			want[ctxID] = []a2a.TaskState{a2a.TaskStateSubmitted}
			n++
		}
		if round%2 == 0 {
			j.crash()
		} else if err := j.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if rewinds < 8 {
		t.Fatalf("%d rewinds: the test did not exercise them", rewinds)
	}
	j := openTestBolt(t, path)
	defer func() { _ = j.Close() }()
	if got := contextsIn(t, j); !reflect.DeepEqual(got, want) {
		t.Fatalf("after %d rewinds: %d contexts, want %d", rewinds, len(got), len(want))
	}
}

// A journal file replaced without its log (restored from a backup, say)
// is refused with a clear error instead of replaying records onto the wrong
// state.
func TestBoltLogRefusesAGap(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "conv.db")
	j := openTestBolt(t, path)
	m := NewMemory(j, true)
	p := conversation.DefaultPolicy()
	for i := range 3 {
		mustDecide(t, m, "o/u/a", p, t0, send(fmt.Sprintf("T%d", i), fmt.Sprintf("C%d", i), "m", "D"), conversation.KindNewContext)
	}
	j.crash()
	// Reopen: bbolt now holds records 1..3 and the log starts again at 0.
	j = openTestBolt(t, path)
	m = NewMemory(j, true)
	mustDecide(t, m, "o/u/a", p, t0, send("T9", "C9", "m", "D"), conversation.KindNewContext)
	j.crash()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if j, err := OpenBoltJournal(path, &BoltOptions{Timeout: 5 * time.Second}); err == nil {
		_ = j.Close()
		t.Fatal("a log resuming at record 4 was replayed onto an empty journal")
	} else {
		t.Log(err)
	}
}
