package mosqtable

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
)

// TableFile is the plugin's bbolt file in its state_dir.
const TableFile = "a2a-fleet-table.db"

// Buckets of the table file: one key per object, so a change writes the objects it touched
// and nothing else (dynsec rewrites its whole JSON file per command).
var (
	bucketMeta    = []byte("meta")
	bucketRoles   = []byte("roles")
	bucketGroups  = []byte("groups")
	bucketClients = []byte("clients")
	bucketCreds   = []byte("credentials")
	keyEpoch      = []byte("epoch")
	keyGeneration = []byte("generation")
	keyDefault    = []byte("defaultACLAccess")
	keyVersion    = []byte("version")
)

// journal persists the plugin's table off the broker's thread: Execute reports the names it
// touched (changed), one goroutine writes them in one bbolt transaction per round (group
// commit without a timer: changes made during a write go into the next). A crash can lose the
// last round; the operator notices the new boot and reads the table again (Backend).
type journal struct {
	db    *bolt.DB
	store *embedded.Store
	logf  func(string, ...any)
	// generation is the plugin's request counter: each round stores the value it had before
	// the round collected its names, so the stored one never claims a change the disk lacks.
	generation func() uint64
	// trace gets every round (PluginConfig.Trace; nil: none).
	trace io.Writer

	mu      sync.Mutex
	roles   map[string]struct{}
	groups  map[string]struct{}
	clients map[string]struct{}
	full    string // non-empty: rewrite everything under this epoch
	lastErr error
	lastGen uint64 // the generation on disk

	wake    chan struct{}
	flushes chan chan error
	stop    chan struct{}
	stopped chan struct{}
}

// stored is what the table file holds: the table (nil on a new or emptied disk), its epoch and
// the generation of the last round written.
type stored struct {
	table      *embedded.Table
	epoch      string
	generation uint64
}

// openJournal opens (or creates) the table file and returns what it holds.
func openJournal(dir string, store *embedded.Store, generation func() uint64, logf func(string, ...any), trace io.Writer) (*journal, stored, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, stored{}, fmt.Errorf("mosqtable: state dir: %w", err)
	}
	// The freelist is not written with every commit (it grows with the file: ≈ 20 KiB per
	// command at 100 000 clients when it is); bbolt rebuilds it from the pages at open.
	db, err := bolt.Open(filepath.Join(dir, TableFile), 0o600, &bolt.Options{Timeout: 5 * time.Second,
		NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return nil, stored{}, fmt.Errorf("mosqtable: open %s: %w", filepath.Join(dir, TableFile), err)
	}
	st, err := readTable(db)
	if err != nil {
		_ = db.Close()
		return nil, stored{}, err
	}
	j := &journal{db: db, store: store, logf: logf, generation: generation, trace: trace, wake: make(chan struct{}, 1), flushes: make(chan chan error),
		stop: make(chan struct{}), stopped: make(chan struct{})}
	j.reset()
	j.lastGen = st.generation
	go j.run()
	return j, st, nil
}

func (j *journal) reset() {
	j.roles, j.groups, j.clients = map[string]struct{}{}, map[string]struct{}{}, map[string]struct{}{}
}

// readTable loads the whole table (none when the file has no epoch: never imported).
func readTable(db *bolt.DB) (stored, error) {
	var t *embedded.Table
	var epoch string
	var gen uint64
	err := db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil || meta.Get(keyEpoch) == nil {
			return nil
		}
		epoch = string(meta.Get(keyEpoch))
		if g := meta.Get(keyGeneration); g != nil {
			gen, _ = strconv.ParseUint(string(g), 10, 64)
		}
		t = &embedded.Table{Version: embedded.TableVersion, State: acl.NewState(nil, nil, nil)}
		var creds map[string]json.RawMessage
		if err := readBucket(tx, bucketRoles, func(k string, v []byte) error {
			var r acl.Role
			err := json.Unmarshal(v, &r)
			t.State.Roles[k] = r
			return err
		}); err != nil {
			return err
		}
		if err := readBucket(tx, bucketGroups, func(k string, v []byte) error {
			var g acl.Group
			err := json.Unmarshal(v, &g)
			t.State.Groups[k] = g
			return err
		}); err != nil {
			return err
		}
		if err := readBucket(tx, bucketClients, func(k string, v []byte) error {
			var c acl.Client
			err := json.Unmarshal(v, &c)
			t.State.Clients[k] = c
			return err
		}); err != nil {
			return err
		}
		creds = map[string]json.RawMessage{}
		if err := readBucket(tx, bucketCreds, func(k string, v []byte) error {
			creds[k] = append(json.RawMessage(nil), v...)
			return nil
		}); err != nil {
			return err
		}
		if d := meta.Get(keyDefault); d != nil {
			var def acl.DefaultACLAccess
			if err := json.Unmarshal(d, &def); err != nil {
				return fmt.Errorf("default access: %w", err)
			}
			t.State.DefaultACL = &def
		}
		// The credentials' type is the store's: decode them through the table's own JSON.
		raw, err := json.Marshal(map[string]any{"credentials": creds})
		if err != nil {
			return err
		}
		return json.Unmarshal(raw, t)
	})
	if err != nil {
		return stored{}, fmt.Errorf("mosqtable: read table: %w", err)
	}
	return stored{table: t, epoch: epoch, generation: gen}, nil
}

func readBucket(tx *bolt.Tx, name []byte, fn func(string, []byte) error) error {
	b := tx.Bucket(name)
	if b == nil {
		return nil
	}
	return b.ForEach(func(k, v []byte) error {
		if err := fn(string(k), v); err != nil {
			return fmt.Errorf("%s %q: %w", name, k, err)
		}
		return nil
	})
}

// changed queues the names a command batch touched.
func (j *journal) changed(n acl.Names) {
	j.mu.Lock()
	for _, k := range n.Roles {
		j.roles[k] = struct{}{}
	}
	for _, k := range n.Groups {
		j.groups[k] = struct{}{}
	}
	for _, k := range n.Clients {
		j.clients[k] = struct{}{}
	}
	j.mu.Unlock()
	j.poke()
}

// replaceAll queues a rewrite of the whole table under a new epoch (after an import).
func (j *journal) replaceAll(epoch string) {
	j.mu.Lock()
	j.full = epoch
	j.reset()
	j.mu.Unlock()
	j.poke()
}

func (j *journal) poke() {
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

func (j *journal) flush() error {
	reply := make(chan error, 1)
	select {
	case j.flushes <- reply:
		return <-reply
	case <-j.stopped:
		return errors.New("mosqtable: journal closed")
	}
}

func (j *journal) close() error {
	select {
	case <-j.stopped:
	default:
		close(j.stop)
		<-j.stopped
	}
	j.mu.Lock()
	err := j.lastErr
	j.mu.Unlock()
	return errors.Join(err, j.db.Close())
}

func (j *journal) run() {
	defer close(j.stopped)
	for {
		select {
		case <-j.wake:
			j.write()
		case reply := <-j.flushes:
			reply <- j.write()
		case <-j.stop:
			j.write()
			return
		}
	}
}

// write persists one round: the whole table after an import, else the touched objects.
func (j *journal) write() error {
	gen := j.generation() // before the names: every change it counts is in this round or an earlier one
	j.mu.Lock()
	full := j.full
	names := acl.Names{Roles: setKeys(j.roles), Groups: setKeys(j.groups), Clients: setKeys(j.clients)}
	j.full = ""
	j.reset()
	j.mu.Unlock()
	var err error
	switch {
	case full != "":
		err = j.writeAll(full, gen)
	case len(names.Roles)+len(names.Groups)+len(names.Clients) > 0:
		start := time.Now()
		var pages int
		pages, err = j.writeSome(names, gen)
		if j.trace != nil {
			traceRound(j.trace, names, pages, time.Since(start))
		}
	case gen != j.lastGen:
		// Every change it counts is on disk already (its names were taken by an earlier round).
		err = j.db.Update(func(tx *bolt.Tx) error {
			meta, err := tx.CreateBucketIfNotExists(bucketMeta)
			if err != nil {
				return err
			}
			return meta.Put(keyGeneration, []byte(strconv.FormatUint(gen, 10)))
		})
	}
	if err != nil {
		j.logf("a2a-fleet table: persist: %v", err)
	} else {
		j.lastGen = gen
	}
	j.mu.Lock()
	j.lastErr = err
	j.mu.Unlock()
	return err
}

func (j *journal) writeAll(epoch string, gen uint64) error {
	t, err := j.store.ExportTable(nil)
	if err != nil {
		return err
	}
	if len(t.Unhashed) > 0 {
		j.changed(acl.Names{Clients: t.Unhashed})
	}
	return j.db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketMeta, bucketRoles, bucketGroups, bucketClients, bucketCreds} {
			if tx.Bucket(name) != nil {
				if err := tx.DeleteBucket(name); err != nil {
					return err
				}
			}
		}
		if err := putTable(tx, t, nil); err != nil {
			return err
		}
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put(keyVersion, []byte("1")); err != nil {
			return err
		}
		if err := meta.Put(keyGeneration, []byte(strconv.FormatUint(gen, 10))); err != nil {
			return err
		}
		return meta.Put(keyEpoch, []byte(epoch))
	})
}

// writeSome writes the named objects; it returns the pages the round wrote.
func (j *journal) writeSome(names acl.Names, gen uint64) (int, error) {
	t, err := j.store.ExportTable(&names)
	if err != nil {
		return 0, err
	}
	if len(t.Unhashed) > 0 {
		j.changed(acl.Names{Clients: t.Unhashed})
	}
	var pages int
	err = j.db.Update(func(tx *bolt.Tx) error {
		if err := putTable(tx, t, &names); err != nil {
			return err
		}
		tx.OnCommit(func() { st := tx.Stats(); pages = int(st.GetWrite()) })
		return tx.Bucket(bucketMeta).Put(keyGeneration, []byte(strconv.FormatUint(gen, 10)))
	})
	return pages, err
}

// putTable writes t's objects; with names, each named object absent from t is deleted.
func putTable(tx *bolt.Tx, t embedded.Table, names *acl.Names) error {
	buckets := map[string]*bolt.Bucket{}
	for _, name := range [][]byte{bucketMeta, bucketRoles, bucketGroups, bucketClients, bucketCreds} {
		b, err := tx.CreateBucketIfNotExists(name)
		if err != nil {
			return err
		}
		buckets[string(name)] = b
	}
	put := func(bucket []byte, k string, v any) error {
		data, err := json.Marshal(v)
		if err != nil {
			return err
		}
		return buckets[string(bucket)].Put([]byte(k), data)
	}
	for k, v := range t.State.Roles {
		if err := put(bucketRoles, k, v); err != nil {
			return err
		}
	}
	for k, v := range t.State.Groups {
		if err := put(bucketGroups, k, v); err != nil {
			return err
		}
	}
	for k, v := range t.State.Clients {
		if err := put(bucketClients, k, v); err != nil {
			return err
		}
	}
	for k, v := range t.Credentials {
		if err := put(bucketCreds, k, v); err != nil {
			return err
		}
	}
	if t.State.DefaultACL != nil {
		if err := put(bucketMeta, string(keyDefault), t.State.DefaultACL); err != nil {
			return err
		}
	}
	if names == nil {
		return nil
	}
	del := func(bucket []byte, keys []string, present func(string) bool) error {
		for _, k := range keys {
			if !present(k) {
				if err := buckets[string(bucket)].Delete([]byte(k)); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := del(bucketRoles, names.Roles, func(k string) bool { _, ok := t.State.Roles[k]; return ok }); err != nil {
		return err
	}
	if err := del(bucketGroups, names.Groups, func(k string) bool { _, ok := t.State.Groups[k]; return ok }); err != nil {
		return err
	}
	if err := del(bucketClients, names.Clients, func(k string) bool { _, ok := t.State.Clients[k]; return ok }); err != nil {
		return err
	}
	// A client whose password was set during the export (t.Unhashed) keeps its old hash
	// until the next round (writeSome queues it again); a deleted client loses it.
	return del(bucketCreds, names.Clients, func(k string) bool { _, ok := t.State.Clients[k]; return ok })
}

func setKeys(m map[string]struct{}) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
