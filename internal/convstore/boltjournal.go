package convstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// BoltJournal is the single-replica journal: one bbolt file, durable across
// restarts (bbolt locks the file: one process). Records live in one bucket,
// keyed so that a context's records are adjacent and recovery is one
// ordered scan:
//
//	agent 0x00 contextID 0x00 0x00          → header record
//	agent 0x00 contextID 0x00 0x01 taskID   → task record
//	agent 0x00 contextID 0x00 0x02 seq      → history item (seq: 8 bytes, big endian)
//
// (ids are validated A2A/MQTT ids and never contain 0x00). Commits are
// grouped: every group is one bbolt write transaction and one fsync.
type BoltJournal struct {
	db      *bolt.DB
	g       *groupCommitter
	commits atomic.Int64
	changes atomic.Int64
}

var bucketRecords = []byte("conversations.v2")

// OpenBoltJournal opens (creating if needed) the journal file at path.
func OpenBoltJournal(path string, o *BoltOptions) (*BoltJournal, error) {
	if o == nil {
		o = &BoltOptions{}
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: o.Timeout, NoSync: o.NoSync, FreelistType: bolt.FreelistMapType, NoFreelistSync: true,
	})
	if err != nil {
		return nil, fmt.Errorf("open bolt journal %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketRecords)
		return err
	}); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("init bolt journal %s: %w", path, err)
	}
	j := &BoltJournal{db: db}
	j.g = newGroupCommitter(j.commit)
	return j, nil
}

// BoltOptions tune OpenBoltJournal.
type BoltOptions struct {
	// NoSync skips fsync on commit: faster, but a crash may lose the last
	// commits. For tests and bulk loads only.
	NoSync bool
	// Timeout waits this long for the file lock (another process holding
	// the file); 0 waits forever.
	Timeout time.Duration
}

// Stats reports how many group commits ran and how many changes they held
// (their ratio is the mean group size).
func (j *BoltJournal) Stats() (commits, changes int64) { return j.commits.Load(), j.changes.Load() }

func ctxPrefix(agent, contextID string) []byte {
	k := make([]byte, 0, len(agent)+len(contextID)+2+40)
	k = append(k, agent...)
	k = append(k, 0)
	k = append(k, contextID...)
	return append(k, 0)
}

func headerKey(agent, contextID string) []byte { return append(ctxPrefix(agent, contextID), 0) }

func taskKey(agent, contextID, taskID string) []byte {
	return append(append(ctxPrefix(agent, contextID), 1), taskID...)
}

func itemKeyBytes(agent, contextID string, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(append(ctxPrefix(agent, contextID), 2), seq)
}

// Append implements Journal.
func (j *BoltJournal) Append(changes ...Change) *Ticket { return j.g.Append(changes...) }

func (j *BoltJournal) commit(changes []Change) error {
	err := j.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRecords)
		for i := range changes {
			ch := &changes[i]
			for _, id := range ch.Del {
				if err := b.Delete(taskKey(ch.Agent, ch.ContextID, id)); err != nil {
					return err
				}
			}
			for _, seq := range ch.DelContent {
				if err := b.Delete(itemKeyBytes(ch.Agent, ch.ContextID, seq)); err != nil {
					return err
				}
			}
			if ch.Delete {
				if err := b.Delete(headerKey(ch.Agent, ch.ContextID)); err != nil {
					return err
				}
				continue
			}
			if ch.Header != nil {
				if err := b.Put(headerKey(ch.Agent, ch.ContextID), ch.Header); err != nil {
					return err
				}
			}
			for _, t := range ch.Put {
				if err := b.Put(taskKey(ch.Agent, ch.ContextID, t.ID), t.Data); err != nil {
					return err
				}
			}
			for _, it := range ch.PutContent {
				if err := b.Put(itemKeyBytes(ch.Agent, ch.ContextID, it.Seq), it.Data); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("commit %d conversation changes: %w", len(changes), err)
	}
	j.commits.Add(1)
	j.changes.Add(int64(len(changes)))
	return nil
}

// Load implements Journal: one read transaction, a consistent snapshot.
func (j *BoltJournal) Load(ctx context.Context, agent string, fn func(agent string, c *conversation.Context, items []*Item) error) error {
	err := j.db.View(func(tx *bolt.Tx) error {
		cur := tx.Bucket(bucketRecords).Cursor()
		var prefix []byte
		if agent != "" {
			prefix = append([]byte(agent), 0)
		}
		var (
			c         *conversation.Context
			items     []*Item
			cAgent    string
			n         int
			loadError error
		)
		flush := func() error {
			if c == nil {
				return nil
			}
			slices.SortFunc(c.Tasks, func(a, b *conversation.Task) int { return int(a.Seq) - int(b.Seq) })
			done, its := c, items
			c, items = nil, nil
			return fn(cAgent, done, its)
		}
		for k, v := cur.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = cur.Next() {
			if n++; n%4096 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			a, rest, ok1 := bytes.Cut(k, []byte{0})
			id, kind, ok2 := bytes.Cut(rest, []byte{0})
			if !ok1 || !ok2 || len(kind) == 0 {
				return fmt.Errorf("journal key %q: %w", k, errRecord)
			}
			if kind[0] == 0 {
				if err := flush(); err != nil {
					return err
				}
				if c, loadError = decodeHeader(string(id), v); loadError != nil {
					return loadError
				}
				cAgent = string(a)
				continue
			}
			if c == nil || c.ID != string(id) || cAgent != string(a) {
				return fmt.Errorf("journal: record %q without its context header: %w", k, errRecord)
			}
			if kind[0] == 2 {
				if len(kind) != 9 {
					return fmt.Errorf("journal key %q: %w", k, errRecord)
				}
				it, err := decodeItem(binary.BigEndian.Uint64(kind[1:]), v)
				if err != nil {
					return fmt.Errorf("context %s/%s: %w", a, id, err)
				}
				items = append(items, it)
				continue
			}
			t, err := decodeTask(string(kind[1:]), v)
			if err != nil {
				return fmt.Errorf("context %s/%s: %w", a, id, err)
			}
			c.Tasks = append(c.Tasks, t)
		}
		return flush()
	})
	if err != nil {
		return fmt.Errorf("load conversations: %w", err)
	}
	return nil
}

// Close implements Journal.
func (j *BoltJournal) Close() error {
	j.g.close()
	if err := j.db.Close(); err != nil {
		return fmt.Errorf("close bolt journal: %w", err)
	}
	return nil
}
