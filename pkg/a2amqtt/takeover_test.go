package a2amqtt_test

import (
	"context"
	"log/slog"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/a2amqtttest"
)

// Two processes of one identity (a copy of an Agent left running, an overlapping deploy) connect
// with one client ID, and MQTT lets each new connection take the session from the other. Each is
// a long-running client that reconnects at once after a drop: without a slower reconnect after
// connections that die right after they come up, the two take the session from each other as
// fast as they can connect (hundreds of CONNECTs a second on both brokers). With it they settle
// to a few takeovers a second at first and one every few seconds after, the broker and the rest
// of its clients unharmed, and each says once, at WARN, what is going on.
func TestTwoClientsWithOneClientIDBackOff(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		u, err := url.Parse(b.URL())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var ups atomic.Int64
		logs := make([]*a2amqtttest.Logs, 2)
		for i := range logs {
			logs[i] = &a2amqtttest.Logs{}
			cfg, _ := a2amqtt.ClientSetup{URL: u, ClientID: "acme/ops/twin", Logger: logs[i].Logger(),
				OnUp: func(*autopaho.ConnectionManager, *paho.Connack) { ups.Add(1) },
			}.Config()
			cm, err := autopaho.NewConnection(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { <-cm.Done() }()
		}
		const window = 4 * time.Second
		time.Sleep(window)
		got := ups.Load()
		cancel()
		// The delays after 2, 3, 4, 5 and 6 short connections in a row are 0.25, 0.5, 1, 2 and
		// 4 s (up to a quarter more): each client connects at most about 6 times in 4 s, 12 for
		// the two. Without the delay: 300-700 on both brokers here.
		if got > 16 {
			t.Fatalf("the two clients connected %d times in %s: they take the session from each other without slowing down", got, window)
		}
		if got < 3 {
			t.Fatalf("the two clients connected %d times in %s: the second never took the session over, the test proves nothing", got, window)
		}
		warned := 0
		for _, l := range logs {
			warned += l.Count(slog.LevelWarn, "mqtt connection lost right after connecting, several times in a row: is another client using this client ID? Reconnecting more slowly")
		}
		if warned == 0 {
			t.Errorf("neither client said why it reconnects more slowly")
		}
		t.Logf("%s: %d connections in %s, %d WARN lines", b.Name(), got, window, warned)
	})
}
