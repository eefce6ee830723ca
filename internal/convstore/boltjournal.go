package convstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
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
// (ids are validated A2A/MQTT ids and never contain 0x00).
//
// Commits are grouped, and a group is durable once it is one record in the
// journal's log (changelog.go: one write and one fdatasync in a
// preallocated file, path + ".log"). The log's records are applied to bbolt
// behind it, every applyEvery or applyBatch changes, in one write
// transaction that also stores the last applied record's sequence number;
// recovery (open) applies the records after it. Reads (Load) apply what is
// pending first, so they see every durable change.
type BoltJournal struct {
	db      *bolt.DB
	log     *changeLog
	g       *groupCommitter
	commits atomic.Int64
	changes atomic.Int64

	// seq is the last record written to the log; only commit, which the
	// group committer runs one at a time, touches it and the log.
	seq uint64
	enc []byte
	// rewindAt is logRewindAt (smaller in tests).
	rewindAt int64

	applyMu sync.Mutex // one apply to bbolt at a time
	mu      sync.Mutex // guards the fields below
	queue   []Change   // in the log, not yet in bbolt, in order
	queued  uint64     // the seq of queue's last change
	// applyErr is the last failed apply's error, until one succeeds.
	applyErr error

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

var (
	bucketRecords = []byte("conversations.v2")
	bucketMeta    = []byte("journal.meta")
	keyApplied    = []byte("applied-seq")
)

// applyEvery and applyBatch bound how long, and how many changes, a
// durable change stays in the log alone before bbolt holds it too.
const (
	applyEvery = 100 * time.Millisecond
	applyBatch = 8192
)

// OpenBoltJournal opens (creating if needed) the journal file at path and
// its log at path + ".log", applying the log's records that bbolt does not
// hold yet.
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
	var applied uint64
	if err := db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketRecords); err != nil {
			return err
		}
		m, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := m.Get(keyApplied); len(v) == 8 {
			applied = binary.BigEndian.Uint64(v)
		}
		return nil
	}); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("init bolt journal %s: %w", path, err)
	}
	j := &BoltJournal{db: db, seq: applied, rewindAt: logRewindAt,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	var replay []Change
	last := applied
	j.log, err = openChangeLog(path+".log", o.NoSync, func(seq uint64, payload []byte) error {
		if seq <= applied {
			return nil // bbolt holds it
		}
		if seq != last+1 {
			return fmt.Errorf("change log %s.log resumes at record %d but bbolt holds up to %d: records are missing (a journal file was replaced without its log?)", path, seq, last)
		}
		changes, err := decodeChanges(payload)
		if err != nil {
			return fmt.Errorf("change log %s.log record %d: %w", path, seq, err)
		}
		replay, last = append(replay, changes...), seq
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	if last > applied {
		if err := j.applyToBolt(replay, last); err != nil {
			_ = j.log.close()
			_ = db.Close()
			return nil, fmt.Errorf("recover bolt journal %s from its log: %w", path, err)
		}
		j.seq = last
	}
	// bbolt holds every record: the log starts again.
	j.log.rewind()
	j.g = newGroupCommitter(j.commit)
	go j.applyLoop()
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

// commit makes a group durable: one log record. The group committer runs
// it one group at a time.
func (j *BoltJournal) commit(changes []Change) error {
	j.mu.Lock()
	err := j.applyErr
	j.mu.Unlock()
	if err != nil {
		return fmt.Errorf("bolt journal cannot apply its log: %w", err)
	}
	if j.log.off >= j.rewindAt {
		// Rewind the log once bbolt holds all of it (once per logRewindAt
		// bytes, this group waits for one bbolt commit).
		if err := j.applyQueued(); err != nil {
			return err
		}
		j.log.rewind()
	}
	j.enc = encodeChanges(j.enc[:0], changes)
	if err := j.log.append(j.seq+1, j.enc); err != nil {
		return fmt.Errorf("commit %d conversation changes: %w", len(changes), err)
	}
	j.seq++
	if cap(j.enc) > 1<<20 {
		j.enc = nil
	}
	j.mu.Lock()
	j.queue = append(j.queue, changes...)
	j.queued = j.seq
	full := len(j.queue) >= applyBatch
	j.mu.Unlock()
	if full {
		select {
		case j.kick <- struct{}{}:
		default:
		}
	}
	j.commits.Add(1)
	j.changes.Add(int64(len(changes)))
	return nil
}

// applyLoop applies the log's records to bbolt behind it.
func (j *BoltJournal) applyLoop() {
	defer close(j.done)
	t := time.NewTicker(applyEvery)
	defer t.Stop()
	for {
		select {
		case <-j.stop:
			return
		case <-t.C:
		case <-j.kick:
		}
		_ = j.applyQueued() // kept in applyErr; the next tick retries
	}
}

// applyQueued writes every change the log holds and bbolt does not into
// bbolt, in one transaction.
func (j *BoltJournal) applyQueued() error {
	j.applyMu.Lock()
	defer j.applyMu.Unlock()
	j.mu.Lock()
	batch, upto := j.queue, j.queued
	j.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	err := j.applyToBolt(batch, upto)
	j.mu.Lock()
	defer j.mu.Unlock()
	j.applyErr = err
	if err != nil {
		return err
	}
	// A fresh slice: the applied changes' memory goes with them.
	j.queue = append([]Change(nil), j.queue[len(batch):]...)
	return nil
}

// applyToBolt writes changes and the seq of the record they end with.
func (j *BoltJournal) applyToBolt(changes []Change, upto uint64) error {
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
		return tx.Bucket(bucketMeta).Put(keyApplied, binary.BigEndian.AppendUint64(nil, upto))
	})
	if err != nil {
		return fmt.Errorf("apply %d conversation changes to bbolt: %w", len(changes), err)
	}
	return nil
}

// Load implements Journal: one read transaction, a consistent snapshot.
func (j *BoltJournal) Load(ctx context.Context, agent string, fn func(agent string, c *conversation.Context, items []*Item) error) error {
	// Every durable change is in the log; bbolt holds it once applied.
	if err := j.applyQueued(); err != nil {
		return fmt.Errorf("load conversations: %w", err)
	}
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
	close(j.stop)
	<-j.done
	err := j.applyQueued()
	err = errors.Join(err, j.log.close())
	if cerr := j.db.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return fmt.Errorf("close bolt journal: %w", err)
	}
	return nil
}

// crash closes the journal as a kill would: what is pending in the group
// committer is dropped, and the log's records are not applied to bbolt.
// For tests of recovery.
func (j *BoltJournal) crash() {
	close(j.stop)
	<-j.done
	j.applyMu.Lock()
	_ = j.log.close()
	_ = j.db.Close()
}
