package convstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// Bolt is the embedded store: one bbolt file, durable across restarts, for a
// single service process (bbolt locks the file). Every Update is one bbolt
// write transaction, so commits are serialized and a View read inside it is
// exactly what the commit replaces: no conflicts, no retries.
//
// Layout: bucket "agents" → one bucket per agent holding
//
//	ctx/<contextID>  → JSON conversation.Context
//	task/<taskID>    → contextID
//	exp/<be64 expiresAt unix ns | contextID> → ""   live contexts by expiry
//	                                              (never-expiring: max uint64)
//	n                → be64 count of exp entries
//
// and bucket "due" → <be64 NextDeadline | agent 0x00 contextID> → "" for the
// sweeper. Live contexts at now = n − exp entries at or before now (only
// the expired-but-not-yet-swept ones are walked).
type Bolt struct {
	db *bolt.DB
}

// BoltOptions tune OpenBolt.
type BoltOptions struct {
	// NoSync skips fsync on commit: faster, but a crash may lose the last
	// commits. For tests and bulk loads only.
	NoSync bool
	// Timeout waits this long for the file lock (another process holding
	// the file); 0 waits forever.
	Timeout time.Duration
}

var (
	bucketAgents = []byte("agents")
	bucketDue    = []byte("due")
	bucketCtx    = []byte("ctx")
	bucketTask   = []byte("task")
	bucketExp    = []byte("exp")
	keyCount     = []byte("n")
)

// OpenBolt opens (creating if needed) the store file at path.
func OpenBolt(path string, o *BoltOptions) (*Bolt, error) {
	if o == nil {
		o = &BoltOptions{}
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:      o.Timeout,
		NoSync:       o.NoSync,
		FreelistType: bolt.FreelistMapType,
		// The freelist is rebuilt on open instead of written on every
		// commit: cheaper commits for a write-heavy store.
		NoFreelistSync: true,
	})
	if err != nil {
		return nil, fmt.Errorf("open bolt store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketAgents, bucketDue} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("init bolt store %s: %w", path, err)
	}
	return &Bolt{db: db}, nil
}

// Close closes the file.
func (b *Bolt) Close() error {
	if err := b.db.Close(); err != nil {
		return fmt.Errorf("close bolt store: %w", err)
	}
	return nil
}

// DB exposes the bbolt handle (backups, stats).
func (b *Bolt) DB() *bolt.DB { return b.db }

// agentBuckets are one agent's sub-buckets; nil when the agent has none.
type agentBuckets struct {
	root, ctx, task, exp *bolt.Bucket
}

func agentOf(tx *bolt.Tx, agent string, create bool) (agentBuckets, error) {
	agents := tx.Bucket(bucketAgents)
	if agents == nil {
		return agentBuckets{}, ErrClosed
	}
	var ab agentBuckets
	if !create {
		ab.root = agents.Bucket([]byte(agent))
		if ab.root == nil {
			return agentBuckets{}, nil
		}
		ab.ctx, ab.task, ab.exp = ab.root.Bucket(bucketCtx), ab.root.Bucket(bucketTask), ab.root.Bucket(bucketExp)
		return ab, nil
	}
	var err error
	if ab.root, err = agents.CreateBucketIfNotExists([]byte(agent)); err != nil {
		return ab, err
	}
	for _, sb := range []struct {
		name []byte
		dst  **bolt.Bucket
	}{{bucketCtx, &ab.ctx}, {bucketTask, &ab.task}, {bucketExp, &ab.exp}} {
		if *sb.dst, err = ab.root.CreateBucketIfNotExists(sb.name); err != nil {
			return ab, err
		}
	}
	return ab, nil
}

func timeKey(t time.Time) uint64 {
	if t.IsZero() {
		return math.MaxUint64
	}
	ns := t.UnixNano()
	if ns < 0 {
		return 0
	}
	return uint64(ns)
}

func expKey(c *conversation.Context) []byte {
	k := make([]byte, 8, 8+len(c.ID))
	binary.BigEndian.PutUint64(k, timeKey(c.ExpiresAt))
	return append(k, c.ID...)
}

func dueKey(agent string, c *conversation.Context) []byte {
	k := make([]byte, 8, 8+len(agent)+1+len(c.ID))
	binary.BigEndian.PutUint64(k, timeKey(c.NextDeadline))
	k = append(k, agent...)
	k = append(k, 0)
	return append(k, c.ID...)
}

func decodeContext(raw []byte) (*conversation.Context, error) {
	var c conversation.Context
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("decode stored context: %w", err)
	}
	return &c, nil
}

// view reads key's View inside tx.
func (b *Bolt) view(tx *bolt.Tx, key Key, now time.Time) (conversation.View, error) {
	v := conversation.View{ContextID: key.ContextID}
	ab, err := agentOf(tx, key.Agent, false)
	if err != nil || ab.root == nil {
		return v, err
	}
	if key.ContextID != "" {
		if raw := ab.ctx.Get([]byte(key.ContextID)); raw != nil {
			if v.Context, err = decodeContext(raw); err != nil {
				return v, fmt.Errorf("context %s/%s: %w", key.Agent, key.ContextID, err)
			}
		}
	}
	if key.TaskID != "" {
		if owner := ab.task.Get([]byte(key.TaskID)); owner != nil {
			v.TaskContextID = string(owner)
		}
	}
	v.LiveContexts = liveCount(ab, now)
	return v, nil
}

func liveCount(ab agentBuckets, now time.Time) int {
	raw := ab.root.Get(keyCount)
	if len(raw) != 8 {
		return 0
	}
	n := int(binary.BigEndian.Uint64(raw))
	limit := timeKey(now)
	cur := ab.exp.Cursor()
	for k, _ := cur.First(); k != nil && binary.BigEndian.Uint64(k) <= limit; k, _ = cur.Next() {
		n--
	}
	return max(n, 0)
}

func sameView(a, b conversation.View) bool {
	va, vb := uint64(0), uint64(0)
	if a.Context != nil {
		va = a.Context.Version
	}
	if b.Context != nil {
		vb = b.Context.Version
	}
	return (a.Context == nil) == (b.Context == nil) && va == vb &&
		a.TaskContextID == b.TaskContextID && a.LiveContexts == b.LiveContexts
}

// Update implements Store. The function first runs on a read-only
// transaction (reads never take bbolt's writer lock nor fsync); if it asks
// for a write, the write transaction re-reads the View and reuses the
// function's answer when nothing changed, or runs it again.
func (b *Bolt) Update(ctx context.Context, key Key, now time.Time, fn func(*Txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var first Txn
	err := b.db.View(func(tx *bolt.Tx) error {
		v, err := b.view(tx, key, now)
		first = Txn{View: v, Now: now}
		return err
	})
	if err != nil {
		return fmt.Errorf("load %s/%s: %w", key.Agent, key.ContextID, err)
	}
	if err := fn(&first); err != nil {
		return err
	}
	if !first.write {
		return nil
	}
	err = b.db.Update(func(tx *bolt.Tx) error {
		v, err := b.view(tx, key, now)
		if err != nil {
			return err
		}
		t := &first
		if !sameView(v, first.View) {
			t = &Txn{View: v, Now: now}
			if err := fn(t); err != nil {
				return err
			}
			if !t.write {
				return nil
			}
		}
		return b.commit(tx, key, t.View.Context, t.put)
	})
	if err != nil {
		return fmt.Errorf("update %s/%s: %w", key.Agent, key.ContextID, err)
	}
	return nil
}

func (b *Bolt) commit(tx *bolt.Tx, key Key, old, n *conversation.Context) error {
	if n != nil && n.ID != key.ContextID {
		return fmt.Errorf("put context %q under key %q", n.ID, key.ContextID)
	}
	ab, err := agentOf(tx, key.Agent, true)
	if err != nil {
		return err
	}
	due := tx.Bucket(bucketDue)
	ch := diff(old, n)
	for _, id := range ch.added {
		if owner := ab.task.Get([]byte(id)); owner != nil && string(owner) != key.ContextID {
			return fmt.Errorf("task %s belongs to context %s, not %s", id, owner, key.ContextID)
		}
	}
	count := 0
	if raw := ab.root.Get(keyCount); len(raw) == 8 {
		count = int(binary.BigEndian.Uint64(raw))
	}
	if old != nil {
		if old.Expired == nil {
			if err := ab.exp.Delete(expKey(old)); err != nil {
				return err
			}
			count--
		}
		if !old.NextDeadline.IsZero() {
			if err := due.Delete(dueKey(key.Agent, old)); err != nil {
				return err
			}
		}
	}
	if n == nil {
		if err := ab.ctx.Delete([]byte(key.ContextID)); err != nil {
			return err
		}
	} else {
		if old != nil {
			n.Version = old.Version + 1
		} else {
			n.Version = 1
		}
		raw, err := json.Marshal(n)
		if err != nil {
			return fmt.Errorf("encode context: %w", err)
		}
		if err := ab.ctx.Put([]byte(key.ContextID), raw); err != nil {
			return err
		}
		if n.Expired == nil {
			if err := ab.exp.Put(expKey(n), nil); err != nil {
				return err
			}
			count++
		}
		if !n.NextDeadline.IsZero() {
			if err := due.Put(dueKey(key.Agent, n), nil); err != nil {
				return err
			}
		}
	}
	var cnt [8]byte
	binary.BigEndian.PutUint64(cnt[:], uint64(max(count, 0)))
	if err := ab.root.Put(keyCount, cnt[:]); err != nil {
		return err
	}
	for _, id := range ch.removed {
		if owner := ab.task.Get([]byte(id)); owner != nil && string(owner) == key.ContextID {
			if err := ab.task.Delete([]byte(id)); err != nil {
				return err
			}
		}
	}
	for _, id := range ch.added {
		if err := ab.task.Put([]byte(id), []byte(key.ContextID)); err != nil {
			return err
		}
	}
	return nil
}

// Context implements Store.
func (b *Bolt) Context(ctx context.Context, agent, contextID string) (*conversation.Context, error) {
	var c *conversation.Context
	err := b.db.View(func(tx *bolt.Tx) error {
		ab, err := agentOf(tx, agent, false)
		if err != nil {
			return err
		}
		if ab.root == nil {
			return ErrNotFound
		}
		raw := ab.ctx.Get([]byte(contextID))
		if raw == nil {
			return ErrNotFound
		}
		c, err = decodeContext(raw)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("context %s/%s: %w", agent, contextID, err)
	}
	return c, nil
}

// TaskContext implements Store.
func (b *Bolt) TaskContext(ctx context.Context, agent, taskID string) (string, error) {
	var id string
	err := b.db.View(func(tx *bolt.Tx) error {
		ab, err := agentOf(tx, agent, false)
		if err != nil {
			return err
		}
		if ab.root == nil {
			return ErrNotFound
		}
		owner := ab.task.Get([]byte(taskID))
		if owner == nil {
			return ErrNotFound
		}
		id = string(owner)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("task %s/%s: %w", agent, taskID, err)
	}
	return id, nil
}

// LiveContexts implements Store.
func (b *Bolt) LiveContexts(ctx context.Context, agent string, now time.Time) (int, error) {
	n := 0
	err := b.db.View(func(tx *bolt.Tx) error {
		ab, err := agentOf(tx, agent, false)
		if err != nil || ab.root == nil {
			return err
		}
		n = liveCount(ab, now)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("live contexts of %s: %w", agent, err)
	}
	return n, nil
}

// Contexts implements Store. It runs in one read transaction: a consistent
// snapshot even while the process keeps writing.
func (b *Bolt) Contexts(ctx context.Context, fn func(agent string, c *conversation.Context) error) error {
	err := b.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketAgents).ForEachBucket(func(agent []byte) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			ab, err := agentOf(tx, string(agent), false)
			if err != nil {
				return err
			}
			name := string(agent)
			return ab.ctx.ForEach(func(k, raw []byte) error {
				c, err := decodeContext(raw)
				if err != nil {
					return fmt.Errorf("context %s/%s: %w", name, k, err)
				}
				return fn(name, c)
			})
		})
	})
	if err != nil {
		return fmt.Errorf("list contexts: %w", err)
	}
	return nil
}

// Due implements Store.
func (b *Bolt) Due(ctx context.Context, now time.Time, limit int) ([]Ref, error) {
	var refs []Ref
	err := b.db.View(func(tx *bolt.Tx) error {
		cur := tx.Bucket(bucketDue).Cursor()
		bound := timeKey(now)
		for k, _ := cur.First(); k != nil && len(refs) < limit; k, _ = cur.Next() {
			if len(k) < 9 || binary.BigEndian.Uint64(k) > bound {
				break
			}
			agent, id, ok := bytes.Cut(k[8:], []byte{0})
			if !ok {
				return errors.New("malformed due key")
			}
			refs = append(refs, Ref{Agent: string(agent), ContextID: string(id)})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("due contexts: %w", err)
	}
	return refs, nil
}
