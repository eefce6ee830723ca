// Package brokertest starts real MQTT v5 brokers for tests: an embedded
// mochi-mqtt server (in-process, always available) and a Mosquitto 2.x child
// process (installed by hack/install-mosquitto.sh); and it has the raw paho v5
// test client (Dial, MustDial, Client) that shows every CONNACK, SUBACK,
// PUBACK and DISCONNECT reason code, and Watch, which tells which connected
// clients a change disconnected (the "no collateral kicks" checks).
//
// Tests that exercise the A2A-over-MQTT profile must run against real brokers,
// not mocks: retained-message, LWT, shared-subscription and PUBACK reason-code
// behaviour differ between brokers and are exactly what the profile relies on.
package brokertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"
)

// Broker is a running broker a test can connect to.
type Broker interface {
	// URL is the broker address in the form mqtt://127.0.0.1:PORT.
	URL() string
	// Addr is host:port.
	Addr() string
	// Name identifies the broker kind in subtest names ("mochi", "mosquitto").
	Name() string
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
// The tiny window between closing the probe listener and the broker binding
// the port is acceptable for tests; brokers are retried on bind failure.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatalf("brokertest: %v", err)
	}
	return port
}

// waitForListener polls addr until a TCP connection succeeds or ctx ends.
func waitForListener(ctx context.Context, addr string) error {
	var lastErr error
	for {
		d := net.Dialer{Timeout: 200 * time.Millisecond}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			_ = c.Close()
			return nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("broker at %s not accepting connections: %w", addr, ctx.Err()), lastErr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ForEach runs fn as a subtest against each broker kind: embedded mochi and
// a Mosquitto process. Mosquitto not being installed fails the test (it is
// never skipped silently), see StartMosquitto.
func ForEach(t *testing.T, fn func(t *testing.T, b Broker)) {
	t.Helper()
	t.Run("mochi", func(t *testing.T) {
		fn(t, StartMochi(t))
	})
	t.Run("mosquitto", func(t *testing.T) {
		fn(t, StartMosquitto(t, MosquittoOptions{}))
	})
}
