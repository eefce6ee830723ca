package mosqtable

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

	mu      sync.Mutex
	roles   map[string]struct{}
	groups  map[string]struct{}
	clients map[string]struct{}
	full    string // non-empty: rewrite everything under this epoch
	lastErr error

	wake    chan struct{}
	flushes chan chan error
	stop    chan struct{}
	stopped chan struct{}
}

// openJournal opens (or creates) the table file and returns the table it holds (nil when it
// holds none: a new or emptied disk) and its epoch.
func openJournal(dir string, store *embedded.Store, logf func(string, ...any)) (*journal, *embedded.Table, string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, "", fmt.Errorf("mosqtable: state dir: %w", err)
	}
	db, err := bolt.Open(filepath.Join(dir, TableFile), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, nil, "", fmt.Errorf("mosqtable: open %s: %w", filepath.Join(dir, TableFile), err)
	}
	table, epoch, err := readTable(db)
	if err != nil {
		_ = db.Close()
		return nil, nil, "", err
	}
	j := &journal{db: db, store: store, logf: logf, wake: make(chan struct{}, 1), flushes: make(chan chan error),
		stop: make(chan struct{}), stopped: make(chan struct{})}
	j.reset()
	go j.run()
	return j, table, epoch, nil
}

func (j *journal) reset() {
	j.roles, j.groups, j.clients = map[string]struct{}{}, map[string]struct{}{}, map[string]struct{}{}
}

// readTable loads the whole table (nil when the file has no epoch: never imported).
func readTable(db *bolt.DB) (*embedded.Table, string, error) {
	var t *embedded.Table
	var epoch string
	err := db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil || meta.Get(keyEpoch) == nil {
			return nil
		}
		epoch = string(meta.Get(keyEpoch))
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
		return nil, "", fmt.Errorf("mosqtable: read table: %w", err)
	}
	return t, epoch, nil
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
	j.mu.Lock()
	full := j.full
	names := acl.Names{Roles: setKeys(j.roles), Groups: setKeys(j.groups), Clients: setKeys(j.clients)}
	j.full = ""
	j.reset()
	j.mu.Unlock()
	var err error
	switch {
	case full != "":
		err = j.writeAll(full)
	case len(names.Roles)+len(names.Groups)+len(names.Clients) > 0:
		err = j.writeSome(names)
	}
	if err != nil {
		j.logf("a2a-fleet table: persist: %v", err)
	}
	j.mu.Lock()
	j.lastErr = err
	j.mu.Unlock()
	return err
}

func (j *journal) writeAll(epoch string) error {
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
		return meta.Put(keyEpoch, []byte(epoch))
	})
}

func (j *journal) writeSome(names acl.Names) error {
	t, err := j.store.ExportTable(&names)
	if err != nil {
		return err
	}
	if len(t.Unhashed) > 0 {
		j.changed(acl.Names{Clients: t.Unhashed})
	}
	return j.db.Update(func(tx *bolt.Tx) error { return putTable(tx, t, &names) })
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
