package mosqtable

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/session"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Config configures the operator's side.
type Config struct {
	// URL of the broker: mqtt://host:port, tls://host:port (or mqtts://).
	URL string
	// Username/Password of the plugin's bootstrap admin (plugin_opt_admin_username and its
	// password).
	Username, Password string
	// ClientID defaults to "a2a-fleet-table-<random>".
	ClientID string
	// TLS of the admin connection (tls:// URLs).
	TLS *tls.Config
	// Prefix of the managed object names (default acl.DefaultPrefix).
	Prefix string
	// Timeout bounds one request/response exchange, waiting for the connection included
	// (default 10s); ConnectTimeout Connect's wait for the first connection (default 10s).
	Timeout, ConnectTimeout time.Duration
	// MaxBatch is the most commands per message (default 1000): a message is applied on the
	// broker's thread in one go, so it is kept to a few milliseconds.
	MaxBatch int
	// CachedReadFor bounds how long ObserveCached answers from the mirror after the plugin last
	// confirmed it (default 1s; a status round trip a second at most, while reconciles run).
	CachedReadFor time.Duration
	// OnKick, when set, is called for every executed command that disconnected someone.
	OnKick func(acl.Kick)
	Logger *slog.Logger
}

// ErrNotOpen is returned by requests made before Open.
var ErrNotOpen = errors.New("mosqtable: admin connection not opened yet")

// Backend implements acl.Backend for the decision-table plugin. It keeps a mirror of the
// plugin's table (an embedded.Store: the same code), so Observe and Check are answered
// locally, and keeps the two equal: changes go to the broker and then, with the broker's
// verdicts, to the mirror, one request at a time (so both apply them in the same order).
// After every (re)connection it compares the plugin's Status with what the mirror was made
// from: a plugin without a table (a broker that started on an empty disk) gets the mirror in
// one import; a plugin that restarted (a new Boot) is read back whole (it is the authority:
// it may have lost its last writes).
type Backend struct {
	cfg    Config
	log    *slog.Logger
	url    string
	nonce  string
	seq    atomic.Uint64
	sess   atomic.Pointer[session.Session]
	opened chan struct{}
	stop   context.CancelFunc

	pmu     sync.Mutex
	pending map[string]chan Response
	// foreign is the newest status that another admin's answer showed (every admin reads the
	// one response topic), received since the last status this backend asked for (pmu): when
	// it is beyond origin, the plugin holds a change the mirror lacks (ObserveCached).
	foreign *Status

	mu         sync.Mutex // one state-changing exchange at a time; guards the fields below
	mirror     *embedded.Store
	synced     bool          // the mirror holds the plugin's table of origin
	origin     origin        // the plugin's epoch, boot and generation the mirror matches
	syncedLink *session.Link // the connection the last sync ran on
	// exchanges numbers the state exchanges (a status or an execute), counted as each is sent
	// (under mu); confirmed is the number of the last one whose answer showed the mirror to be
	// the plugin's table (mu). A read that began before exchange confirmed was sent needs no
	// status of its own: currentSince.
	exchanges   atomic.Uint64
	confirmed   uint64
	confirmedAt time.Time // when confirmed was last set (mu)

	mutations, reads, roundTrips atomic.Uint64
	kicks, kickedUsernames       atomic.Uint64

	onReady atomic.Pointer[func(context.Context)]

	presence presenceView
}

// New checks cfg and returns a backend that is not connected yet: Open starts it.
func New(cfg Config) (*Backend, error) {
	if cfg.URL == "" {
		return nil, errors.New("mosqtable: broker URL is required")
	}
	u, err := a2amqtt.ParseBrokerURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("mosqtable: %w", err)
	}
	if cfg.Username == "" {
		return nil, errors.New("mosqtable: admin username is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = acl.DefaultPrefix
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 1000
	}
	if cfg.CachedReadFor <= 0 {
		cfg.CachedReadFor = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	nonce := randomID()
	if cfg.ClientID == "" {
		cfg.ClientID = "a2a-fleet-table-" + nonce
	}
	mirror, err := embedded.NewStore(embedded.StoreConfig{Prefix: cfg.Prefix, KeepHashes: true})
	if err != nil {
		return nil, fmt.Errorf("mosqtable: mirror: %w", err)
	}
	return &Backend{cfg: cfg, log: cfg.Logger.With("component", "mosqtable"), url: u.Redacted(), nonce: nonce,
		opened: make(chan struct{}), pending: map[string]chan Response{}, mirror: mirror,
		presence: presenceView{read: make(chan struct{})}}, nil
}

// NotifyReady sets a callback run after every (re)connection, once the mirror and the
// plugin agree (the operator's broker runtime checks its state sentinel there).
func (b *Backend) NotifyReady(fn func(context.Context)) { b.onReady.Store(&fn) }

// Open starts the admin connection in the background; it reconnects until ctx ends.
func (b *Backend) Open(ctx context.Context) error { return b.open(ctx, nil) }

func (b *Backend) open(ctx context.Context, onRefused func(error)) error {
	sess, err := session.Start(ctx, session.Config{
		Name:           "decision table admin",
		URL:            b.cfg.URL,
		TLS:            b.cfg.TLS,
		Username:       b.cfg.Username,
		Password:       func() []byte { return []byte(b.cfg.Password) },
		ClientID:       b.cfg.ClientID,
		ConnectTimeout: b.cfg.ConnectTimeout,
		PacketTimeout:  b.cfg.Timeout,
		Subscriptions:  []paho.SubscribeOptions{{Topic: ResponseTopic, QoS: 1}, {Topic: PresenceTopic, QoS: 1}},
		OnMessage:      b.dispatch,
		OnRefused:      onRefused,
		OnReady: func(ctx context.Context, _ *session.Link) {
			b.mu.Lock()
			err := b.sync(ctx)
			b.mu.Unlock()
			if err != nil {
				b.log.Info("could not sync the decision table with the broker; will retry on the next request", "err", err)
			}
			// Subscribed to PresenceTopic already: the events after this answer are newer.
			b.readPresence(ctx)
			if fn := b.onReady.Load(); fn != nil {
				(*fn)(ctx)
			}
		},
		Logger: b.cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("mosqtable: %w", err)
	}
	if !b.sess.CompareAndSwap(nil, sess) {
		return errors.New("mosqtable: admin connection already open")
	}
	close(b.opened)
	return nil
}

// Connect is New plus Open with a connection of its own (ended by Close), waiting until the
// mirror and the plugin agree: for tools and tests.
func Connect(ctx context.Context, cfg Config) (*Backend, error) {
	b, err := New(cfg)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	refused := make(chan error, 1)
	if err := b.open(runCtx, func(err error) {
		select {
		case refused <- err:
		default:
		}
	}); err != nil {
		cancel()
		return nil, err
	}
	b.stop = cancel
	waitCtx, waitCancel := context.WithTimeout(ctx, b.cfg.ConnectTimeout)
	defer waitCancel()
	ready := make(chan error, 1)
	go func() {
		if _, err := b.sess.Load().Await(waitCtx); err != nil {
			ready <- err
			return
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		ready <- b.ensureSynced(waitCtx)
	}()
	select {
	case err := <-ready:
		if err == nil {
			return b, nil
		}
		_ = b.Close(context.Background())
		return nil, fmt.Errorf("mosqtable: admin connection to %s as %q: %w", b.url, cfg.Username, err)
	case err := <-refused:
		_ = b.Close(context.Background())
		return nil, fmt.Errorf("mosqtable: broker %s refused admin %q (check the plugin's admin credentials): %w", b.url, cfg.Username, err)
	}
}

// Close disconnects the admin connection and stops the mirror.
func (b *Backend) Close(ctx context.Context) error {
	var err error
	if sess := b.sess.Load(); sess != nil {
		err = sess.Close(ctx)
	}
	if b.stop != nil {
		b.stop()
	}
	return errors.Join(err, b.mirror.Close())
}

// Healthy returns nil while the admin connection is up (or down for less than grace).
func (b *Backend) Healthy(grace time.Duration) error {
	sess := b.sess.Load()
	if sess == nil {
		return ErrNotOpen
	}
	return sess.Healthy(grace)
}

// Prefix implements acl.Backend.
func (b *Backend) Prefix() string { return b.cfg.Prefix }

// Stats implements acl.Backend.
func (b *Backend) Stats() acl.Stats {
	return acl.Stats{Mutations: b.mutations.Load(), Reads: b.reads.Load(), RoundTrips: b.roundTrips.Load(),
		Kicks: b.kicks.Load(), KickedUsernames: b.kickedUsernames.Load()}
}

// Observe implements acl.Backend from the mirror, after one status round trip (constant
// cost at the broker) that tells whether anyone else changed the table since.
func (b *Backend) Observe(ctx context.Context, only *acl.Names) (acl.State, error) {
	if err := b.current(ctx); err != nil {
		return acl.State{}, err
	}
	b.reads.Add(1)
	return b.mirror.Observe(ctx, only)
}

// ObserveCached implements acl.CachedObserver: the mirror, with no round trip, while the plugin
// has shown nothing the mirror lacks: it was made or confirmed on the current admin connection
// less than CachedReadFor ago, and no other admin's answer since showed a generation beyond it.
// Otherwise it is Observe. Every admin's answer goes to every admin (ResponseTopic), in the
// order the plugin applied the requests, so another admin's change reaches this backend in the
// time its answer takes; the bound covers the rest.
func (b *Backend) ObserveCached(ctx context.Context, only *acl.Names) (acl.State, error) {
	if !b.mirrorConfirmed(ctx) {
		if err := b.current(ctx); err != nil {
			return acl.State{}, err
		}
	}
	b.reads.Add(1)
	return b.mirror.Observe(ctx, only)
}

// mirrorConfirmed reports whether ObserveCached may answer from the mirror as it is.
func (b *Backend) mirrorConfirmed(ctx context.Context) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.synced || time.Since(b.confirmedAt) >= b.cfg.CachedReadFor {
		return false
	}
	b.pmu.Lock()
	f := b.foreign
	b.pmu.Unlock()
	if f != nil && (f.Boot != b.origin.boot || f.Epoch != b.origin.epoch || f.Generation > b.origin.gen || !f.Loaded) {
		return false
	}
	return b.onSyncedLink(ctx)
}

// onSyncedLink reports whether the admin connection is up and is the one the mirror was last
// synced on (mu held): a new connection may lead to a broker that restarted.
func (b *Backend) onSyncedLink(ctx context.Context) bool {
	sess := b.sess.Load()
	if sess == nil {
		return false
	}
	l, err := sess.Await(ctx)
	return err == nil && l == b.syncedLink
}

// Check implements acl.Backend: the mirror's decision, the plugin's by construction.
func (b *Backend) Check(ctx context.Context, username string, access acl.Access, topic string) (acl.Decision, error) {
	if err := b.current(ctx); err != nil {
		return acl.Decision{}, err
	}
	b.reads.Add(1)
	return b.mirror.Check(ctx, username, access, topic)
}

// current makes sure the mirror is the plugin's table as of some moment during the call.
func (b *Backend) current(ctx context.Context) error {
	return b.currentSince(ctx, b.exchanges.Load())
}

// currentSince makes sure the mirror is the plugin's table as of a moment after exchange
// asked was sent. Reads wait for each other on mu: when an exchange sent after this read began
// (a status of another read, or an execute) came back showing the mirror current, and nothing
// has happened since, the read answers from the mirror without a status of its own. Concurrent
// reconciles then share one status round trip instead of queueing one each; a read that began
// after the last exchange still asks the plugin.
func (b *Backend) currentSince(ctx context.Context, asked uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.synced && b.confirmed > asked && b.onSyncedLink(ctx) {
		return nil
	}
	return b.sync(ctx)
}

// Execute implements acl.Backend: the commands go to the plugin (in messages of MaxBatch),
// its verdicts are the answer, and the mirror applies them after it.
func (b *Backend) Execute(ctx context.Context, cmds []acl.Command) error {
	cmds, err := withPasswordHashes(cmds)
	if err != nil {
		return fmt.Errorf("mosqtable: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for start := 0; start < len(cmds); start += b.cfg.MaxBatch {
		batch := cmds[start:min(start+b.cfg.MaxBatch, len(cmds))]
		outs, err := b.executeBatch(ctx, batch)
		if err != nil {
			return errors.Join(append(errs, fmt.Errorf("mosqtable: commands %d-%d (%s...): %w", start+1, start+len(batch), batch[0], err))...)
		}
		b.mutations.Add(uint64(len(batch)))
		b.reportKicks(ctx, batch, outs)
		if err := embedded.Errors(batch, outs); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// executeBatch sends one message (with mu held), resyncing first when needed and once more
// when the plugin turns out to have lost its table.
func (b *Backend) executeBatch(ctx context.Context, cmds []acl.Command) ([]embedded.Outcome, error) {
	for attempt := 1; ; attempt++ {
		if err := b.ensureSynced(ctx); err != nil {
			return nil, err
		}
		req := Request{Op: OpExecute, Commands: cmds}
		if attempt == 1 && b.origin.roleEdits {
			// Large shared roles go as edits of the mirror's, which is the plugin's table of
			// generation origin.gen (synced).
			req.Commands, req.Edits = roleEdits(b.mirror, cmds)
			req.Base = b.origin.gen
		}
		exchange := b.exchanges.Add(1)
		resp, err := b.request(ctx, req)
		if err != nil {
			// The broker may or may not have applied them: read it again next time.
			b.synced = false
			return nil, err
		}
		if (resp.Error == ErrTableNotLoaded || resp.Error == ErrStaleEdit) && attempt == 1 {
			// Nothing was applied: read the plugin's table again, then send the lists whole.
			b.synced = false
			continue
		}
		if resp.Error != "" {
			return nil, errors.New(resp.Error)
		}
		if len(resp.Outcomes) != len(cmds) {
			b.synced = false
			return nil, fmt.Errorf("the plugin answered %d outcomes for %d commands", len(resp.Outcomes), len(cmds))
		}
		if resp.Status.Boot != b.origin.boot || resp.Status.Generation != b.origin.gen+1 {
			// Applied to a broker that restarted since the mirror was made, or after
			// another admin's change: read the table again before the next use.
			b.synced = false
			return resp.Outcomes, nil
		}
		b.origin.gen = resp.Status.Generation
		mirrored, err := b.mirror.ExecuteEach(ctx, cmds)
		if err == nil {
			for i := range mirrored {
				if mirrored[i].Verdict != resp.Outcomes[i].Verdict {
					err = fmt.Errorf("%s: the mirror's verdict %d differs from the broker's %d (%s)", cmds[i], mirrored[i].Verdict, resp.Outcomes[i].Verdict, resp.Outcomes[i].Message)
					break
				}
			}
		}
		if err != nil {
			b.log.Info("the mirror diverged from the broker's table; reading it again", "err", err)
			b.synced = false
		} else {
			b.confirmed, b.confirmedAt = exchange, time.Now()
		}
		return resp.Outcomes, nil
	}
}

func (b *Backend) reportKicks(ctx context.Context, cmds []acl.Command, outs []embedded.Outcome) {
	for i, o := range outs {
		if len(o.Kicked) == 0 {
			continue
		}
		k := acl.Kick{Command: cmds[i], Usernames: o.Kicked, ClientIDs: o.ClientIDs}
		k.Command.Password, k.Command.PasswordHash = "", nil
		b.kicks.Add(1)
		b.kickedUsernames.Add(uint64(len(o.Kicked)))
		acl.ReportKick(ctx, k)
		if b.cfg.OnKick != nil {
			b.cfg.OnKick(k)
		}
	}
}

// ensureSynced syncs unless the mirror is known to match (mu held).
// A new connection is synced first, whatever the mirror believes: the broker behind it may
// have restarted.
func (b *Backend) ensureSynced(ctx context.Context) error {
	if b.synced && b.onSyncedLink(ctx) {
		return nil
	}
	return b.sync(ctx)
}

// syncAction is what sync does to make the mirror and the plugin agree.
type syncAction int

const (
	syncNone   syncAction = iota // they agree
	syncAdopt                    // they agree; the plugin restarted with everything on its disk
	syncImport                   // the plugin gets the mirror
	syncExport                   // the mirror gets the plugin's table
)

// origin is what the mirror was made from: the plugin's epoch, boot and generation.
type origin struct {
	epoch, boot string
	gen         uint64
	// roleEdits: the plugin takes role edits (Status.RoleEdits).
	roleEdits bool
}

// decideSync picks the action for the plugin's status st, given the mirror's origin o and
// whether the mirror is known to be o's table (synced):
//   - a plugin without a table gets the mirror (fail closed until then);
//   - a plugin of the mirror's epoch whose generation is below the mirror's lost changes it had
//     acknowledged (it crashed before its disk round): it gets the mirror back, which has them;
//   - the same boot and generation: nothing to do; the same epoch and generation after a
//     restart: the disk had everything;
//   - anything else (another admin's changes, a request that may or may not have been applied,
//     another lineage, a mirror never made): the broker is the authority, the mirror reads it.
func decideSync(st Status, o origin, synced bool) syncAction {
	switch {
	case !st.Loaded:
		return syncImport
	case o.epoch != "" && st.Epoch == o.epoch && st.Generation < o.gen:
		return syncImport
	case synced && st.Epoch == o.epoch && st.Generation == o.gen && st.Boot == o.boot:
		return syncNone
	case synced && st.Epoch == o.epoch && st.Generation == o.gen:
		return syncAdopt
	default:
		return syncExport
	}
}

// sync makes the mirror and the plugin agree (mu held); see decideSync.
func (b *Backend) sync(ctx context.Context) error {
	var link *session.Link
	if sess := b.sess.Load(); sess != nil {
		link, _ = sess.Await(ctx)
	}
	exchange := b.exchanges.Add(1)
	// Other admins' answers received before this status is asked for are older than it: it
	// tells whether the mirror has their changes.
	b.pmu.Lock()
	b.foreign = nil
	b.pmu.Unlock()
	asked := time.Now()
	st, err := b.request(ctx, Request{Op: OpStatus})
	if err != nil {
		b.synced = false
		return err
	}
	var got Status
	switch decideSync(st.Status, b.origin, b.synced) {
	case syncNone:
		b.syncedLink, b.confirmed, b.confirmedAt = link, exchange, asked
		return nil
	case syncAdopt:
		got = st.Status
	case syncImport:
		if got, err = b.importMirror(ctx, st.Status); err != nil {
			b.synced = false
			return err
		}
	case syncExport:
		resp, err := b.request(ctx, Request{Op: OpExport})
		if err == nil && resp.Error != "" {
			err = errors.New(resp.Error)
		}
		if err == nil && resp.Table == nil {
			err = errors.New("export without a table")
		}
		if err != nil {
			b.synced = false
			return fmt.Errorf("mosqtable: read the broker's table: %w", err)
		}
		if err := b.mirror.ImportTable(*resp.Table); err != nil {
			b.synced = false
			return fmt.Errorf("mosqtable: mirror the broker's table: %w", err)
		}
		got = resp.Status
	}
	b.origin = origin{epoch: got.Epoch, boot: got.Boot, gen: got.Generation, roleEdits: got.RoleEdits}
	b.synced, b.syncedLink, b.confirmed, b.confirmedAt = true, link, exchange, asked
	return nil
}

// importMirror sends the mirror to the plugin in one import (in parts) and returns the
// plugin's status after it.
func (b *Backend) importMirror(ctx context.Context, before Status) (Status, error) {
	t, err := b.mirror.ExportTable(nil)
	if err != nil {
		return Status{}, fmt.Errorf("mosqtable: export the mirror: %w", err)
	}
	start := time.Now()
	parts, err := splitTable(t, b.cfg.MaxBatch, importPartBytes)
	if err != nil {
		return Status{}, err
	}
	id := fmt.Sprintf("%s-%d", b.nonce, b.seq.Add(1))
	var resp Response
	for i, part := range parts {
		resp, err = b.request(ctx, Request{Op: OpImport, Table: &part, Import: id, Part: i, More: i < len(parts)-1})
		if err == nil && resp.Error != "" {
			err = errors.New(resp.Error)
		}
		if err != nil {
			return Status{}, fmt.Errorf("mosqtable: import the table into the broker (part %d of %d): %w", i+1, len(parts), err)
		}
	}
	why := "it had none"
	if before.Loaded {
		why = fmt.Sprintf("it restarted at generation %d, below the %d it had acknowledged", before.Generation, b.origin.gen)
	}
	b.log.Info("gave the broker its decision table", "why", why, "clients", len(t.State.Clients),
		"roles", len(t.State.Roles), "groups", len(t.State.Groups), "messages", len(parts), "took", time.Since(start).String())
	return resp.Status, nil
}

// importPartBytes bounds the encoded objects of one import message: a quarter of the broker's
// max_packet_size (1 MiB in config/mosquitto), so that the message with its envelope stays far
// below it whatever the objects weigh. An Agent's role grows with its callers (0.3 KiB for a small
// one, over 1 KiB with selectors and grants): a count alone (MaxBatch) let a 10 000-Agent table's
// parts exceed the limit, and the broker dropped the admin connection at every attempt.
const importPartBytes = 256 << 10

// splitTable cuts t into parts of at most maxObjects objects (a client with its password counts
// as one) whose encodings add up to at most maxBytes (an object larger than maxBytes goes alone
// into a part), so that every import message stays below the broker's max_packet_size.
func splitTable(t embedded.Table, maxObjects, maxBytes int) ([]embedded.Table, error) {
	var parts []embedded.Table
	size := 0
	cur := func(weight int) *embedded.Table {
		if len(parts) > 0 {
			p := &parts[len(parts)-1]
			if len(p.State.Roles)+len(p.State.Groups)+len(p.State.Clients) >= maxObjects || (size > 0 && size+weight > maxBytes) {
				parts = append(parts, embedded.Table{})
				size = 0
			}
		} else {
			parts = append(parts, embedded.Table{})
		}
		p := &parts[len(parts)-1]
		if p.State.Roles == nil {
			p.Version, p.State, p.Credentials = t.Version, acl.NewState(nil, nil, nil), map[string]*embedded.Credential{}
			p.State.DefaultACL = t.State.DefaultACL
		}
		size += weight
		return p
	}
	weigh := func(key string, objects ...any) (int, error) {
		n := len(key) + 8
		for _, o := range objects {
			b, err := json.Marshal(o)
			if err != nil {
				return 0, fmt.Errorf("mosqtable: encode %q for the import: %w", key, err)
			}
			n += len(b) + len(key) + 8
		}
		return n, nil
	}
	cur(0)
	for _, k := range slices.Sorted(maps.Keys(t.State.Roles)) {
		w, err := weigh(k, t.State.Roles[k])
		if err != nil {
			return nil, err
		}
		cur(w).State.Roles[k] = t.State.Roles[k]
	}
	for _, k := range slices.Sorted(maps.Keys(t.State.Groups)) {
		w, err := weigh(k, t.State.Groups[k])
		if err != nil {
			return nil, err
		}
		cur(w).State.Groups[k] = t.State.Groups[k]
	}
	for _, k := range slices.Sorted(maps.Keys(t.State.Clients)) {
		c, hasCredential := t.Credentials[k]
		w, err := weigh(k, t.State.Clients[k], c)
		if err != nil {
			return nil, err
		}
		p := cur(w)
		p.State.Clients[k] = t.State.Clients[k]
		if hasCredential {
			p.Credentials[k] = c
		}
	}
	return parts, nil
}

// Status asks the plugin for its state.
func (b *Backend) Status(ctx context.Context) (Status, error) {
	resp, err := b.request(ctx, Request{Op: OpStatus})
	return resp.Status, err
}

// request sends one Request and waits for its Response (bounded by Config.Timeout).
func (b *Backend) request(ctx context.Context, req Request) (Response, error) {
	select {
	case <-b.opened:
	case <-ctx.Done():
		return Response{}, fmt.Errorf("%w: %w", ErrNotOpen, ctx.Err())
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	sess := b.sess.Load()
	l, err := sess.Await(ctx)
	if err != nil {
		return Response{}, fmt.Errorf("mosqtable: admin connection: %w", err)
	}
	req.ID = fmt.Sprintf("%s-%d", b.nonce, b.seq.Add(1))
	payload, err := json.Marshal(req)
	if err != nil {
		return Response{}, fmt.Errorf("mosqtable: encode %s: %w", req.Op, err)
	}
	ch := make(chan Response, 1)
	b.pmu.Lock()
	b.pending[req.ID] = ch
	b.pmu.Unlock()
	defer func() {
		b.pmu.Lock()
		delete(b.pending, req.ID)
		b.pmu.Unlock()
	}()
	b.roundTrips.Add(1)
	pr, err := sess.Publish(ctx, &paho.Publish{Topic: ControlTopic, QoS: 1, Payload: payload})
	if err != nil {
		return Response{}, fmt.Errorf("mosqtable: publish %s: %w", req.Op, err)
	}
	if pr != nil && pr.ReasonCode >= 0x80 {
		return Response{}, fmt.Errorf("mosqtable: publish %s refused (PUBACK reason %d): is %q the plugin's admin?", req.Op, pr.ReasonCode, b.cfg.Username)
	}
	select {
	case r := <-ch:
		if r.Error == "not authorised" {
			return r, fmt.Errorf("mosqtable: %s: the plugin does not take %q as its admin", req.Op, b.cfg.Username)
		}
		return r, nil
	case <-l.Gone():
		return Response{}, fmt.Errorf("mosqtable: %s: admin connection lost before the broker replied", req.Op)
	case <-ctx.Done():
		return Response{}, fmt.Errorf("mosqtable: no reply to %s from the broker: %w", req.Op, ctx.Err())
	}
}

// dispatch hands responses to their waiters (other admins' are ignored).
func (b *Backend) dispatch(p *paho.Publish) {
	if p.Topic == PresenceTopic {
		b.presenceEvent(p)
		return
	}
	if p.Topic != ResponseTopic {
		return
	}
	var r Response
	if err := json.Unmarshal(p.Payload, &r); err != nil {
		b.log.Warn("unparseable decision table response", "err", err)
		return
	}
	if r.Presence != nil {
		// Here, not in the requester: in order with the events on the same connection.
		b.replacePresence(*r.Presence)
	}
	b.pmu.Lock()
	ch, ok := b.pending[r.ID]
	if !strings.HasPrefix(r.ID, b.nonce+"-") && (b.foreign == nil || r.Status.Generation >= b.foreign.Generation || r.Status.Boot != b.foreign.Boot) {
		st := r.Status
		b.foreign = &st // another admin's answer: what the plugin held after its request
	}
	b.pmu.Unlock()
	if ok {
		select {
		case ch <- r:
		default:
		}
	}
}

// withPasswordHashes returns cmds with the at-rest form of each password they set
// (acl.Command.PasswordHash), computed here, on the caller's goroutine and before the
// backend's lock: the plugin and the mirror take it instead of each hashing the password
// again (PBKDF2, about half a millisecond, was the largest part of what a new Agent costs the
// broker). cmds itself is not changed.
func withPasswordHashes(cmds []acl.Command) ([]acl.Command, error) {
	var out []acl.Command
	for i, c := range cmds {
		if c.Password == "" || c.PasswordHash != nil || (c.Op != acl.OpCreateClient && c.Op != acl.OpSetClientPassword && c.Op != acl.OpModifyClient) {
			continue
		}
		h, err := embedded.HashPassword(c.Password)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c, err)
		}
		if out == nil {
			out = slices.Clone(cmds)
		}
		out[i].PasswordHash = h
	}
	if out == nil {
		return cmds, nil
	}
	return out, nil
}
