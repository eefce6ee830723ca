// Package dynsec is the production acl.Backend: Mosquitto's
// dynamic-security plugin, driven over an admin MQTT v5 connection.
//
// Commands are JSON published to $CONTROL/dynamic-security/v1, batched
// ({"commands":[...]}, in order, one message per batch); the plugin answers
// on $CONTROL/dynamic-security/v1/response with one {"responses":[...]}
// message per batch, echoing each command's "correlationData" string, which
// is how replies are matched to waiters (other admins may share the response
// topic). The connection is an autopaho one: it reconnects by itself and
// resubscribes the response topic on every reconnect; calls made while it
// is down wait for it (bounded by their context and Config.Timeout).
//
// Written against Mosquitto 2.0.11; docs/broker.md lists what that version
// can and cannot do.
package dynsec

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/session"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Config configures New and Connect.
type Config struct {
	// URL of the broker: mqtt://host:port, tls://host:port (or mqtts://).
	URL string
	// Username/Password of a dynsec client holding the plugin's admin rights
	// (mosquitto_ctrl dynsec init creates one with the "admin" role).
	Username string
	Password string
	// ClientID defaults to "a2a-fleet-dynsec-<random>" so two operator
	// replicas never take each other's session over.
	ClientID string
	// TLS enables TLS with this configuration (used with tls:// URLs).
	TLS *tls.Config
	// Prefix of the managed object names (default acl.DefaultPrefix).
	Prefix string
	// Timeout bounds one request/response exchange, including waiting for
	// the connection (default 10s). The caller's context can shorten it.
	Timeout time.Duration
	// ConnectTimeout bounds Connect's wait for the first connection
	// (default 10s). A refused CONNACK (bad admin credentials) fails at once.
	ConnectTimeout time.Duration
	// MaxBatch is the maximum number of commands per message (default 100;
	// fewer when the broker is slow per command, so that a message stays
	// within about a third of Timeout); MaxBatchBytes the maximum JSON size
	// of one (default 256 KiB, keep it under the broker's max_packet_size).
	// Concurrent callers share messages: while one is in flight, the next
	// collects every queued request up to these limits (group commit, no
	// timer).
	MaxBatch      int
	MaxBatchBytes int
	// ListPageSize is the count used when listing (default 1000).
	ListPageSize int
	// CountKicks makes Execute find out whom group- and role-level kicking
	// commands disconnect (a getGroup, or a listing of clients and groups,
	// before the batch): Stats.Kicks, OnKick and acl.Trace then cover them.
	// Client-level kicks are always counted (the command names its client).
	// Off by default: the reads cost round trips exactly when a change
	// already disconnects many clients.
	CountKicks bool
	// OnKick, when set, is called for every executed command that
	// disconnects someone (must not block).
	OnKick func(acl.Kick)
	// OnReady runs in its own goroutine after every (re)connection, once the
	// response topic is subscribed; ctx ends with that connection. The
	// operator checks its broker state sentinel there.
	OnReady func(ctx context.Context)
	Logger  *slog.Logger
}

// ErrConnectionLost is returned for requests whose replies were still
// outstanding when the admin connection dropped: the broker may or may not
// have executed them; observe again before retrying (acl.Apply does).
var ErrConnectionLost = errors.New("dynsec: admin connection lost before the broker replied")

// ErrNotOpen is returned by requests made before Open.
var ErrNotOpen = errors.New("dynsec: admin connection not opened yet")

// Backend implements acl.Backend for Mosquitto's dynamic-security plugin.
type Backend struct {
	cfg   Config
	log   *slog.Logger
	url   string // redacted, for messages
	nonce string
	seq   atomic.Uint64
	sess  atomic.Pointer[session.Session]

	mu      sync.Mutex
	pending map[string]chan response // by correlationData

	// Group commit: requests queue here; one sender at a time takes all
	// queued ones (up to the batch limits) into the next message.
	qmu     sync.Mutex
	queue   []*call
	sending bool

	mutations, reads, roundTrips atomic.Uint64
	kicks, kickedUsernames       atomic.Uint64
	cmdCost                      atomic.Int64 // ns per command, see batchLimit

	stop   context.CancelFunc // set by Connect
	opened chan struct{}      // closed by Open

	// onReady is NotifyReady's callback (besides Config.OnReady).
	onReady atomic.Pointer[func(context.Context)]
}

// NotifyReady sets a callback run like Config.OnReady after every (re)connection, for a caller
// that gets the backend ready-made (the operator's broker runtime checks its state sentinel
// there).
func (b *Backend) NotifyReady(fn func(context.Context)) { b.onReady.Store(&fn) }

// New checks cfg and returns a backend that is not connected yet: Open
// starts its connection.
func New(cfg Config) (*Backend, error) {
	if cfg.URL == "" {
		return nil, errors.New("dynsec: broker URL is required")
	}
	u, err := a2amqtt.ParseBrokerURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("dynsec: %w", err)
	}
	if cfg.Username == "" {
		return nil, errors.New("dynsec: admin username is required")
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
		cfg.MaxBatch = 100
	}
	if cfg.MaxBatchBytes <= 0 {
		cfg.MaxBatchBytes = 256 << 10
	}
	if cfg.ListPageSize <= 0 {
		cfg.ListPageSize = 1000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var nonce [6]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, fmt.Errorf("dynsec: random nonce: %w", err)
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "a2a-fleet-dynsec-" + hex.EncodeToString(nonce[:])
	}
	return &Backend{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "dynsec"),
		url:     u.Redacted(),
		nonce:   hex.EncodeToString(nonce[:]),
		pending: map[string]chan response{},
		opened:  make(chan struct{}),
	}, nil
}

// Open starts the admin connection in the background: it lives, and
// reconnects for ever, until ctx ends (the operator passes its manager's
// context). Requests wait for it within their timeout.
func (b *Backend) Open(ctx context.Context) error {
	return b.open(ctx, nil)
}

func (b *Backend) open(ctx context.Context, onRefused func(error)) error {
	sess, err := session.Start(ctx, session.Config{
		Name:           "dynsec admin",
		URL:            b.cfg.URL,
		TLS:            b.cfg.TLS,
		Username:       b.cfg.Username,
		Password:       func() []byte { return []byte(b.cfg.Password) },
		ClientID:       b.cfg.ClientID,
		ConnectTimeout: b.cfg.ConnectTimeout,
		PacketTimeout:  b.cfg.Timeout,
		Subscriptions:  []paho.SubscribeOptions{{Topic: ResponseTopic, QoS: 1}},
		OnMessage:      b.dispatch,
		OnRefused:      onRefused,
		OnReady: func(ctx context.Context, _ *session.Link) {
			if b.cfg.OnReady != nil {
				b.cfg.OnReady(ctx)
			}
			if fn := b.onReady.Load(); fn != nil {
				(*fn)(ctx)
			}
		},
		Logger: b.cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("dynsec: %w", err)
	}
	if !b.sess.CompareAndSwap(nil, sess) {
		return errors.New("dynsec: admin connection already open")
	}
	close(b.opened)
	return nil
}

// Connect is New plus Open with a connection of its own (ended by Close),
// waiting until it is usable: for tools and tests. Bad admin credentials
// fail at the first CONNACK.
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
	go func() { _, err := b.sess.Load().Await(waitCtx); ready <- err }()
	select {
	case err := <-ready:
		if err == nil {
			return b, nil
		}
		cancel()
		<-b.sess.Load().Done()
		return nil, fmt.Errorf("dynsec: admin connection to %s as %q: %w", b.url, cfg.Username, err)
	case err := <-refused:
		cancel()
		<-b.sess.Load().Done()
		return nil, fmt.Errorf("dynsec: broker %s refused admin %q (check the dynsec admin credentials): %w", b.url, cfg.Username, err)
	}
}

// Close disconnects the admin connection (a connection opened with Open
// also ends with its context).
func (b *Backend) Close(ctx context.Context) error {
	sess := b.sess.Load()
	if sess == nil {
		return nil
	}
	err := sess.Close(ctx)
	if b.stop != nil {
		b.stop()
	}
	return err
}

// Healthy returns nil while the admin connection is up (or down for less
// than grace), for readiness checks.
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

// dispatch hands replies to their waiters; replies to other admins'
// requests (unknown correlation) are ignored.
func (b *Backend) dispatch(p *paho.Publish) {
	if p.Topic != ResponseTopic {
		return
	}
	var env responseEnvelope
	if err := json.Unmarshal(p.Payload, &env); err != nil {
		b.log.Warn("unparseable dynsec response", "err", err)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range env.Responses {
		if ch, ok := b.pending[r.CorrelationData]; ok {
			select {
			case ch <- r:
			default:
			}
		}
	}
}

// errSend marks a request that may not have reached the broker.
var errSend = errors.New("send failed")

// exchange is roundTrip bounded by Config.Timeout, resent when the
// connection dropped in the middle (up to 5 attempts). Every command this
// package sends is idempotent (a repeated create or delete gets the benign
// "already exists" or "not found", modify*/set* converge, reads have no
// effect), so resending a batch the broker may already have executed is
// safe.
func (b *Backend) exchange(ctx context.Context, cmds []wireCmd) ([]response, error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		resps, l, err := b.roundTrip(ctx, cmds)
		if err == nil || l == nil || attempt == 5 || ctx.Err() != nil || !(errors.Is(err, ErrConnectionLost) || errors.Is(err, errSend)) {
			return resps, err
		}
		b.log.Info("admin connection failed during a request; resending", "attempt", attempt, "err", err)
		// Wait until the failure is noticed (or a moment passed), so the
		// resend goes to the next connection, not the dying one.
		select {
		case <-l.Gone():
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
}

// call is one caller's request waiting for a message.
type call struct {
	ctx  context.Context
	cmds []wireCmd
	size int
	done chan callResult
}

type callResult struct {
	resps []response
	link  *session.Link
	err   error
}

// roundTrip queues cmds for the next message and waits for their replies,
// in command order. Whoever finds no message in flight becomes the sender
// until the queue is empty.
func (b *Backend) roundTrip(ctx context.Context, cmds []wireCmd) ([]response, *session.Link, error) {
	select {
	case <-b.opened:
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("%w: %w", ErrNotOpen, ctx.Err())
	}
	size := 0
	for _, c := range cmds {
		j, _ := json.Marshal(c)
		size += len(j) + 1
	}
	c := &call{ctx: ctx, cmds: cmds, size: size, done: make(chan callResult, 1)}
	b.qmu.Lock()
	b.queue = append(b.queue, c)
	lead := !b.sending
	b.sending = true
	b.qmu.Unlock()
	if lead {
		go b.sendQueued()
	}
	select {
	case r := <-c.done:
		return r.resps, r.link, r.err
	case <-ctx.Done():
		if down := b.sess.Load().Healthy(0); down != nil {
			return nil, nil, fmt.Errorf("waiting for the admin connection (%v): %w", down, ctx.Err())
		}
		return nil, nil, fmt.Errorf("waiting for the broker's reply: %w", ctx.Err())
	}
}

// sendQueued sends messages while requests are queued, one in flight at a
// time, each carrying as many queued requests as fit.
func (b *Backend) sendQueued() {
	for {
		b.qmu.Lock()
		var batch []*call
		n, size := 0, 0
		limit := b.batchLimit()
		for len(b.queue) > 0 {
			c := b.queue[0]
			if c.ctx.Err() != nil {
				b.queue = b.queue[1:]
				continue // its caller has given up
			}
			if len(batch) > 0 && (n+len(c.cmds) > limit || size+c.size > b.cfg.MaxBatchBytes) {
				break
			}
			batch = append(batch, c)
			n += len(c.cmds)
			size += c.size
			b.queue = b.queue[1:]
		}
		if len(batch) == 0 {
			b.sending = false
			b.qmu.Unlock()
			return
		}
		b.qmu.Unlock()
		b.send(batch)
	}
}

// send publishes one message with the commands of batch and hands each call
// its replies.
func (b *Backend) send(batch []*call) {
	finish := func(r callResult) {
		for _, c := range batch {
			c.done <- r
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.Timeout)
	defer cancel()
	sess := b.sess.Load()
	l, err := sess.Await(ctx)
	if err != nil {
		finish(callResult{err: err})
		return
	}
	var cmds []wireCmd
	for _, c := range batch {
		cmds = append(cmds, c.cmds...)
	}
	ids := make([]string, len(cmds))
	chans := make([]chan response, len(cmds))
	b.mu.Lock()
	for i := range cmds {
		ids[i] = fmt.Sprintf("%s-%d", b.nonce, b.seq.Add(1))
		cmds[i].CorrelationData = ids[i]
		chans[i] = make(chan response, 1)
		b.pending[ids[i]] = chans[i]
	}
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		for _, id := range ids {
			delete(b.pending, id)
		}
		b.mu.Unlock()
	}()

	payload, err := json.Marshal(request{Commands: cmds})
	if err != nil {
		finish(callResult{link: l, err: fmt.Errorf("encode commands: %w", err)})
		return
	}
	b.roundTrips.Add(1)
	sent := time.Now()
	// QoS 1 so a message lost on a dying connection is an error here, and a
	// refused publish (the user is no admin) shows as PUBACK reason >= 0x80.
	pr, err := sess.Publish(ctx, &paho.Publish{Topic: ControlTopic, QoS: 1, Payload: payload})
	switch {
	case errors.Is(err, session.ErrConnectionLost):
		finish(callResult{link: l, err: fmt.Errorf("publish to %s: %w: %w", ControlTopic, errSend, ErrConnectionLost)})
		return
	case err != nil && ctx.Err() != nil:
		finish(callResult{link: l, err: fmt.Errorf("publish to %s: no PUBACK: %w", ControlTopic, ctx.Err())})
		return
	case err != nil:
		finish(callResult{link: l, err: fmt.Errorf("publish to %s: %w: %w", ControlTopic, errSend, err)})
		return
	}
	if pr != nil && pr.ReasonCode >= 0x80 {
		reason := ""
		if pr.Properties != nil {
			reason = pr.Properties.ReasonString
		}
		finish(callResult{link: l, err: fmt.Errorf("publish to %s refused (PUBACK reason %d %s): the user lacks the dynsec admin role", ControlTopic, pr.ReasonCode, reason)})
		return
	}
	out := make([]response, len(cmds))
	for i, ch := range chans {
		select {
		case r := <-ch:
			out[i] = r
		case <-l.Gone():
			finish(callResult{link: l, err: ErrConnectionLost})
			return
		case <-ctx.Done():
			finish(callResult{link: l, err: fmt.Errorf("no reply to %s from the broker: %w", cmds[i].Command, ctx.Err())})
			return
		}
	}
	b.observeCost(time.Since(sent), len(cmds))
	at := 0
	for _, c := range batch {
		c.done <- callResult{resps: out[at : at+len(c.cmds)], link: l}
		at += len(c.cmds)
	}
}

// Execute implements acl.Backend: commands go out in order, in batches of
// Config.MaxBatch; every command the broker refuses (other than benign
// "already exists"/"not found") is reported. A failed exchange (timeout,
// connection lost) stops at that batch. Kicks are reported (see
// Config.CountKicks).
func (b *Backend) Execute(ctx context.Context, cmds []acl.Command) error {
	wires := make([]wireCmd, len(cmds))
	for i, c := range cmds {
		w, err := encode(c)
		if err != nil {
			return err
		}
		wires[i] = w
	}
	var before *acl.State
	if b.cfg.CountKicks {
		st, err := b.kickState(ctx, cmds)
		if err != nil {
			b.log.Info("could not read who the commands will disconnect; their kicks go uncounted", "err", err)
		} else {
			before = st
		}
	}
	var errs []error
	for start := 0; start < len(wires); {
		end := b.batchEnd(wires, start)
		b.mutations.Add(uint64(end - start))
		resps, err := b.exchange(ctx, wires[start:end])
		if err != nil {
			errs = append(errs, fmt.Errorf("dynsec: batch of commands %d-%d (%s...): %w", start+1, end, cmds[start], err))
			return errors.Join(errs...)
		}
		for i, r := range resps {
			c := cmds[start+i]
			if v := verdict(c, r.Error); v.Failed() {
				errs = append(errs, &acl.CommandError{Command: c, Verdict: v, Message: r.Error})
			}
			b.reportKick(ctx, c, r.Error, before)
		}
		start = end
	}
	return errors.Join(errs...)
}

// alreadyDone are Mosquitto 2.0.11 dynsec's replies that mean a command's goal was reached
// before it ran: the object, link or rule it creates exists, or the one it deletes is gone.
var alreadyDone = map[acl.Op]string{
	acl.OpCreateRole:     "Role already exists",
	acl.OpCreateGroup:    "Group already exists",
	acl.OpCreateClient:   "Client already exists",
	acl.OpDeleteRole:     "Role not found",
	acl.OpDeleteGroup:    "Group not found",
	acl.OpDeleteClient:   "Client not found",
	acl.OpAddGroupRole:   "Group is already in this role",
	acl.OpAddGroupClient: "Client is already in this group",
	// Used as the revocation kick; the rule may be gone already.
	acl.OpRemoveRoleACL: "ACL not found",
	acl.OpAddRoleACL:    "ACL with this topic already exists",
}

// verdict maps dynsec's reply to a command ("" for success) to the model's verdict.
func verdict(c acl.Command, errText string) acl.Verdict {
	switch {
	case errText == "":
		return acl.Applied
	case c.Op == acl.OpCreateRole && errText == alreadyDone[acl.OpCreateRole] && len(c.ACLs) > 0:
		// dynsec keeps the existing role as it is: the ACLs of this create were not written.
		return acl.LostContent
	case alreadyDone[c.Op] == errText:
		return acl.AlreadyDone
	}
	return acl.Refused
}

// kicked reports whether dynsec 2.0.11 ran its "enforce any changes" kick
// for c given its reply (the same cases the embedded store mirrors).
func kicked(c acl.Command, errText string) bool {
	if !c.Kicks() {
		return false
	}
	switch {
	case errText == "":
		return true
	case c.Op == acl.OpAddGroupClient && errText == "Client is already in this group":
		return true
	case c.Op == acl.OpModifyClient && errText == "Role not found":
		return true
	}
	return false
}

// reportKick counts and reports whom c disconnected. Group- and role-level
// kicks are known only with the state read before the batch.
func (b *Backend) reportKick(ctx context.Context, c acl.Command, errText string, before *acl.State) {
	if !kicked(c, errText) {
		return
	}
	var users []string
	switch c.Op {
	case acl.OpDeleteGroup, acl.OpAddGroupRole, acl.OpRemoveGroupRole, acl.OpDeleteRole, acl.OpAddRoleACL, acl.OpRemoveRoleACL:
		if before == nil {
			return
		}
		users = acl.KickTargets(*before, c)
	default:
		users = []string{c.Username}
	}
	if len(users) == 0 {
		return
	}
	c.Password = ""
	k := acl.Kick{Command: c, Usernames: users}
	b.kicks.Add(1)
	b.kickedUsernames.Add(uint64(len(users)))
	acl.ReportKick(ctx, k)
	if b.cfg.OnKick != nil {
		b.cfg.OnKick(k)
	}
}

// kickState reads what the group- and role-level kicking commands of cmds
// need to name their targets: the members of each group (getGroup), and for
// role-level ones every client and group (a listing). Nil when no command
// needs it.
func (b *Backend) kickState(ctx context.Context, cmds []acl.Command) (*acl.State, error) {
	var groups []string
	roles := false
	for _, c := range cmds {
		switch c.Op {
		case acl.OpDeleteGroup, acl.OpAddGroupRole, acl.OpRemoveGroupRole:
			groups = append(groups, c.Group)
		case acl.OpDeleteRole, acl.OpAddRoleACL, acl.OpRemoveRoleACL:
			roles = true
		}
	}
	switch {
	case roles:
		st, err := b.list(ctx)
		if err != nil {
			return nil, err
		}
		return &st, nil
	case len(groups) > 0:
		st, err := b.groupMembers(ctx, groups)
		if err != nil {
			return nil, err
		}
		return &st, nil
	}
	return nil, nil
}

// groupMembers returns a state holding the named groups and their members
// (as clients carrying the membership).
func (b *Backend) groupMembers(ctx context.Context, groups []string) (acl.State, error) {
	st := acl.NewState(nil, nil, nil)
	var cmds []wireCmd
	for _, g := range groups {
		cmds = append(cmds, wireCmd{Command: "getGroup", Groupname: g})
	}
	err := b.readEach(ctx, cmds, func(_ wireCmd, data json.RawMessage) error {
		var d getData
		if err := json.Unmarshal(data, &d); err != nil || d.Group == nil {
			return fmt.Errorf("decode getGroup: %w", err)
		}
		st.Groups[d.Group.Groupname] = d.Group.model()
		for _, m := range d.Group.Clients {
			c := st.Clients[m.Username]
			c.Username = m.Username
			c.Groups = append(c.Groups, d.Group.Groupname)
			st.Clients[m.Username] = c
		}
		return nil
	})
	if err != nil {
		return acl.State{}, err
	}
	return st, nil
}

// batchEnd picks how many commands from start fit one message.
func (b *Backend) batchEnd(wires []wireCmd, start int) int {
	size := 0
	end := start
	limit := b.batchLimit()
	for end < len(wires) && end-start < limit {
		j, _ := json.Marshal(wires[end])
		if end > start && size+len(j) > b.cfg.MaxBatchBytes {
			break
		}
		size += len(j) + 1
		end++
	}
	return end
}

// batchLimit is how many commands one message may carry: MaxBatch, or fewer
// when the broker is slow per command. Mosquitto 2.0.11 rewrites its whole
// dynsec file after each command and acknowledges a message only after
// running all of it, so on a large configuration (35 ms per command at 2 500
// clients, docs/broker.md) a full message would outlast the request
// timeout; a message is kept to about a third of Timeout at the measured
// cost per command.
func (b *Backend) batchLimit() int {
	cost := time.Duration(b.cmdCost.Load())
	if cost <= 0 {
		return b.cfg.MaxBatch
	}
	return max(1, min(b.cfg.MaxBatch, int(b.cfg.Timeout/3/cost)))
}

// observeCost folds one message's time per command into the estimate
// (exponentially weighted, a quarter for the new sample).
func (b *Backend) observeCost(elapsed time.Duration, cmds int) {
	sample := int64(elapsed) / int64(max(1, cmds))
	for {
		old := b.cmdCost.Load()
		next := sample
		if old > 0 {
			next = old + (sample-old)/4
		}
		if b.cmdCost.CompareAndSwap(old, next) {
			return
		}
	}
}

// read runs read-only commands (not counted as mutations).
func (b *Backend) read(ctx context.Context, cmds []wireCmd) ([]response, error) {
	if len(cmds) == 0 {
		return nil, nil
	}
	b.reads.Add(uint64(len(cmds)))
	return b.exchange(ctx, cmds)
}

// notFound tells a get reply for an absent object from a real failure.
func notFound(r response) bool {
	return strings.HasSuffix(r.Error, " not found")
}

// Observe implements acl.Backend.
func (b *Backend) Observe(ctx context.Context, only *acl.Names) (acl.State, error) {
	var st acl.State
	var err error
	if only == nil {
		st, err = b.list(ctx)
	} else {
		st, err = b.get(ctx, filterNames(*only, b.cfg.Prefix), true)
	}
	if err != nil {
		return acl.State{}, fmt.Errorf("dynsec: observe: %w", err)
	}
	return st, nil
}

func filterNames(n acl.Names, prefix string) acl.Names {
	keep := func(in []string) []string {
		var out []string
		for _, s := range in {
			if strings.HasPrefix(s, prefix) {
				out = append(out, s)
			}
		}
		return out
	}
	return acl.Names{Roles: keep(n.Roles), Groups: keep(n.Groups), Clients: keep(n.Clients)}
}

// list pages through listRoles/listGroups/listClients (verbose) and keeps
// the prefixed objects.
func (b *Backend) list(ctx context.Context) (acl.State, error) {
	st := acl.NewState(nil, nil, nil)
	kinds := []string{"listRoles", "listGroups", "listClients"}
	offsets := map[string]int{}
	done := map[string]bool{}
	first := true
	for {
		var cmds []wireCmd
		for _, k := range kinds {
			if !done[k] {
				cmds = append(cmds, wireCmd{Command: k, Verbose: ptr(true), Count: ptr(b.cfg.ListPageSize), Offset: ptr(offsets[k])})
			}
		}
		if first {
			cmds = append(cmds, wireCmd{Command: "getDefaultACLAccess"})
		}
		if len(cmds) == 0 {
			return st, nil
		}
		resps, err := b.read(ctx, cmds)
		if err != nil {
			return acl.State{}, err
		}
		for i, r := range resps {
			if r.Error != "" {
				return acl.State{}, fmt.Errorf("%s: broker refused: %s", cmds[i].Command, r.Error)
			}
			if r.Command == "getDefaultACLAccess" {
				var d defaultData
				if err := json.Unmarshal(r.Data, &d); err != nil {
					return acl.State{}, fmt.Errorf("decode getDefaultACLAccess: %w", err)
				}
				m := d.model()
				st.DefaultACL = &m
				continue
			}
			var d listData
			if err := json.Unmarshal(r.Data, &d); err != nil {
				return acl.State{}, fmt.Errorf("decode %s: %w", r.Command, err)
			}
			n := 0
			switch r.Command {
			case "listRoles":
				n = len(d.Roles)
				for _, x := range d.Roles {
					if strings.HasPrefix(x.Rolename, b.cfg.Prefix) {
						st.Roles[x.Rolename] = x.model()
					}
				}
			case "listGroups":
				n = len(d.Groups)
				for _, x := range d.Groups {
					if strings.HasPrefix(x.Groupname, b.cfg.Prefix) {
						st.Groups[x.Groupname] = x.model()
					}
				}
			case "listClients":
				n = len(d.Clients)
				for _, x := range d.Clients {
					if strings.HasPrefix(x.Username, b.cfg.Prefix) {
						st.Clients[x.Username] = x.model()
					}
				}
			}
			offsets[r.Command] += n
			if n == 0 || offsets[r.Command] >= d.TotalCount {
				done[r.Command] = true
			}
		}
		first = false
	}
}

// get fetches the named objects with getRole/getGroup/getClient in one
// batch (and the default access when withDefault); absent ones are left out.
func (b *Backend) get(ctx context.Context, n acl.Names, withDefault bool) (acl.State, error) {
	st := acl.NewState(nil, nil, nil)
	var cmds []wireCmd
	for _, r := range n.Roles {
		cmds = append(cmds, wireCmd{Command: "getRole", Rolename: r})
	}
	for _, g := range n.Groups {
		cmds = append(cmds, wireCmd{Command: "getGroup", Groupname: g})
	}
	for _, c := range n.Clients {
		cmds = append(cmds, wireCmd{Command: "getClient", Username: c})
	}
	if withDefault {
		cmds = append(cmds, wireCmd{Command: "getDefaultACLAccess"})
	}
	err := b.readEach(ctx, cmds, func(c wireCmd, data json.RawMessage) error {
		if c.Command == "getDefaultACLAccess" {
			var d defaultData
			if err := json.Unmarshal(data, &d); err != nil {
				return fmt.Errorf("decode getDefaultACLAccess: %w", err)
			}
			m := d.model()
			st.DefaultACL = &m
			return nil
		}
		var d getData
		if err := json.Unmarshal(data, &d); err != nil {
			return fmt.Errorf("decode %s: %w", c.Command, err)
		}
		switch {
		case d.Role != nil:
			st.Roles[d.Role.Rolename] = d.Role.model()
		case d.Group != nil:
			st.Groups[d.Group.Groupname] = d.Group.model()
		case d.Client != nil:
			st.Clients[d.Client.Username] = d.Client.model()
		}
		return nil
	})
	if err != nil {
		return acl.State{}, err
	}
	return st, nil
}

// readEach runs read commands in MaxBatch chunks and hands fn the data of
// each reply; an absent object is skipped, any other refusal fails.
func (b *Backend) readEach(ctx context.Context, cmds []wireCmd, fn func(wireCmd, json.RawMessage) error) error {
	for start := 0; start < len(cmds); start += b.cfg.MaxBatch {
		end := min(start+b.cfg.MaxBatch, len(cmds))
		resps, err := b.read(ctx, cmds[start:end])
		if err != nil {
			return err
		}
		for i, r := range resps {
			c := cmds[start+i]
			if r.Error != "" {
				if notFound(r) {
					continue
				}
				return fmt.Errorf("%s %s%s%s: broker refused: %s", c.Command, c.Rolename, c.Groupname, c.Username, r.Error)
			}
			if err := fn(c, r.Data); err != nil {
				return err
			}
		}
	}
	return nil
}

// Check implements acl.Backend by fetching the client, its groups and all
// their roles (any names, prefixed or not) and deciding locally with the
// same code the embedded broker uses (acl.Policy), which the conformance
// tests hold against the real broker's answers.
func (b *Backend) Check(ctx context.Context, username string, access acl.Access, topic string) (acl.Decision, error) {
	st, err := b.get(ctx, acl.Names{Clients: []string{username}}, true)
	if err != nil {
		return acl.Decision{}, fmt.Errorf("dynsec: check %s %q for %q: %w", access, topic, username, err)
	}
	c, ok := st.Clients[username]
	if !ok {
		return st.Check(username, access, topic), nil
	}
	var roles []string
	for _, r := range c.Roles {
		roles = append(roles, r.Name)
	}
	more, err := b.get(ctx, acl.Names{Groups: c.Groups, Roles: roles}, false)
	if err != nil {
		return acl.Decision{}, fmt.Errorf("dynsec: check %s %q for %q: %w", access, topic, username, err)
	}
	var groupRoles []string
	for _, g := range more.Groups {
		for _, r := range g.Roles {
			if _, have := more.Roles[r.Name]; !have {
				groupRoles = append(groupRoles, r.Name)
			}
		}
	}
	rest, err := b.get(ctx, acl.Names{Roles: groupRoles}, false)
	if err != nil {
		return acl.Decision{}, fmt.Errorf("dynsec: check %s %q for %q: %w", access, topic, username, err)
	}
	for k, v := range more.Roles {
		st.Roles[k] = v
	}
	for k, v := range rest.Roles {
		st.Roles[k] = v
	}
	for k, v := range more.Groups {
		st.Groups[k] = v
	}
	return st.Check(username, access, topic), nil
}

var _ acl.Backend = (*Backend)(nil)
