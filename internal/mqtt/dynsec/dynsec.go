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
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Config configures Connect.
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
	// MaxBatch is the maximum number of commands per message (default 100);
	// MaxBatchBytes the maximum JSON size of one (default 256 KiB, keep it
	// under the broker's max_packet_size).
	MaxBatch      int
	MaxBatchBytes int
	// ListPageSize is the count used when listing (default 1000).
	ListPageSize int
	Logger       *slog.Logger
}

// ErrConnectionLost is returned for requests whose replies were still
// outstanding when the admin connection dropped: the broker may or may not
// have executed them; observe again before retrying (acl.Apply does).
var ErrConnectionLost = errors.New("dynsec: admin connection lost before the broker replied")

// Backend implements acl.Backend for Mosquitto's dynamic-security plugin.
type Backend struct {
	cfg    Config
	log    *slog.Logger
	cm     *autopaho.ConnectionManager
	cancel context.CancelFunc
	nonce  string
	seq    atomic.Uint64

	mu      sync.Mutex
	link    *link                    // current connection generation
	pending map[string]chan response // by correlationData

	mutations, reads, roundTrips atomic.Uint64
	lastConnErr                  atomic.Pointer[error] // why the last connect attempt failed
}

// link is one connection's readiness: ready closes once the response topic
// is subscribed (err says whether that worked); a new link replaces it when
// the connection drops.
type link struct {
	ready chan struct{}
	err   error
	down  bool
	// gone closes when this connection drops; requests sent on it stop
	// waiting (paho may keep an unacknowledged QoS 1 publish pending for
	// the session instead of failing it).
	gone chan struct{}
}

func newLink() *link { return &link{ready: make(chan struct{}), gone: make(chan struct{})} }

// Connect opens the admin connection and waits until it is usable.
func Connect(ctx context.Context, cfg Config) (*Backend, error) {
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
	b := &Backend{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "dynsec", "broker", u.Redacted()),
		nonce:   hex.EncodeToString(nonce[:]),
		link:    newLink(),
		pending: map[string]chan response{},
	}

	refused := make(chan error, 1)
	pcfg := autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{u},
		TlsCfg:                        cfg.TLS,
		KeepAlive:                     30,
		CleanStartOnInitialConnection: true,
		ConnectTimeout:                cfg.ConnectTimeout,
		ReconnectBackoff:              reconnectBackoff,
		ConnectUsername:               cfg.Username,
		ConnectPassword:               []byte(cfg.Password),
		OnConnectionUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			b.lastConnErr.Store(nil)
			// Must not block autopaho: subscribe from a goroutine.
			b.mu.Lock()
			l := b.link
			b.mu.Unlock()
			go b.subscribe(cm, l)
		},
		OnConnectionDown: func() bool {
			b.connectionDown()
			return true
		},
		OnConnectError: func(err error) {
			b.lastConnErr.Store(&err)
			var ce *autopaho.ConnackError
			if errors.As(err, &ce) {
				select {
				case refused <- err:
				default:
				}
			}
			b.log.Debug("admin connect attempt failed", "err", err)
		},
		ClientConfig: paho.ClientConfig{
			ClientID: cfg.ClientID,
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){
				func(pr paho.PublishReceived) (bool, error) {
					b.dispatch(pr.Packet)
					return true, nil
				},
			},
		},
	}
	runCtx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	cm, err := autopaho.NewConnection(runCtx, pcfg)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("dynsec: start admin connection to %s: %w", u.Redacted(), err)
	}
	b.cm = cm

	waitCtx, waitCancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer waitCancel()
	ready := make(chan error, 1)
	go func() { ready <- b.waitReady(waitCtx) }()
	select {
	case err := <-ready:
		if err == nil {
			return b, nil
		}
		cancel()
		<-cm.Done()
		return nil, fmt.Errorf("dynsec: admin connection to %s as %q: %w", u.Redacted(), cfg.Username, err)
	case err := <-refused:
		cancel()
		<-cm.Done()
		return nil, fmt.Errorf("dynsec: broker %s refused admin %q (check the dynsec admin credentials): %w", u.Redacted(), cfg.Username, err)
	}
}

// reconnectBackoff: the first attempt is immediate, then 250ms doubling up
// to 5s, so a restarted broker is picked up quickly.
func reconnectBackoff(attempt int) time.Duration {
	if attempt == 0 {
		return 0
	}
	return min(time.Duration(250*(1<<min(attempt-1, 5)))*time.Millisecond, 5*time.Second)
}

// Close disconnects the admin connection.
func (b *Backend) Close(ctx context.Context) error {
	err := b.cm.Disconnect(ctx)
	b.cancel()
	select {
	case <-b.cm.Done():
	case <-ctx.Done():
	}
	if err != nil && !errors.Is(err, autopaho.ConnectionDownError) {
		return fmt.Errorf("dynsec: disconnect: %w", err)
	}
	return nil
}

// Prefix implements acl.Backend.
func (b *Backend) Prefix() string { return b.cfg.Prefix }

// Stats implements acl.Backend.
func (b *Backend) Stats() acl.Stats {
	return acl.Stats{Mutations: b.mutations.Load(), Reads: b.reads.Load(), RoundTrips: b.roundTrips.Load()}
}

// subscribe runs on every (re)connection: the session is not persistent,
// so the response subscription must be renewed before any command is sent.
func (b *Backend) subscribe(cm *autopaho.ConnectionManager, l *link) {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.Timeout)
	defer cancel()
	suback, err := cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: ResponseTopic, QoS: 1}}})
	switch {
	case suback != nil && len(suback.Reasons) == 1 && suback.Reasons[0] >= 0x80:
		// paho also returns an error here; the reason code is the clear part.
		err = fmt.Errorf("subscription to %s refused (SUBACK reason %d): the user lacks the dynsec admin role", ResponseTopic, suback.Reasons[0])
	case err != nil:
		err = fmt.Errorf("subscribe to %s: %w", ResponseTopic, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if l != b.link || l.down {
		return // the connection this was for is already gone
	}
	if err != nil {
		l.err = fmt.Errorf("dynsec: %w", err)
		b.log.Error("admin connection unusable", "err", err)
	}
	close(l.ready)
}

// connectionDown fails every outstanding request (their replies, if any,
// went to the dead session) and starts a new, not yet ready, link.
func (b *Backend) connectionDown() {
	b.mu.Lock()
	defer b.mu.Unlock()
	old := b.link
	old.down = true
	select {
	case <-old.ready:
	default:
		old.err = ErrConnectionLost
		close(old.ready)
	}
	close(old.gone)
	b.link = newLink()
	b.log.Warn("admin connection down; reconnecting")
}

// waitReady blocks until the connection is up and subscribed.
func (b *Backend) waitReady(ctx context.Context) error {
	_, err := b.readyLink(ctx)
	return err
}

// readyLink is waitReady returning the connection it waited for.
func (b *Backend) readyLink(ctx context.Context) (*link, error) {
	for {
		b.mu.Lock()
		l := b.link
		b.mu.Unlock()
		select {
		case <-l.ready:
		case <-ctx.Done():
			if last := b.lastConnErr.Load(); last != nil {
				return nil, fmt.Errorf("waiting for the admin connection (last attempt: %v): %w", *last, ctx.Err())
			}
			return nil, fmt.Errorf("waiting for the admin connection: %w", ctx.Err())
		case <-b.cm.Done():
			return nil, errors.New("admin connection closed")
		}
		b.mu.Lock()
		err, down := l.err, l.down
		b.mu.Unlock()
		if down {
			continue // dropped meanwhile; wait for the next one
		}
		return l, err
	}
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
		// Wait until autopaho has noticed the failure (or a moment passed),
		// so the resend goes to the next connection, not the dying one.
		select {
		case <-l.gone:
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
}

// roundTrip sends one batch and returns the replies in command order.
func (b *Backend) roundTrip(ctx context.Context, cmds []wireCmd) ([]response, *link, error) {
	l, err := b.readyLink(ctx)
	if err != nil {
		return nil, nil, err
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
		return nil, l, fmt.Errorf("encode commands: %w", err)
	}
	b.roundTrips.Add(1)
	// QoS 1 so a message lost on a dying connection is an error here, and a
	// refused publish (the user is no admin) shows as PUBACK reason >= 0x80.
	type published struct {
		pr  *paho.PublishResponse
		err error
	}
	pubc := make(chan published, 1)
	go func() {
		pr, err := b.cm.Publish(ctx, &paho.Publish{Topic: ControlTopic, QoS: 1, Payload: payload})
		pubc <- published{pr, err}
	}()
	var pr *paho.PublishResponse
	select {
	case p := <-pubc:
		if p.err != nil && p.pr == nil {
			return nil, l, fmt.Errorf("publish to %s: %w: %w", ControlTopic, errSend, p.err)
		}
		pr = p.pr
	case <-l.gone:
		return nil, l, fmt.Errorf("publish to %s: %w: %w", ControlTopic, errSend, ErrConnectionLost)
	case <-ctx.Done():
		return nil, l, fmt.Errorf("publish to %s: no PUBACK: %w", ControlTopic, ctx.Err())
	}
	if pr != nil && pr.ReasonCode >= 0x80 {
		reason := ""
		if pr.Properties != nil {
			reason = pr.Properties.ReasonString
		}
		return nil, l, fmt.Errorf("publish to %s refused (PUBACK reason %d %s): the user lacks the dynsec admin role", ControlTopic, pr.ReasonCode, reason)
	}
	out := make([]response, len(cmds))
	for i, ch := range chans {
		select {
		case r := <-ch:
			out[i] = r
		case <-l.gone:
			return nil, l, ErrConnectionLost
		case <-ctx.Done():
			return nil, l, fmt.Errorf("no reply to %s from the broker: %w", cmds[i].Command, ctx.Err())
		}
	}
	return out, l, nil
}

// Execute implements acl.Backend: commands go out in order, in batches of
// Config.MaxBatch; every command the broker refuses (other than benign
// "already exists"/"not found") is reported. A failed exchange (timeout,
// connection lost) stops at that batch.
func (b *Backend) Execute(ctx context.Context, cmds []acl.Command) error {
	wires := make([]wireCmd, len(cmds))
	for i, c := range cmds {
		w, err := encode(c)
		if err != nil {
			return err
		}
		wires[i] = w
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
			if r.Error != "" && !acl.Benign(c.Op, r.Error) {
				errs = append(errs, &acl.CommandError{Command: c, Message: r.Error})
			}
		}
		start = end
	}
	return errors.Join(errs...)
}

// batchEnd picks how many commands from start fit one message.
func (b *Backend) batchEnd(wires []wireCmd, start int) int {
	size := 0
	end := start
	for end < len(wires) && end-start < b.cfg.MaxBatch {
		j, _ := json.Marshal(wires[end])
		if end > start && size+len(j) > b.cfg.MaxBatchBytes {
			break
		}
		size += len(j) + 1
		end++
	}
	return end
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
	for start := 0; start < len(cmds); start += b.cfg.MaxBatch {
		end := min(start+b.cfg.MaxBatch, len(cmds))
		resps, err := b.read(ctx, cmds[start:end])
		if err != nil {
			return acl.State{}, err
		}
		for i, r := range resps {
			c := cmds[start+i]
			if r.Error != "" {
				if notFound(r) {
					continue
				}
				return acl.State{}, fmt.Errorf("%s %s%s%s: broker refused: %s", c.Command, c.Rolename, c.Groupname, c.Username, r.Error)
			}
			if c.Command == "getDefaultACLAccess" {
				var d defaultData
				if err := json.Unmarshal(r.Data, &d); err != nil {
					return acl.State{}, fmt.Errorf("decode getDefaultACLAccess: %w", err)
				}
				m := d.model()
				st.DefaultACL = &m
				continue
			}
			var d getData
			if err := json.Unmarshal(r.Data, &d); err != nil {
				return acl.State{}, fmt.Errorf("decode %s: %w", c.Command, err)
			}
			switch {
			case d.Role != nil:
				st.Roles[d.Role.Rolename] = d.Role.model()
			case d.Group != nil:
				st.Groups[d.Group.Groupname] = d.Group.model()
			case d.Client != nil:
				st.Clients[d.Client.Username] = d.Client.model()
			}
		}
	}
	return st, nil
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
