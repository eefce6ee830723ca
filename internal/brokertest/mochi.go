package brokertest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/sessionhandover"
)

// Mochi is an embedded mochi-mqtt v5 broker.
type Mochi struct {
	addr     string
	listener string
	server   *mqtt.Server
	once     sync.Once
}

// URL implements Broker.
func (m *Mochi) URL() string { return "mqtt://" + m.addr }

// Addr implements Broker.
func (m *Mochi) Addr() string { return m.addr }

// Name implements Broker.
func (m *Mochi) Name() string { return "mochi" }

// Server exposes the underlying server, e.g. to inject hooks.
func (m *Mochi) Server() *mqtt.Server { return m.server }

// Stop closes the broker; safe to call more than once.
//
// mochi 2.7.9's own shutdown path (closeListenerClients →
// Clients.GetByListener) takes the clients' read lock recursively and
// deadlocks when a client is being removed at the same moment. Closing the
// listener first with a client closer that takes the lock once makes
// mochi's Close skip that path (the embedded broker's Server.Close does
// the same).
func (m *Mochi) Stop() {
	m.once.Do(func() {
		m.server.Listeners.Close(m.listener, func(string) {
			for _, cl := range m.server.Clients.GetAll() {
				if !cl.Net.Inline && !cl.Closed() {
					_ = m.server.DisconnectClient(cl, packets.ErrServerShuttingDown)
				}
			}
		})
		_ = m.server.Close()
	})
}

// StartMochi starts an embedded mochi-mqtt broker on a free loopback port with
// an allow-all auth hook. It is stopped when the test ends.
func StartMochi(t testing.TB) *Mochi {
	t.Helper()
	m, err := startMochi()
	if err != nil {
		t.Fatalf("brokertest: %v", err)
	}
	t.Cleanup(m.Stop)
	return m
}

// NewMochi starts an embedded broker outside a test (benchmarks, examples);
// the caller must Stop it.
func NewMochi() (*Mochi, error) { return startMochi() }

func startMochi() (*Mochi, error) {
	var lastErr error
	// Retry a few times: the free port may be taken between probe and bind.
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		server := mqtt.New(&mqtt.Options{
			InlineClient: true,
			// Quiet: broker chatter drowns test output.
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err := server.AddHook(new(auth.AllowHook), nil); err != nil {
			return nil, fmt.Errorf("mochi: add allow hook: %w", err)
		}
		// As the embedded broker does: without it mochi loses a message fanned out while a
		// persistent session is taken over (package sessionhandover).
		if err := server.AddHook(&sessionhandover.Hook{Server: server}, nil); err != nil {
			return nil, fmt.Errorf("mochi: add session hand-over hook: %w", err)
		}
		if err := server.AddListener(listeners.NewTCP(listeners.Config{ID: "tcp", Address: addr})); err != nil {
			lastErr = fmt.Errorf("mochi: listen on %s: %w", addr, err)
			_ = server.Close()
			continue
		}
		if err := server.Serve(); err != nil {
			lastErr = fmt.Errorf("mochi: serve: %w", err)
			_ = server.Close()
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = waitForListener(ctx, addr)
		cancel()
		if err != nil {
			_ = server.Close()
			lastErr = err
			continue
		}
		return &Mochi{addr: addr, listener: "tcp", server: server}, nil
	}
	return nil, fmt.Errorf("start mochi: %w", lastErr)
}
