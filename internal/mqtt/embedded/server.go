package embedded

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"

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
	listener *listeners.TCP
	tls      bool
}

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
	if err := store.Attach(m); err != nil {
		_ = store.Close()
		return nil, err
	}
	l := listeners.NewTCP(listeners.Config{ID: "a2a-fleet", Address: cfg.Addr, TLSConfig: cfg.TLS})
	if err := m.AddListener(l); err != nil {
		_ = m.Close()
		_ = store.Close()
		return nil, fmt.Errorf("embedded: listen on %s: %w", cfg.Addr, err)
	}
	if err := m.Serve(); err != nil {
		_ = m.Close()
		_ = store.Close()
		return nil, fmt.Errorf("embedded: serve: %w", err)
	}
	return &Server{mochi: m, store: store, listener: l, tls: cfg.TLS != nil}, nil
}

// Attach adds the enforcing hook to a mochi server and lets the store
// disconnect its clients (for servers built elsewhere; Start does this). It
// also turns on mochi's NoInheritedPropertiesOnAck: by default mochi copies
// a PUBLISH's properties into its PUBACK and then also writes the reason
// code 0x01, which MQTT.js refuses ("Invalid puback reason code") and then
// misparses the stream. Do not also add an allow-all hook: mochi allows
// what any hook allows.
func (s *Store) Attach(m *mqtt.Server) error {
	m.Options.Capabilities.Compatibilities.NoInheritedPropertiesOnAck = true
	h := NewHook(s)
	h.server = m
	if err := m.AddHook(h, nil); err != nil {
		return fmt.Errorf("embedded: add ACL hook: %w", err)
	}
	// mochi acknowledges a PUBLISH before fanning it out: without this hook a message fanned
	// out while a persistent session is taken over (an agent's reconnect) is lost.
	if err := m.AddHook(new(sessionhandover.Hook), nil); err != nil {
		return fmt.Errorf("embedded: add session hand-over hook: %w", err)
	}
	s.setConnections(h)
	return nil
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

// Close stops the broker and writes the last snapshot (if any).
func (s *Server) Close() error {
	// mochi 2.7.9's own shutdown path (closeListenerClients →
	// Clients.GetByListener) takes the clients' read lock recursively and
	// deadlocks if a client is being removed at the same moment (observed in
	// tests). Closing the listener first with our own client closer, which
	// takes the lock once, makes mochi's Close skip that path.
	s.mochi.Listeners.Close(s.listener.ID(), func(string) {
		for _, cl := range s.mochi.Clients.GetAll() {
			if !cl.Net.Inline && !cl.Closed() {
				_ = s.mochi.DisconnectClient(cl, packets.ErrServerShuttingDown)
			}
		}
	})
	var errs []error
	if err := s.mochi.Close(); err != nil {
		errs = append(errs, fmt.Errorf("embedded: close: %w", err))
	}
	if err := s.store.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
