package embedded

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/sessionhandover"
)

// Config configures Start.
type Config struct {
	// Addr to listen on, e.g. "127.0.0.1:1883" ("127.0.0.1:0" picks a port;
	// see Server.Addr).
	Addr string
	// TLS, when set, makes the listener TLS-only.
	TLS *tls.Config
	// MaxPacketSize is the largest MQTT packet accepted (mochi
	// Capabilities.MaximumPacketSize, Mosquitto's max_packet_size); 0 means
	// no limit.
	MaxPacketSize uint32
	// Store configures identities (admin user, prefix, snapshot file).
	Store StoreConfig
	// Logger for mochi (default: discard; mochi is chatty).
	Logger *slog.Logger
}

// Server is a running embedded broker.
type Server struct {
	mochi    *mqtt.Server
	store    *Store
	hook     *Hook
	listener *listeners.Net
	// conns are the listener's accepted connections, for a shutdown that always finishes.
	conns *trackingListener
	tls   bool

	closeOnce sync.Once
	closeErr  error
}

// ShutdownGrace bounds each of the two waits of Close: for mochi to end every connection it was
// told to end, and then, after the remaining connections (clients that never finished a CONNECT,
// or whose goroutine is stuck) were closed under it, for mochi to notice.
const ShutdownGrace = 2 * time.Second

// Start creates the store (loading its snapshot), starts mochi with the
// enforcing hook on cfg.Addr and returns once it accepts connections.
func Start(cfg Config) (*Server, error) {
	if cfg.Addr == "" {
		return nil, errors.New("embedded: listen address is required")
	}
	store, err := NewStore(cfg.Store)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		// Disabled, not only discarded: a discarding handler still formats every record, and
		// mochi logs an Error for every PUBLISH the hook answers 0x10 (no subscriber), ~10 % of
		// the broker's CPU under a flood of requests whose answers nobody reads.
		logger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.Level(math.MaxInt)}))
	}
	caps := mqtt.NewDefaultServerCapabilities()
	caps.MaximumPacketSize = cfg.MaxPacketSize
	m := mqtt.New(&mqtt.Options{Logger: logger, Capabilities: caps})
	hook, err := store.attach(m)
	if err != nil {
		_ = store.Close()
		return nil, err
	}
	// Our own listener (mochi's Net around it) rather than mochi's TCP listener, so Close can stop
	// accepting before it ends the clients and close every accepted connection in the end.
	raw, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		_ = store.Close()
		return nil, fmt.Errorf("embedded: listen on %s: %w", cfg.Addr, err)
	}
	tracked := newTrackingListener(raw)
	var nl net.Listener = tracked
	if cfg.TLS != nil {
		nl = tls.NewListener(tracked, cfg.TLS)
	}
	l := listeners.NewNet("a2a-fleet", nl)
	if err := m.AddListener(l); err != nil {
		_ = raw.Close()
		_ = store.Close()
		return nil, fmt.Errorf("embedded: listen on %s: %w", cfg.Addr, err)
	}
	if err := m.Serve(); err != nil {
		_ = raw.Close()
		_ = m.Close()
		_ = store.Close()
		return nil, fmt.Errorf("embedded: serve: %w", err)
	}
	return &Server{mochi: m, store: store, hook: hook, listener: l, conns: tracked, tls: cfg.TLS != nil}, nil
}

// Attach adds the enforcing hook to a mochi server and lets the store
// disconnect its clients (for servers built elsewhere; Start does this). It
// also turns on mochi's NoInheritedPropertiesOnAck: by default mochi copies
// a PUBLISH's properties into its PUBACK and then also writes the reason
// code 0x01, which MQTT.js refuses ("Invalid puback reason code") and then
// misparses the stream. Do not also add an allow-all hook: mochi allows
// what any hook allows.
func (s *Store) Attach(m *mqtt.Server) error {
	_, err := s.attach(m)
	return err
}

func (s *Store) attach(m *mqtt.Server) (*Hook, error) {
	m.Options.Capabilities.Compatibilities.NoInheritedPropertiesOnAck = true
	h := NewHook(s)
	h.server = m
	if err := m.AddHook(h, nil); err != nil {
		return nil, fmt.Errorf("embedded: add ACL hook: %w", err)
	}
	// mochi acknowledges a PUBLISH before fanning it out: without this hook a message fanned
	// out while a persistent session is taken over (an agent's reconnect) is lost.
	if err := m.AddHook(&sessionhandover.Hook{Server: m}, nil); err != nil {
		return nil, fmt.Errorf("embedded: add session hand-over hook: %w", err)
	}
	s.setConnections(h)
	return h, nil
}

// Addr is the bound host:port.
func (s *Server) Addr() string { return s.listener.Address() }

// URL is mqtt://host:port (or tls://).
func (s *Server) URL() string {
	if s.tls {
		return "tls://" + s.Addr()
	}
	return "mqtt://" + s.Addr()
}

// Backend is the acl.Backend managing this broker's identities.
func (s *Server) Backend() acl.Backend { return s.store }

// Store is the same, with its concrete type.
func (s *Server) Store() *Store { return s.store }

// Mochi exposes the underlying server (e.g. for inline clients).
func (s *Server) Mochi() *mqtt.Server { return s.mochi }

// Close stops the broker and writes the last snapshot (if any). It always finishes, within about
// twice ShutdownGrace, whatever the clients do:
//
//  1. the listener stops accepting, and a CONNECT that arrives on a connection accepted before is
//     answered CONNACK 0x8B "server shutting down";
//  2. every client gets DISCONNECT 0x8B "server shutting down" and its connection is closed (an
//     SDK client then reconnects to nothing and waits for the broker to come back);
//  3. mochi's own close waits for every connection's goroutine; after ShutdownGrace the
//     connections still open (a client that never sent its CONNECT, a goroutine stuck in a
//     write to a client that reads nothing) are closed under it, and after another
//     ShutdownGrace Close returns an error naming how many remained instead of waiting.
//
// mochi 2.7.9's own Close would first disconnect the clients and only then stop accepting, so a
// client reconnecting at once (autopaho does) slipped in between and mochi then waited for it
// for as long as it stayed connected (issue 23: `make dev` hung 35 s and more on Ctrl-C).
func (s *Server) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Server) close() error {
	s.hook.shuttingDown.Store(true)
	_ = s.conns.Close()
	// mochi 2.7.9's own shutdown path (closeListenerClients → Clients.GetByListener) takes the
	// clients' read lock recursively and deadlocks if a client is being removed at the same
	// moment (observed in tests). Closing the listener first with our own client closer, which
	// takes the lock once, makes mochi's Close skip that path.
	s.mochi.Listeners.Close(s.listener.ID(), func(string) { s.disconnectClients() })
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.mochi.Close() // waits for every connection's goroutine
	}()
	var errs []error
	if !waitFor(done, ShutdownGrace) {
		s.disconnectClients() // any that got in meanwhile
		s.conns.closeAll()
		if !waitFor(done, ShutdownGrace) {
			errs = append(errs, fmt.Errorf("embedded: %d client connection(s) still open %s after the shutdown began; stopped waiting for them", s.conns.open(), 2*ShutdownGrace))
		}
	}
	if err := s.store.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// disconnectClients tells every client the server is shutting down and closes its connection.
func (s *Server) disconnectClients() {
	for _, cl := range s.mochi.Clients.GetAll() {
		if !cl.Net.Inline && !cl.Closed() {
			_ = s.mochi.DisconnectClient(cl, packets.ErrServerShuttingDown)
		}
	}
}

func waitFor(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// trackingListener records the connections it accepted until they are closed, so a shutdown can
// close the ones mochi did not.
type trackingListener struct {
	net.Listener
	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

func newTrackingListener(l net.Listener) *trackingListener {
	return &trackingListener{Listener: l, conns: map[*trackedConn]struct{}{}}
}

// Accept implements net.Listener.
func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	tc := &trackedConn{Conn: c, l: l}
	l.conns[tc] = struct{}{}
	return tc, nil
}

// Close implements net.Listener: no more connections are accepted.
func (l *trackingListener) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	return l.Listener.Close()
}

// closeAll closes every connection still open.
func (l *trackingListener) closeAll() {
	l.mu.Lock()
	conns := make([]*trackedConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

func (l *trackingListener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

type trackedConn struct {
	net.Conn
	l    *trackingListener
	once sync.Once
}

// Close implements net.Conn.
func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}
