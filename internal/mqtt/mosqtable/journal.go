package mosqtable

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
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
	// bucketRoleEdits holds edits of large roles (roleedit.go): key role name, 0, sequence
	// (big-endian), so a role's edits follow its name in order.
	bucketRoleEdits = []byte("roleEdits")
	// bucketLargeRoles holds the roles of minEditRules rules or more, apart from the others:
	// bbolt rewrites a whole leaf when one key of it changes, and a new Agent's small role
	// inserted beside a unit's large one would rewrite that one with it.
	bucketLargeRoles = []byte("largeRoles")
	// keyEpochEdits holds the epoch instead of keyEpoch in a file that may hold role edits: a
	// plugin from before them finds no epoch, hence no table, and fails closed until the
	// operator imports one, instead of loading the large roles without their last edits.
	keyEpochEdits = []byte("epochWithRoleEdits")
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

	// written is, per large role, its list as the disk holds it (its record and its edits),
	// and edits the count of its edit records (writer goroutine only).
	written map[string][]acl.ACL
	edits   map[string]int

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
	j.forgetWritten()
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
		if meta == nil {
			return nil
		}
		e := meta.Get(keyEpochEdits)
		if e == nil {
			e = meta.Get(keyEpoch)
		}
		if e == nil {
			return nil
		}
		epoch = string(e)
		if g := meta.Get(keyGeneration); g != nil {
			gen, _ = strconv.ParseUint(string(g), 10, 64)
		}
		t = &embedded.Table{Version: embedded.TableVersion, State: acl.NewState(nil, nil, nil)}
		var creds map[string]json.RawMessage
		for _, b := range [][]byte{bucketRoles, bucketLargeRoles} {
			if err := readBucket(tx, b, func(k string, v []byte) error {
				var r acl.Role
				err := json.Unmarshal(v, &r)
				t.State.Roles[k] = r
				return err
			}); err != nil {
				return err
			}
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
		if err := readRoleEdits(tx, t.State.Roles); err != nil {
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
	err = j.db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketMeta, bucketRoles, bucketGroups, bucketClients, bucketCreds, bucketRoleEdits, bucketLargeRoles} {
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
		return meta.Put(keyEpochEdits, []byte(epoch))
	})
	j.forgetWritten()
	if err == nil {
		for k, r := range t.State.Roles {
			if len(r.ACLs) >= minEditRules {
				j.written[k] = r.ACLs
			}
		}
	}
	return err
}

// writeSome writes the named objects; it returns the pages the round wrote.
func (j *journal) writeSome(names acl.Names, gen uint64) (int, error) {
	// A large role whose list on disk is known is read as an edit of that list, compared in
	// the store without a copy of the role (thousands of rules for an org's); the rest is
	// exported.
	var edited map[string]acl.RoleSplice
	for _, k := range names.Roles {
		if prev, known := j.written[k]; known && j.edits[k] < maxRoleEdits {
			if e, ok := j.store.RoleEditSince(k, prev); ok {
				if edited == nil {
					edited = map[string]acl.RoleSplice{}
				}
				edited[k] = e
			}
		}
	}
	if edited != nil {
		names.Roles = slices.DeleteFunc(slices.Clone(names.Roles), func(k string) bool { _, ok := edited[k]; return ok })
	}
	t, err := j.store.ExportTable(&names)
	if err != nil {
		return 0, err
	}
	if len(t.Unhashed) > 0 {
		j.changed(acl.Names{Clients: t.Unhashed})
	}
	var pages int
	var done func()
	err = j.db.Update(func(tx *bolt.Tx) error {
		var err error
		if done, err = j.putRoleEdits(tx, &t, &names, edited); err != nil {
			return err
		}
		if err := putTable(tx, t, &names); err != nil {
			return err
		}
		tx.OnCommit(func() { st := tx.Stats(); pages = int(st.GetWrite()) })
		return tx.Bucket(bucketMeta).Put(keyGeneration, []byte(strconv.FormatUint(gen, 10)))
	})
	if err != nil {
		// What the disk holds of the large roles is not known: write them whole next time.
		j.forgetWritten()
	} else {
		done()
	}
	return pages, err
}

// putTable writes t's objects; with names, each named object absent from t is deleted.
func putTable(tx *bolt.Tx, t embedded.Table, names *acl.Names) error {
	buckets := map[string]*bolt.Bucket{}
	for _, name := range [][]byte{bucketMeta, bucketRoles, bucketGroups, bucketClients, bucketCreds, bucketLargeRoles} {
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
		in, other := bucketRoles, bucketLargeRoles
		if len(v.ACLs) >= minEditRules {
			in, other = other, in
		}
		if err := put(in, k, v); err != nil {
			return err
		}
		if err := buckets[string(other)].Delete([]byte(k)); err != nil {
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
	for _, b := range [][]byte{bucketRoles, bucketLargeRoles} {
		if err := del(b, names.Roles, func(k string) bool { _, ok := t.State.Roles[k]; return ok }); err != nil {
			return err
		}
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

// maxRoleEdits is how many edit records a role gathers before it is written whole again (its
// edits deleted): a change writes its own rules plus, amortised, 1/maxRoleEdits of the role.
const maxRoleEdits = 64

func (j *journal) forgetWritten() {
	j.written, j.edits = map[string][]acl.ACL{}, map[string]int{}
}

// putRoleEdits writes, for each large role of t whose list on disk is known, the change as an
// edit record (RoleEdit) instead of the whole role, and takes those roles out of t and names
// (putTable writes the rest whole). A role written whole loses its edit records. The returned
// function records, once the transaction committed, what the disk holds.
func (j *journal) putRoleEdits(tx *bolt.Tx, t *embedded.Table, names *acl.Names, edited map[string]acl.RoleSplice) (func(), error) {
	edits, err := tx.CreateBucketIfNotExists(bucketRoleEdits)
	if err != nil {
		return nil, err
	}
	meta, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return nil, err
	}
	if e := meta.Get(keyEpoch); e != nil {
		// A file written before role edits: its epoch moves to the key they need.
		if err := meta.Put(keyEpochEdits, append([]byte(nil), e...)); err != nil {
			return nil, err
		}
		if err := meta.Delete(keyEpoch); err != nil {
			return nil, err
		}
	}
	written := map[string][]acl.ACL{}
	counts := map[string]int{}
	put := func(k string, e RoleEdit) error {
		seq, err := edits.NextSequence()
		if err != nil {
			return err
		}
		data, err := json.Marshal(e)
		if err != nil {
			return err
		}
		return edits.Put(roleEditKey(k, seq), data)
	}
	for k, e := range edited {
		if len(e.Insert) == 0 && e.Keep+e.KeepEnd == e.Had {
			continue // unchanged since the disk's list
		}
		if err := put(k, roleEditOf(e)); err != nil {
			return nil, err
		}
		counts[k] = j.edits[k] + 1
	}
	var whole []string
	keepNames := names.Roles[:0:0]
	for _, k := range names.Roles {
		r, exists := t.State.Roles[k]
		prev, known := j.written[k]
		if exists && known && j.edits[k] < maxRoleEdits {
			if e, ok := acl.SpliceOf(prev, r.ACLs); ok {
				if len(e.Insert) == 0 && e.Keep+e.KeepEnd == e.Had && e.Had == len(r.ACLs) {
					// The disk holds it already (a whole write of the table that ran after
					// the change, and a round that names it again): no record.
					delete(t.State.Roles, k)
					continue
				}
				if err := put(k, roleEditOf(e)); err != nil {
					return nil, err
				}
				written[k], counts[k] = r.ACLs, j.edits[k]+1
				delete(t.State.Roles, k)
				continue
			}
		}
		// Written whole (or deleted) by putTable: its edits go.
		if err := deleteRoleEdits(edits, k); err != nil {
			return nil, err
		}
		keepNames = append(keepNames, k)
		whole = append(whole, k)
		if exists && len(r.ACLs) >= minEditRules {
			written[k], counts[k] = r.ACLs, 0
		}
	}
	names.Roles = keepNames
	return func() {
		for _, k := range whole {
			delete(j.written, k)
			delete(j.edits, k)
		}
		for k, l := range written {
			j.written[k], j.edits[k] = l, counts[k]
		}
		for k, e := range edited {
			// The journal's own copy, edited in place: no copy of the role either.
			j.written[k] = slices.Replace(j.written[k], e.Keep, e.Had-e.KeepEnd, e.Insert...)
			if n, ok := counts[k]; ok {
				j.edits[k] = n
			}
		}
	}, nil
}

func roleEditKey(role string, seq uint64) []byte {
	k := make([]byte, 0, len(role)+9)
	k = append(k, role...)
	k = append(k, 0)
	return binary.BigEndian.AppendUint64(k, seq)
}

func deleteRoleEdits(b *bolt.Bucket, role string) error {
	prefix := append([]byte(role), 0)
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}

// readRoleEdits applies the edit records to the roles read (in each role's order).
func readRoleEdits(tx *bolt.Tx, roles map[string]acl.Role) error {
	return readBucket(tx, bucketRoleEdits, func(k string, v []byte) error {
		if len(k) < 9 || k[len(k)-9] != 0 {
			return errors.New("role edit without a role name")
		}
		name := k[:len(k)-9]
		var e RoleEdit
		if err := json.Unmarshal(v, &e); err != nil {
			return err
		}
		r, ok := roles[name]
		if !ok || len(r.ACLs) != e.Had || e.Keep < 0 || e.KeepEnd < 0 || e.Keep+e.KeepEnd > e.Had {
			return fmt.Errorf("role edit of %d rules for role %q of %d", e.Had, name, len(r.ACLs))
		}
		list := make([]acl.ACL, 0, e.Keep+len(e.Insert)+e.KeepEnd)
		list = append(list, r.ACLs[:e.Keep]...)
		list = append(list, e.Insert...)
		r.ACLs = append(list, r.ACLs[e.Had-e.KeepEnd:]...)
		roles[name] = r
		return nil
	})
}
