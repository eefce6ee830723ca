package a2amqtt_test

import (
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/a2amqtttest"
)

// The CONNECT packets the one setup builds: a clean session on every connect (not only the
// first), or a persistent one from the first CONNECT on with Request Problem Information; the
// password asked for at every attempt.
func TestClientSetupConnectPackets(t *testing.T) {
	u, _ := url.Parse("mqtt://127.0.0.1:1883")
	password := "first"
	build := func(expiry time.Duration) autopaho.ClientConfig {
		cfg, _ := a2amqtt.ClientSetup{URL: u, ClientID: "acme/ops/a", Username: "u", Password: func() []byte { return []byte(password) }, SessionExpiry: expiry}.Config()
		return cfg
	}
	// autopaho builds the packet from these fields, then calls ConnectPacketBuilder.
	connect := func(cfg autopaho.ClientConfig, first bool) *paho.Connect {
		cp := &paho.Connect{ClientID: cfg.ClientID, KeepAlive: cfg.KeepAlive, CleanStart: cfg.CleanStartOnInitialConnection && first}
		if cfg.SessionExpiryInterval != 0 {
			cp.Properties = &paho.ConnectProperties{SessionExpiryInterval: &cfg.SessionExpiryInterval}
		}
		cp, err := cfg.ConnectPacketBuilder(cp, u)
		if err != nil {
			t.Fatal(err)
		}
		return cp
	}

	clean := build(0)
	if clean.KeepAlive != 30 || clean.ConnectTimeout != 10*time.Second || clean.SessionExpiryInterval != 0 {
		t.Errorf("defaults: keep-alive %d, connect timeout %s, session expiry %d", clean.KeepAlive, clean.ConnectTimeout, clean.SessionExpiryInterval)
	}
	for _, first := range []bool{true, false} {
		if cp := connect(clean, first); !cp.CleanStart || cp.Properties != nil {
			t.Errorf("clean session, first=%v: CleanStart %v, properties %+v", first, cp.CleanStart, cp.Properties)
		}
	}
	persistent := build(1500 * time.Millisecond)
	for _, first := range []bool{true, false} {
		cp := connect(persistent, first)
		if cp.CleanStart || cp.Properties == nil || *cp.Properties.SessionExpiryInterval != 1 || !cp.Properties.RequestProblemInfo {
			t.Errorf("persistent session, first=%v: CleanStart %v, properties %+v", first, cp.CleanStart, cp.Properties)
		}
	}
	if cp := connect(clean, true); string(cp.Password) != "first" || !cp.PasswordFlag {
		t.Errorf("password %q (flag %v)", cp.Password, cp.PasswordFlag)
	}
	password = "rotated"
	if cp := connect(clean, false); string(cp.Password) != "rotated" {
		t.Errorf("a rotated password is not used at the next attempt: %q", cp.Password)
	}
	password = ""
	if cp := connect(clean, false); cp.PasswordFlag {
		t.Error("an empty password is sent")
	}
}

func TestReconnectBackoff(t *testing.T) {
	want := []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	for i, w := range want {
		if got := a2amqtt.ReconnectBackoff(i); got != w {
			t.Errorf("attempt %d: %s, want %s", i, got, w)
		}
	}
	if got := a2amqtt.ReconnectBackoff(1000); got != 5*time.Second {
		t.Errorf("attempt 1000: %s", got)
	}
}

// Quiet logs and health: a refused CONNECT is one WARN per distinct cause, a dial error is
// DEBUG before the first connection, a drop is one INFO, and health says how long the
// connection is down and why.
func TestClientSetupStateAndLogs(t *testing.T) {
	u, _ := url.Parse("mqtt://127.0.0.1:1883")
	logs := &a2amqtttest.Logs{}
	var downs, refusals int
	cfg, st := a2amqtt.ClientSetup{URL: u, ClientID: "c", Logger: logs.Logger(),
		OnDown:         func() { downs++ },
		OnConnectError: func(error) { refusals++ },
	}.Config()
	if err := st.Healthy(time.Hour); err != nil {
		t.Errorf("within the grace before the first connection: %v", err)
	}
	dial := errors.New("dial tcp 127.0.0.1:1883: connect: connection refused")
	cfg.OnConnectError(dial)
	if err := st.Healthy(0); err == nil || !strings.Contains(err.Error(), "not connected after") || !errors.Is(err, dial) {
		t.Errorf("never connected: %v", err)
	}
	refused := &autopaho.ConnackError{ReasonCode: 0x86, Reason: "bad user name or password"}
	for range 3 {
		cfg.OnConnectError(refused)
	}
	if n := logs.Count(slog.LevelWarn, "broker refused the connection"); n != 1 {
		t.Errorf("a refusal repeated 3 times logged %d WARNs, want 1", n)
	}
	if n := len(logs.AtLeast(slog.LevelWarn)); n != 1 {
		t.Errorf("WARN lines: %v", logs.AtLeast(slog.LevelDebug))
	}
	cfg.OnConnectionUp(nil, &paho.Connack{})
	if !st.Up() || st.Healthy(0) != nil || st.LastConnectError() != nil {
		t.Errorf("up: %v %v %v", st.Up(), st.Healthy(0), st.LastConnectError())
	}
	if reconnect := cfg.OnConnectionDown(); !reconnect {
		t.Error("a lost connection is not reconnected")
	}
	if logs.Count(slog.LevelInfo, "mqtt connection lost; reconnecting") != 1 || downs != 1 || refusals != 4 {
		t.Errorf("drop: logs %v, OnDown %d, OnConnectError %d", logs.AtLeast(slog.LevelDebug), downs, refusals)
	}
	if err := st.Healthy(0); err == nil || !strings.Contains(err.Error(), "connection down for") {
		t.Errorf("down: %v", err)
	}
	cfg.OnConnectionUp(nil, &paho.Connack{})
	if logs.Count(slog.LevelInfo, "mqtt connection restored") != 1 {
		t.Errorf("restore not logged: %v", logs.AtLeast(slog.LevelDebug))
	}
	if n := len(logs.AtLeast(slog.LevelWarn)); n != 1 {
		t.Errorf("expected reconnect logged WARN/ERROR: %v", logs.AtLeast(slog.LevelDebug))
	}
}
